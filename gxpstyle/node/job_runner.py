"""Jobs on one node: a shell command with its cwd and environment, streamed
output, exit status and cancel. `gxpc e` and `gxpc make` recipes use it.

Each job runs in its own session (process group) so that cancel and quit reach
every process the command started.

Lifetimes. No job outlives the agent (or session daemon) that started it, even
when that process is SIGKILLed: a watchdog (see `Watchdog`) holds the read end of
a pipe only we can write, knows every job's process group, and kills them all
when the pipe closes, whatever way we died. Why not the alternatives:
PR_SET_PDEATHSIG reaches only the job's shell (its own children are re-parented
and keep running; `sleep 1000 & sleep 1000` escapes), fires when the forking
*thread* exits (the daemon has threads), needs ctypes and a preexec_fn (unsafe
with threads); a subreaper adopts orphans while we live, and they go to init
with us. The watchdog costs one small process per node, started with the first
job.

Flow control. Output: a job may have OUT_WINDOW bytes sent and not yet
acknowledged (`out_ack`) by its consumer (the client library acks as it hands
output to the program); past it, reading the job's pipes stops, so a slow reader
holds the job (which blocks on its full pipe) and no queue on the way grows.
The node may also pause all output while its link up is congested
(`pause_output`). Stdin: the client sends at most a window per job ahead; we
buffer what the pipe does not take, and acknowledge (`stdin_ack`) what the
command has read, so a command that never reads its stdin stops the sender.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os

try:  # the C type: `collections` loads keyword, operator and reprlib, 1.6 ms of an agent's start
    from _collections import deque
except ImportError:  # an interpreter without it
    from collections import deque

try:  # the C module itself: `signal` loads enum and functools, 2.5 ms of every agent's start
    import _signal as signal
except ImportError:  # an interpreter without it
    import signal  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

    from gxpstyle.node.job_spawn import Spawned

from gxpstyle.node.job_spawn import ShellSpawner, close_inherited
from gxpstyle.transport.event_loop import EventLoop

READ_SIZE = 64 << 10
ENV_BASES = 32              # environments a node keeps for `base` (JobTable.start mirrors it)
OUT_WINDOW = 1 << 20        # output bytes in flight per job before its consumer acks
STDIN_ACK_EVERY = 128 << 10
KILL_GRACE = 1.0            # SIGTERM, then SIGKILL after this long


# The watchdog runs as its own program, a POSIX shell script (a shell starts in
# a fraction of a millisecond; a Python watchdog cost each node as much CPU as
# its own start, paid by a thousand agents at their first `gxpc e`, issue 27),
# in its own session so that a kill of our process group spares it. It sleeps
# on stdin, a pipe we never write, until our end closes (we died, or quit);
# only then does it read its stdout (a read end: it writes nothing), a pipe of
# the lines we wrote meanwhile: "+PGID" (a job started), "-PGID" (its group is
# empty); anything but a number over 1 is ignored (`kill -1` would reach every
# process of the user). It SIGTERMs every group left, SIGKILLs after a grace.
# (Woken by each line, it cost a node a tenth of its CPU per `gxpc e`.)
WATCHDOG_SOURCE = r"""cd / || exit 1
while read -r l; do :; done
exec <&1
g=" "
while read -r l; do
  p=${l#?}
  case $p in ''|*[!0-9]*|0*|1) continue ;; esac
  case $l$g in
    +*" $p "*) ;;
    +*) g="$g$p " ;;
    -*" $p "*) g="${g%%" $p "*} ${g#*" $p "}" ;;
  esac
