#!/usr/bin/env python3
"""Single namespace operations in a GMount against local disk and bindfs (issue 26).

Run as root (the test bed needs it), from the checkout, after `scripts/install`
(it installs bindfs, the anchor, with apt-get when missing):

    /opt/gxpstyle/venv/bin/python benchmarks/namespace_ops.py            # 8 and 32 hosts, 5 reps
    /opt/gxpstyle/venv/bin/python benchmarks/namespace_ops.py --quick    # 8 hosts, 3 reps, 50 ops

What it does:

* Builds a test bed (tests/testbed/) of the largest --hosts count (default 8 and
  32; unshaped links), the checkout and the venv hidden on every host, and one
  ordinary user that runs everything of the product from the installed venv.
  /dev/fuse is made 0666 for the run (restored afterwards).
* For each count N, a session of the user explores tb01..tbNN and mounts a GMount
  of every node's EXPORT (the head's included) at MNT (not timed); all sessions
  stay open together, so every case is measured in the same reps.
* The cases, all on the head, each in a new directory per rep:
    local     a directory of the head's own disk (/var/tmp): the anchor;
    bindfs    `bindfs --no-allow-other` over a local directory (a C FUSE file
              system: the ceiling of any FUSE mount here);
    gmountN   the head's mount of the GMount of N hosts.
* One small Python process of the user (the same for every case) runs each
  operation --ops times in a row, timed per operation with no fork between:
    stat miss         stat of a name that does not exist (a new name each time)
    stat miss again   stat of the same missing name again
    create            create an empty file (O_CREAT|O_EXCL, close)
    write             create a file and write 512 bytes to it, close
    chmod             chmod of a file this node holds (one of the created ones)
    mkdir             mkdir
    rm                unlink of a file this node holds (the created ones)
  Reps are interleaved (every case in each rep, in an order reversed every rep).
* Prints the median ms per operation for each case, the ratios GMount/bindfs
  and 32/8 hosts, the load average before and after, and issue 26's goals:
  each operation within 2x bindfs, and flat from 8 to 32 hosts (at most 1.25x).

Everything is cleaned up whatever happens (Ctrl-C, SIGTERM, errors): bindfs and
the GMounts unmounted, sessions quit, the bed torn down, the directories removed,
/dev/fuse's mode restored. Standard library only, plus tests/testbed/ and
benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from bindfs_anchor import BindfsMount

from bench_harness import (
    Bench,
    BenchError,
    ensure_anchor,
    holds_text,
    log,
    main_driver,
    ratio_text,
    value_text,
)

OPS = ("stat miss", "stat miss again", "create", "write", "chmod", "mkdir", "rm")
GOAL_X_BINDFS, GOAL_FLAT = 2.0, 1.25

# Runs as the bench user: makes DIR, times each operation N times in a row,
# prints seconds per operation (JSON), then removes what it made (not timed).
LOOP = r"""
import json, os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
names = {k: [os.path.join(d, "%s%d" % (k, i)) for i in range(n)] for k in ("miss", "e", "w", "d")}
data = b"x" * 512
out = {}

def missing(path):
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    sys.exit("%s exists" % path)

def create(path):
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

def write(path):
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    os.write(fd, data)
    os.close(fd)

def timed(op, fn, paths):
    t0 = time.perf_counter()
    for p in paths:
        fn(p)
    out[op] = (time.perf_counter() - t0) / len(paths)

timed("stat miss", missing, names["miss"])
timed("stat miss again", missing, [names["miss"][0]] * n)
timed("create", create, names["e"])
timed("write", write, names["w"])
timed("chmod", lambda p: os.chmod(p, 0o600), names["e"])
timed("mkdir", os.mkdir, names["d"])
timed("rm", os.unlink, names["e"])
for p in names["w"]:
    os.unlink(p)
for p in names["d"]:
    os.rmdir(p)
