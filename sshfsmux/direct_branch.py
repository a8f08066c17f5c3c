"""A branch on another agent's export, over the direct data channel
(SSHFSM-Direct): file data moves over one authenticated TCP connection to the
exporting agent instead of through SSH.

    branch = DirectBranch(host, port, key, pin, node, cipher=True, cache_dir=...)

`key` is fs_protocol.data_channel_key(session secret); `pin` the session
certificate's SHA-256 (unused with cipher=False, which keeps the mutual HMAC
authentication and authenticates every frame, but sends data in clear).

One persistent connection carries every call, matched to its reply by request
id, so any number of FUSE threads can call at once. If the connection drops, the
next call connects again (once per call); a call that may already have reached
the server is sent again only if it is idempotent, else it fails with EIO.

Reads. open_read asks for the whole file once ("read_file"): the server streams
it back to back at link speed into a replica file in cache_dir, and reads are
served from that file as soon as the bytes they need have arrived. A replica is
written under a temporary name and renamed to its final name only when the
stream is complete, the file did not change while it was sent (same size, mtime
and ctime) and its times had settled (older than fs_protocol.SETTLE_SECONDS on
the server, so a later change cannot hide within the same timestamp): replicas
are complete and immutable, or invisible. The next open_read of the same path
sends the replica's (size, mtime, ctime, inode); while the server finds them
unchanged it answers without data and the replica is read locally.

Writes are buffered per handle, sent in frames of up to fs_protocol.MAX_IO
without waiting for each acknowledgement; flush, fsync, read and close wait for
every outstanding acknowledgement and report the first error.

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time

from gxpstyle import link_auth
from sshfsmux import fs_protocol
from sshfsmux.branch import STAT_KEYS, Branch, ReadHandle, WriteHandle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

CALL_SECONDS = 20.0         # default: a call, or a stream standing still, longer than this fails
MAX_CALL_SECONDS = 3600.0
RETRY_SECONDS = 5.0         # after the export stopped answering, calls fail at once this long
WRITE_FRAME = fs_protocol.MAX_IO
TMP_PREFIX = ".tmp-"
TMP_MAX_AGE = 3600.0        # leftovers of a crashed run older than this are removed
_HAVE_KEYS = ("size", "mtime_ns", "ctime_ns", "ino")
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
    channel = None      # type: Any

    def __init__(self) -> None:
        self.done = threading.Event()
        self.errno = 0
        self.result = None      # type: Any
        self.lost = None        # type: Optional[str]

    def on_reply(self, err: int, result: Any) -> bool:
        """Store the reply; True if fs_data frames follow."""
        self.errno, self.result = err, result
        self.done.set()
        return False

    def on_data(self, msg: "Dict[str, Any]") -> bool:
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

    def __init__(self, host: str, port: int, key: bytes, pin: "Optional[str]", cipher: bool,
                 timeout: float, call_timeout: float) -> None:
        sock, macs = fs_protocol.connect(host, port, key, pin, cipher, timeout)
        self.timeout = call_timeout
        self.lock = threading.Lock()
        self.pending = {}           # type: Dict[int, _Pending]
        self.next_req = 1
        self.dead = None            # type: Optional[str]
        # a peer that stops reading or stops mid-frame is gone after the same bound
        self.conn = fs_protocol.FrameConn(sock, macs, on_frame=self._on_frame,
                                          on_close=self._on_close, frame_seconds=call_timeout,
                                          stall_seconds=call_timeout)
        self.conn.start("fs-direct-%s:%d" % (host, port))

    def submit(self, call: str, args: "Dict[str, Any]", p: _Pending, block: bool = True) -> int:
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
        self.names = []             # type: List[str]

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

    def on_data(self, msg: "Dict[str, Any]") -> bool:
        if msg["data"]:
            self.names.extend(os.fsdecode(n) for n in msg["data"].split(b"\0"))
        if msg["eof"]:
            if msg.get("errno"):
                self.errno = errno.EIO
            self.done.set()
            return True
        return False


class _Fetch(_Pending):
    """A whole-file stream into a replica file; readers wait on `cond` for bytes."""

    def __init__(self, branch: "DirectBranch", key: str) -> None:
        _Pending.__init__(self)
        self.branch = branch
        self.key = key
        self.cond = threading.Condition()
        self.fd = -1
        self.reader_fd = -1
        self.tmp = None             # type: Optional[str]
        self.meta = None            # type: Optional[Tuple[int, int, int, int]]
        self.received = 0
        self.complete = False
        self.failed = None          # type: Optional[str]
        self.progress = time.monotonic()

    def on_reply(self, err: int, result: Any) -> bool:
        if not err:
            try:
                meta = tuple(int(result[k]) for k in _HAVE_KEYS)
                unchanged = result["unchanged"] is True
            except (TypeError, KeyError, ValueError):
                err = errno.EIO
        if err:
            self.errno = err
            self.done.set()
            return False
        self.result = result
        if unchanged:
            self.done.set()
            return False
        self.meta = meta        # type: ignore
        try:
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=self.branch.cache_dir)
            self.fd, self.tmp = fd, tmp
            self.reader_fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            self._discard()
            self.errno = e.errno or errno.EIO
            self._cancel()
            self.done.set()
            return True         # the (cancelled) stream still ends with an eof frame
        self.done.set()
        return True

    def _cancel(self) -> None:
        ch = self.channel
        if ch is None:
            return
        try:
            ch.submit("cancel", {"req": self.req}, _Pending(), block=False)
        except _ConnectionLost:
            pass

    def on_data(self, msg: "Dict[str, Any]") -> bool:
        data = msg["data"]
        if data and self.fd >= 0 and self.failed is None:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError as e:
                self._fail("writing the replica: %s" % os.strerror(e.errno or errno.EIO))
                self._cancel()
            else:
                with self.cond:
                    self.received += len(data)
                    self.progress = time.monotonic()
                    self.cond.notify_all()
        if msg["eof"]:
            self._finish(msg)
            return True
        return False

    def _finish(self, msg: "Dict[str, Any]") -> None:
        err = msg.get("errno", 0)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if err or msg.get("size") != self.received:
            self._fail("stream ended with %s" % (os.strerror(err) if isinstance(err, int) and err
                                                 else "a wrong size"))
        meta = self.meta
        if (self.failed is None and self.tmp is not None and meta is not None
                and msg.get("settled") is True and self.received == meta[0]
                and msg.get("mtime_ns") == meta[1] and msg.get("ctime_ns") == meta[2]):
            self.branch._publish(self.key, meta, self.tmp)
        else:
            self._discard()
        with self.cond:
            self.complete = True
            self.cond.notify_all()

    def _fail(self, why: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = why
            self.cond.notify_all()

    def _discard(self) -> None:
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None

    def on_lost(self, reason: str) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._discard()
        self._fail("connection lost: %s" % reason)
        with self.cond:
            self.complete = True
            self.cond.notify_all()
        _Pending.on_lost(self, reason)      # reader_fd stays for the opener to take or drop

    def take_reader(self) -> int:
        with self.cond:
            fd, self.reader_fd = self.reader_fd, -1
            return fd

    def drop_reader(self) -> None:
        fd = self.take_reader()
        if fd >= 0:
            os.close(fd)

    def wait_for(self, end: int, timeout: float) -> None:
        """Block until bytes [0, end) are in the replica or the stream is over."""
        with self.cond:
            while not self.complete and self.received < end:
                left = self.progress + timeout - time.monotonic()
                if left <= 0:
                    raise _oserror(errno.EIO, "the stream stood still for %gs" % timeout)
                self.cond.wait(min(left, 1.0))
            if self.received < end and self.failed is not None:
                raise _oserror(errno.EIO, self.failed)


class _WriteAck(_Pending):
    def __init__(self, handle: "_RemoteFile", expect: int) -> None:
        _Pending.__init__(self)
        self.handle = handle
        self.expect = expect

    def on_reply(self, err: int, result: Any) -> bool:
        if not err and result != self.expect:
            err = errno.EIO
        self.handle._ack(err)
        return False

    def on_lost(self, reason: str) -> None:
        self.handle._ack(errno.EIO)


# --- handles ------------------------------------------------------------------

class _ReplicaReader(ReadHandle):
    def __init__(self, fd: int, fetch: "Optional[_Fetch]", timeout: float) -> None:
        self.fd = fd
        self.fetch = fetch
        self.timeout = timeout
        self.lock = threading.Lock()

    def read(self, size: int, offset: int) -> bytes:
        fetch = self.fetch
        if fetch is not None:
            if fetch.complete and fetch.failed is None:
                self.fetch = None
            else:
                fetch.wait_for(offset + size, self.timeout)
        with self.lock:
            if self.fd < 0:
                raise _oserror(errno.EBADF)
            return os.pread(self.fd, size, offset)

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class _RemoteFile(WriteHandle):
    """A file open for writing on the export; writes are pipelined."""

    def __init__(self, branch: "DirectBranch", ch: _Channel, fh: int) -> None:
        self.branch = branch
        self.ch = ch
        self.fh = fh
        self.lock = threading.Lock()        # the buffer, and sending
        self.acks = threading.Condition()   # inflight, error (taken by the I/O thread)
        self.inflight = 0
        self.error = None                   # type: Optional[OSError]
        self.buf = bytearray()
        self.buf_off = 0
        self.closed = False

    # acknowledgements, from the I/O thread
    def _ack(self, err: int) -> None:
        with self.acks:
            self.inflight -= 1
            if err and self.error is None:
                self.error = _oserror(err)
            self.acks.notify_all()

    def _check(self) -> None:
        if self.closed:
            raise _oserror(errno.EBADF)
        with self.acks:
            if self.error is not None:
                raise self.error

    def _send(self, offset: int, data: bytes) -> None:
        with self.acks:
            self.inflight += 1
        try:
            self.ch.submit("write", {"fh": self.fh, "offset": offset, "data": data},
                           _WriteAck(self, len(data)))
        except _ConnectionLost as e:
            with self.acks:
                self.inflight -= 1
                if self.error is None:
                    self.error = _oserror(errno.EIO, "data channel lost: %s" % e)
            raise self.error

    def _send_buf(self) -> None:
        if self.buf:
            data, self.buf = bytes(self.buf), bytearray()
            self._send(self.buf_off, data)

    def write(self, data: bytes, offset: int) -> int:
        n = len(data)
        with self.lock:
            self._check()
            if self.buf and offset == self.buf_off + len(self.buf) and len(self.buf) + n <= WRITE_FRAME:
                self.buf += data
            else:
                self._send_buf()
                view = memoryview(data)
                pos = 0
                while n - pos >= WRITE_FRAME:
                    self._send(offset + pos, bytes(view[pos:pos + WRITE_FRAME]))
                    pos += WRITE_FRAME
                self.buf = bytearray(view[pos:])
                self.buf_off = offset + pos
            if len(self.buf) >= WRITE_FRAME:
                self._send_buf()
        return n

    def _drain(self) -> None:
        """Send the buffer and wait for every acknowledgement (lock held)."""
        self._send_buf()
        deadline = time.monotonic() + self.branch.timeout
        with self.acks:
            while self.inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.ch.close("writes not acknowledged")
                    raise _oserror(errno.EIO, "writes not acknowledged")
                self.acks.wait(left)
            if self.error is not None:
                raise self.error

    def _call(self, call: str, args: "Dict[str, Any]") -> Any:
        p = _Pending()
        try:
            self.ch.submit(call, args, p)
            return p.wait(self.branch.timeout)
        except _ConnectionLost as e:
            raise _oserror(errno.EIO, "data channel lost: %s" % e)

    def flush(self) -> None:
        with self.lock:
            self._check()
            self._drain()

    def fsync(self) -> None:
        with self.lock:
            self._check()
            self._drain()
            self._call("fsync", {"fh": self.fh})

    def truncate(self, length: int) -> None:
        with self.lock:
            self._check()
            self._drain()
            self._call("ftruncate", {"fh": self.fh, "length": length})

    def read(self, size: int, offset: int) -> bytes:
        with self.lock:
            self._check()
            self._drain()
            out = []
            while size > 0:
                piece = self._call("pread", {"fh": self.fh, "offset": offset,
                                             "size": min(size, fs_protocol.MAX_IO)})
                if not isinstance(piece, bytes):
                    raise _oserror(errno.EIO, "bad reply")
                out.append(piece)
                if len(piece) < min(size, fs_protocol.MAX_IO):
                    break
                size -= len(piece)
                offset += len(piece)
            return b"".join(out)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            first = None
            try:
                self._drain()
            except OSError as e:
                first = e
            self.closed = True
            try:
                self._call("close_write", {"fh": self.fh})
            except OSError as e:
                first = first or e
            if first is not None:
                raise first


# --- the branch -----------------------------------------------------------------

class DirectBranch(Branch):
    """A remote export reached over the direct data channel."""

    def __init__(self, host: str, port: int, key: bytes, pin: "Optional[str]", node: str,
                 cipher: bool = True, cache_dir: "Optional[str]" = None,
                 timeout: float = CALL_SECONDS,
                 connect_timeout: float = link_auth.HANDSHAKE_SECONDS,
                 writable: bool = True) -> None:
        self.host, self.port, self.key, self.pin = host, port, key, pin
        self.node = node
        self.name = "direct:%s" % node
        self.local = False
        self.writable = writable
        self.cipher = cipher
        if not 0 < timeout <= MAX_CALL_SECONDS:
            raise ValueError("timeout %r out of range" % timeout)
        self.timeout = timeout
        self.connect_timeout = min(connect_timeout, timeout)
        self._retry_at = 0.0        # no new connection before this (monotonic)
        self._chan = None           # type: Optional[_Channel]
        self._chan_lock = threading.Lock()
        self._own_cache = cache_dir is None
        if cache_dir is None:
            cache_dir = tempfile.mkdtemp(prefix="sshfsm-replicas-")
        else:
            os.makedirs(cache_dir, 0o700, exist_ok=True)
        self.cache_dir = cache_dir
        self._replicas = {}         # type: Dict[str, Tuple[Tuple[int, int, int, int], str]]
        self._cache_lock = threading.Lock()
        self.stats = {"connects": 0, "streams": 0, "reused": 0}
        self._load_cache()

    # -- connection ------------------------------------------------------------
    def _channel(self) -> _Channel:
        with self._chan_lock:
            ch = self._chan
            if ch is not None and ch.dead is None:
                return ch
            if time.monotonic() < self._retry_at:
                raise _oserror(errno.EIO, "%s is not answering" % self.node)
            try:
                ch = _Channel(self.host, self.port, self.key, self.pin, self.cipher,
                              self.connect_timeout, self.timeout)
            except link_auth.AuthError as e:
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise _oserror(errno.EACCES, "data channel to %s refused: %s" % (self.node, e))
            except OSError as e:
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise _oserror(errno.EIO, "data channel to %s: %s" % (self.node, e))
            self.stats["connects"] += 1
            self._chan = ch
            return ch

    def _call(self, call: str, args: "Dict[str, Any]",
              make: "Optional[Callable[[], _Pending]]" = None) -> "Tuple[Any, _Channel]":
        for attempt in (0, 1):
            ch = self._channel()
            p = make() if make is not None else _Pending()
            try:
                ch.submit(call, args, p)
                return p.wait(self.timeout), ch
            except _Timeout:
                # the export stopped answering: later calls fail at once for a while
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise
            except _ConnectionLost as e:
                if attempt == 0 and (not e.sent or call in fs_protocol.IDEMPOTENT):
                    continue
                raise _oserror(errno.EIO, "data channel to %s lost: %s" % (self.node, e))
        raise _oserror(errno.EIO)       # not reached

    def _do(self, call: str, **args: Any) -> Any:
        return self._call(call, args)[0]

    def close(self) -> None:
        with self._chan_lock:
            ch, self._chan = self._chan, None
        if ch is not None:
            ch.close("branch closed")
            ch.conn.join(5)
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    # -- replicas --------------------------------------------------------------
    def _key(self, rel: str) -> str:
        raw = ("%s\0%s" % (self.node, rel)).encode("utf-8", "surrogateescape")
        return hashlib.sha256(raw).hexdigest()[:40]

    @staticmethod
    def _replica_name(key: str, meta: "Tuple[int, int, int, int]") -> str:
        return "%s.%d.%d.%d.%d" % ((key,) + tuple(meta))

    def _load_cache(self) -> None:
        now = time.time()
        for name in os.listdir(self.cache_dir):
            path = os.path.join(self.cache_dir, name)
            try:
                st = os.lstat(path)
                if name.startswith(TMP_PREFIX):
                    if now - st.st_mtime > TMP_MAX_AGE:
                        os.unlink(path)
                    continue
                parts = name.split(".")
                if len(parts) != 5 or len(parts[0]) != 40:
                    continue
                meta = tuple(int(x) for x in parts[1:])
                # A replica whose length is not the one in its name is damaged (a
                # crash before the data reached the disk): never serve it.
                if not stat.S_ISREG(st.st_mode) or st.st_size != meta[0] or parts[0] in self._replicas:
                    os.unlink(path)
                    continue
                self._replicas[parts[0]] = (meta, name)    # type: ignore
            except (OSError, ValueError):
                continue

    def _publish(self, key: str, meta: "Tuple[int, int, int, int]", tmp: str) -> None:
        name = self._replica_name(key, meta)
        with self._cache_lock:
            old = self._replicas.get(key)
            try:
                os.rename(tmp, os.path.join(self.cache_dir, name))
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                return
            self._replicas[key] = (meta, name)
            if old is not None and old[1] != name:
                try:
                    os.unlink(os.path.join(self.cache_dir, old[1]))
                except OSError:
                    pass

    def _forget(self, *rels: str) -> None:
        with self._cache_lock:
            for rel in rels:
                old = self._replicas.pop(self._key(rel), None)
                if old is not None:
                    try:
                        os.unlink(os.path.join(self.cache_dir, old[1]))
                    except OSError:
                        pass

    # -- Branch ----------------------------------------------------------------
    def getattr(self, path: str) -> "Dict[str, Any]":
        r = self._do("getattr", path=_rel(path))
        try:
            return {k: r[k] for k in STAT_KEYS}
        except (TypeError, KeyError):
            raise _oserror(errno.EIO, "bad reply")

    def readdir(self, path: str) -> "List[str]":
        holder = []         # type: List[_DirList]

        def make() -> _Pending:
            holder.append(_DirList())
            return holder[-1]
        self._call("readdir", {"path": _rel(path)}, make)
        return holder[-1].names

    def readlink(self, path: str) -> str:
        r = self._do("readlink", path=_rel(path))
        if not isinstance(r, str):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def mkdir(self, path: str, mode: int) -> None:
        self._do("mkdir", path=_rel(path), mode=mode & 0o7777)

    def rmdir(self, path: str) -> None:
        self._do("rmdir", path=_rel(path))

    def unlink(self, path: str) -> None:
        rel = _rel(path)
        self._forget(rel)
        self._do("unlink", path=rel)

    def rename(self, old: str, new: str) -> None:
        o, n = _rel(old), _rel(new)
        self._forget(o, n)
        self._do("rename", old=o, new=n)

    def symlink(self, target: str, path: str) -> None:
        self._do("symlink", target=target, path=_rel(path))

    def chmod(self, path: str, mode: int) -> None:
        self._do("chmod", path=_rel(path), mode=mode & 0o7777)

    def truncate(self, path: str, length: int) -> None:
        rel = _rel(path)
        self._forget(rel)
        self._do("truncate", path=rel, length=length)

    def utimens(self, path: str, times: "Optional[Tuple[float, float]]") -> None:
        self._do("utimens", path=_rel(path), times=None if times is None else list(times))

    def statfs(self) -> "Dict[str, Any]":
        r = self._do("statfs")
        if not isinstance(r, dict):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def getxattr(self, path: str, name: str) -> bytes:
        r = self._do("getxattr", path=_rel(path), name=name)
        if not isinstance(r, bytes):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        self._do("setxattr", path=_rel(path), name=name, value=bytes(value))

    def listxattr(self, path: str) -> "List[str]":
        r = self._do("listxattr", path=_rel(path))
        if not isinstance(r, list):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def removexattr(self, path: str, name: str) -> None:
        self._do("removexattr", path=_rel(path), name=name)

    def read_range(self, path: str, size: int, offset: int) -> bytes:
        """One range of a file without a replica (the "read" call)."""
        r = self._do("read", path=_rel(path), offset=offset, size=min(size, fs_protocol.MAX_IO))
        if not isinstance(r, bytes):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def open_read(self, path: str) -> ReadHandle:
        rel = _rel(path)
        key = self._key(rel)
        for _ in range(2):
            with self._cache_lock:
                cand = self._replicas.get(key)
            have = dict(zip(_HAVE_KEYS, cand[0])) if cand is not None else None
            fetches = []    # type: List[_Fetch]

            def make() -> _Pending:
                fetches.append(_Fetch(self, key))
                return fetches[-1]
            try:
                result, _ch = self._call("read_file", {"path": rel, "have": have}, make)
            except BaseException:
                for f in fetches:
                    f.drop_reader()
                raise
            for f in fetches[:-1]:
                f.drop_reader()
            fetch = fetches[-1]
            if result.get("unchanged") is True:
                if cand is None:
                    raise _oserror(errno.EIO, "bad reply")
                try:
                    fd = os.open(os.path.join(self.cache_dir, cand[1]), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    self._forget(rel)
                    continue
                self.stats["reused"] += 1
                return _ReplicaReader(fd, None, self.timeout)
            fd = fetch.take_reader()
            if fd < 0:
                raise _oserror(errno.EIO, fetch.failed or "stream failed")
            self.stats["streams"] += 1
            return _ReplicaReader(fd, fetch, self.timeout)
        raise _oserror(errno.EIO, "replica vanished")

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        rel = _rel(path)
        self._forget(rel)
        fh, ch = self._call("open_write", {"path": rel, "flags": flags & 0x7FFFFFFF,
                                           "mode": mode & 0o7777, "create": bool(create)})
        if isinstance(fh, bool) or not isinstance(fh, int):
            raise _oserror(errno.EIO, "bad reply")
        return _RemoteFile(self, ch, fh)
