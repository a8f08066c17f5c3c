#!/usr/bin/env python3
"""What any FUSE file system can reach on this machine: local disk against
bindfs (a C passthrough FUSE file system) and against sshfsm over a local
directory (ours, the same code path as a GMount node reading its own export).

Run as root, from the checkout, after `scripts/install` (it installs bindfs, the anchor, when missing):

    /opt/gxpstyle/venv/bin/python benchmarks/fuse_ceiling.py [--reps 3]

It measures, with the page cache (and dentries) dropped before every pass:
  read8   8 readers at once, 64 MiB each, 1 MiB reads (the locality case of
          benchmarks/mount.py without the network and the test bed)
  read1   one reader of one 64 MiB file
  stat    os.stat of 10,000 files in one directory, cold
and prints medians, anchor (local disk) and both FUSE file systems, with the
ratios to local disk and ours to bindfs (issue 17's goals: stat >= 0.8x
bindfs, read8 and read1 >= 0.9x). It exists to say whether a goal stated against local disk (mount.py:
locality >= 0.8x local, stat >= 30% of local) is within FUSE's reach here at all.
Everything it makes is under one temporary directory, unmounted and removed at
the end (also on errors and Ctrl-C).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_harness import ensure_anchor

FILES, BIG, READERS = 10000, 64 << 20, 8
CASES = ("read8", "read1", "stat")


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_all(d: str, n: int) -> float:
    """MB/s of n readers at once, each reading its own file with 1 MiB reads."""
    sizes = []

    def one(i: int) -> None:
        total = 0
        with open(os.path.join(d, "big%d" % i), "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
        sizes.append(total)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(sizes) / (time.perf_counter() - t) / 1e6


def server_pid(mnt: str) -> int | None:
    """The FUSE server process serving mnt (its command line ends with it)."""
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open("/proc/%s/cmdline" % e, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[-2] == mnt.encode():
                return int(e)
    return None


def cpu_s(pid: int | None) -> float:
    """utime + stime of pid (all its threads), in seconds (0 without a pid)."""
    if pid is None:
        return 0.0
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stat_all(d: str) -> float:
    t = time.perf_counter()
    for i in range(FILES):
        os.stat(os.path.join(d, "m", "f%05d" % i))
    return FILES / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--case", action="append", choices=CASES,
                   help="measure only this case (repeatable; default: all three)")
    a = p.parse_args(argv)
    cases = [c for c in CASES if c in (a.case or CASES)]
    if os.getuid() != 0:
        p.error("run as root (drop_caches)")
    if not ensure_anchor("bindfs", "bindfs"):
        p.error("bindfs is not installed and apt-get could not install it")
    sshfsm = os.path.join(os.environ.get("GXP_VENV", "/opt/gxpstyle/venv"), "bin", "sshfsm")
    top = tempfile.mkdtemp(prefix="fuse-ceiling-", dir="/var/tmp")
    src, bmnt, omnt = (os.path.join(top, x) for x in ("src", "bindfs", "sshfsm"))
    mounted = []
    samples = {}
    try:
        for d in (os.path.join(src, "m"), bmnt, omnt):
            os.makedirs(d)
        for i in range(READERS if {"read8", "read1"} & set(cases) else 0):
            with open(os.path.join(src, "big%d" % i), "wb") as f:
                f.write(os.urandom(BIG))
        for i in range(FILES):
            open(os.path.join(src, "m", "f%05d" % i), "w").close()
        subprocess.run(["bindfs", src, bmnt], check=True)
        mounted.append(bmnt)
        subprocess.run([sshfsm, src, omnt], check=True)
        mounted.append(omnt)
        fns = {"read8": lambda d: read_all(d, READERS), "read1": lambda d: read_all(d, 1),
               "stat": stat_all}
        systems = [("local", src), ("bindfs", bmnt), ("sshfsm", omnt)]
        for rep in range(a.reps):
            # one case at a time, the three file systems back to back (each
            # case's samples close in time), in turns reversed every rep (no
            # file system always runs first after the disk's own pass)
            for case in cases:
                for name, d in (systems if rep % 2 == 0 else systems[::-1]):
                    drop_caches()
                    pid = server_pid(d) if name != "local" else None
                    c0 = cpu_s(pid)
                    samples.setdefault((case, name), []).append(fns[case](d))
                    if case == "stat" and pid is not None:
                        samples.setdefault(("cpu", name), []).append((cpu_s(pid) - c0) / FILES * 1e6)
            print("  rep %d done" % (rep + 1), file=sys.stderr)
    finally:
        for m in mounted:
            subprocess.run(["fusermount3", "-u", m]) if m == omnt else subprocess.run(["fusermount", "-u", m])
        shutil.rmtree(top, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print("%-12s %12s %12s %12s %14s %14s %14s" % ("case", "local", "bindfs (C)", "sshfsm",
                                                    "bindfs/local", "sshfsm/local", "sshfsm/bindfs"))
    units = {"read8": "read8 MB/s", "read1": "read1 MB/s", "stat": "stat /s"}
    for case in cases:
        l, b, o = med[(case, "local")], med[(case, "bindfs")], med[(case, "sshfsm")]
        print("%-12s %12.0f %12.0f %12.0f %14.2f %14.2f %14.2f" % (units[case], l, b, o, b / l, o / l, o / b))
    print("spread (min-max of the reps, as a share of the median): " + ", ".join(
        "%s %s %.0f%%" % (case, name, 100 * (max(v) - min(v)) / statistics.median(v))
        for (case, name), v in sorted(samples.items()) if case in cases and name != "local"))
    if ("cpu", "sshfsm") in med and ("cpu", "bindfs") in med:
        print("server CPU per cold stat (utime+stime): bindfs %.0f us, sshfsm %.0f us"
              % (med[("cpu", "bindfs")], med[("cpu", "sshfsm")]))
    print("(medians of %d reps; caches dropped before every pass; %d CPUs)" % (a.reps, os.cpu_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