os.rmdir(d)
print(json.dumps(out))
"""


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class NamespaceOps(Bench):
    name = "namespace_ops.py"
    call_timeout = 900
    leftover_fuse_only = True

    def __init__(self, hosts: list, reps: int, ops: int) -> None:
        super().__init__(log)
        self.host_counts, self.reps, self.ops = hosts, reps, ops
        tag = uuid.uuid4().hex[:6]
        self.tag = "nsops-" + tag
        self.mount_tag = self.tag           # head mounts left with it are unmounted on clean-up
        self.top = "/var/tmp/" + self.tag
        self.dirs: dict = {}                # case -> directory the loop runs in
        self.sessions: dict = {}            # case -> (session, mountpoint) for GMount cases
        self.bindfs: BindfsMount | None = None

    # -- setup -------------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed()
        if not ensure_anchor("bindfs", "bindfs"):
            raise BenchError("bindfs is not installed and apt-get could not install it (the anchor)")
        self.open_fuse()
        names = ["tb%02d" % i for i in range(1, max(self.host_counts) + 1)]
        dt = self.bed_up(names, "gxpns")
        log("%s: test bed of %d hosts and user %s up in %.1fs" % (self.name, len(names), self.user.name, dt))
        self.make_dir(self.top)
        self.dirs["local"] = self.make_dir(os.path.join(self.top, "local"))
        src = self.make_dir(os.path.join(self.top, "bindfs-src"))
        mnt = self.make_dir("/tmp/%s-bindfs" % self.tag)
        self.bindfs = BindfsMount(self, src, mnt)
        self.dirs["bindfs"] = mnt
        for n in self.host_counts:
            self._gmount(n, names[:n])

    def _gmount(self, n: int, names: list) -> None:
        """A session of the user on n hosts with a GMount of every node's export."""
        case = "gmount%d" % n
        self.session = os.path.join(self.top, "session%d" % n)
        export, mnt = "/tmp/%s-exp%d" % (self.tag, n), "/tmp/%s-mnt%d" % (self.tag, n)
        self.made_dirs += [export, mnt]      # the head's (the hosts' go with the bed)
        self.gxpc("use", "ssh", "head", "tb*")
        self.sessions[case] = (self.session, None)
        dt, _ = self.gxpc("explore", *names)
        self.gxpc("e", "mkdir -p %s %s" % (export, mnt))
        self.gxpc("mount", export, mnt)
        self.sessions[case] = (self.session, mnt)
        self.dirs[case] = mnt
        log("%s: %d hosts explored in %.1fs, GMount at %s" % (self.name, n, dt, mnt))

    def as_user(self, argv: list) -> str:
        r = self.bed.run_as(self.user.name, argv, env=self.env(), capture_output=True, text=True,
                            timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.strip()[:500]))
        return r.stdout

    # -- run -----------------------------------------------------------------------
    def run(self) -> None:
        self.info["load before"] = _load()
        cases = list(self.dirs)
        log("%s: %d reps of %d ops each, cases %s" % (self.name, self.reps, self.ops, ", ".join(cases)))
        for rep in range(self.reps):
            for case in (cases if rep % 2 == 0 else cases[::-1]):
                d = os.path.join(self.dirs[case], "rep%d" % rep)
                out = json.loads(self.as_user(["/usr/bin/python3", "-I", "-c", LOOP, d, str(self.ops)]))
                for op in OPS:
                    self.add("%s %s" % (case, op), out[op] * 1000.0)
            log("  rep %d: %s" % (rep + 1, "; ".join(
                "%s %s" % (c, " ".join("%.2f" % self.samples["%s %s" % (c, op)][-1] for op in OPS))
                for c in cases)))
        self.info["load after"] = _load()

    # -- clean-up ---------------------------------------------------------------------
    def release(self) -> None:
        if self.bindfs is not None:
            self.guarded("unmounting bindfs", self.bindfs.unmount)
            self.bindfs = None
        for case, (session, mnt) in list(self.sessions.items()):
            self.session = session
            if mnt:
                self.guarded("unmounting " + mnt, self.gxpc, "umount", mnt)
            self.guarded("quitting the session of " + case, self.quit_session)
            del self.sessions[case]
        left = self.settle(0)
        if left:
            self.kill_survivors(left)

    # -- report -----------------------------------------------------------------------
    def report(self) -> None:
        gm = ["gmount%d" % n for n in self.host_counts]
        cols = ["local", "bindfs"] + gm
        ratios = ["%s/bindfs" % c for c in gm]
        flat = len(gm) > 1
        if flat:
            ratios.append("%d/%d hosts" % (self.host_counts[-1], self.host_counts[0]))
        print("ms per operation on the head, median of %d reps of %d operations each; load average "
              "before %s, after %s" % (self.reps, self.ops, self.info["load before"],
                                       self.info["load after"]))
        print("%-16s" % "operation" + "".join("%10s" % c for c in cols) + "".join("%16s" % r for r in ratios))
        verdicts = []
        for op in OPS:
            v = {c: self.med("%s %s" % (c, op)) for c in cols}
            row = "%-16s" % op + "".join("%10s" % value_text("%.3f", v[c]) for c in cols)
            row += "".join("%16s" % ratio_text(v["bindfs"], v[c]) for c in gm)
            if flat:
                row += "%16s" % ratio_text(v[gm[0]], v[gm[-1]])
            print(row)
            for c in gm:
                x = v[c] / v["bindfs"] if v["bindfs"] else float("inf")
                verdicts.append("%s %s: %.2fx bindfs (goal at most %.1fx: %s)"
                                % (op, c, x, GOAL_X_BINDFS, holds_text(x <= GOAL_X_BINDFS)))
            if flat:
                x = v[gm[-1]] / v[gm[0]] if v[gm[0]] else float("inf")
                verdicts.append("%s: %s/%s %.2fx (flat, goal at most %.2fx: %s)"
                                % (op, gm[-1], gm[0], x, GOAL_FLAT, holds_text(x <= GOAL_FLAT)))
        print()
        for line in verdicts:
            print("goal: " + line)
        for line in self.noticed_lines():
            print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="8,32", help="GMount sizes, comma-separated (default 8,32)")
    p.add_argument("--reps", type=int, default=5, help="reps of every case (default 5)")
    p.add_argument("--ops", type=int, default=200, help="operations of each kind per rep (default 200)")
    p.add_argument("--quick", action="store_true", help="8 hosts, 3 reps, 50 operations")
    a = p.parse_args(argv)
    try:
        hosts = sorted({int(x) for x in a.hosts.split(",") if x.strip()})
    except ValueError:
        p.error("--hosts takes host counts separated by commas, such as 8,32")
    if a.quick:
        hosts, a.reps, a.ops = [8], 3, 50
    if not hosts or not all(1 <= n <= 64 for n in hosts) or not 1 <= a.reps <= 100 \
            or not 1 <= a.ops <= 100000:
        p.error("--hosts from 1 to 64 each, --reps from 1 to 100, --ops from 1 to 100000")
    return main_driver(NamespaceOps, hosts, a.reps, a.ops)


if __name__ == "__main__":
    sys.exit(main())