done
s() { a=" "; for p in $g; do kill -$1 -$p 2>/dev/null && a="$a$p "; done; g=$a; }
s TERM
for p in $g; do kill -CONT -$p 2>/dev/null; done
n=0
while [ "$g" != " " ] && [ $n -lt %(rounds)d ]; do sleep 0.05; n=$((n+1)); s 0; done
s KILL
""" % {"rounds": int(KILL_GRACE / 0.05)}
LINES_MAX = 16 << 10      # bytes of lines in the pipe before they are rewritten as the groups left


class Watchdog:
    """Kills the registered process groups when this process dies."""

    def __init__(self, environ: Optional[Callable[[], Dict[str, str]]] = None,
                 prepare: Callable[[], None] = close_inherited) -> None:
        self.wfd: Optional[int] = None     # its stdin: closed, it acts
        self.lines: Optional[Tuple[int, int]] = None   # its stdout (our read end, write end)
        self.pid: Optional[int] = None
        self.environ = environ     # its environment (default os.environ)
        self.prepare = prepare     # before posix_spawn: it inherits no fd of ours
        self.groups: Set[int] = set()
        self.held = 0              # bytes in the lines pipe

    def _start(self) -> bool:
        r, w = os.pipe()      # not inheritable: no job (and no child agent) holds a write end
        lr, lw = os.pipe()
        argv = ["/bin/sh", "-c", WATCHDOG_SOURCE, "gxp-watchdog"]
        try:
            if hasattr(os, "posix_spawn"):
                self.prepare()     # the watchdog must hold no link of ours open
                null = os.devnull
                env = self.environ() if self.environ is not None else os.environ
                self.pid = os.posix_spawn("/bin/sh", argv, env, setsid=True, file_actions=[
                    (os.POSIX_SPAWN_DUP2, r, 0), (os.POSIX_SPAWN_DUP2, lr, 1),
                    (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0)])
            else:
                import subprocess
                self.pid = subprocess.Popen(
                    argv, stdin=r, stdout=lr, stderr=subprocess.DEVNULL,
                    start_new_session=True, close_fds=True).pid
        except OSError:
            for fd in (w, lr, lw):
                os.close(fd)
            return False
        finally:
            os.close(r)
        os.set_blocking(lr, False)
        os.set_blocking(lw, False)
        self.wfd, self.lines, self.held = w, (lr, lw), 0
        return True

    def _write(self, line: bytes) -> None:
        if self.wfd is None and not self._start():
            return
        assert self.lines is not None
        try:
            self.held += os.write(self.lines[1], line)
            if self.held > LINES_MAX:
                self._rewrite()
        except OSError:
            # Dead (someone killed it), stuck or full: start a fresh one next time.
            self.close()

    def _rewrite(self) -> None:
        # The groups left, then the lines before them read out: whenever we
        # die, the pipe names every live group.
        assert self.lines is not None
        old, self.held = self.held, 0
        self.held = os.write(self.lines[1], b"".join(b"+%d\n" % p for p in self.groups))
        while old > 0:
            old -= len(os.read(self.lines[0], old))

    def add(self, pgid: int) -> None:
        self.groups.add(pgid)
        self._write(b"+%d\n" % pgid)

    def remove(self, pgid: int) -> None:
        if self.wfd is not None:
            self.groups.discard(pgid)
            self._write(b"-%d\n" % pgid)

    def close(self) -> None:
        """Closing its stdin is the watchdog's signal: it kills what is left and exits."""
        for fd in (self.lines or ()) + ((self.wfd,) if self.wfd is not None else ()):
            try:
                os.close(fd)
            except OSError:
                pass
        self.wfd = self.lines = None
        self.groups = set()
        if self.pid is not None:
            try:
                os.waitpid(self.pid, os.WNOHANG)     # reap it if it is already gone
            except ChildProcessError:
                pass
            self.pid = None


class Job:
    def __init__(self, runner: JobRunner, key: Tuple[str, int], proc: Spawned) -> None:
        self.runner = runner
        self.key = key
        self.proc = proc
        self.open_fds: Dict[int, int] = {}   # fd -> 1 or 2 (stdout/stderr)
        # Closed through their file objects only: an os.close() here would leave
        # Popen's objects to close the same number again when collected, by
        # then maybe a client's socket.
        self.files: Dict[int, Any] = {}
        self.stdin_fd: Optional[int] = proc.stdin.fileno() if proc.stdin else None
        self.stdin_buf: Deque[memoryview] = deque()
        self.stdin_eof = False
        self.stdin_written = 0        # bytes written to the pipe, not yet acked
        self.status: Optional[int] = None    # Popen returncode once the process exited
        self.watched = False          # its exit is watched (loop.watch_child)
        self.unacked = 0              # output bytes sent and not acknowledged
        self.credit = True            # False once unacked >= OUT_WINDOW
        self.reading = False
        for stream, f in ((1, proc.stdout), (2, proc.stderr)):
            if f is not None:
                fd = f.fileno()
                os.set_blocking(fd, False)
                self.open_fds[fd] = stream
                self.files[fd] = f
        if self.stdin_fd is not None:
            os.set_blocking(self.stdin_fd, False)


