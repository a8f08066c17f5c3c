"""The client end of the direct data channel: one authenticated connection
to an exporting agent and the calls in flight on it, matched to their replies
by request id, so any number of FUSE threads can call at once. Every call is
bounded: no reply within the branch's timeout fails it with EIO (_Timeout) and
closes the connection.

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import os
import threading

from sshfsmux.direct import protocol as fs_protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

_ConnectionLost = fs_protocol.ConnectionLost


def _oserror(code: int, detail: str = "") -> OSError:
    return fs_protocol.oserror(code, detail)


def _rel(path: str) -> str:
    """A branch path ("/", "/a/b") as a wire path ("", "a/b")."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise _oserror(errno.EINVAL, "branch paths are absolute")
    return path.strip("/")


class _Timeout(OSError):
    """A call without an answer within the bound (errno EIO)."""


# --- requests in flight -------------------------------------------------------

class _Pending:
    """A call waiting for its reply. on_reply/on_data/on_lost run in the
    connection's I/O thread and must not block."""

    req = 0
    channel: Any = None

    def __init__(self) -> None:
        self.done = threading.Event()
        self.errno = 0
        self.result: Any = None
        self.lost: Optional[str] = None

    def on_reply(self, err: int, result: Any) -> bool:
        """Store the reply; True if fs_data frames follow."""
        self.errno, self.result = err, result
        self.done.set()
        return False

    def on_data(self, msg: Dict[str, Any]) -> bool:
        """Take one fs_data frame; True when the stream is over."""
        return bool(msg["eof"])

    def on_lost(self, reason: str) -> None:
        self.lost = reason
        self.done.set()

    def wait(self, timeout: float) -> Any:
        if not self.done.wait(timeout):
            ch = self.channel
            if ch is not None:
                ch.forget(self.req)
                ch.close("call timed out")
            raise _Timeout(errno.EIO, "no reply from the export within %gs" % timeout)
        if self.lost is not None:
            raise _ConnectionLost(self.lost, sent=True)
        if self.errno:
            raise _oserror(self.errno)
        return self.result


class _Channel:
    """One authenticated connection and the calls in flight on it."""

    def __init__(self, host: Optional[str], port: int, key: bytes, pin: Optional[str], cipher: bool,
                 timeout: float, call_timeout: float, via: Any = None) -> None:
        sock, macs = fs_protocol.connect(host, port, key, pin, cipher, timeout, via)
        self.timeout = call_timeout
        self.lock = threading.Lock()
        self.pending: Dict[int, _Pending] = {}
        self.next_req = 1
        self.dead: Optional[str] = None
        # a peer that stops reading or stops mid-frame is gone after the same bound
        self.conn = fs_protocol.FrameConn(sock, macs, on_frame=self._on_frame,
                                          on_close=self._on_close, frame_seconds=call_timeout,
                                          stall_seconds=call_timeout)
        self.conn.start("fs-direct-%s:%d" % (host, port))

    def submit(self, call: str, args: Dict[str, Any], p: _Pending, block: bool = True) -> int:
        with self.lock:
            if self.dead is not None:
                raise _ConnectionLost(self.dead, sent=False)
            req = self.next_req
            self.next_req += 1
            p.req, p.channel = req, self
            self.pending[req] = p
        try:
            self.conn.send_frame(fs_protocol.call_frame(req, call, args), block=block,
                                 timeout=self.timeout)
        except _ConnectionLost as e:
            self.forget(req)
            raise _ConnectionLost(str(e), sent=False)
        return req

    def forget(self, req: int) -> None:
        with self.lock:
            self.pending.pop(req, None)

    def close(self, reason: str = "closed") -> None:
        self.conn.close(reason)

    def _on_frame(self, body: bytes) -> None:
        msg = fs_protocol.decode(body, ("fs_reply", "fs_data"))
        req = msg["req"]
        with self.lock:
            p = self.pending.get(req)
        if p is None:
            return                  # a call we gave up on, or data after a cancel
        if msg["op"] == "fs_reply":
            finished = not p.on_reply(msg["errno"], msg["result"])
        else:
            finished = p.on_data(msg)
        if finished:
            with self.lock:
                if self.pending.get(req) is p:
                    del self.pending[req]

    def _on_close(self, reason: str) -> None:
        with self.lock:
            self.dead = reason or "connection closed"
            lost = list(self.pending.values())
            self.pending.clear()
        for p in lost:
            p.on_lost(self.dead)


class _DirList(_Pending):
    def __init__(self) -> None:
        _Pending.__init__(self)
        self.names: List[str] = []

    def on_reply(self, err: int, result: Any) -> bool:
        if not err and (not isinstance(result, dict) or not isinstance(result.get("names"), list)
                        or not all(isinstance(n, str) for n in result["names"])):
            err = errno.EIO
        self.errno = err
        if err:
            self.done.set()
            return False
        self.names = list(result["names"])
        if result.get("more") is True:
            return True
        self.done.set()
        return False

    def on_data(self, msg: Dict[str, Any]) -> bool:
        if msg["data"]:
            self.names.extend(os.fsdecode(n) for n in msg["data"].split(b"\0"))
        if msg["eof"]:
            if msg.get("errno"):
                self.errno = errno.EIO
            self.done.set()
            return True
        return False
