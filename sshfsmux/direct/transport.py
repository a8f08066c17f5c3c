"""The transport of the direct data channel: the handshake and the framed
connection both ends share.

Connection. TCP to the exporting agent, then link_auth's handshake keyed with
`data_channel_key(session secret)`: HMAC mutual proof over fresh nonces, TLS with
the session certificate pinned, a proof inside TLS (label "fs"). With
cipher=False (the mount's `-o cipher=none`, for trusted networks) the label is
"fs-none": the same mutual HMAC proof, no TLS, and every frame afterwards carries
a 16-byte HMAC-SHA256 tag under a per-connection, per-direction key derived from
the session key and both nonces, over a sequence number, the destination and the
message. So data crosses the wire in clear but nobody without the key can
inject, replay, reorder or splice frames; authentication is never off. The label
is covered by the proofs and each server accepts only its own, so nobody can
downgrade a TLS server.

Frames are gxpstyle.protocol.wire frames, parsed by wire.FrameReader (each length checked
against max_frame before buffering); fs_protocol decodes and checks the message.
The two ends of a data channel need no addresses, so with cipher=none the
source address of every frame carries its tag (32 hex digits): the frames stay
plain wire frames.

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import os
import select
import socket
import ssl
import struct
import threading
import time

from gxpstyle.protocol import wire
from gxpstyle.transport import link_auth

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Tuple

LABEL = "fs"
LABEL_PLAIN = "fs-none"
TAG_BYTES = 16
TAG_CHARS = 2 * TAG_BYTES      # the tag as a wire address: hex digits
_SEQ = struct.Struct("!Q")
_LEN = struct.Struct("!I")


def frame_tag(key: bytes, seq: int, dst_part: Any, message: Any) -> bytes:
    """The tag of frame number `seq` (cipher=none): HMAC over the sequence number,
    the destination (its length byte and address) and the message."""
    h = hmac.new(key, _SEQ.pack(seq), hashlib.sha256)
    h.update(dst_part)
    h.update(message)
    return h.digest()[:TAG_BYTES].hex().encode("ascii")


def tag_frame(key: bytes, seq: int, frame: bytes) -> Tuple[bytes, Any]:
    """A complete wire frame with its source address replaced by its tag, as
    (header, message) pieces to send one after the other."""
    dl = frame[4]
    sl = frame[5 + dl]
    dst_part = frame[4:5 + dl]
    message = memoryview(frame)[6 + dl + sl:]
    tag = frame_tag(key, seq, dst_part, message)
    head = _LEN.pack(2 + dl + TAG_CHARS + len(message)) + dst_part + bytes((TAG_CHARS,)) + tag
    return head, message


def check_tag(key: bytes, seq: int, frame: bytes) -> None:
    """Check the tag in the source address of a frame (no length prefix);
    wire.FrameError if it is not the one frame number `seq` must carry."""
    dl = frame[0]
    if dl > wire.MAX_ADDR or 2 + dl > len(frame) or frame[1 + dl] != TAG_CHARS:
        raise wire.FrameError("bad frame MAC")
    start = 2 + dl + TAG_CHARS
    if start > len(frame):
        raise wire.FrameError("bad frame MAC")
    mv = memoryview(frame)
    want = frame_tag(key, seq, mv[:1 + dl], mv[start:])
    if not hmac.compare_digest(bytes(mv[2 + dl:start]), want):
        raise wire.FrameError("bad frame MAC")


# --- handshake ----------------------------------------------------------------

def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise link_auth.AuthError("handshake timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:
            raise link_auth.AuthError("handshake timed out")
        if not chunk:
            raise link_auth.AuthError("peer closed during handshake")
        buf += chunk
    return buf


def _plain_keys(key: bytes, nc: bytes, ns: bytes) -> Tuple[bytes, bytes]:
    """(client-to-server, server-to-client) frame MAC keys."""
    return (_mac(key, b"fs-none c2s", nc, ns), _mac(key, b"fs-none s2c", nc, ns))


def plain_client_handshake(sock: socket.socket, key: bytes,
                           timeout: float = link_auth.HANDSHAKE_SECONDS) -> Tuple[bytes, bytes]:
    """link_auth's clear-text mutual proof for label "fs-none"; returns the frame
    MAC keys (send, receive). Raises link_auth.AuthError."""
    deadline = time.monotonic() + timeout
    lab = LABEL_PLAIN.encode("ascii")
    nc = os.urandom(32)
    sock.sendall(link_auth.MAGIC + bytes((len(lab),)) + lab + nc)
    ns = _recv_exact(sock, 32, deadline)
    sock.sendall(_mac(key, b"c1", lab, nc, ns))
    proof = _recv_exact(sock, 32, deadline)
    if not hmac.compare_digest(proof, _mac(key, b"s1", lab, nc, ns)):
        raise link_auth.AuthError("server failed to prove the key")
    c2s, s2c = _plain_keys(key, nc, ns)
    return c2s, s2c


def plain_server_handshake(sock: socket.socket, key: bytes,
                           timeout: float = link_auth.HANDSHAKE_SECONDS) -> Tuple[bytes, bytes]:
    """The server side of plain_client_handshake; returns (send, receive) keys."""
    deadline = time.monotonic() + timeout
    head = _recv_exact(sock, 5, deadline)
    if head[:4] != link_auth.MAGIC:
        raise link_auth.AuthError("bad magic")
    lab = _recv_exact(sock, head[4], deadline) if head[4] else b""
    nc = _recv_exact(sock, 32, deadline)
    if lab != LABEL_PLAIN.encode("ascii"):
        raise link_auth.AuthError("unknown label")
    ns = os.urandom(32)
    sock.sendall(ns)
    proof = _recv_exact(sock, 32, deadline)
    if not hmac.compare_digest(proof, _mac(key, b"c1", lab, nc, ns)):
        raise link_auth.AuthError("client failed to prove the key")
    sock.sendall(_mac(key, b"s1", lab, nc, ns))
    c2s, s2c = _plain_keys(key, nc, ns)
    return s2c, c2s


def tune_socket(sock: socket.socket) -> None:
    for level, opt in ((socket.IPPROTO_TCP, socket.TCP_NODELAY),
                       (socket.SOL_SOCKET, socket.SO_KEEPALIVE)):
        try:
            sock.setsockopt(level, opt, 1)
        except OSError:
            pass


def connect(host: Optional[str], port: int, key: bytes, pin: Optional[str], cipher: bool = True,
            timeout: float = link_auth.HANDSHAKE_SECONDS,
            via: Optional[Callable[[float], socket.socket]] = None,
            ) -> Tuple[socket.socket, Optional[Tuple[bytes, bytes]]]:
    """An authenticated data channel socket and its frame MAC keys (None with
    TLS). Raises link_auth.AuthError or OSError.

    host None: straight through `via`. Otherwise, found by trying: when the
    direct connection cannot be made (refused, unreachable, no answer within
    `timeout`) or what answers there is not the export (its proofs fail: the
    same private address on another site), `via(timeout)` gives a socket that
    reaches the same port another way (the tree: NodeHost.open_stream), and
    the handshake runs over that, end to end."""
    if host is not None:
        try:
            return _handshake(socket.create_connection((host, port), timeout=timeout),
                              key, pin, cipher, timeout)
        except (OSError, link_auth.AuthError):
            if via is None:
                raise
    if via is None:
        raise OSError(errno.EHOSTUNREACH, "no way to the export")
    return _handshake(via(timeout), key, pin, cipher, timeout)


def _handshake(sock: socket.socket, key: bytes, pin: Optional[str], cipher: bool,
               timeout: float) -> Tuple[socket.socket, Optional[Tuple[bytes, bytes]]]:
    try:
        tune_socket(sock)
        if cipher:
            if not pin:
                raise link_auth.AuthError("no certificate pin for an encrypted channel")
            return link_auth.client_handshake(sock, LABEL, key, pin, timeout), None
        return sock, plain_client_handshake(sock, key, timeout)
    except BaseException:
        sock.close()
        raise


# --- transport ----------------------------------------------------------------

class ConnectionLost(Exception):
    """The connection is gone; `sent` tells whether the request may have left."""

    def __init__(self, reason: str, sent: bool = False) -> None:
        Exception.__init__(self, reason)
        self.sent = sent


RECV_BUDGET = 1 << 20       # bytes read per loop turn before writing gets a chance
SEND_MAX = 256 << 10        # bytes handed to one send() or asked of one recv()


class FrameConn:
    """One authenticated socket (TLS, or plain with frame MACs) driven by one
    thread with non-blocking I/O: an SSL object is never used from two threads.

    Incoming frames go to on_frame(body) in the I/O thread; it may raise
    wire.FrameError to drop the peer. Any thread may send_frame(); other threads
    block while more than out_high bytes wait (the I/O thread never blocks). With
    pause_when_full the connection stops reading while its output is over
    out_high, so a peer that does not read its replies cannot grow our memory.
    producer() is called in the I/O thread while the output is below out_low and
    returns whether it queued something (stream data). A frame must arrive
    within frame_seconds of its first byte and queued output must move within
    stall_seconds, else the peer is dropped. on_close(reason) runs once, last."""

    def __init__(self, sock: socket.socket, macs: Optional[Tuple[bytes, bytes]] = None,
                 on_frame: Optional[Callable[[Any], None]] = None,
                 on_close: Optional[Callable[[str], None]] = None,
                 producer: Optional[Callable[[], bool]] = None,
                 pause_when_full: bool = False, out_high: int = 4 << 20, out_low: int = 1 << 20,
                 frame_seconds: float = 60.0, stall_seconds: float = 300.0,
                 max_frame: int = wire.MAX_FRAME) -> None:
        self.sock = sock
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.send_key: Optional[bytes] = macs[0] if macs else None
        self.recv_key: Optional[bytes] = macs[1] if macs else None
        self.send_seq = self.recv_seq = 0
        self.on_frame = on_frame
        self.on_close = on_close
        self.producer = producer
        self.pause_when_full = pause_when_full
        self.out_high, self.out_low = out_high, out_low
        self.frame_seconds, self.stall_seconds = frame_seconds, stall_seconds
        self.max_frame = max_frame
        self.reason = ""
        self.closing = False
        self.frames_in = 0
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._out: collections.deque = collections.deque()
        self._out_bytes = 0
        self._head_off = 0
        self._retry_len = 0                 # an SSL write must be retried with the same length
        self._last_progress = time.monotonic()
        self._reader = wire.FrameReader(max_frame)
        self._stage = bytearray(SEND_MAX)   # where reads land
        self._partial_since: Optional[float] = None
        self._read_wants_write = False
        self._write_wants_read = False
        self._io_ident: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        sock.setblocking(False)

    # -- any thread ------------------------------------------------------------
    def start(self, name: str = "fs-conn") -> None:
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()

    def send_frame(self, frame: bytes, block: bool = True, timeout: Optional[float] = None) -> None:
        """Queue a complete wire frame (with its length prefix). Raises ConnectionLost."""
        in_io = threading.get_ident() == self._io_ident
        with self._lock:
            if block and not in_io:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self._out_bytes >= self.out_high and not self.closing:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise ConnectionLost("timed out waiting to send")
                    self._space.wait(left)     # notified as the queue drains or closes
            if self.closing:
                raise ConnectionLost(self.reason or "connection closed")
            was_empty = self._out_bytes == 0
            if self.send_key is not None:
                head, message = tag_frame(self.send_key, self.send_seq, frame)
                self.send_seq += 1
                self._out.append(head)
                self._out.append(message)
                self._out_bytes += len(head) + len(message)
            else:
                self._out.append(frame)
                self._out_bytes += len(frame)
            if was_empty:
                self._last_progress = time.monotonic()
        if was_empty and not in_io:
            self._wake()

    @property
    def queued(self) -> int:
        return self._out_bytes

    def close(self, reason: str = "closed") -> None:
        with self._lock:
            if not self.closing:
                self.closing = True
                self.reason = reason
            self._space.notify_all()
        self._wake()

    def join(self, timeout: Optional[float] = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    # -- the I/O thread -------------------------------------------------------
    def run(self) -> None:
        self._io_ident = threading.get_ident()
        reason = ""
        try:
            self._loop()
        except wire.FrameError as e:
            reason = "bad frame: %s" % e
        except ConnectionLost as e:
            reason = str(e)
        except ssl.SSLError as e:
            reason = "TLS error: %s" % (e.reason or e.__class__.__name__)
        except OSError as e:
            reason = "socket error: %s" % (os.strerror(e.errno) if e.errno else e)
        except Exception as e:      # a bug must not take the process down with it
            reason = "internal error: %s: %s" % (e.__class__.__name__, e)
        self._shutdown(reason)

    def _shutdown(self, reason: str) -> None:
        with self._lock:
            if not self.closing:
                self.closing = True
                self.reason = reason
            elif not self.reason:
                self.reason = reason
            self._out.clear()
            self._out_bytes = 0
            self._space.notify_all()
        for s in (self.sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        self._reader = wire.FrameReader(self.max_frame)      # let go of a partial frame
        if self.on_close is not None:
            self.on_close(self.reason)

    def _loop(self) -> None:
        poller = select.poll()
        sfd = self.sock.fileno()
        poller.register(self._wake_r.fileno(), select.POLLIN)
        poller.register(sfd, select.POLLIN)
        registered = select.POLLIN
        paused = False
        while not self.closing:
            if self.producer is not None:
                while self._out_bytes < self.out_low and not self.closing and self.producer():
                    pass
            now_paused = self.pause_when_full and self._out_bytes >= self.out_high
            if paused and not now_paused and self._reader.pending:
                self._partial_since = time.monotonic()   # the peer's clock stood still too
            paused = now_paused
            if not paused and self.tls and self.sock.pending():  # type: ignore[attr-defined]
                self._read()
                self._write()
                continue
            want = 0
            if not paused or self._write_wants_read:
                want |= select.POLLIN
            if self._out_bytes or self._read_wants_write:
                want |= select.POLLOUT
            if want != registered:
                poller.modify(sfd, want)
                registered = want
            events = poller.poll(self._wait_ms())
            readable = writable = False
            for fd, ev in events:
                if fd == sfd:
                    if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                        readable = True
                    if ev & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                        writable = True
                else:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
            if self.closing:
                break
            if writable or (readable and self._write_wants_read):
                self._write()
            if readable and (not paused or self._read_wants_write):
                self._read()
            elif writable and self._read_wants_write:
                self._read()
            self._check_deadlines()

    def _wait_ms(self) -> Optional[int]:
        """How long the poll may wait: until the first deadline _check_deadlines
        enforces, or without end (None) while none runs: the wake-up pipe and
        the socket bring every other change."""
        due = None
        if self._partial_since is not None and self._reader.pending:
            due = self._partial_since + self.frame_seconds
        if self._out_bytes:
            stall = self._last_progress + self.stall_seconds
            due = stall if due is None else min(due, stall)
        if due is None:
            return None
        return max(0, int((due - time.monotonic()) * 1000) + 1)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if (self._partial_since is not None and self._reader.pending
                and now - self._partial_since > self.frame_seconds):
            raise ConnectionLost("slow peer: frame incomplete after %.0f s" % self.frame_seconds)
        if self._out_bytes and now - self._last_progress > self.stall_seconds:
            raise ConnectionLost("peer stopped reading for %.0f s" % self.stall_seconds)

    def _read(self) -> None:
        self._read_wants_write = False
        got = 0
        while got < RECV_BUDGET and not self.closing:
            try:
                n = self.sock.recv_into(self._stage)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                break
            except ssl.SSLWantWriteError:
                self._read_wants_write = True
                break
            if not n:
                if self._reader.pending:
                    raise ConnectionLost("truncated frame: peer closed mid-frame")
                raise ConnectionLost("peer closed")
            got += n
            with memoryview(self._stage) as mv:
                frames = self._reader.feed(mv[:n])     # lengths checked before buffering
            for frame in frames:
                if self.closing:
                    return
                self._deliver(frame)
            # a frame must arrive within frame_seconds of its first byte
            if frames:
                self._partial_since = time.monotonic() if self._reader.pending else None
            elif self._partial_since is None:
                self._partial_since = time.monotonic()
            if self.pause_when_full and self._out_bytes >= self.out_high:
                break

    def _deliver(self, frame: bytes) -> None:
        """Check a whole frame (no length prefix; with cipher=none its tag) and
        hand it on."""
        if self.recv_key is not None:
            check_tag(self.recv_key, self.recv_seq, frame)
            self.recv_seq += 1
        self.frames_in += 1
        if self.on_frame is not None:
            self.on_frame(frame)

    def _write(self) -> None:
        self._write_wants_read = False
        sent = 0
        while sent < RECV_BUDGET:
            with self._lock:
                if not self._out:
                    return
                head = self._out[0]
                off = self._head_off
            n_try = self._retry_len or min(len(head) - off, SEND_MAX)
            try:
                with memoryview(head) as mv:
                    n = self.sock.send(mv[off:off + n_try])
            except ssl.SSLWantWriteError:
                self._retry_len = n_try
                return
            except ssl.SSLWantReadError:
                self._retry_len = n_try
                self._write_wants_read = True
                return
            except (BlockingIOError, InterruptedError):
                return
            self._retry_len = 0
            if n <= 0:
                return
            sent += n
            with self._lock:
                self._head_off += n
                self._out_bytes -= n
                if self._head_off >= len(head):
                    self._out.popleft()
                    self._head_off = 0
                if self._out_bytes < self.out_high:
                    self._space.notify_all()
                self._last_progress = time.monotonic()
