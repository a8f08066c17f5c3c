#!/usr/bin/env python3
"""Locality-aware placement against placement by load only, for `gxpc make`.

Run as root, from the checkout, after `scripts/install`:

    /opt/gxpstyle/venv/bin/python benchmarks/locality.py            # 2 reps
    /opt/gxpstyle/venv/bin/python benchmarks/locality.py --quick    # 1 rep, smaller data

What it does:

* A test bed of 8 hosts, every link shaped to 100 Mbit/s (tbf at both ends of
  each veth, tests/testbed/), one ordinary user; a session explores the 8
  hosts, mounts a GMount of their /tmp, and masks the head out (`gxpc smask`
  after a command that fails on it), so every recipe runs on a host and every
  input byte a recipe reads from elsewhere crosses a 100 Mbit link.
* Two workflows, each run from scratch in the mount with `gxpc make -j16`:
    pipeline   examples/pipeline (simulate a reference and reads, split the
               reads into PARTS, align each part against the shared reference,
               merge), with --reads reads; the reference and the reads are
               made first, not timed, by `gxpc make ref.fa reads.fq` with the
               default placement in both arms (they start from the same
               layout; simulating is a CPU-bound minute that no placement
               changes, and on a shared machine its noise swamped the rest);
    mapreduce  every host writes its share of the input (--chunks chunks of
               --chunk-mib MiB each, chunk k on host k mod 8), then a map
               recipe per chunk (cksum: it reads the chunk, little CPU) and
               one reduce.
* Each workflow twice, interleaved, --reps times: `locality` (the default:
  SOFT placement by the input bytes the replica catalog says each host holds)
  and `load` (GXP_PLACE=load on make's command line, which also overrides
  the makefile's own hints: by load only, the behaviour before the catalog).
  Measured: makespan (wall seconds of the make), and bytes moved between
  hosts (the sum over the hosts' veths of bytes received while the make ran:
  data pulled across the links, plus a little
  control traffic). The mapreduce input is written before the timing starts.
* Prints medians, the ratios (bytes: load / locality, goal >= 3x; makespan:
  locality / load, goal < 1), and Confuga's published BWA figures (Table I of
  the push/pull paper: 25 storage nodes, 1 Gbit links, 826 jobs) beside ours.

* Each host has its own share of the CPUs, as it has its own link:
  --cpu-share (default: this machine's cores / 8, 0.25 of a CPU on 2 cores)
  caps every process of a host at that CPU time (a cgroup per host,
  tests/testbed/), so 8 hosts never contend for the cores and a host that
  runs more recipes is slower, as a real node would be. Without it
  (--cpu-share 0) the hosts share this machine's cores freely and a
  CPU-bound stage takes the same time wherever its recipes run: the makespan
  then measures CPU contention between emulated hosts, not placement. Bytes
  moved do not depend on it. Other work on the machine still slows every
  host alike; both placements run interleaved on the same bed.

Everything is cleaned up whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

from bench_harness import BenchError, GMountBench, log, main_driver, ratio_text

HOSTS = ["tq%02d" % i for i in range(1, 9)]
BW = "100mbit"
JOBS = 16
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = os.path.join(REPO, "examples", "pipeline")

# A map reads its chunk once and does little with it (cksum: a checksum and
# the size, as a scan or a filter would): the stage is bound by reading its
# input, which is where placement matters. (A CPU-heavy map measures this
# machine's 2 cores, shared by all 8 hosts, and not the placement.)
MAPREDUCE = """\
CHUNKS := $(sort $(wildcard in/chunk*.bin))
all: total.txt
counts/%.txt: in/%.bin
\tmkdir -p counts && cksum < $< > $@
total.txt: $(patsubst in/%.bin,counts/%.txt,$(CHUNKS))
\tcat $^ | awk '{n += $$2; print $$1} END {print "bytes", n}' > $@
"""

# Confuga (push/pull paper, Table I): BWA, 826 jobs, 2 x 3.1 GB queries split
# 274 ways, 265 MB shared reference, 25 storage nodes on 1 Gbit links.
CONFUGA_BWA = [
    ("Push All", "03:33:05", "364.34 s transferring", "1,946 pushes"),
    ("Auto, PT = 256 MB", "00:49:04", "44,713.10 s transferring", "25 pushes, 5,991 pulls"),
    ("Pull All", "01:11:19", "77,975.30 s transferring", "6,244 pulls"),
]


def stage_times(trace: str, t0: float) -> str:
    """Per stage (a recipe's script, or its first command): recipes, the
    hosts they ran on, and when the first started and the last ended, in
    seconds from the make's start (from its --trace)."""
    stages: dict[str, list] = {}
    with open(trace) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") != "recipe":
                continue
            words = rec["recipe"].split()
            script = [w for w in words if w.endswith(".py")]
            name = os.path.basename(script[0]) if script else words[0]
            st = stages.setdefault(name, [0, set(), float("inf"), 0.0])
            st[0] += 1
            st[1].add(rec["node"])
            st[2], st[3] = min(st[2], rec["start"] - t0), max(st[3], rec["end"] - t0)
    return "".join("stage %-12s %3d recipes on %d hosts, %6.1f s to %6.1f s\n"
                   % (name, n, len(hosts), a, b)
                   for name, (n, hosts, a, b) in sorted(stages.items(), key=lambda kv: kv[1][2]))


class LocalityBench(GMountBench):
    name = "locality.py"
    hosts = HOSTS
    host_glob = "tq*"
    bandwidth = BW

    def __init__(self, a) -> None:
        super().__init__(log, "gxplq")
        self.a = a

    def bed_up(self, names, user_prefix: str, **up_args) -> float:
        return super().bed_up(names, user_prefix, cpu_share=self.a.cpu_share or None, **up_args)

    # -- measuring -------------------------------------------------------------
    def rx_bytes(self) -> dict[str, int]:
        """Bytes each host received (bridge-side tx of its veth)."""
        got = {}
        for h in HOSTS:
            with open("/sys/class/net/%s/statistics/tx_bytes" % self.bed.host(h).veth) as f:
                got[h] = int(f.read())
        return got

    def as_user(self, argv, cwd=None, env=None, timeout=None):
        if cwd:
            argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd] + list(argv)
        e = self.env()
        e.update(env or {})
        r = self.bed.run_as(self.user.name, argv, env=e, capture_output=True, text=True,
                            timeout=timeout or self.call_timeout)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr[-2000:]))
        return r

    def gmake(self, key: str, work: str, args, mode: str) -> None:
        env = {"GXP_SESSION": self.session}
        if mode == "load":
            # on make's command line: it overrides the makefile's own
            # target-specific GXP_PLACE (the pipeline's HARD split) as well
            args = list(args) + ["GXP_PLACE=load"]
        trace = os.path.join(self.top, "%s-%s.trace" % (key.replace(" ", "-"), uuid.uuid4().hex[:6]))
        if self.a.explain:
            args = ["--explain-placement", "--trace=" + trace] + list(args)
        b0 = self.rx_bytes()
        t0 = time.monotonic()
        r = self.timed(key, lambda: self.as_user(
            [os.path.join(os.path.dirname(sys.executable), "gxpc"), "make", "-s", "-j%d" % JOBS]
            + list(args), cwd=work, env=env))
        self.add(key + " s", time.monotonic() - t0)
        if self.a.explain:
            # where each recipe ran and why, for reading afterwards
            with open(os.path.join(self.a.explain, key.replace(" ", "-") + ".txt"), "a") as f:
                f.write(r.stderr)
                f.write(stage_times(trace, time.time() - (time.monotonic() - t0)))
        b1 = self.rx_bytes()
        per_host = [b1[h] - b0[h] for h in HOSTS]
        self.add(key + " MB", sum(per_host) / 1e6)
        self.add(key + " link MB", max(per_host) / 1e6)    # the busiest host's link

    # -- workflows -------------------------------------------------------------
    def pipeline(self, mode: str, rep: int) -> None:
        work = os.path.join(self.mnt, "pipe-%s-%d" % (mode, rep))
        self.as_user(["sh", "-c", 'mkdir "$1" && cp "$2"/Makefile "$2"/*.py "$1"/', "sh", work, PIPELINE])
        args = ["READS=%d" % self.a.reads, "REFLEN=100000", "PARTS=16"]
        self.as_user([os.path.join(os.path.dirname(sys.executable), "gxpc"), "make", "-s", "ref.fa",
                      "reads.fq"] + args, cwd=work, env={"GXP_SESSION": self.session})
        self.gmake("pipeline " + mode, work, args, mode)
        self.as_user(["rm", "-rf", work])

    def mapreduce(self, mode: str, rep: int) -> None:
        work = os.path.join(self.mnt, "mr-%s-%d" % (mode, rep))
        self.as_user(["sh", "-c", 'mkdir -p "$1/in" && cat > "$1/Makefile"', "sh", work])
        with open(os.path.join(self.top, "mr.mk"), "w") as f:
            f.write(MAPREDUCE)
        self.as_user(["cp", os.path.join(self.top, "mr.mk"), os.path.join(work, "Makefile")])
        # each host writes its share where it stands (its own export), not
        # timed; chunk k is on host k mod 8, spread as a data set's blocks
        # are (named by host, make's sorted order would ask for one host's
        # chunks at a time)
        per = self.a.chunks // len(HOSTS)
        self.gxpc("e", "i=0; while [ $i -lt %d ]; do head -c %d /dev/urandom > %s/in/chunk-$(printf "
                  "%%04d $((i * GXP_NUM_EXECS + GXP_EXEC_IDX))).bin; i=$((i+1)); done"
                  % (per, self.a.chunk_mib << 20, work))
        r = self.as_user(["sh", "-c", 'ls "$1"/in | wc -l', "sh", work])
        if int(r.stdout) != per * len(HOSTS):
            raise BenchError("mapreduce: %s chunks written, not %d" % (r.stdout.strip(), per * len(HOSTS)))
        self.gmake("mapreduce " + mode, work, [], mode)
        self.as_user(["rm", "-rf", work])

    def run(self) -> None:
        for rep in range(self.a.reps):
            for mode in (("locality", "load") if rep % 2 == 0 else ("load", "locality")):
                for wf in self.a.workflows:
                    getattr(self, wf)(mode, rep)

    # -- report ----------------------------------------------------------------
    def report(self) -> None:
        print()
        cpu = ("%.3g CPU each" % self.a.cpu_share if self.a.cpu_share
               else "sharing %d cores" % (os.cpu_count() or 1))
        print("locality-aware placement against load only: %d hosts, %s links, %s, gxpc make -j%d, "
              "%d rep(s), medians" % (len(HOSTS), BW, cpu, JOBS, self.a.reps))
        print("%-10s %-9s %12s %12s %14s %10s" % ("workflow", "placement", "makespan s", "moved MB",
                                                  "busiest link", "CPU busy"))
        verdicts = []
        for wf in self.a.workflows:
            for mode in ("locality", "load"):
                k = "%s %s" % (wf, mode)
                print("%-10s %-9s %12.1f %12.1f %11.1f MB %9.0f%%" % (
                    wf, mode, self.med(k + " s"), self.med(k + " MB"), self.med(k + " link MB"),
                    100 * (self.med(k + " busy") or 0)))
            moved = (self.med(wf + " load MB"), self.med(wf + " locality MB"))
            span = (self.med(wf + " load s"), self.med(wf + " locality s"))
            print("%-10s bytes moved load/locality %s (goal >= 3x); makespan locality/load %s "
                  "(goal < 1)" % (wf, ratio_text(moved[1], moved[0]), ratio_text(span[0], span[1])))
            verdicts.append("%s: bytes %s, makespan %s" % (
                wf, "met" if moved[0] >= 3 * max(moved[1], 1e-9) else "NOT met",
                "met" if span[1] < span[0] else "NOT met"))
        print("goals: " + "; ".join(verdicts))
        print()
        print("Confuga (push/pull paper, Table I), BWA: 826 jobs, 2 x 3.1 GB reads split 274 ways, "
              "265 MB reference, 25 nodes, 1 Gbit")
        for row in CONFUGA_BWA:
            print("  %-18s makespan %s  %-26s %s" % row)
        print("  (their best, Auto, moves the 265 MB reference by push and pulls the split parts: "
              "31% faster than all pulls)")
        for line in self.noticed_lines():
            print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--reads", type=int, default=200000, help="pipeline reads (200,000: 43 MB)")
    p.add_argument("--chunks", type=int, default=32, help="mapreduce input chunks (a multiple of 8)")
    p.add_argument("--chunk-mib", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="1 rep, 50,000 reads, 16 chunks of 4 MiB")
    p.add_argument("--only", choices=("pipeline", "mapreduce"), help="run one workflow, not both")
    p.add_argument("--cpu-share", type=float, default=(os.cpu_count() or 1) / len(HOSTS),
                   help="CPU time of each host, in CPUs (default: cores / %d, so hosts do not "
                   "contend); 0: hosts share the cores freely" % len(HOSTS))
    p.add_argument("--explain", metavar="DIR", help="run make with --explain-placement and append "
                   "what it says to DIR/WORKFLOW-PLACEMENT.txt")
    a = p.parse_args(argv)
    a.workflows = (a.only,) if a.only else ("pipeline", "mapreduce")
    if a.cpu_share and not 0.01 <= a.cpu_share <= (os.cpu_count() or 1):
        p.error("--cpu-share %g: not between 0.01 and %d CPUs" % (a.cpu_share, os.cpu_count() or 1))
    if a.quick:
        a.reps, a.reads, a.chunks, a.chunk_mib = 1, 50000, 16, 4
    return main_driver(LocalityBench, a)


if __name__ == "__main__":
    sys.exit(main())
