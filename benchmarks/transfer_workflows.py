"""Confuga's workflows at small scale: `gxpc make` with its inputs pushed, pulled,
or split by the pull threshold (run by `benchmarks/transfers.py --workflows`).

Run as root, from the checkout, after scripts/install:

    /opt/gxpstyle/venv/bin/python benchmarks/transfers.py --workflows [--reps N] [--quick]

A test bed of 8 hosts (tw01..tw08), every link shaped to 100 Mbit/s, one
ordinary user; a session explores them, GMounts their /tmp, and masks the head
out, so every recipe runs on a host. Before each case its inputs are written
fresh (untimed) on tw01, in tw01's export, as a workflow's first step would
leave them; then `gxpc make -j16` runs with --pull-threshold and --trace:

  shared   (Confuga's IALR: one large file every job needs) --shared-mib MiB,
           one consumer per host (GXP_ON, hard), in two waves: tw01..tw04,
           then tw05..tw08 once the first wave is done (4 holders by then):
             push        --pull-threshold 0
             pull random --pull-threshold inf (holders in random order)
             pull fixed  --pull-threshold inf --pull-order fixed (by node id:
                         every pull starts from the same holder)
  bwa      (Confuga's BWA: a shared reference and many split parts, all made on
           one node) a --ref-mib MiB reference and --parts parts of
           --part-kib KiB; one align recipe per part (reads ref and its part,
           0.5 s of work), placed by load so that every mode moves the same
           files:
             push        --pull-threshold 0
             pull        --pull-threshold inf
             threshold   the default, 1M (the reference pushed, the parts pulled)

Measured: makespan (wall seconds of the make), bytes the hosts received while
it ran (their veths), and from the trace the pushes, the pulls and the sum of
their seconds (Confuga's "total transfer time"). Confuga's Table I is printed
beside ours. Goal (issue 16): the threshold at least as fast as the better pure
mode. All hosts share this machine's CPUs (and other work may run on it).
"""
from __future__ import annotations

import json
import os
import time

from bench_harness import BenchError, GMountBench, log, ratio_text

HOSTS = ["tw%02d" % i for i in range(1, 9)]
BW = "100mbit"
JOBS = 16

# Confuga (push/pull paper, Table I): 25 storage nodes, 1 Gbit links.
CONFUGA = [
    ("IALR", "Push All", "01:52:00", "8,891.75", "97", "0"),
    ("IALR", "Auto, PT = 256 MB", "01:52:13", "8,976.17", "24", "74"),
    ("IALR", "Pull All", "03:38:16", "163,802.00", "0", "96"),
    ("BWA", "Push All", "03:33:05", "364.34", "1,946", "0"),
    ("BWA", "Auto, PT = 256 MB", "00:49:04", "44,713.10", "25", "5,991"),
    ("BWA", "Pull All", "01:11:19", "77,975.30", "0", "6,244"),
]

# Two waves: tw01 (the holder) and tw02..tw04 at once, then tw05..tw08 at once
# when the first wave is done (4 holders by then: random pulls spread over them).
SHARED = "all: " + " ".join("c%d" % i for i in range(1, 9)) + "\n" + "".join(
    "c{i}: GXP_ON = tw0{i}\nc{i}: GXP_PLACE = hard\nc{i}:{after}\n\tsha256sum shared > $@\n".format(
        i=i, after=" c1 c2 c3 c4" if i > 4 else "") for i in range(1, 9))

BWA = """\
PARTS := $(sort $(wildcard part*.fq))
all: $(PARTS:.fq=.sam)
%.sam: %.fq
\tcat ref.fa $< | sha256sum > $@ && sleep 0.5
"""