class JobRunner:
    """Starts jobs and reports through `send(dst, msg)`. `backlog()` is kept for
    callers that ask how many bytes wait on the way up; pausing on it is the
    node's decision (`pause_output` / `resume_output`)."""

    def __init__(self, loop: EventLoop, node_id: str,
                 send: Callable[[str, Dict[str, Any]], None],
                 backlog: Callable[[], int],
                 environ: Optional[Dict[str, str]] = None) -> None:
        self.loop = loop
        self.node_id = node_id
        self.send = send
        self.backlog = backlog
        self.jobs: Dict[Tuple[str, int], Job] = {}
        self.paused = False
        # os.environ as a dict, made once (reading it decodes every variable,
        # a forked agent's first `gxpc e` cost, issue 27); forks inherit it.
        self._environ = environ
        self.spawner = ShellSpawner()
        self.watchdog = Watchdog(self.environ, self.spawner.prepare)
        # Groups whose shell exited while some member still ran (`cmd &` with its
        # output elsewhere): still ours to kill at quit, still the watchdog's.
        self.lingering: Set[int] = set()
        self._killing: Optional[Callable[[], None]] = None
        self._kill_timer: Optional[int] = None
        # The environment of a job, by what its exec asked for: the recipes of
        # one make ask for the same, and copying os.environ (it decodes every
        # variable) costs more than the rest of a start. Nothing of ours
        # changes os.environ after start.
        self._envs: Dict[Any, Dict[str, str]] = {}
        # The environments execs name by `base` (a make's, sent once per node),
        # oldest first: the head forgets them in the same order.
        self._bases: Dict[int, Dict[str, Optional[str]]] = {}

    # -- start -------------------------------------------------------------
    def start(self, requester: str, msg: Dict[str, Any]) -> None:
        key = (requester, msg["job"])
        if key in self.jobs:
            return
        base = msg.get("base")
        if base is not None and msg.get("base_env") is not None:
            self._bases.pop(base, None)
            if len(self._bases) >= ENV_BASES:
                del self._bases[next(iter(self._bases))]
            self._bases[base] = msg["base_env"]
            self._envs.clear()
        if base is not None and base not in self._bases:
            self.send(requester, {"op": "exit", "job": msg["job"], "status": 127,
                                  "error": "start: the job's environment was not sent to this node"})
            return
        env = self._env(msg["env"], base)
        cwd = msg["cwd"] or env.get("HOME") or "/"
        self.start_watchdog()
        try:
            proc = self.spawner.spawn(msg["cmd"], cwd, env, bool(msg["stdin"]))
        except OSError as e:
            where = "cwd %s" % cwd if isinstance(e, FileNotFoundError) and e.filename == cwd else "start"
            self.send(requester, {"op": "exit", "job": msg["job"], "status": 127,
                                  "error": "%s: %s" % (where, e.strerror)})
            return
        self.watchdog.add(proc.pid)
        job = Job(self, key, proc)
        self.jobs[key] = job
        self._set_reading(job)
        self._check_lingering()

    def start_watchdog(self) -> None:
        """Before the first job (an agent starts it once it is up, so that the
        first `gxpc e` after explore pays no process start per node)."""
        if self.watchdog.wfd is None:
            self.watchdog._start()

    def environ(self) -> Dict[str, str]:
        # os.environ (nothing of ours changes it after start); not to be changed
        if self._environ is None:
            self._environ = dict(os.environ)
        return self._environ

    def _env(self, changes: Dict[str, Optional[str]], base: Optional[int] = None) -> Dict[str, str]:
        key = (base, frozenset(changes.items()))
        env = self._envs.get(key)
        if env is None:
            env = dict(self.environ())
            for layer in (self._bases[base], changes) if base is not None else (changes,):
                for k, v in layer.items():
                    if not isinstance(k, str) or "=" in k or "\0" in k:
                        continue
                    if v is None:
                        env.pop(k, None)
                    elif isinstance(v, str) and "\0" not in v:
                        env[k] = v
            if len(self._envs) >= 16:
                self._envs.clear()
            self._envs[key] = env
        return env

    # -- output --------------------------------------------------------------
    def _set_reading(self, job: Job) -> None:
        want = job.credit and not self.paused
        if want == job.reading:
            return
        job.reading = want
        for fd in job.open_fds:
            if want:
                self.loop.add_reader(fd, self._reader(job, fd))
            else:
                self.loop.remove_reader(fd)

    def _reader(self, job: Job, fd: int) -> Callable[[], None]:
        return lambda: self._readable(job, fd)

    def _readable(self, job: Job, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            job.unacked += len(data)
            if job.unacked >= OUT_WINDOW and job.credit:
                job.credit = False
                self._set_reading(job)
            # May pause us (the node's link up is congested): state first, then send.
            self.send(job.key[0], {"op": "out", "job": job.key[1], "fd": job.open_fds[fd], "data": data})
            return
        self.loop.forget(fd)
        del job.open_fds[fd]
        job.files.pop(fd).close()
        self._maybe_finish(job)

    def ack_output(self, requester: str, job_id: int, nbytes: int) -> None:
        """The consumer took `nbytes` of this job's output."""
        job = self.jobs.get((requester, job_id))
        if job is None:
            return
        job.unacked = max(0, job.unacked - nbytes)
        if not job.credit and job.unacked < OUT_WINDOW:
            job.credit = True
            self._set_reading(job)

    def pause_output(self) -> None:
        if not self.paused:
            self.paused = True
            for job in self.jobs.values():
                self._set_reading(job)

    def resume_output(self) -> None:
        if self.paused:
            self.paused = False
            for job in list(self.jobs.values()):
                self._set_reading(job)

    # -- exit ------------------------------------------------------------------
    # A job's exit is watched (a pidfd in the loop) only once its output has
    # closed and the shell had not exited yet, or while jobs are killed: the
    # shell mostly exits as its output closes, and the watch cost every job
    # four system calls and a loop event of its own (issue 27).
    def _check_exit(self, job: Job) -> None:
        rc = job.proc.poll()
        if rc is not None:
            if job.watched:
                job.watched = False
                self.loop.unwatch_child(job.proc.pid)
            job.status = rc
        elif not job.watched:
            job.watched = True
            self.loop.watch_child(job.proc.pid, lambda: self._child_event(job))

    def _child_event(self, job: Job) -> None:
        if job.status is not None:
            return
        self._check_exit(job)
        if job.status is None:
            return       # a SIGCHLD for another child
        self._maybe_finish(job)
        if self._killing is not None and all(j.status is not None for j in self.jobs.values()):
            self._kill_done()

    def _maybe_finish(self, job: Job) -> None:
        # Done when the output is closed and the process has exited (in either
        # order: a background process may hold the output after the shell exits).
        if job.open_fds or self.jobs.get(job.key) is not job:
            return
        if job.status is None:
            self._check_exit(job)
            if job.status is None:
                return
        rc = job.status
        status = rc if rc >= 0 else 128 - rc
        self._close_stdin(job)
        self.jobs.pop(job.key, None)
        self._forget_group(job.proc.pid)
        self.send(job.key[0], {"op": "exit", "job": job.key[1], "status": status,
                               "error": "" if rc >= 0 else "killed by signal %d" % -rc})

    def _forget_group(self, pgid: int) -> None:
        # The watchdog forgets a group only once it is empty: a group id cannot
        # be reused while any member lives, so it signals no stranger's group
        # (short of a lingering group emptying, then its id being recycled past
        # pid_max, between two of our checks).
        if _group_alive(pgid):
            self.lingering.add(pgid)
        else:
            self.watchdog.remove(pgid)

    def _check_lingering(self) -> None:
        for pgid in list(self.lingering):
            if not _group_alive(pgid):
                self.lingering.discard(pgid)
                self.watchdog.remove(pgid)

    # -- stdin -------------------------------------------------------------------
    def write_stdin(self, requester: str, msg: Dict[str, Any]) -> None:
        job = self.jobs.get((requester, msg["job"]))
        if job is None:
            return
        if job.stdin_fd is None:
            if msg["data"] and job.proc.stdin is not None:
                # The command closed its stdin: tell the sender to stop.
                self._stdin_ack(job, len(msg["data"]), eof=True)
            return
        if msg["data"]:
            job.stdin_buf.append(memoryview(msg["data"]))
        job.stdin_eof = job.stdin_eof or msg["eof"]
        self._flush_stdin(job)

    def _flush_stdin(self, job: Job) -> None:
        fd = job.stdin_fd
        if fd is None:
            return
        while job.stdin_buf:
            buf = job.stdin_buf[0]
            try:
                n = os.write(fd, buf)
            except (BlockingIOError, InterruptedError):
                self.loop.add_writer(fd, lambda: self._flush_stdin(job))
                if job.stdin_written >= STDIN_ACK_EVERY:
                    self._stdin_ack(job, job.stdin_written)
                return
            except OSError:
                # EPIPE: the command will read no more. Drop, and stop the sender.
                dropped = job.stdin_written + sum(len(b) for b in job.stdin_buf)
                job.stdin_buf.clear()
                self._close_stdin(job)
                self._stdin_ack(job, dropped, eof=True)
                return
            job.stdin_written += n
            if n == len(buf):
                job.stdin_buf.popleft()
            else:
                job.stdin_buf[0] = buf[n:]
        self.loop.remove_writer(fd)
        if job.stdin_written:
            self._stdin_ack(job, job.stdin_written)
        if job.stdin_eof:
            self._close_stdin(job)

    def _stdin_ack(self, job: Job, nbytes: int, eof: bool = False) -> None:
        job.stdin_written = 0
        self.send(job.key[0], {"op": "stdin_ack", "job": job.key[1], "bytes": nbytes, "eof": eof})

    def _close_stdin(self, job: Job) -> None:
        if job.stdin_fd is not None:
            self.loop.forget(job.stdin_fd)
            try:
                if job.proc.stdin is not None:
                    job.proc.stdin.close()
            except OSError:
                pass
            job.stdin_fd = None

    # -- cancel and quit -----------------------------------------------------
    def kill(self, requester: str, job_id: int, sig: int) -> None:
        job = self.jobs.get((requester, job_id))
        if job is None:
            return
        if sig == signal.SIGKILL:
            # A hard kill (Ctrl-C twice, or the client went away): nobody may
            # ack again, so drain what is left (a pipe's worth at most) instead
            # of holding the job open for credit.
            job.unacked = -(1 << 62)
            job.credit = True
            self._set_reading(job)
        _signal_group(job.proc.pid, sig)

    def kill_all(self, done: Optional[Callable[[], None]] = None) -> None:
        """SIGTERM every job's group (and lingering ones); SIGKILL them when the
        jobs have exited or after KILL_GRACE. `done()` then (on the loop)."""
        self._killing = done or _noop
        for job in self.jobs.values():
            job.unacked = -(1 << 62)     # quitting: no more acks will come
            job.credit = True
            self._set_reading(job)
        for pgid in self._groups():
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)
        for job in list(self.jobs.values()):
            if job.status is None:
                self._check_exit(job)      # its exit ends the wait below
        if all(j.status is not None for j in self.jobs.values()):
            self.loop.call_later(0, self._kill_done)
        else:
            self._kill_timer = self.loop.call_later(KILL_GRACE, self._kill_done)

    def _groups(self) -> List[int]:
        return [j.proc.pid for j in self.jobs.values()] + list(self.lingering)

    def _kill_done(self) -> None:
        done, self._killing = self._killing, None
        if done is None:
            return
        self.loop.cancel(self._kill_timer)
        self._kill_timer = None
        for pgid in self._groups():
            _signal_group(pgid, signal.SIGKILL)
        done()

    def close(self) -> None:
        """At exit: stop watching, let the watchdog go (it kills what is left)."""
        for job in self.jobs.values():
            if job.watched:
                self.loop.unwatch_child(job.proc.pid)
        self.watchdog.close()
        self.spawner.close()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _noop() -> None:
    pass
