"""Open files of a direct branch: a whole-file stream into a replica (_Fetch)
and its readers, and a file open for writing on the export (_RemoteFile), its
writes pipelined.

Reads. The server streams the whole file back to back into a replica download
of the replica store (replica_cache), and readers are served from that file as
soon as the bytes they need have arrived. The download is committed (renamed
to its final name) only when the stream is complete, the file did not change
while it was sent (same size, mtime and ctime) and its times had settled (older
than fs_protocol.SETTLE_SECONDS on the server, so a later change cannot hide
within the same timestamp): replicas are complete and immutable, or invisible.

Writes are buffered per handle, sent in frames of up to fs_protocol.MAX_IO
without waiting for each acknowledgement; flush, fsync, read and close wait for
every outstanding acknowledgement and report the first error.

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import os
import threading
import time

from sshfsmux.branches.branch import ReadHandle, WriteHandle
from sshfsmux.direct import protocol as fs_protocol
from sshfsmux.direct.channel import _Channel, _ConnectionLost, _oserror, _Pending

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from sshfsmux.branches.replica_cache import Download
    from sshfsmux.direct.branch import DirectBranch

WRITE_FRAME = fs_protocol.MAX_IO
HAVE_KEYS = ("size", "mtime_ns", "ctime_ns", "ino")


class _Fetch(_Pending):
    """A whole-file stream into a replica file; readers wait on `cond` for bytes."""

    def __init__(self, branch: DirectBranch, key: str) -> None:
        _Pending.__init__(self)
        self.branch = branch
        self.key = key
        self.cond = threading.Condition()
        self.fd = -1
        self.reader_fd = -1
        self.download: Optional[Download] = None
        self.meta: Optional[Tuple[int, int, int, int]] = None
        self.received = 0
        self.complete = False
        self.failed: Optional[str] = None
        self.progress = time.monotonic()
        self.end: Dict[str, Any] = {}      # the stream's last frame (its version, settled)
        self._over: List[Callable[[], None]] = []

    def on_reply(self, err: int, result: Any) -> bool:
        if not err:
            try:
                meta = tuple(int(result[k]) for k in HAVE_KEYS)
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
            self.download = self.branch.cache.begin(self.key, *meta)
            self.fd = self.download.fd
            self.reader_fd = os.open(self.download.temp, os.O_RDONLY | os.O_CLOEXEC)
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

    def on_data(self, msg: Dict[str, Any]) -> bool:
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

    def _finish(self, msg: Dict[str, Any]) -> None:
        err = msg.get("errno", 0)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if err or msg.get("size") != self.received:
            self._fail("stream ended with %s" % (os.strerror(err) if isinstance(err, int) and err
                                                 else "a wrong size"))
        meta = self.meta
        settled = msg.get("settled") is True
        # unsettled: kept only for a branch told of every change (its `known`)
        if (self.failed is None and self.download is not None and meta is not None
                and (settled or self.branch.known is not None) and self.received == meta[0]
                and msg.get("mtime_ns") == meta[1] and msg.get("ctime_ns") == meta[2]):
            self.download.commit(settled)   # verified and renamed, or dropped
            self.download = None
        else:
            self._discard()
        self.end = dict(msg)
        self._set_complete()

    def _set_complete(self) -> None:
        with self.cond:
            self.complete = True
            self.cond.notify_all()
            over, self._over = self._over, []
        for cb in over:
            cb()

    def when_over(self, cb: Callable[[], None]) -> None:
        """cb() once the stream ended (now if it has), whether or not it failed."""
        with self.cond:
            if not self.complete:
                self._over.append(cb)
                return
        cb()

    def wait_over(self, timeout: float) -> Dict[str, Any]:
        """The stream's last frame once it ended well; OSError if it failed
        or stood still for `timeout`."""
        self.wait_for(1 << 62, timeout)
        if self.failed is not None or not self.end:
            raise _oserror(errno.EIO, self.failed or "stream failed")
        return self.end

    def _fail(self, why: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = why
            self.cond.notify_all()

    def _discard(self) -> None:
        if self.download is not None:
            self.download.abort()
            self.download = None

    def on_lost(self, reason: str) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._discard()
        self._fail("connection lost: %s" % reason)
        self._set_complete()
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
                    self.branch.not_answering("the stream stood still for %gs" % timeout)
                    raise _oserror(errno.EIO, "the stream stood still for %gs" % timeout)
                self.cond.wait(left)     # notified on every chunk, the end and a failure
            if self.received < end and self.failed is not None:
                raise _oserror(errno.EIO, self.failed)


class _WriteAck(_Pending):
    def __init__(self, handle: _RemoteFile, expect: int) -> None:
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
    def __init__(self, fd: int, fetch: Optional[_Fetch], timeout: float) -> None:
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

    def __init__(self, branch: DirectBranch, ch: _Channel, fh: int) -> None:
        self.branch = branch
        self.ch = ch
        self.fh = fh
        self.lock = threading.Lock()        # the buffer, and sending
        self.acks = threading.Condition()   # inflight, error (taken by the I/O thread)
        self.inflight = 0
        self.error: Optional[OSError] = None
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
                    self.branch.not_answering("writes not acknowledged")
                    raise _oserror(errno.EIO, "writes not acknowledged")
                self.acks.wait(left)
            if self.error is not None:
                raise self.error

    def _call(self, call: str, args: Dict[str, Any]) -> Any:
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