class WorkflowsBench(GMountBench):
    name = "transfers.py --workflows"
    hosts = HOSTS
    host_glob = "tw*"
    bandwidth = BW

    def __init__(self, a) -> None:
        super().__init__(log, "gxptw")
        self.a = a
        self.seq = 0

    # -- helpers -----------------------------------------------------------------
    def rx_bytes(self) -> int:
        total = 0
        for h in HOSTS:
            with open("/sys/class/net/%s/statistics/tx_bytes" % self.bed.host(h).veth) as f:
                total += int(f.read())
        return total

    def as_user(self, argv, cwd=None):
        if cwd:
            argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd] + list(argv)
        e = self.env()
        e["GXP_SESSION"] = self.session
        r = self.bed.run_as(self.user.name, argv, env=e, capture_output=True, text=True,
                            timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr[-2000:]))
        return r

    def workdir(self, makefile: str, inputs: str) -> str:
        """A fresh directory with `makefile`; `inputs` (make rules) run on tw01."""
        self.seq += 1
        work = os.path.join(self.mnt, "w%d" % self.seq)
        self.as_user(["mkdir", work])
        src = os.path.join(self.top, "Makefile.%d" % self.seq)
        with open(src, "w") as f:
            f.write(inputs)
        self.as_user(["cp", src, os.path.join(work, "Makefile")])
        self.as_user([self.gxpc_path(), "make", "-s", "-j8", "GXP_ON=tw01"], cwd=work)
        with open(src, "w") as f:
            f.write(makefile)
        self.as_user(["cp", src, os.path.join(work, "Makefile")])
        time.sleep(1.0)     # the catalog hears of the new files
        return work

    def gxpc_path(self) -> str:
        import sys
        return os.path.join(os.path.dirname(sys.executable), "gxpc")

    def gmake(self, key: str, work: str, args) -> None:
        trace = os.path.join(self.top, "trace-%d.json" % self.seq)
        b0 = self.rx_bytes()
        t0 = time.monotonic()
        self.timed(key, lambda: self.as_user(
            [self.gxpc_path(), "make", "-s", "-j%d" % JOBS, "--trace=" + trace] + list(args), cwd=work))
        self.add(key + " s", time.monotonic() - t0)
        self.add(key + " MB", (self.rx_bytes() - b0) / 1e6)
        with open(trace) as f:
            lines = [json.loads(x) for x in f]
        if self.a.traces:
            import shutil
            os.makedirs(self.a.traces, exist_ok=True)
            shutil.copy(trace, os.path.join(self.a.traces, key.replace(" ", "-") + ".json"))
        xs = [x for x in lines if x["kind"] == "transfer"]
        self.add(key + " pushes", sum(1 for x in xs if x["mode"] == "push"))
        self.add(key + " pulls", sum(1 for x in xs if x["mode"] == "pull"))
        self.add(key + " xfer s", sum(x["end"] - x["start"] for x in xs))
        log("  %-22s %6.1f s" % (key, self.med(key + " s") or 0))

    # -- the workflows -------------------------------------------------------------
    def shared(self, mode: str) -> None:
        inputs = "shared:\n\thead -c %d /dev/urandom > $@\n" % (self.a.shared_mib << 20)
        work = self.workdir(SHARED, inputs)
        args = {"push": ["--pull-threshold", "0"], "pull random": ["--pull-threshold", "inf"],
                "pull fixed": ["--pull-threshold", "inf", "--pull-order", "fixed"]}[mode]
        self.gmake("shared " + mode, work, args)
        self.as_user(["rm", "-rf", work])

    def bwa(self, mode: str) -> None:
        parts = " ".join("part%03d.fq" % i for i in range(self.a.parts))
        inputs = ("all: ref.fa %s\nref.fa:\n\thead -c %d /dev/urandom > $@\n"
                  "part%%.fq:\n\thead -c %d /dev/urandom > $@\n"
                  % (parts, self.a.ref_mib << 20, self.a.part_kib << 10))
        work = self.workdir(BWA, inputs)
        args = {"push": ["--pull-threshold", "0"], "pull": ["--pull-threshold", "inf"],
                "threshold": []}[mode] + ["GXP_PLACE=load"]
        self.gmake("bwa " + mode, work, args)
        self.as_user(["rm", "-rf", work])

    def run(self) -> None:
        for rep in range(self.a.reps):
            if self.a.only in ("", "shared"):
                for mode in ("push", "pull random", "pull fixed")[::1 if rep % 2 == 0 else -1]:
                    self.shared(mode)
            if self.a.only in ("", "bwa"):
                for mode in ("push", "pull", "threshold")[::1 if rep % 2 == 0 else -1]:
                    self.bwa(mode)

    # -- the report ----------------------------------------------------------------
    def report(self) -> None:
        print()
        print("Confuga's workflows at small scale: %d hosts, %s links, gxpc make -j%d, %d rep(s), "
              "medians" % (len(HOSTS), BW, JOBS, self.a.reps))
        print("  shared: one %d MiB file, 8 consumers; bwa: a %d MiB reference, %d parts of %d KiB"
              % (self.a.shared_mib, self.a.ref_mib, self.a.parts, self.a.part_kib))
        print("%-8s %-12s %10s %10s %8s %8s %12s %9s" % ("workflow", "transfers", "makespan s",
                                                       "moved MB", "pushes", "pulls",
                                                       "transfer s", "CPU busy"))
        for wf, modes in (("shared", ("push", "pull random", "pull fixed")),
                          ("bwa", ("push", "pull", "threshold"))):
            if self.a.only not in ("", wf):
                continue
            for mode in modes:
                k = "%s %s" % (wf, mode)
                print("%-8s %-12s %10.1f %10.1f %8.0f %8.0f %12.1f %8.0f%%" % (
                    wf, mode, self.med(k + " s"), self.med(k + " MB"), self.med(k + " pushes"),
                    self.med(k + " pulls"), self.med(k + " xfer s"),
                    100 * (self.med(k + " busy") or 0)))
        sp, sr, sf = (self.med("shared %s s" % m) for m in ("push", "pull random", "pull fixed"))
        if sp is not None:
            print("shared: pull random / push %s, pull fixed / pull random %s"
                  % (ratio_text(sp, sr), ratio_text(sr, sf)))
        bp, bl, bt = (self.med("bwa %s s" % m) for m in ("push", "pull", "threshold"))
        best = min(bp, bl) if bp is not None else None
        if best is not None:
            print("bwa: threshold / better pure mode %s (goal <= 1: %s); push / threshold %s, "
                  "pull / threshold %s" % (ratio_text(best, bt), "met" if bt <= best else "NOT met",
                                           ratio_text(bt, bp), ratio_text(bt, bl)))
        print()
        print("Confuga (push/pull paper, Table I), 25 nodes, 1 Gbit links:")
        print("  %-5s %-18s %10s %16s %7s %7s" % ("", "transfers", "time", "transfer s", "pushes",
                                                  "pulls"))
        for row in CONFUGA:
            print("  %-5s %-18s %10s %16s %7s %7s" % row)
        print("  (BWA: Auto 31% faster than Pull All, 77% faster than Push All)")
        for line in self.noticed_lines():
            print(line)


def add_arguments(p) -> None:
    p.add_argument("--only", choices=["shared", "bwa"], default="", help="one workflow only")
    p.add_argument("--traces", default="", help="keep each case's gxpc make --trace in this directory")
    p.add_argument("--shared-mib", type=int, default=48, help="shared workflow: MiB (default 48)")
    p.add_argument("--ref-mib", type=int, default=48, help="bwa: reference MiB (default 48)")
    p.add_argument("--parts", type=int, default=32, help="bwa: parts (default 32)")
    p.add_argument("--part-kib", type=int, default=512,
                   help="bwa: KiB a part (default 512: under the default threshold, so pulled)")


def quick(a) -> None:
    a.reps, a.shared_mib, a.ref_mib, a.parts, a.part_kib = 1, 16, 16, 16, 512
