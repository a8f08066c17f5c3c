"""Open remote files over SFTP: pipelined writes, and whole-file streaming
into a replica.

Reads: a _Stream fetches the WHOLE file into a replica (replica_cache.py) with
up to STREAM_INFLIGHT requests of the session's read size in flight (no round
trip per block); reads are served from the replica as soon as their bytes are
there. The replica becomes visible only when complete and unchanged while it
streamed. A stream whose last reader closes before it is complete is abandoned
and its partial file removed. Files too large for the cache are read with one
request per read (DirectReadHandle).

Writes: straight to the remote file, pipelined (up to WRITE_INFLIGHT requests in
flight); an error comes back on a later write, flush, fsync or close.
"""
from __future__ import annotations

import errno
import os
import struct
import threading

from paramiko.message import Message
from paramiko.sftp import (
    CMD_CLOSE,
    CMD_DATA,
    CMD_EXTENDED,
    CMD_FSETSTAT,
    CMD_FSTAT,
    CMD_OPEN,
    CMD_READ,
    CMD_WRITE,
    int64,
)
from paramiko.sftp_attr import SFTPAttributes

from sshfsmux.branches.branch import ReadHandle, WriteHandle
from sshfsmux.sftp.session import (
    FX_EOF,
    FX_FAILURE,
    SSH_FXF_READ,
    STREAM_CHUNK,
    STREAM_INFLIGHT,
    WRITE_INFLIGHT,
    SftpSession,
    StatusError,
    _err,
    _handle_of,
    check_status,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from sshfsmux.sftp.branch import SftpBranch

class SftpWriteHandle(WriteHandle):
    """A remote file open for writing; writes are pipelined."""

    def __init__(self, branch: SftpBranch, full: bytes, path: str, session: SftpSession,
                 handle: bytes) -> None:
        self.branch = branch
        self.full = full
        self.path = path
        self.session = session
        self.handle = handle
        self._cond = threading.Condition()
        self._inflight = 0
        self._error: Optional[OSError] = None
        self.closed = False

    def _done(self, t: int, data: bytes, err: Optional[BaseException]) -> None:
        with self._cond:
            self._inflight -= 1
            if err is not None:
                if self._error is None:
                    self._error = err if isinstance(err, OSError) else _err(errno.EIO)
            else:
                try:
                    check_status(t, data[4:])
                except OSError as e:
                    if self._error is None:
                        self._error = _err(errno.ENOSPC) if getattr(e, "code", 0) == FX_FAILURE else e
            self._cond.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def write(self, data: bytes, offset: int) -> int:
        if self.closed:
            raise _err(errno.EBADF)
        self._raise_error()
        pos = 0
        n = len(data)
        wc = self.session.write_chunk
        while pos < n:
            chunk = data[pos:pos + wc] if (pos or n > wc) else data
            with self._cond:
                while self._inflight >= WRITE_INFLIGHT:
                    self._cond.wait()
                self._inflight += 1
            try:
                self.session.send(CMD_WRITE, (self.handle, int64(offset + pos), chunk), self._done)
            except OSError:
                with self._cond:
                    self._inflight -= 1
                raise
            pos += len(chunk)
        return n

    def wait(self) -> None:
        """Until every write sent so far is answered (errors kept for later)."""
        with self._cond:
            while self._inflight > 0:
                self._cond.wait()

    def drain(self) -> None:
        self.wait()
        self._raise_error()

    def read(self, size: int, offset: int) -> bytes:
        self.drain()
        return read_range(self.session, self.handle, size, offset)

    def truncate(self, length: int) -> None:
        self.drain()
        a = SFTPAttributes()
        a.st_size = length
        self.session.request(CMD_FSETSTAT, self.handle, a)
        self.branch._invalidate(self.full)

    def flush(self) -> None:
        self.drain()

    def fsync(self) -> None:
        self.drain()
        if "fsync@openssh.com" in self.session.extensions:
            self.session.request(CMD_EXTENDED, "fsync@openssh.com", self.handle)

    def fstat(self) -> Dict[str, Any]:
        self.drain()
        t, data = self.session.request(CMD_FSTAT, self.handle)
        return self.branch._attrs(SFTPAttributes._from_msg(Message(data)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.drain()
        finally:
            try:
                self.session.request(CMD_CLOSE, self.handle)
            except OSError:
                pass
            self.branch._writer_closed(self)


class _Stream:
    """Streams one remote file into a replica download; shared by the readers
    of that version while it runs."""

    def __init__(self, branch: SftpBranch, full: bytes, key: str, size: int, mtime: int) -> None:
        self.branch = branch
        self.full = full
        self.key = key
        self.size = size
        self.mtime = mtime
        self.session = branch._session()
        t, data = branch._call_on(self.session, CMD_OPEN, full, SSH_FXF_READ, SFTPAttributes())
        self.handle = _handle_of(data)
        try:
            self.download = branch.cache.begin(key, size, mtime)
        except OSError:
            self.session.send(CMD_CLOSE, (self.handle,), lambda t, d, e: None)
            raise
        self.fd = self.download.fd
        self.cond = threading.Condition()
        self.next_off = 0
        self.inflight = 0
        self.contiguous = 0
        self.ranges: Dict[int, int] = {}  # start -> end, beyond `contiguous`
        self.eof = size
        self.error: Optional[OSError] = None
        self.refs = 1
        self.cancelled = False
        self.finished = False   # no more data will arrive (complete, eof, error, cancel)
        self.committed = False
        self._retry: List[Tuple[int, int]] = []
        self.thread = threading.Thread(target=self._pump, name="sftp-stream", daemon=True)
        self.thread.start()

    # runs in its own thread: issues requests, never in the reader thread
    def _pump(self) -> None:
        try:
            while True:
                with self.cond:
                    while (not self.cancelled and self.error is None and self.inflight >= STREAM_INFLIGHT):
                        self.cond.wait()
                    if self.cancelled or self.error is not None:
                        break
                    if self._retry:
                        off, n = self._retry.pop()
                    elif self.next_off < self.eof:
                        off = self.next_off
                        n = min(self.session.read_chunk, self.eof - off)
                        self.next_off += n
                    elif self.inflight == 0:
                        break
                    else:
                        self.cond.wait()
                        continue
                    self.inflight += 1
                try:
                    self.session.send(CMD_READ, (self.handle, int64(off), n), self._reply(off, n))
                except OSError as e:
                    with self.cond:
                        self.inflight -= 1
                        self.error = e
                        self.cond.notify_all()
                    break
        finally:
            self._wind_up()

    def _reply(self, off: int, n: int) -> Callable:
        def done(t: int, data: bytes, err: Optional[BaseException]) -> None:
            failure = None
            got = 0
            if err is not None:
                failure = err if isinstance(err, OSError) else _err(errno.EIO)
            elif t == CMD_DATA:
                got = struct.unpack_from(">I", data, 4)[0]
                if not self.cancelled:
                    try:
                        os.pwrite(self.fd, memoryview(data)[8:8 + got], off)
                    except OSError as e:
                        failure = e
            else:
                try:
                    check_status(t, data[4:])
                    failure = _err(errno.EIO)
                except StatusError as e:
                    if e.code != FX_EOF:
                        failure = e
                except OSError as e:
                    failure = e
            with self.cond:
                self.inflight -= 1
                if failure is not None:
                    if self.error is None:
                        self.error = failure
                elif got < n:
                    if got == 0 and t != CMD_DATA:
                        self.eof = min(self.eof, off)   # the file is shorter than it was
                    else:
                        self._retry.append((off + got, n - got))
                if got:
                    self._add_range(off, off + got)
                self.cond.notify_all()
        return done

    def _add_range(self, start: int, end: int) -> None:
        if start <= self.contiguous:
            self.contiguous = max(self.contiguous, end)
            while self.contiguous in self.ranges:
                self.contiguous = max(self.contiguous, self.ranges.pop(self.contiguous))
        else:
            self.ranges[start] = max(end, self.ranges.get(start, 0))

    def _wind_up(self) -> None:
        """All requests answered (or given up): close the remote handle, publish
        the replica if every byte of this version arrived."""
        with self.cond:
            while self.inflight > 0:
                self.cond.wait()
            ok = (not self.cancelled and self.error is None and self.eof == self.size
                  and self.contiguous >= self.size)
        if ok:
            # the version must not have changed while it streamed in
            try:
                t, data = self.session.request(CMD_FSTAT, self.handle)
                a = SFTPAttributes._from_msg(Message(data))
                ok = a.st_size == self.size and int(a.st_mtime or 0) == self.mtime
            except OSError:
                ok = False
        try:
            self.session.send(CMD_CLOSE, (self.handle,), lambda t, d, e: None)
        except OSError:
            pass
        path = self.download.commit() if ok else None
        with self.cond:
            self.committed = path is not None
            if not ok:
                self.download.abort()
            self.finished = True
            self.cond.notify_all()
            refs = self.refs
        if refs == 0:
            self._close_fd()
        self.branch._stream_done(self)

    def _close_fd(self) -> None:
        with self.cond:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def wait(self, size: int, offset: int) -> Tuple[int, int]:
        """Wait until [offset, offset+size) (cut at EOF) is in the replica file;
        returns (fd, bytes available there)."""
        with self.cond:
            end = min(offset + size, self.eof)
            while self.contiguous < end and not self.finished and self.error is None:
                self.cond.wait()
                end = min(offset + size, self.eof)
            if self.contiguous < end:
                raise self.error or _err(errno.EIO)
            # a read that reaches the end returns once the replica is published
            # (or known not to be), so "read it all, then look" sees it
            while end >= self.size and not self.finished:
                self.cond.wait()
            return self.fd, max(0, end - offset)

    def read(self, size: int, offset: int) -> bytes:
        fd, n = self.wait(size, offset)
        return os.pread(fd, n, offset) if n else b""

    def release(self) -> None:
        with self.cond:
            self.refs -= 1
            if self.refs > 0:
                return
            if not self.finished:
                if self.contiguous < self.size:
                    self.cancelled = True   # a partial replica is never kept
                    self.cond.notify_all()
                return                      # the pump thread cleans up (or commits)
        self._close_fd()


class StreamReadHandle(ReadHandle):
    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.closed = False

    def read(self, size: int, offset: int) -> bytes:
        return self.stream.read(size, offset)

    def fd_for(self, size: int, offset: int) -> Tuple[int, int]:
        return self.stream.wait(size, offset)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.release()


class DirectReadHandle(ReadHandle):
    """Reads of a file too large for the replica cache: one request per read."""

    def __init__(self, session: SftpSession, handle: bytes) -> None:
        self.session = session
        self.handle = handle

    def read(self, size: int, offset: int) -> bytes:
        return read_range(self.session, self.handle, size, offset)

    def close(self) -> None:
        try:
            self.session.request(CMD_CLOSE, self.handle)
        except OSError:
            pass


def read_range(session: SftpSession, handle: bytes, size: int, offset: int) -> bytes:
    """Read `size` bytes at `offset` from an open remote file, in server-sized
    requests; short at end of file."""
    out = []
    got = 0
    while got < size:
        try:
            t, data = session.request(CMD_READ, handle, int64(offset + got),
                                      min(size - got, STREAM_CHUNK))
        except StatusError as e:
            if e.code == FX_EOF:
                break
            raise
        if t != CMD_DATA:
            break
        chunk = Message(data).get_string()
        if not chunk:
            break
        out.append(chunk)
        got += len(chunk)
    return b"".join(out)
