# Starting a job's shell on a node, cheaply: posix_spawn where it is safe,
# subprocess.Popen where it is not (job_runner.py runs what this starts).
#
# Shipped to agents: standard library only, Python 3.8 syntax.
from __future__ import annotations

import os

try:  # the C module itself: `signal` loads enum and functools, 2.5 ms of every agent's start
    import _signal as signal
except ImportError:  # an interpreter without it
    import signal  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional


class _Fd:
    # One end of a job's pipe, closed once (a Popen file object's part).
    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class Spawned:
    # What a job needs of subprocess.Popen: pid, pipes, poll().

    def __init__(self, pid: int, stdin: Optional[_Fd], stdout: _Fd, stderr: _Fd) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:     # reaped by someone else: as Popen.poll does
                self.returncode = 0
                return 0
            if pid == 0:
                return None
            self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.returncode


def _no_other_threads() -> bool:
    import _thread
    count = getattr(_thread, "_count", None)
    return count is not None and count() == 0


# What Popen's restore_signals gives back to the job: Python ignores these.
_DEFAULT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, n))


# Starts `/bin/sh -c cmd` in its own session with piped stdout and stderr (and
# stdin, or /dev/null). posix_spawn (vfork and exec, no copy of this process's
# page tables, no Python between them) costs the node about half of what
# subprocess.Popen does. It has no cwd argument, so the node changes its own
# directory around the call and back (to a descriptor of where it was), which
# is safe only with no other thread (a role node's FUSE thread, a TLS relay):
# then, and where posix_spawn is missing, subprocess.Popen. Every descriptor of
# ours is close-on-exec (PEP 446, and close_inherited for what we inherited),
# so the job inherits none of them. (Comments, not docstrings: agents carry
# this module's code, docstrings included, within a byte budget.)
class ShellSpawner:

    def __init__(self) -> None:
        self.here: Optional[int] = None      # our own directory, to come back to
        self.null: Optional[int] = None      # /dev/null, the stdin of a job without one
        self.checked = False

    def spawn(self, cmd: str, cwd: str, env: Dict[str, str], stdin: bool) -> Any:
        if not hasattr(os, "posix_spawn") or not _no_other_threads():
            import subprocess
            return subprocess.Popen(
                ["/bin/sh", "-c", cmd], cwd=cwd, env=env,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True)
        self.prepare()
        if self.here is None:
            self.here = os.open(".", os.O_RDONLY)
        if self.null is None:
            self.null = os.open(os.devnull, os.O_RDONLY)
        mine: List[int] = []        # our ends of the pipes, closed if the spawn fails
        theirs: List[int] = []      # the job's ends, closed after it
        try:
            if stdin:
                in_r, in_w = os.pipe()
                mine.append(in_w)
                theirs.append(in_r)
            else:
                in_r = self.null
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            mine += [out_r, err_r]
            theirs += [out_w, err_w]
            os.chdir(cwd)
            try:
                pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", cmd], env, setsid=True,
                                     setsigdef=_DEFAULT_SIGNALS, file_actions=[
                                         (os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                                         (os.POSIX_SPAWN_DUP2, err_w, 2)])
            finally:
                os.fchdir(self.here)
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return Spawned(pid, _Fd(in_w) if stdin else None, _Fd(out_r), _Fd(err_r))

    def prepare(self) -> None:
        # before our first posix_spawn, job's or watchdog's (later fds are O_CLOEXEC)
        if not self.checked:
            self.checked = True
            close_inherited()

    def close(self) -> None:
        for fd in (self.here, self.null):
            if fd is not None:
                os.close(fd)
        self.here = self.null = None


def close_inherited() -> None:
    # Close-on-exec for what this process inherited open across exec (Python
    # opens its own close-on-exec), so no job holds a link.
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:
                pass
