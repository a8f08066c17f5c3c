"""Local children by fork: an agent starts a plain agent on its own host as a
copy of itself instead of a new interpreter.

A `local` child started through the first stage costs a Python start, the
payload's decode and its modules' execution: about 20 ms of CPU, paid a
thousand times by `gxpc explore --local 1000`. A fork of an agent that has
all of that loaded costs a fraction of it. The forked child is a separate
process with its own node id, link, process group and session directory, as an
exec'd one: it closes everything it inherited but its link, drops the parent's
node and loop (never returning into them) and reads its hello from the link
like any agent. The parent keeps it as it keeps a channel's process: a process
group to signal, a pid to reap.

Only where that is safe and the result the same: a plain agent (not the head,
whose daemon has threads and services, and not a service's node), no other
thread in the parent (a fork copies only the calling thread, and a lock
another thread held stays held), the child neither a service node (a fresh
process with the pushed code) nor on an interpreter of its own (`--python`),
and a pidfd to wait on the child with a bound (Linux 5.3, Python 3.9).
Everywhere else the first stage runs as before.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import sys

from gxpstyle.protocol import wire

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional, Set


def can_fork(node: Any, spec: Dict[str, Any]) -> bool:
    """Whether `node` may start the local child `spec` describes by fork."""
    if node.id == wire.HEAD or node.role or spec.get("role") or spec.get("python"):
        return False
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None or not hasattr(os, "fork"):
        return False
    from gxpstyle.node.job_spawn import _no_other_threads
    if not _no_other_threads():
        return False
    try:
        os.close(pidfd_open(os.getpid()))
    except OSError:      # ENOSYS on old kernels, EPERM in some sandboxes
        return False
    return True


class ForkedProcess:
    """What a ChildStart needs of a channel's process (subprocess.Popen's
    pid, poll and wait), for a child this process forked."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
                return 0
            if pid == 0:
                return None
            self.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                               else os.WEXITSTATUS(status))
        return self.returncode

    def wait(self, timeout: float) -> int:
        """Its exit status once it has exited, waiting at most `timeout`
        seconds for that (its pidfd says when); subprocess.TimeoutExpired if
        it has not."""
        if self.poll() is None:
            import select
            fd = -1
            if hasattr(os, "pidfd_open"):      # can_fork checked that it is
                try:
                    fd = os.pidfd_open(self.pid)
                except OSError:      # gone and reaped between the two calls
                    pass
            if fd >= 0:
                try:
                    select.select([fd], [], [], timeout)
                finally:
                    os.close(fd)
        if self.poll() is None:
            import subprocess
            raise subprocess.TimeoutExpired("gxp-agent", timeout)
        assert self.returncode is not None
        return self.returncode


# Before its first fork an agent runs a command on itself WARM_RUNS times
# (CPython 3.11 specializes code from its ninth call), so that its forks
# inherit specialized code and filled caches instead of each writing those
# pages at its first command: a quarter of the first `e`'s page faults
# after explore (issue 27).
WARM_RUNS = 16


class Warming:
    # forks wait for the runs once; a fork's code has run its parent's
    def __init__(self, node: Any, warm: bool) -> None:
        self.node = node
        self.left = 0 if warm else WARM_RUNS      # runs not ended
        self.waiting: List[Any] = []

    def start(self, cs: Any) -> None:
        if not self.left:
            start(cs)
            return
        self.waiting.append(cs)
        node = self.node
        for job in range(WARM_RUNS if len(self.waiting) == 1 else 0):
            frame = wire.encode_frame(node.id, node.id, {
                "op": "exec_tree", "job": job, "cmd": "exit 0", "cwd": None, "env": {},
                "stdin": False, "fold": False, "targets": {node.id: {}}})
            try:
                node.trees.start(node.id, wire.decode_message(wire.split_frame(frame[4:])[2]))
            except Exception as e:     # forks all the same, unwarmed
                node.log_failure("a command before the first fork", e)
                self.left = 1
                self.ended()
                return

    def ended(self) -> None:
        # a run's report reached the node itself
        self.left -= 1
        for cs in self.waiting if not self.left else ():
            try:
                if not cs.finished:
                    start(cs)
            except Exception as e:
                cs._finish(False, str(e))


def start(cs: Any) -> None:
    """Fork the child of ChildStart `cs`: the parent attaches to its pipes
    (no marker, no payload: it already runs our code) and sends the hello."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    sys.stderr.flush()       # else the child would write our pending text again
    environ = cs.node.jobs.environ()     # made here once, not in every child
    try:
        pid = os.fork()
    except OSError:
        for fd in (stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w):
            os.close(fd)
        raise
    if pid == 0:
        _child(cs.node.payloads, environ, stdin_r, stdout_w, stderr_w)
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    cs.proc = ForkedProcess(pid)
    cs.forked = True
    cs.attach(stdout_r, stdin_w, stderr_r, need_marker=False)


def _child(payloads: Any, environ: Dict[str, str], rfd: int, wfd: int, errfd: int) -> None:
    """In the forked child: become a fresh agent on the link (rfd, wfd), with
    nothing of the parent's but its code; never returns."""
    try:
        import gc
        # The parent's objects stay as they are, never collected: a collected
        # socket or loop of the parent's would close a descriptor number that
        # is ours by then (and a collection would copy every page it touches).
        gc.freeze()
        try:
            import _signal as signal
        except ImportError:
            import signal  # type: ignore[no-redef]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the parent's handler is the parent's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)       # the parent loop's wake-up pipe
        os.setsid()                    # a process group of its own, as a channel's child
        os.dup2(errfd, 2)
        _close_all_but({0, 1, 2, rfd, wfd})
        from gxpstyle.node import agent
        agent.run(rfd, wfd, payloads, environ, forked=True)
    finally:
        os._exit(1)         # never back into the parent's loop


def _close_all_but(keep: Set[int]) -> None:
    """Close every descriptor the fork copied but `keep`: the parent's links,
    jobs' pipes, loop and watchdog are not the child's to hold open."""
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
