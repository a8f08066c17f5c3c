"""The library side of `gxpc`: find or start the session daemon, send requests,
receive replies and streamed frames. The CLI is a client of this API only.
"""
from __future__ import annotations

import _socket  # not socket: its enums double gxpc's start-up CPU
import os
import select
import sys
import time

from gxpstyle.head import session
from gxpstyle.protocol import wire

# Imported for types only: gxpc loads this module on every start, and typing
# alone costs about as much CPU as the interpreter's own start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any, Dict, Iterator, Optional, Tuple

START_TIMEOUT = 30.0
# The daemon's first line: drop the working directory from sys.path (`-c`
# puts it first), then run the module named by the next argument as __main__.
DAEMON_START = ("import sys, runpy; del sys.path[0]; "
                "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
# Output credit goes back to the job every ACK_EVERY bytes handed to the program
# (job_runner.OUT_WINDOW is the most a job may have unacknowledged: keep this well under).
ACK_EVERY = 256 << 10


class ClientError(RuntimeError):
    """No session, a refused connection, or a daemon that went away."""


class Client:
    def __init__(self, session_dir: Optional[str] = None) -> None:
        self.session_dir = os.path.abspath(session_dir or session.default_session_dir())
        self.sock: Optional[socket.socket] = None
        self.reader = wire.FrameReader()
        self.req = 0
        self.backlog: list = []
        # Frames queued to the daemon. Whole frames only, so a frame may go out
        # directly (a signal handler's kill) whenever this is empty.
        self.out_buf = bytearray()
        self.unacked: Dict[Tuple[str, int], int] = {}

    # -- connection -------------------------------------------------------------
    def connect(self, start: bool) -> bool:
        """Connect to the daemon; start it first when `start`. False if none runs."""
        session.check_path_length(self.session_dir)
        try:
            os.lstat(self.session_dir)
            exists = True
        except FileNotFoundError:
            exists = False
        except PermissionError:
            raise session.SessionError("%s: permission denied (not your session)" % self.session_dir)
        if exists:
            session.check_private_dir(self.session_dir)
        path = session.socket_path(self.session_dir)
        if self._try_connect(path):
            return True
        if not start:
            return False
        session.ensure_session_dir(self.session_dir)
        self._start_daemon()
        if not self._try_connect(path):
            raise ClientError("session daemon started but its socket does not answer")
        return True

    def _try_connect(self, path: str) -> bool:
        if not os.path.exists(path):
            return False
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            s.close()
            return False
        except PermissionError:
            s.close()
            raise ClientError("%s: permission denied" % path)
        self.sock = s   # type: ignore[assignment]  # socket.socket's base: the same calls
        return True

    def _start_daemon(self) -> None:
        # Not `python -m`: that puts the user's working directory first on the
        # daemon's sys.path, so a `gxpstyle` folder where gxpc runs would be
        # the daemon's code. -I would also drop PYTHONPATH and a user-site
        # install; this drops only the working directory. The module name is
        # an argument, so `ps` shows "gxpstyle.head.daemon --session DIR".
        import subprocess
        r, w = os.pipe()
        log = os.path.join(self.session_dir, session.LOG_NAME)
        proc = subprocess.Popen(
            [sys.executable, "-c", DAEMON_START, "gxpstyle.head.daemon", "--session", self.session_dir,
             "--ready-fd", str(w)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(w,), start_new_session=True, close_fds=True)
        os.close(w)
        # "ok" on the pipe once the daemon listens; end of file if it dies first
        # (it held the only write end): no need to watch the process itself
        deadline = time.monotonic() + START_TIMEOUT
        data = b""
        while b"ok" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                break
            chunk = os.read(r, 16)
            if not chunk:
                break
            data += chunk
        os.close(r)
        proc.poll()     # reaped if it died (our child until then)
        if b"ok" not in data:
            tail = ""
            try:
                with open(log) as f:
                    lines = [line for line in f.read().splitlines() if line.strip()]
                    tail = lines[-1] if lines else ""
            except OSError:
                pass
            raise ClientError("session daemon did not start%s" % (": " + tail if tail else ""))

    def wait_closed(self, timeout: float) -> bool:
        """Block until the daemon closes the connection (it does by exiting,
        after removing its socket), at most `timeout` seconds; False if it
        is still there. What it sends meanwhile is dropped."""
        deadline = time.monotonic() + timeout
        while self.sock is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return False
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return True
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # -- frames -------------------------------------------------------------------
    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def send(self, dst: str, msg: Dict[str, Any]) -> None:
        """Send now (blocking), after anything queued."""
        self.queue(dst, msg)
        self.flush(block=True)

    def queue(self, dst: str, msg: Dict[str, Any]) -> None:
        self.out_buf += wire.encode_frame(dst, "c", msg)

    def send_urgent(self, dst: str, msg: Dict[str, Any]) -> None:
        """For signal handlers: straight out when no frame is half sent, else queued."""
        if self.out_buf:
            self.queue(dst, msg)
        else:
            assert self.sock is not None
            self.sock.sendall(wire.encode_frame(dst, "c", msg))

    def flush(self, block: bool = False) -> None:
        """Write what is queued: all of it when `block`, else what the socket takes now."""
        assert self.sock is not None
        while self.out_buf:
            if block:
                select.select([], [self.sock], [])
            try:
                n = self.sock.send(self.out_buf, _socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                if block:
                    continue
                return
            except OSError as e:
                raise ClientError("the session daemon closed the connection (%s)" % e.strerror)
            del self.out_buf[:n]

    def request(self, cmd: str, args: Optional[Dict[str, Any]] = None) -> int:
        self.req += 1
        self.send(wire.HEAD, {"op": "request", "req": self.req, "cmd": cmd, "args": args or {}})
        return self.req

    def receive(self) -> None:
        """Read what the daemon sent (one recv) into the backlog. Raises ClientError
        when the daemon goes."""
        assert self.sock is not None
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionResetError:
            data = b""
        if not data:
            raise ClientError("the session daemon closed the connection")
        try:
            for frame in self.reader.feed(data):
                _, src, body = wire.split_frame(frame)
                self.backlog.append((src, wire.decode_message(body)))
        except wire.FrameError as e:
            raise ClientError("bad frame from the daemon: %s" % e)

    def take(self) -> Optional[Tuple[str, Dict[str, Any]]]:
        """The next received message, or None; output is acknowledged as it is
        handed over (the program consumes it before asking for more)."""
        if not self.backlog:
            return None
        src, msg = self.backlog.pop(0)
        op = msg["op"]
        if op == "out":
            self.ack_output(src, msg["job"], len(msg["data"]))
        elif op == "exit":
            self.unacked.pop((src, msg["job"]), None)
        elif op == "exits":          # a job's nodes that ended, folded along the tree
            for g in msg["groups"]:
                for nid in g["nodes"]:
                    self.unacked.pop((nid, msg["job"]), None)
        return src, msg

    def ack_output(self, src: str, job: int, nbytes: int) -> None:
        key = (src, job)
        n = self.unacked.get(key, 0) + nbytes
        if n >= ACK_EVERY:
            self.queue(src, {"op": "out_ack", "job": job, "bytes": n})
            n = 0
        self.unacked[key] = n

    def next_message(self, timeout: Optional[float] = None) -> Optional[Tuple[str, Dict[str, Any]]]:
        """(src, message), or None on timeout. Raises ClientError when the daemon goes."""
        assert self.sock is not None
        while not self.backlog:
            wants_write = [self.sock] if self.out_buf else []
            readable, writable, _ = select.select([self.sock], wants_write, [], timeout)
            if writable:
                self.flush()
            if not readable:
                if writable and self.out_buf:
                    continue
                return None
            self.receive()
        item = self.take()
        if self.out_buf:
            self.flush()
        return item

    def call(self, cmd: str, args: Optional[Dict[str, Any]] = None,
             on_print: Any = None) -> Tuple[int, Dict[str, Any]]:
        """Send a request and wait for its reply; `print` messages go to on_print."""
        req = self.request(cmd, args)
        while True:
            item = self.next_message()
            if item is None:
                continue
            _, msg = item
            if msg["op"] == "print" and msg["req"] == req:
                if on_print is not None:
                    on_print(msg["stream"], msg["data"])
            elif msg["op"] == "reply" and msg["req"] == req:
                return msg["status"], msg["result"]

    def stat(self) -> Dict[str, Any]:
        """The session's state: `nodes` as a list of dicts (the daemon sends a
        table), plus what each service adds (masks, mounts)."""
        status, result = self.call("stat")
        if status:
            raise ClientError(result.get("error", "stat failed"))
        fields = result.pop("node_fields", [])
        result["nodes"] = [dict(zip(fields, row)) for row in result.pop("node_rows", [])]
        return result

    def messages(self, timeout: Optional[float] = None) -> Iterator[Tuple[str, Dict[str, Any]]]:
        while True:
            item = self.next_message(timeout)
            if item is None:
                return
            yield item
