"""The SFTP request multiplexer: one channel, one reader thread matching
responses to requests by id, so any number of FUSE threads can have requests in
flight at once (paramiko's SFTPClient reads responses in the calling thread,
which is not safe from several threads, and its prefetch is limited to 32 KiB
requests). Paramiko supplies the transport, channel, packet framing (BaseSFTP)
and attribute codec. A watchdog bounds every request (see SftpSession).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time

import paramiko
from paramiko.message import Message
from paramiko.sftp import CMD_EXTENDED, CMD_INIT, CMD_STATUS, CMD_VERSION, BaseSFTP, int64
from paramiko.sftp_attr import SFTPAttributes

from sshfsmux.sftp.ssh_connect import MAX_PACKET, WINDOW, ConnectError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple

DEFAULT_TIMEOUT = 30.0        # seconds a request may go unanswered before the host counts as gone
RETRY_SECONDS = 5.0           # after a host stopped answering, accesses fail at once this long
STREAM_CHUNK = 255 * 1024     # OpenSSH's largest read (limits@openssh.com says so too)
STREAM_INFLIGHT = 16          # 4 MiB in flight
WRITE_CHUNK = 128 * 1024
WRITE_INFLIGHT = 64

SSH_FXF_READ = 0x01
SSH_FXF_WRITE = 0x02
SSH_FXF_APPEND = 0x04
SSH_FXF_CREAT = 0x08
SSH_FXF_TRUNC = 0x10
SSH_FXF_EXCL = 0x20

FX_OK, FX_EOF, FX_NO_SUCH_FILE, FX_PERMISSION_DENIED, FX_FAILURE = 0, 1, 2, 3, 4
FX_BAD_MESSAGE, FX_NO_CONNECTION, FX_CONNECTION_LOST, FX_OP_UNSUPPORTED = 5, 6, 7, 8
_STATUS_ERRNO = {
    FX_EOF: errno.EIO,  # callers that expect EOF handle it themselves
    FX_NO_SUCH_FILE: errno.ENOENT,
    FX_PERMISSION_DENIED: errno.EACCES,
    FX_FAILURE: errno.EIO,
    FX_BAD_MESSAGE: errno.EINVAL,
    FX_NO_CONNECTION: errno.ENOTCONN,
    FX_CONNECTION_LOST: errno.EIO,
    FX_OP_UNSUPPORTED: errno.ENOTSUP,
}

def _err(code: int, what: str = "") -> OSError:
    return OSError(code, os.strerror(code), what) if what else OSError(code, os.strerror(code))

def _enc(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")

def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")

class ConnectionLost(OSError):
    def __init__(self, reason: str = "connection lost") -> None:
        super().__init__(errno.EIO, reason)

class StatusError(OSError):
    """An SFTP status other than OK, with the SFTP code kept."""

    errno: int      # never None here: every SFTP code maps to one (EIO by default)

    def __init__(self, code: int, text: str) -> None:
        e = _STATUS_ERRNO.get(code, errno.EIO)
        if code != FX_FAILURE:
            message = os.strerror(e)
        else:
            message = "Failure" + (": " + text if text and text != "Failure" else "")
        super().__init__(e, message)
        self.code = code

# --------------------------------------------------------------------------
# the request multiplexer
# --------------------------------------------------------------------------

class _Req:
    __slots__ = ("event", "t", "data", "error", "callback", "sent")

    def __init__(self, callback: Optional[Callable] = None) -> None:
        self.event = None if callback else threading.Event()
        self.sent = time.monotonic()
        self.t = 0
        self.data = b""
        self.error: Optional[BaseException] = None
        self.callback = callback

def _pack(msg: Message, args: tuple) -> None:
    for a in args:
        if isinstance(a, int64):
            msg.add_int64(a)
        elif isinstance(a, int):
            msg.add_int(a)
        elif isinstance(a, SFTPAttributes):
            a._pack(msg)
        else:
            msg.add_string(_enc(a))

def check_status(t: int, data: bytes) -> None:
    """Raise for a STATUS response other than OK (data without the request id)."""
    if t != CMD_STATUS:
        return
    m = Message(data)
    code = m.get_int()
    if code == FX_OK:
        return
    try:
        text = m.get_text()
    except Exception:
        text = ""
    raise StatusError(code, text)

class SftpSession(BaseSFTP):
    """One SFTP channel with a reader thread; thread-safe.

    A watchdog thread bounds every request: when requests are in flight and
    nothing at all has arrived for `request_timeout` seconds since the oldest
    of them was sent, the host is taken for gone and the session dies (every
    request in flight fails with EIO, the transport is closed). Counting from
    the last packet received, not from each request, keeps a slow but live
    link (many pipelined writes draining at a few hundred kB/s) alive."""

    def __init__(self, transport: paramiko.Transport, timeout: float = 20.0,
                 request_timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        self.transport = transport
        self.request_timeout = request_timeout
        self.timed_out = False
        self.dead_at = 0.0
        self._last_rx = time.monotonic()
        chan = transport.open_session(window_size=WINDOW, max_packet_size=MAX_PACKET,
                                      timeout=timeout)
        chan.settimeout(timeout)       # for the handshake only
        chan.invoke_subsystem("sftp")
        self.sock = chan
        self.chan = chan
        m = Message()
        m.add_int(3)
        self._send_packet(CMD_INIT, m)
        try:
            t, data = self._read_packet()
        except socket.timeout:
            raise ConnectError("the SFTP subsystem did not answer")
        chan.settimeout(None)
        if t != CMD_VERSION:
            raise ConnectError("the server did not start an SFTP subsystem")
        m = Message(data)
        self.version = m.get_int()
        self.extensions: Dict[str, bytes] = {}
        while m.get_remainder():
            try:
                name = _dec(m.get_string())
                self.extensions[name] = m.get_string()
            except Exception:
                break
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)   # pending became non-empty, or dead
        self._send_lock = threading.Lock()
        self._pending: Dict[int, _Req] = {}  # in the order sent
        self._next = 1
        self.dead: Optional[str] = None
        self._thread = threading.Thread(target=self._run, name="sftp-reader", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, name="sftp-watchdog", daemon=True).start()
        self.read_chunk = STREAM_CHUNK
        self.write_chunk = WRITE_CHUNK
        if "limits@openssh.com" in self.extensions:
            try:
                t, data = self.request(CMD_EXTENDED, "limits@openssh.com")
                m = Message(data)
                m.get_int64()                       # max packet length
                max_read, max_write = m.get_int64(), m.get_int64()
                if max_read > 0:
                    self.read_chunk = max(32 * 1024, min(max_read, 1024 * 1024))
                if max_write > 0:
                    self.write_chunk = max(32 * 1024, min(max_write, 1024 * 1024))
            except (OSError, Exception):
                pass

    # -- framing -------------------------------------------------------
    def _read_all(self, n: int) -> bytes:
        parts = []
        while n > 0:
            x = self.chan.recv(n)
            if not x:
                raise EOFError()
            parts.append(x)
            n -= len(x)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_packet(self) -> Tuple[int, bytes]:
        head = self._read_all(5)
        size, t = struct.unpack(">IB", head)
        if size > 64 * 1024 * 1024 or size < 1:
            raise EOFError("garbage packet")
        return t, self._read_all(size - 1) if size > 1 else b""

    def _send_packet(self, t: int, packet: Message) -> None:
        body = packet.asbytes()
        self.chan.sendall(struct.pack(">IB", len(body) + 1, t) + body)

    # -- requests ------------------------------------------------------
    def send(self, t: int, args: tuple, callback: Optional[Callable] = None) -> _Req:
        req = _Req(callback)
        with self._lock:
            if self.dead:
                raise ConnectionLost(self.dead)
            rid = self._next
            self._next = (self._next + 1) & 0xFFFFFFFF or 1
            if not self._pending:
                self._changed.notify()
            self._pending[rid] = req
        msg = Message()
        msg.add_int(rid)
        _pack(msg, args)
        try:
            with self._send_lock:
                self._send_packet(t, msg)
        except Exception as e:
            with self._lock:
                self._pending.pop(rid, None)
            self._die("send failed: %s" % e)
            raise ConnectionLost(self.dead or "connection lost")
        return req

    def request(self, t: int, *args: Any) -> Tuple[int, bytes]:
        """Send and wait; returns (type, data after the id). STATUS errors raise."""
        req = self.send(t, args)
        assert req.event is not None     # no callback: a waiting request
        # the watchdog ends the wait; the check here only guards against a bug there
        while not req.event.wait(self.request_timeout):
            if time.monotonic() - max(req.sent, self._last_rx) > self.request_timeout * 2 + 5:
                self._expire()
        if req.error is not None:
            raise req.error
        check_status(req.t, req.data)
        return req.t, req.data

    def _run(self) -> None:
        try:
            while True:
                t, data = self._read_packet()
                self._last_rx = time.monotonic()
                if len(data) < 4:
                    continue
                rid = struct.unpack_from(">I", data)[0]
                with self._lock:
                    req = self._pending.pop(rid, None)
                if req is None:
                    continue
                if req.callback is not None:
                    try:
                        req.callback(t, data, None)
                    except Exception:
                        pass
                else:
                    assert req.event is not None     # no callback: a waiting request
                    req.t, req.data = t, data[4:]
                    req.event.set()
        except BaseException as e:
            self._die("connection lost (%s)" % (e or type(e).__name__))

    def _watch(self) -> None:
        with self._lock:
            while self.dead is None:
                if not self._pending:
                    self._changed.wait()
                    continue
                oldest = next(iter(self._pending.values()))
                heard = max(oldest.sent, self._last_rx)
                left = heard + self.request_timeout - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                break
        if self.dead is None:
            self._expire()

    def _expire(self) -> None:
        """No answer within the bound: the host is gone (or unreachable)."""
        self.timed_out = True
        self._die("no answer within %gs" % self.request_timeout)
        try:
            self.transport.close()     # unblocks a send stuck on a full window too
        except Exception:
            pass

    def _die(self, reason: str) -> None:
        with self._lock:
            if self.dead is None:
                self.dead = reason
                self.dead_at = time.monotonic()
            pending, self._pending = self._pending, {}
            self._changed.notify_all()
        err = ConnectionLost(self.dead or reason)
        for req in pending.values():
            if req.callback is not None:
                try:
                    req.callback(0, b"", err)
                except Exception:
                    pass
            else:
                assert req.event is not None     # no callback: a waiting request
                req.error = err
                req.event.set()

    @property
    def alive(self) -> bool:
        return self.dead is None and self.transport.is_active()

    def close(self) -> None:
        self._die("closed")
        try:
            self.chan.close()
        except Exception:
            pass

def _handle_of(data: bytes) -> bytes:
    return Message(data).get_string()
