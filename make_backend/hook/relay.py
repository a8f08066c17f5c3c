"""The per-make relay: one connection to the session for all of make's recipes.

`gxpc make` runs it while make runs. Each recipe's `gxpmake-job` (hook/c_source.py)
connects to its Unix socket and sends, as data, the exact command make would
have run (argv), its cwd and environment, with make's stdin, stdout and stderr
for that recipe; the relay asks the head's `job` verb for a node, writes the
recipe's output straight into those fds (so `-O` and make's ordering hold),
and answers the job's exit status. Signals the job gets are forwarded as kills.
A recipe whose node is lost runs once more on another node; make sees only the
final result.

No name or argument is ever parsed by a shell here or on the head: the node's
/bin/sh gets `exec 'argv0' 'argv1' ...`, each word single-quoted.

Head side only; standard library.
"""
from __future__ import annotations

import functools
import os
import resource
import select
import signal
import socket
import stat
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from gxpstyle.protocol import wire
from gxpstyle.transport.event_loop import EventLoop
from make_backend.hook import recipe_files
from make_backend.hook.job_shell import HOST_BOUND

EXIT_NO_RUN = 127
# Not copied from the head (they describe its login), except SHLVL: bash reads
# SHLVL and SSH_CLIENT to decide whether sshd started it (then it sources
# bashrc), so a recipe's bash must see make's SHLVL, and no SSH_* that make's
# environment lacks (the node's agent has its own, from its ssh login).
NOT_COPIED = HOST_BOUND - {"SHLVL"}
LOGIN_ONLY = ("SSH_CLIENT", "SSH2_CLIENT", "SSH_CONNECTION", "SSH_TTY")
MAX_REQUEST = 64 << 20
PROGRESS_EVERY = 0.2      # seconds between redraws of the progress line, at most
_FDS = struct.calcsize("3i")


def quote(word: bytes) -> str:
    """One shell word that means exactly `word` (any bytes but NUL)."""
    return "'" + word.decode("utf-8", "surrogateescape").replace("'", "'\\''") + "'"


def node_command(argv: List[bytes]) -> str:
    """What the node's /bin/sh runs: argv, exec'd as make would (PATH lookup of
    argv[0] in the recipe's environment); a missing program is one line.
    make's default `/bin/sh -c RECIPE` is what the node runs anyway: the recipe
    goes as it is, one exec fewer."""
    if len(argv) == 3 and argv[0] == b"/bin/sh" and argv[1] == b"-c":
        return argv[2].decode("utf-8", "surrogateescape")
    words = " ".join(quote(w) for w in argv)
    prog = quote(argv[0])
    return ("command -v %s >/dev/null 2>&1 && exec %s; "
            "printf 'gxpc make: %%s: no such program on node %%s\\n' %s \"$GXP_HOSTNAME\" >&2; "
            "exit 127" % (prog, words, prog))


def parse_request(data: bytes) -> Tuple[str, List[bytes], bytes]:
    """(cwd, argv, environment block) from a gxpmake-job request (hook/c_source.py's
    CLIENT); the block is parsed by parse_env, once for every distinct block."""
    pos = 8
    end = data.index(b"\0", pos)
    cwd = data[pos:end]
    pos = end + 1
    argc, = struct.unpack_from("=I", data, pos)
    pos += 4
    words = []
    for _ in range(argc):
        end = data.index(b"\0", pos)
        words.append(data[pos:end])
        pos = end + 1
    # words[0] is the program make resolved; the node looks argv[0] up itself
    return cwd.decode("utf-8", "surrogateescape"), words[1:], data[pos:]


def parse_env(block: bytes) -> Dict[str, Optional[str]]:
    envc, = struct.unpack_from("=I", block, 0)
    items = block[4:].split(b"\0")[:envc]
    env: Dict[str, Optional[str]] = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        key = k.decode("utf-8", "surrogateescape")
        if sep and key not in NOT_COPIED:
            env[key] = v.decode("utf-8", "surrogateescape")
    return env


MAX_ENV_VALUE, MAX_ENV_ITEMS = 1 << 20, 1 << 14   # the make service's ENV_ARGS


def check_env(env: Dict[str, Optional[str]]) -> None:
    """Refuse, in the user's words, an environment the session would not carry
    whole: a recipe must never run with part of it."""
    if len(env) > MAX_ENV_ITEMS:
        raise ValueError("the environment has %d variables; at most %d reach the nodes"
                         % (len(env), MAX_ENV_ITEMS))
    for k, v in env.items():
        if v is not None and len(v) > MAX_ENV_VALUE:
            raise ValueError("environment variable %s is %d characters long; at most %d reach the nodes"
                             % (k, len(v), MAX_ENV_VALUE))


