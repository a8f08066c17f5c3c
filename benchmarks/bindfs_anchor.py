"""bindfs over a local directory, mounted by the bench user: the anchor of
namespace_ops.py and real_project.py (a C passthrough FUSE file system, the
ceiling of any FUSE mount here).

Its unmount waits for the bindfs process to end (on a pidfd, bounded), so
that a server that outlives its mount is reported as such, with its state,
instead of as an anonymous survivor of the user's processes.
"""
from __future__ import annotations

import os
import select
import signal

from bench_harness import BenchError, proc_cmdline, user_pids

EXIT_BOUND = 30.0    # seconds bindfs gets to end after its unmount


def _state(pid: int) -> str:
    try:
        with open("/proc/%d/status" % pid) as f:
            state = f.read().split("State:", 1)[1].split("\n", 1)[0].strip()
        with open("/proc/%d/wchan" % pid) as f:
            return "%s, waiting in %s" % (state, f.read().strip() or "-")
    except (OSError, IndexError):
        return "gone"


def _namespaces_with(mnt: str) -> str:
    """The mount namespaces (one process of each, the first three) that still have
    a mount at mnt: a namespace made while bindfs was mounted (another program's
    `unshare --mount`, such as a concurrent test bed's hosts) holds a copy of the
    mount, and bindfs serves it until that namespace goes."""
    seen: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.readlink("/proc/%s/ns/mnt" % entry)
            if ns in seen:
                continue
            with open("/proc/%s/mountinfo" % entry) as f:
                if any(line.split()[4:5] == [mnt] for line in f):
                    seen[ns] = "%s %s" % (entry, proc_cmdline(int(entry))[:60])
        except OSError:
            continue
    shown = sorted(seen.values())
    return "%d namespaces (%s)" % (len(shown), "; ".join(shown[:3])) if shown else "none"


class BindfsMount:
    """`bindfs --no-allow-other SRC MNT` as bench.user (an ordinary user:
    bindfs adds -o allow_other unless told not to, and fusermount refuses it
    without user_allow_other in fuse.conf)."""

    def __init__(self, bench, src: str, mnt: str) -> None:
        self.bench, self.mnt = bench, mnt
        self.pid = None
        r = bench.bed.run_as(bench.user.name, ["bindfs", "--no-allow-other", src, mnt], env=bench.env(),
                             capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError("bindfs %s %s failed (%d): %s" % (src, mnt, r.returncode, r.stderr.strip()))
        found = [p for p in user_pids(bench.user.uid) if proc_cmdline(p).split()[-1:] == [mnt]]
        self.pid = found[0] if found else None

    def unmount(self) -> None:
        """fusermount3 -u as the user, then bindfs's end awaited (EXIT_BOUND)."""
        r = self.bench.bed.run_as(self.bench.user.name, ["fusermount3", "-u", self.mnt], env=self.bench.env(),
                                  capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError("fusermount3 -u %s failed (%d): %s" % (self.mnt, r.returncode, r.stderr.strip()))
        if self.pid is None:
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return
        try:
            ended, _, _ = select.select([fd], [], [], EXIT_BOUND)
            if not ended:
                self.bench.odd.append("bindfs (pid %d) still running %.0f s after its unmount (%s; %s "
                                      "still mounted in %s, copied by mount namespaces made while it was "
                                      "mounted): killed" % (
                                          self.pid, EXIT_BOUND, _state(self.pid), self.mnt,
                                          _namespaces_with(self.mnt)))
                os.kill(self.pid, signal.SIGKILL)
        finally:
            os.close(fd)
