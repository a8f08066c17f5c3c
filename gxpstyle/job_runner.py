"""Jobs on one node: a shell command with its cwd and environment, streamed
output, exit status and cancel. `gxpc e` uses it today; `gxpc make` recipes ride
on the same messages later.

Each job runs in its own session (process group) so that cancel and quit reach
every process the command started.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Callable, Dict, Optional, Tuple
    import subprocess

from gxpstyle.event_loop import EventLoop

READ_SIZE = 64 << 10


class Job:
    def __init__(self, runner: "JobRunner", key: Tuple[str, int], proc: subprocess.Popen) -> None:
        self.runner = runner
        self.key = key
        self.proc = proc
        self.open_fds: Dict[int, int] = {}   # fd -> 1 or 2 (stdout/stderr)
        # Closed through their file objects only: an os.close() here would leave
        # Popen's objects to close the same number again when collected, by
        # then maybe a client's socket.
        self.files: Dict[int, Any] = {}
        self.stdin_fd: Optional[int] = proc.stdin.fileno() if proc.stdin else None
        self.stdin_buf = b""
        self.stdin_eof = False
        self.status: Optional[int] = None
        self.poll_timer: Optional[int] = None
        for stream, f in ((1, proc.stdout), (2, proc.stderr)):
            if f is not None:
                fd = f.fileno()
                os.set_blocking(fd, False)
                self.open_fds[fd] = stream
                self.files[fd] = f
        if self.stdin_fd is not None:
            os.set_blocking(self.stdin_fd, False)


class JobRunner:
    """Starts jobs and reports through `send(dst, msg)`; `backlog()` says how
    many bytes wait on the way up so output reading can pause (backpressure)."""

    HIGH_WATER = 8 << 20

    def __init__(self, loop: EventLoop, node_id: str,
                 send: Callable[[str, Dict[str, Any]], None],
                 backlog: Callable[[], int]) -> None:
        self.loop = loop
        self.node_id = node_id
        self.send = send
        self.backlog = backlog
        self.jobs: Dict[Tuple[str, int], Job] = {}

    def start(self, requester: str, msg: Dict[str, Any]) -> None:
        import subprocess   # here, not at the top: a node that runs no job never pays for it
        key = (requester, msg["job"])
        if key in self.jobs:
            return
        env = dict(os.environ)
        for k, v in msg["env"].items():
            if not isinstance(k, str) or "=" in k or "\0" in k:
                continue
            if v is None:
                env.pop(k, None)
            elif isinstance(v, str) and "\0" not in v:
                env[k] = v
        cwd = msg["cwd"] or env.get("HOME") or "/"
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", msg["cmd"]], cwd=cwd, env=env,
                stdin=subprocess.PIPE if msg["stdin"] else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True)
        except OSError as e:
            where = "cwd %s" % cwd if isinstance(e, FileNotFoundError) and e.filename == cwd else "start"
            self.send(requester, {"op": "exit", "job": msg["job"], "status": 127,
                                  "error": "%s: %s" % (where, e.strerror)})
            return
        job = Job(self, key, proc)
        self.jobs[key] = job
        for fd in job.open_fds:
            self._watch(job, fd)

    def _watch(self, job: Job, fd: int) -> None:
        self.loop.add_reader(fd, lambda: self._readable(job, fd))

    def _readable(self, job: Job, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.send(job.key[0], {"op": "out", "job": job.key[1], "fd": job.open_fds[fd], "data": data})
            if self.backlog() > self.HIGH_WATER:
                self._pause_all()
            return
        self.loop.forget(fd)
        del job.open_fds[fd]
        job.files.pop(fd).close()
        if not job.open_fds:
            self._reap(job)

    def _pause_all(self) -> None:
        for job in self.jobs.values():
            for fd in job.open_fds:
                self.loop.remove_reader(fd)
        self.loop.call_later(0.05, self._maybe_resume)

    def _maybe_resume(self) -> None:
        if self.backlog() > self.HIGH_WATER // 2:
            self.loop.call_later(0.05, self._maybe_resume)
            return
        for job in self.jobs.values():
            for fd in job.open_fds:
                self._watch(job, fd)

    def _reap(self, job: Job) -> None:
        # Output is closed; the process may still run (it closed its stdout).
        rc = job.proc.poll()
        if rc is None:
            job.poll_timer = self.loop.call_later(0.05, lambda: self._reap(job))
            return
        status = rc if rc >= 0 else 128 - rc
        self._close_stdin(job)
        self.jobs.pop(job.key, None)
        self.send(job.key[0], {"op": "exit", "job": job.key[1], "status": status,
                               "error": "" if rc >= 0 else "killed by signal %d" % -rc})

    def write_stdin(self, requester: str, msg: Dict[str, Any]) -> None:
        job = self.jobs.get((requester, msg["job"]))
        if job is None or job.stdin_fd is None:
            return
        job.stdin_buf += msg["data"]
        job.stdin_eof = job.stdin_eof or msg["eof"]
        self._flush_stdin(job)

    def _flush_stdin(self, job: Job) -> None:
        fd = job.stdin_fd
        if fd is None:
            return
        while job.stdin_buf:
            try:
                n = os.write(fd, job.stdin_buf)
            except (BlockingIOError, InterruptedError):
                self.loop.add_writer(fd, lambda: self._flush_stdin(job))
                return
            except OSError:
                job.stdin_buf = b""
                break
            job.stdin_buf = job.stdin_buf[n:]
        self.loop.remove_writer(fd)
        if job.stdin_eof:
            self._close_stdin(job)

    def _close_stdin(self, job: Job) -> None:
        if job.stdin_fd is not None:
            self.loop.forget(job.stdin_fd)
            assert job.proc.stdin is not None      # stdin_fd is its fileno
            try:
                job.proc.stdin.close()
            except OSError:
                pass
            job.stdin_fd = None

    def kill(self, requester: str, job_id: int, sig: int) -> None:
        job = self.jobs.get((requester, job_id))
        if job is not None:
            self._signal(job, sig)

    def _signal(self, job: Job, sig: int) -> None:
        try:
            os.killpg(job.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self) -> None:
        import subprocess
        for job in list(self.jobs.values()):
            self._signal(job, signal.SIGTERM)
        for job in list(self.jobs.values()):
            try:
                job.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._signal(job, signal.SIGKILL)
                try:
                    job.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
