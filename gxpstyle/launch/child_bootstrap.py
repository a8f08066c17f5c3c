"""Bringing up one child agent: run the channel, wait for the first stage's
marker, ship the payload and the hello, wait for `ready`. Every way this can go
wrong ends in one line of reason and no process left behind.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

from gxpstyle.launch import bootstrap
from gxpstyle.transport.links import Link

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Callable, Dict, Optional

MAX_GARBAGE = 64 << 10     # what a login script may print before the marker
EXIT_WAIT = 1.0            # how long a failed channel may take to exit before we report it
STDERR_KEEP = 4096

_EXIT_REASONS = {
    97: "agent payload truncated in transit",
    98: "agent payload over the size limit",
    99: "agent payload failed its checksum",
    126: "python not executable",
    127: "python3 not found on the target",
}


def last_line(data: bytes) -> str:
    for line in reversed(data.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if line and not line.startswith("Warning: Permanently added"):
            return line[:300]
    return ""


class ChildStart:
    """One bootstrap in progress. `done(start, ok, reason, link_or_None, info)` is
    called once."""

    def __init__(self, node: Any, child: str, target: str, channel: str,
                 spec: Dict[str, Any], timeout: float,
                 done: Callable[[ChildStart, bool, str, Optional[Link], Dict[str, Any]], None]
                 ) -> None:
        self.node = node
        self.loop = node.loop
        self.child = child
        self.target = target
        self.channel = channel
        self.spec = spec
        self.timeout = timeout
        self.done_cb = done
        self.finished = False
        self.proc: Optional[Any] = None     # subprocess.Popen, or local_fork.ForkedProcess
        self.stdout_buf = b""
        self.stderr_buf = b""
        self.stderr_fd: Optional[int] = None
        self.rfd: Optional[int] = None
        self.wfd: Optional[int] = None
        self.link: Optional[Link] = None
        self.batch_job: Optional[str] = None
        self.started = time.monotonic()
        self.timer = self.loop.call_later(timeout, self._timed_out)
        self.kill_hook: Optional[Callable[[], None]] = None
        self.exit_wait: Optional[int] = None    # the timer of _failed_early's wait
        self.forked = False      # a fork of its parent (local_fork.py): it has our code
        # Once the channel runs (after this round): the payload is built while
        # it connects, not after its marker (the head's first child: ~70 ms).
        self.loop.at_end(self._build_payload)

    def _build_payload(self) -> None:
        if not (self.finished or self.forked):
            import sys
            self.node.payloads.for_tag(sys.implementation.cache_tag, service=bool(self.spec.get("role")))

    # -- process channels ------------------------------------------------
    def start_process(self, argv: list) -> None:
        # Our own pipes, not Popen's file objects: the link closes these fds,
        # and file objects would close the same numbers again when collected.
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours, theirs = [stdin_w, stdout_r, stderr_r], [stdin_r, stdout_w, stderr_w]
        try:
            self.proc = subprocess.Popen(argv, stdin=theirs[0], stdout=theirs[1], stderr=theirs[2],
                                         start_new_session=True, close_fds=True)
        except OSError as e:
            for fd in ours:
                os.close(fd)
            self._finish(False, "cannot run %s: %s" % (argv[0], e.strerror))
            return
        finally:
            for fd in theirs:
                os.close(fd)
        self.attach(stdout_r, stdin_w, stderr_r, need_marker=True)

    def attach(self, rfd: int, wfd: int, efd: Optional[int], need_marker: bool) -> None:
        """Start the handshake on given fds (process pipes, a paramiko or TLS relay)."""
        self.rfd, self.wfd = rfd, wfd
        os.set_blocking(rfd, False)
        if efd is not None:
            self.stderr_fd = efd
            os.set_blocking(efd, False)
            self.loop.add_reader(efd, self._stderr_readable)
        if need_marker:
            self.loop.add_reader(rfd, self._stdout_readable)
        else:
            self._marker_seen(b"", None)

    def _stderr_readable(self) -> None:
        if self.stderr_fd is None:
            return
        try:
            data = os.read(self.stderr_fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_stderr()
            return
        if self.finished:
            # After bootstrap, the child's stderr is diagnostics for the session log.
            self.node.child_stderr(self.child, data)
        else:
            self.stderr_buf = (self.stderr_buf + data)[-STDERR_KEEP:]

    def _stdout_readable(self) -> None:
        if self.rfd is None:
            return
        try:
            data = os.read(self.rfd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self.rfd)
            self._failed_early()
            return
        self.stdout_buf += data
        i = self.stdout_buf.find(bootstrap.MARKER)
        j = self.stdout_buf.find(b"\n", i) if i >= 0 else -1
        if j >= 0:
            self.loop.remove_reader(self.rfd)
            tag = self.stdout_buf[i + len(bootstrap.MARKER):j].decode("ascii", "replace")
            rest = self.stdout_buf[j + 1:]
            self.stdout_buf = b""
            self._marker_seen(rest, tag)
        elif len(self.stdout_buf) > MAX_GARBAGE:
            self._finish(False, "no agent marker within %d bytes of output" % MAX_GARBAGE)

    def _marker_seen(self, rest: bytes, tag: Optional[str]) -> None:
        assert self.rfd is not None and self.wfd is not None   # set by attach()
        self.link = Link(self.loop, self.rfd, self.wfd, self.child,
                         self.node.on_child_frame, self.node.on_child_close)
        self.link.starting = self
        if not self.forked:
            self.link.send_frame(bootstrap.payload_wire(
                self.node.payloads.for_tag(tag, service=bool(self.spec.get("role")))))
        self.link.send(self.child, self.node.id, self.node.hello_for(
            self.child, self.target, self.spec.get("role"), self.spec.get("role_config"),
            self.spec.get("role_module")))
        self.link.feed_initial(rest)

    def ready(self, info: Dict[str, Any]) -> None:
        """The child said ready: the link is up."""
        info = dict(info)
        info["bootstrap_seconds"] = round(time.monotonic() - self.started, 3)
        self._finish(True, "", info)

    def link_closed(self, why: str) -> None:
        if not self.finished:
            self._failed_early()

    def _failed_early(self, waited: bool = False) -> None:
        if self.finished:
            return
        rc = self.proc.poll() if self.proc is not None else None
        if rc is None and self.proc is not None and not waited:
            if self.exit_wait is None:
                # its status and last stderr come with its exit (an event)
                self.loop.watch_child(self.proc.pid, self._failed_early)
                self.exit_wait = self.loop.call_later(EXIT_WAIT, lambda: self._failed_early(True))
            return
        if self.stderr_fd is not None:
            try:
                while True:
                    data = os.read(self.stderr_fd, 65536)
                    if not data:
                        break
                    self.stderr_buf = (self.stderr_buf + data)[-STDERR_KEEP:]
            except OSError:
                pass
        reason = last_line(self.stderr_buf)
        if not reason and rc is not None:
            reason = _EXIT_REASONS.get(rc, "channel exited with status %d" % rc)
        elif rc in (97, 98, 99):
            reason = _EXIT_REASONS[rc]
        self._finish(False, reason or "channel closed before the agent started")

    def _timed_out(self) -> None:
        if self.finished:
            return
        why = "no answer within %gs" % self.timeout
        if self.batch_job:
            why = "batch job %s did not connect back within %gs" % (self.batch_job, self.timeout)
        tail = last_line(self.stderr_buf)
        self._finish(False, why + (" (%s)" % tail if tail else ""))

    def _finish(self, ok: bool, reason: str, info: Optional[Dict[str, Any]] = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.loop.cancel(self.timer)
        if self.exit_wait is not None:          # _failed_early's wait
            self.loop.cancel(self.exit_wait)
            self.loop.unwatch_child(self.proc.pid)  # type: ignore[union-attr]
        if not ok:
            self.kill()
        self.done_cb(self, ok, reason, self.link if ok else None, info or {})

    def kill(self) -> None:
        if self.link is not None and not self.link.closed:
            self.link.on_close = lambda link, why: None
            self.link.close("bootstrap failed")
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self.link is None and self.rfd is not None and self.wfd is not None:
            # No link took the fds over: they are still ours to close.
            for fd in {self.rfd, self.wfd}:
                self.loop.forget(fd)
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.rfd = self.wfd = None
        self._close_stderr()
        if self.kill_hook is not None:
            self.kill_hook()

    def _close_stderr(self) -> None:
        if self.stderr_fd is not None:
            self.loop.forget(self.stderr_fd)
            try:
                os.close(self.stderr_fd)
            except OSError:
                pass
            self.stderr_fd = None

    def terminate(self) -> None:
        """At quit: the child had its chance to exit; make sure its channel is gone."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def reap(self, wait: float) -> None:
        if self.proc is None:
            # Not a process channel: close the paramiko connection, cancel the
            # batch job if it is still there.
            if self.kill_hook is not None:
                self.kill_hook()
            return
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