def label_of(argv: List[bytes], limit: int = 60) -> str:
    """How messages (and the job log, with a larger limit) name a recipe: the
    first line of its command."""
    text = argv[-1].decode("utf-8", "replace").strip().split("\n", 1)[0] if argv else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Recipe:
    def __init__(self, conn: socket.socket, fds: List[int]) -> None:
        self.conn = conn
        self.fds = fds                      # make's stdin, stdout, stderr for it
        self.buf = bytearray()
        self.want = 0
        self.cwd = ""
        self.argv: List[bytes] = []
        self.env_block = b""
        self.req: Optional[int] = None
        self.node: Optional[str] = None
        self.name = ""
        self.job: Optional[int] = None
        self.avoid: List[str] = []
        self.signals: List[int] = []
        self.started = 0.0
        self.out_bytes = 0
        self.want_stdin = False             # make gave it a stdin worth reading
        self.stdin = False                  # which we are reading for the job now
        self.settle = False                 # the head acts on its files before its exit counts
        self.exit: Optional[Tuple[int, str]] = None   # the exit, held until the head says settled
        self.settled = False                # the head said so (before the exit came)


class Relay:
    """Serves gxpmake-job clients on `path` until make exits."""

    def __init__(self, client: Any, path: str, joblog: Any = None,
                 progress_fd: Optional[int] = None, explain_fd: Optional[int] = None,
                 transfer: Optional[Dict[str, Any]] = None) -> None:
        self.c = client                      # gxpstyle.gxpc.client.Client, connected
        self.transfer = dict(transfer or {})  # options of the planned transfers (the env verb)
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1024)
        self.listener.setblocking(False)
        # the one event loop (gxpstyle/transport/event_loop.py): every fd below is read
        # by a callback; what a round queued for the head leaves at its end
        self.loop = EventLoop()
        self.loop.add_reader(self.listener.fileno(), self._in_round(self._accept))
        self.loop.add_reader(self.c.sock.fileno(), self._in_round(self._from_head_or_gone))
        self.round_end_queued = False
        self.progress_timer: Optional[int] = None
        self.by_fd: Dict[int, Recipe] = {}
        self.by_req: Dict[int, Recipe] = {}
        self.unsettled: Dict[int, Recipe] = {}    # job -> a recipe that ended, until `settled`
        self.by_job: Dict[int, Recipe] = {}
        self.by_stdin: Dict[int, Recipe] = {}
        self.joblog = joblog                 # a text file (--joblog), or None
        self.progress_fd = progress_fd       # a terminal for the progress line, or None
        self.progress_shown = False
        self.progress_at = 0.0
        self.progress_line = ""
        self.progress_due: Optional[float] = None   # a redraw held back (PROGRESS_EVERY)
        self.done = 0
        self.dead = ""                       # why the session is gone, once it is
        self.accept_paused = False           # no fd left for another recipe just now
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.fd_base = 16 + len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
        self.base_env: Optional[Dict[str, Optional[str]]] = None   # sent once (`env` verb)
        self.out = bytearray()               # frames to the head, sent once per round
        self.env_diffs: Dict[bytes, Dict[str, Optional[str]]] = {}
        self.block_hints: Dict[bytes, Dict[str, Any]] = {}   # placement hints (recipe_files.py)
        self.dir_hints = recipe_files.DirHints()
        self.explain_fd = explain_fd         # --explain-placement: a line per recipe there
        self.null_rdev: Optional[int] = None  # /dev/null's device: no stdin worth reading

    # -- the loop -----------------------------------------------------------------
    def _in_round(self, handle: Callable[[], None]) -> Callable[[], None]:
        """`handle`, then (once a round, after every event of it) _end_round."""
        def run() -> None:
            handle()
            if not self.round_end_queued:
                self.round_end_queued = True
                self.loop.at_end(self._end_round)
        return run

    def _end_round(self) -> None:
        self.round_end_queued = False
        self._flush()
        self._progress()
        if self.progress_due is not None and self.progress_timer is None:
            self.progress_timer = self.loop.call_later(
                max(0.0, self.progress_due - time.monotonic()), self._progress_due_now)

    def _progress_due_now(self) -> None:
        self.progress_timer = None
        self._end_round()

    # -- clients ----------------------------------------------------------------
    def _pause_accept(self) -> None:
        if not self.accept_paused:
            self.accept_paused = True
            self.loop.remove_reader(self.listener.fileno())

    def _accept(self) -> None:
        while True:
            # 4 descriptors a recipe (its connection, make's 3 fds): one that
            # would not fit waits in the listen queue until a recipe ends.
            if self.fd_base + 4 * (len(self.by_fd) + 1) > self.fd_limit:
                self._pause_accept()
                return
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:        # out of descriptors after all
                self._pause_accept()
                return
            conn.setblocking(False)
            r = Recipe(conn, [])
            self.by_fd[conn.fileno()] = r
            self.loop.add_reader(conn.fileno(), self._in_round(functools.partial(self._readable, r)))

    def _readable(self, r: Recipe) -> None:
        try:
            if not r.fds:
                data, anc, _, _ = r.conn.recvmsg(1 << 16, socket.CMSG_LEN(_FDS))
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        r.fds = list(struct.unpack("3i", payload[:_FDS]))
                if data and not r.fds:
                    self._drop(r)
                    return
            else:
                data = r.conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._client_gone(r)
            return
        if r.req is None and r.job is None and r.want >= 0:
            r.buf += data
            if len(r.buf) >= 8 and not r.want:
                if r.buf[:4] != b"GXPJ":
                    self._drop(r)
                    return
                r.want, = struct.unpack_from("=I", r.buf, 4)
                if r.want > MAX_REQUEST:
                    self._drop(r)
                    return
            if r.want and len(r.buf) >= r.want:
                r.cwd, r.argv, r.env_block = parse_request(bytes(r.buf))
                r.buf = bytearray()
                r.want = -1
                self._submit(r)
            return
        for sig in data:              # each byte: a signal the job got
            self._signal(r, sig)

    def _signal(self, r: Recipe, sig: int) -> None:
        r.signals.append(sig)
        if r.job is not None and r.node is not None:
            kill = sig if len(r.signals) == 1 else int(signal.SIGKILL)
            self._send(r.node, {"op": "kill", "job": r.job, "sig": kill})

    def _client_gone(self, r: Recipe) -> None:
        """make killed the client (or it died): the recipe must stop too."""
        if r.job is not None and r.node is not None:
            self._send(r.node, {"op": "kill", "job": r.job, "sig": int(signal.SIGKILL)})
        self._drop(r)

    def _drop(self, r: Recipe) -> None:
        self._stop_stdin(r)
        fd = r.conn.fileno()
        if self.by_fd.pop(fd, None) is not None:
            self.loop.remove_reader(fd)
        if r.req is not None:
            self.by_req.pop(r.req, None)
            r.req = None
        if r.job is not None:
            self.by_job.pop(r.job, None)
            self.unsettled.pop(r.job, None)
        r.conn.close()
        for f in r.fds:
            os.close(f)
        r.fds = []
        if self.accept_paused:
            self.accept_paused = False
            self.loop.add_reader(self.listener.fileno(), self._in_round(self._accept))

    # -- the head -----------------------------------------------------------------
    def _wants_stdin(self, fd: int) -> bool:
        """Does make give this recipe a stdin it could read? Not /dev/null, not
        make's closed pipe (the other jobs of a -j make), not a terminal we do
        not own (reading it would stop us)."""
        try:
            st = os.fstat(fd)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == self._null_rdev():
                return False
            if os.isatty(fd) and os.tcgetpgrp(fd) != os.getpgrp():
                return False
        except OSError:
            return False
        p = select.poll()
        p.register(fd, select.POLLIN)
        ev = p.poll(0)
        return not (ev and ev[0][1] & select.POLLHUP and not ev[0][1] & select.POLLIN)

    def _null_rdev(self) -> int:
        if self.null_rdev is None:
            self.null_rdev = os.stat(os.devnull).st_rdev
        return self.null_rdev

    def _stdin_readable(self, r: Recipe) -> None:
        try:
            data = os.read(r.fds[0], 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if r.node is not None and r.job is not None:
            self._send(r.node, {"op": "stdin", "job": r.job, "data": data, "eof": not data})
        if not data:
            self._stop_stdin(r)

    def _stop_stdin(self, r: Recipe) -> None:
        if r.stdin:
            r.stdin = False
            self.by_stdin.pop(r.fds[0], None)
            self.loop.remove_reader(r.fds[0])

    def _submit(self, r: Recipe) -> None:
        if self.dead:
            self._finish(r, EXIT_NO_RUN, self.dead)
            return
        try:
            env = self._env_diff(r.env_block)
        except ValueError as e:
            self._finish(r, EXIT_NO_RUN, str(e))
            return
        args: Dict[str, Any] = {"cmd": node_command(r.argv), "cwd": r.cwd, "env": env, "avoid": r.avoid}
        args.update(self._placement_fields(r))
        if r.fds and self._wants_stdin(r.fds[0]):
            r.want_stdin = args["stdin"] = True
        r.req = self._request("job", args)
        self.by_req[r.req] = r
        r.started = time.time()

    def _placement_fields(self, r: Recipe) -> Dict[str, Any]:
        """The recipe's paths and hints for the head's placement (recipe_files.py)."""
        out: Dict[str, Any] = dict(self.block_hints.get(r.env_block) or {})
        paths = recipe_files.recipe_paths([w.decode("utf-8", "surrogateescape") for w in r.argv], r.cwd)
        if paths:
            out["inputs"] = paths
        dp, _ = self.dir_hints.of(paths, r.cwd)
        if dp:
            out["dp"] = dp
        return out

    def _env_diff(self, block: bytes) -> Dict[str, Optional[str]]:
        """What this recipe's environment changes from the make's (sent once):
        the recipes of one make level share one block, parsed once."""
        diff = self.env_diffs.get(block)
        if diff is not None:
            return diff
        env = parse_env(block)
        check_env(env)
        hints = recipe_files.hint_args(recipe_files.split_hints(env))
        if len(self.block_hints) >= 16:
            self.block_hints.clear()
        self.block_hints[block] = hints
        if self.base_env is None:
            # The node's agent has the environment the session started with: a
            # variable make does not export (unexport, or unset since) is unset.
            self.base_env = {k: None for k in os.environ if k not in NOT_COPIED}
            self.base_env.update((k, None) for k in LOGIN_ONLY)
            self.base_env.update(env)
            self._request("env", dict(self.transfer, env=self.base_env))
        base = self.base_env
        diff = {k: v for k, v in env.items() if base.get(k) != v}
        diff.update((k, None) for k, v in base.items() if v is not None and k not in env)
        if len(self.env_diffs) >= 16:
            self.env_diffs.clear()
        self.env_diffs[block] = diff
        return diff

    def _request(self, cmd: str, args: Dict[str, Any]) -> int:
        self.c.req += 1
        self.out += wire.encode_frame(wire.HEAD, "c", {"op": "request", "req": self.c.req,
                                                       "cmd": cmd, "args": args})
        return self.c.req

    def _send(self, node: str, msg: Dict[str, Any]) -> None:
        self.out += wire.encode_frame(node, "c", msg)

    def _flush(self) -> None:
        if self.out and not self.dead:
            data, self.out = bytes(self.out), bytearray()
            try:
                self.c.sock.sendall(data)
            except OSError as e:
                self._session_gone("the session daemon went away (%s)" % (e.strerror or e))

    def _from_head_or_gone(self) -> None:
        try:
            self._from_head()
        except (ConnectionError, OSError) as e:
            self._session_gone(str(e) or "the session daemon went away")

    def _from_head(self) -> None:
        try:
            data = self.c.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionError("the session daemon closed the connection")
        for frame in self.c.reader.feed(data):
            _, src, body = wire.split_frame(frame)
            self._message(src, wire.decode_message(body))

    def _message(self, src: str, msg: Dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "reply":
            r = self.by_req.pop(msg["req"], None)
            if r is None:
                return
            r.req = None
            if msg["status"]:
                self._finish(r, EXIT_NO_RUN, msg["result"].get("error", "no node for the recipe"))
                return
            res = msg["result"]
            r.node, r.job, r.name = res["node"], res["job"], res["name"]
            r.settle = bool(res.get("settle"))
            if self.explain_fd is not None:
                self._explain(r, res)
            self.by_job[r.job] = r
            if r.want_stdin and not r.stdin and r.fds:
                r.stdin = True
                self.by_stdin[r.fds[0]] = r
                self.loop.add_reader(r.fds[0], self._in_round(functools.partial(self._stdin_readable, r)))
            if r.signals:
                sig = r.signals.pop()
                self._signal(r, sig)
        elif op == "out":
            r = self.by_job.get(msg["job"])
            if r is not None and src == r.node and r.fds:
                r.out_bytes += len(msg["data"])
                self._clear_progress()
                _write_all(r.fds[msg["fd"]], msg["data"])
        elif op == "exit":
            r = self.by_job.get(msg["job"])
            if r is None or src != r.node:
                return
            del self.by_job[msg["job"]]
            error = msg["error"]
            if error.startswith("node lost") and not r.avoid and not r.signals:
                self._say(r, "%s: %s on %s; running it again on another node"
                          % (label_of(r.argv), error, r.name))
                r.avoid.append(r.node)
                r.node = r.job = None
                r.settled = False
                self._submit(r)
                return
            if r.settle and not r.settled:
                # write-on-exit: make hears the status once every mount shows
                # the recipe's files as they are now (head/service.py)
                r.exit = (msg["status"], error)
                self.unsettled[msg["job"]] = r
                return
            self._finish(r, msg["status"], error)
        elif op == "settled" and src == wire.HEAD:
            r = self.unsettled.pop(msg["job"], None)
            if r is not None and r.exit is not None:
                self._finish(r, *r.exit)
            elif msg["job"] in self.by_job:     # before its exit came
                self.by_job[msg["job"]].settled = True

    def _explain(self, r: Recipe, res: Dict[str, Any]) -> None:
        self._clear_progress()
        line = "gxpc make: %s -> %s: %s; %d bytes local, %d fetched\n" % (
            label_of(r.argv, 200), r.name, res.get("why") or "load", int(res.get("local") or 0),
            int(res.get("fetch") or 0))
        assert self.explain_fd is not None
        _write_all(self.explain_fd, line.encode("utf-8", "replace"))

    def _say(self, r: Recipe, text: str) -> None:
        self._clear_progress()
        if r.fds:
            _write_all(r.fds[2], ("gxpc make: %s\n" % text).encode("utf-8", "replace"))

    def _finish(self, r: Recipe, status: int, error: str) -> None:
        if error and not error.startswith("killed by signal"):
            where = " (on %s)" % r.name if r.name else ""
            self._say(r, "%s: %s%s" % (label_of(r.argv), error, where))
        self.done += 1
        if self.joblog is not None:
            self._log(r, status, time.time())
        try:
            r.conn.setblocking(True)
            r.conn.sendall(struct.pack("=i", status))
        except OSError:
            pass
        self._drop(r)

    def _log(self, r: Recipe, status: int, end: float) -> None:
        recipe = label_of(r.argv, 4000).replace("\t", " ")
        try:
            self.joblog.write("%s\t%s\t%.3f\t%.3f\t%d\t%d\n" % (recipe, r.name or "-", r.started,
                                                               end, status, r.out_bytes))
            self.joblog.flush()
        except OSError as e:    # a full disk: the recipes go on, the log stops, once said
            os.write(2, ("gxpc make: cannot write the job log %s: %s; no more lines go there\n"
                         % (self.joblog.name, e.strerror)).encode("utf-8", "replace"))
            self.joblog = None

    def _progress(self) -> None:
        """Redraw the progress line if it changed, at most every PROGRESS_EVERY
        seconds: a change within that is drawn when it runs out (progress_due)."""
        if self.progress_fd is None:
            return
        busy = len({r.node for r in self.by_job.values()})
        line = ("\rgxpc make: %d done, %d running, %d waiting for a node, %d node%s busy\x1b[K"
                % (self.done, len(self.by_job), len(self.by_req), busy, "" if busy == 1 else "s"))
        if self.progress_shown and line == self.progress_line:
            self.progress_due = None
            return
        now = time.monotonic()
        if now - self.progress_at < PROGRESS_EVERY:
            self.progress_due = self.progress_at + PROGRESS_EVERY
            return
        self.progress_due = None
        self.progress_at = now
        _write_all(self.progress_fd, line.encode())
        self.progress_shown = True
        self.progress_line = line

    def _clear_progress(self) -> None:
        if self.progress_shown and self.progress_fd is not None:
            _write_all(self.progress_fd, b"\r\x1b[K")
            self.progress_shown = False
            self.progress_at = time.monotonic()

    def _session_gone(self, why: str) -> None:
        if self.dead:
            return
        self.dead = why
        self.out = bytearray()
        self.loop.remove_reader(self.c.sock.fileno())
        for r in (list(self.by_req.values()) + list(self.by_job.values())
                  + list(self.unsettled.values())):
            if r.exit is not None:     # it ran; only the settling is lost
                self._finish(r, *r.exit)
            else:
                self._finish(r, EXIT_NO_RUN, why)

    # -- serving ------------------------------------------------------------------
    def serve(self, done_fd: int) -> None:
        """Until done_fd is readable (make exited); then stop what is left."""
        self.loop.add_reader(done_fd, self.loop.stop)
        try:
            self.loop.run()
        finally:
            self._clear_progress()
            for r in list(self.by_fd.values()):
                self._client_gone(r)
            self._flush()
            self.listener.close()
            self.loop.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[n:]
