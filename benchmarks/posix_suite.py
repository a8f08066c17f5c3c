#!/usr/bin/env python3
"""pjdfstest (POSIX conformance) on a GMount of test-bed hosts, with tmpfs and
sshfsm as anchors: how many of its checks pass, and where the failures are.

Run as root, from the checkout, after `scripts/install`, with a pjdfstest build
made outside the repository (its source from github.com/pjd/pjdfstest;
`autoreconf -ifs && ./configure && make pjdfstest`):

    PJDFSTEST=/path/to/pjdfstest /opt/gxpstyle/venv/bin/python benchmarks/posix_suite.py \
        [--on tmpfs,sshfsm,gmount] [--hosts 4] [--tests chmod,link] [--jobs 2] [--log FILE]

What it does, for each file system of --on (default all three):
  tmpfs   a tmpfs mounted for the run (what a local file system gives)
  sshfsm  `sshfsm -o allow_other SRC MNT` of one local directory, as root
  gmount  a test bed of --hosts sshd hosts (tests/testbed/); root on the head
          reaches them through the sh channel (nsenter into each host's
          namespaces, as ssh would put it there) and runs
          `gxpc mount -o allow_other EXPORT MNT`: every host and the head
          export EXPORT and mount the merge of all of them. The suite runs in
          the head's mount.
pjdfstest runs as root (its steps switch to other uids themselves, which is
why the mounts need allow_other). Every test file runs with `sh FILE` in its
own directory of the mount, --jobs at a time; a check is an "ok" or "not ok"
TAP line, and a check a file planned but never printed (it died, or timed out
after --timeout seconds) counts as failed.

Prints, per file system: checks passed of planned and the ratio to tmpfs; then
the failures of the last file system, grouped by test directory, with the
failing files (the full TAP of each failing file goes to --log). Nothing that
drops the kernel's caches (drop_caches: fuse_ceiling.py, mount.py) may run at the
same time: a FUSE inode the kernel forgets gets a new number at its next lookup,
and rename/09 and rename/10, which compare inode numbers, then fail by the hundred.
Everything is
unmounted and removed at the end, the bed torn down, also on errors and Ctrl-C.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

from bench_harness import GXPC, VENV, Bench, BenchError, fuse_at, log, main_driver

SYSTEMS = ("tmpfs", "sshfsm", "gmount")
PLAN = re.compile(r"^1\.\.(\d+)")
RESULT = re.compile(r"^(not ok|ok)\s+(\d+)")


def run_file(t: str, where: str, timeout: float, running: set) -> tuple[int, int, str]:
    """(passed, planned, TAP text) of one pjdfstest file run in `where`; the
    process is in `running` while it runs (killed on an interruption)."""
    os.makedirs(where, exist_ok=True)
    p = subprocess.Popen(["sh", t], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    running.add(p)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0] + "\n# timed out\n"
    finally:
        running.discard(p)
    planned, passed = 0, 0
    for line in out.splitlines():
        m = PLAN.match(line)
        if m:
            planned = int(m.group(1))
        m = RESULT.match(line)
        if m and m.group(1) == "ok":
            passed += 1
    return passed, planned, out


class PosixSuite(Bench):
    name = "posix_suite.py"
    leftover_fuse_only = True

    def __init__(self, a) -> None:
        super().__init__(log)
        self.a = a
        self.suite = a.pjdfstest
        self.top = tempfile.mkdtemp(prefix="gxp-posix-", dir="/var/tmp")
        self.mount_tag = os.path.basename(self.top)
        self.mounted: list = []          # (how, path) to unmount
        self.results: dict = {}          # system -> {file: (passed, planned, tap)}
        self.gm = None                   # GMount mountpoint while mounted

    # -- the files -------------------------------------------------------------
    def files(self) -> list:
        tests = os.path.join(self.suite, "tests")
        dirs = self.a.tests.split(",") if self.a.tests else sorted(
            d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)))
        out = []
        for d in dirs:
            out += sorted(glob.glob(os.path.join(tests, d, "*.t")))
        if not out:
            raise BenchError("no pjdfstest files under %s for %s" % (tests, self.a.tests or "all"))
        return out

    def run_suite(self, system: str, mnt: str) -> None:
        files = self.files()
        log("%s: %d files in %s" % (system, len(files), mnt))
        got = {}
        running: set = set()
        pool = concurrent.futures.ThreadPoolExecutor(self.a.jobs)
        try:
            futs = {pool.submit(run_file, t, os.path.join(mnt, "w%d" % i), self.a.timeout, running): t
                    for i, t in enumerate(files)}
            for f in concurrent.futures.as_completed(futs):
                got[futs[f]] = f.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            for p in list(running):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            pool.shutdown(wait=True)
        self.results[system] = got

    # -- the file systems --------------------------------------------------------
    def setup(self) -> None:
        if not self.suite or not os.access(os.path.join(self.suite, "pjdfstest"), os.X_OK):
            raise BenchError("set PJDFSTEST (or --pjdfstest) to a pjdfstest build directory")
        os.chmod(self.top, 0o755)
        if "gmount" in self.a.on:
            self.check_installed()
            self.bed_up(["tp%02d" % (i + 1) for i in range(self.a.hosts)], "gxpposix")

    def run(self) -> None:
        for system in self.a.on:
            getattr(self, "on_" + system)()

    def on_tmpfs(self) -> None:
        mnt = os.path.join(self.top, "tmpfs")
        os.makedirs(mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "gxp-posix", mnt], check=True)
        self.mounted.append(("umount", mnt))
        self.run_suite("tmpfs", mnt)

    def on_sshfsm(self) -> None:
        src, mnt = os.path.join(self.top, "src"), os.path.join(self.top, "sshfsm")
        os.makedirs(src)
        os.makedirs(mnt)
        subprocess.run([os.path.join(VENV, "bin", "sshfsm"), "-o", "allow_other", src, mnt],
                       check=True, timeout=60)
        self.mounted.append(("fusermount3", mnt))
        self.run_suite("sshfsm", mnt)

    def gxpc(self, *args, check: bool = True, timeout=None):
        """gxpc as root (the suite needs a root mount: chown, other uids)."""
        argv = [GXPC, "--session", self.session] + [str(a) for a in args]
        env = dict(os.environ, PATH=os.path.join(VENV, "bin") + ":/usr/local/bin:/usr/bin:/bin")
        r = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=self.call_timeout if timeout is None else timeout)
        if check and r.returncode != 0:
            raise BenchError("gxpc %s failed (%d):\n%s%s" % (" ".join(map(str, args)), r.returncode,
                                                            r.stdout, r.stderr))
        return 0.0, r

    def on_gmount(self) -> None:
        assert self.bed is not None
        # the sh channel's way onto a host: its namespaces, as root (what
        # `ssh root@host` would give on a real cluster)
        enter = os.path.join(self.top, "enter.sh")
        with open(enter, "w") as f:
            f.write('case "$1" in\n')
            for h in self.bed.hosts.values():
                f.write("%s) pid=%d ;;\n" % (h.name, h.pid))
            f.write('*) echo "no host $1" >&2; exit 255 ;;\nesac\n'
                    'exec nsenter -t "$pid" -n -m -u -- /bin/sh -c "$2"\n')
        self.session = os.path.join(self.top, "session")
        # named after mount_tag: a mount left by a failure is unmounted on clean-up
        export, mnt = "/tmp/%s-exp" % self.mount_tag, "/tmp/%s-mnt" % self.mount_tag
        self.made_dirs += [export, mnt]
        self.gxpc("use", "sh", "head", "tp*", "--template", "sh %s {host} {cmd}" % enter)
        self.gxpc("explore", *self.bed.names)
        self.gxpc("e", "mkdir -p %s %s" % (export, mnt))
        os.makedirs(export, exist_ok=True)
        os.makedirs(mnt, exist_ok=True)
        self.gxpc("mount", "-o", "allow_other", export, mnt, timeout=300)
        self.gm = mnt
        with open("/proc/mounts") as f:
            if not fuse_at(f.read().splitlines(), mnt):
                raise BenchError("no FUSE mount at %s after gxpc mount" % mnt)
        self.run_suite("gmount", mnt)

    # -- clean-up and report -------------------------------------------------------
    def release(self) -> None:
        if self.session is not None:
            if self.gm is not None:
                self.guarded("gxpc umount", self.gxpc, "umount", self.gm)
            self.guarded("gxpc quit", self.gxpc, "quit")

    def cleanup(self) -> None:
        for how, mnt in reversed(self.mounted):
            subprocess.run([how, "-u", mnt] if how == "fusermount3" else [how, mnt],
                           capture_output=True, timeout=60)
        if self.bed is not None and self.user is None:
            self.release()
        super().cleanup()
        shutil.rmtree(self.top, ignore_errors=True)

    def report(self) -> None:
        anchor = None
        if "tmpfs" in self.results:
            anchor = sum(p for p, _, _ in self.results["tmpfs"].values())
        print("%-8s %8s %8s %9s %10s" % ("fs", "passed", "planned", "passed %", "x tmpfs"))
        for system in self.a.on:
            got = self.results[system]
            passed = sum(p for p, _, _ in got.values())
            planned = sum(n for _, n, _ in got.values())
            print("%-8s %8d %8d %8.1f%% %10s" % (system, passed, planned, 100.0 * passed / max(planned, 1),
                                                 "%.3f" % (passed / anchor) if anchor else "-"))
        last = "gmount" if "gmount" in self.a.on else self.a.on[-1]
        groups: dict = {}
        for t, (p, n, _tap) in sorted(self.results[last].items()):
            if p < n:
                d = os.path.basename(os.path.dirname(t))
                groups.setdefault(d, []).append((os.path.basename(t), n - p))
        if groups:
            print("\nfailed checks on %s, by directory:" % last)
            for d, fs in sorted(groups.items(), key=lambda kv: -sum(x for _, x in kv[1])):
                print("  %-12s %5d  %s" % (d, sum(x for _, x in fs),
                                           " ".join("%s:%d" % f for f in fs)))
        if self.a.log:
            with open(self.a.log, "w") as f:
                for system in self.a.on:
                    for t, (p, n, tap) in sorted(self.results[system].items()):
                        if p < n:
                            f.write("=== %s %s %d/%d\n%s\n" % (system, t, p, n, tap))
        print("(pjdfstest at %s; %d jobs at a time; %d CPUs)" % (self.suite, self.a.jobs, os.cpu_count()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pjdfstest", default=os.environ.get("PJDFSTEST"),
                   help="a pjdfstest build directory (default: $PJDFSTEST)")
    p.add_argument("--on", default=",".join(SYSTEMS),
                   help="file systems, comma-separated, of: " + " ".join(SYSTEMS))
    p.add_argument("--hosts", type=int, default=4, help="test-bed hosts of the GMount (1-32)")
    p.add_argument("--tests", default="", help="pjdfstest directories, comma-separated (default all)")
    p.add_argument("--jobs", type=int, default=2, help="test files at once (1-16)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per test file")
    p.add_argument("--log", help="write the TAP of every failing file here")
    a = p.parse_args(argv)
    a.on = [s for s in a.on.split(",") if s]
    bad = [s for s in a.on if s not in SYSTEMS]
    if bad or not a.on:
        p.error("--on: unknown file system %s (choose from %s)" % (",".join(bad), ", ".join(SYSTEMS)))
    if not 1 <= a.hosts <= 32 or not 1 <= a.jobs <= 16:
        p.error("--hosts must be 1-32 and --jobs 1-16")
    return main_driver(PosixSuite, a)


if __name__ == "__main__":
    sys.exit(main())
