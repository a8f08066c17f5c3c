"""The agent side of the direct data channel: serve one export directory to
authenticated peers (SSHFSM-Direct).

    server = ExportServer(root, read_only, key, certfile, keyfile, pin)
    ... server.port ...
    server.close()

A link_auth.Listener accepts TCP connections (bounded handshakes, each with a
deadline); a peer that fails the handshake gets no byte of data and costs one
log line. An authenticated connection gets its own thread (at most max_clients
at once) that runs the connection's non-blocking I/O loop and serves its calls
(fs_protocol) against the confined root: every path is resolved inside the
export by confined_paths, so "..", absolute paths and symlinks leading out are
EACCES, also for symlinks created while we walk. A read-only export refuses
every mutating call with EROFS here. A peer that sends a frame that is not a
valid message, a truncated or oversized frame, or stalls in the middle of a
frame is dropped with one log line; memory per connection is bounded by one
frame in, the output high-water mark out, and a bounded number of open handles
and streams. A site proxy's read_peer: peer_relay.py.

Standard library only, Python 3.8 syntax (agents run this).
"""
from __future__ import annotations

import collections
import errno
import os
import stat
import sys
import threading
import time

from gxpstyle.transport import link_auth
from sshfsmux.branches import confined_paths
from sshfsmux.branches.branch import stat_dict
from sshfsmux.direct import peer_relay
from sshfsmux.direct import protocol as fs_protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

MAX_CLIENTS = 64
MAX_HANDLES = 256           # open write handles per connection
MAX_STREAMS = 64            # streams in progress per connection
MAX_OPEN = 512              # handles and streams of all connections together

_STATVFS_KEYS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                 "f_ffree", "f_favail", "f_flag", "f_namemax")
_WRITE_FLAGS = (os.O_APPEND | os.O_TRUNC | os.O_EXCL | getattr(os, "O_SYNC", 0)
                | getattr(os, "O_DSYNC", 0))


def _stderr_log(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Listener(link_auth.Listener):
    """link_auth.Listener whose handshake thread becomes the connection's thread:
    the handshake slot is given back once the peer is authenticated, and the
    connection is served without a relay (its I/O loop owns the TLS socket)."""

    def __init__(self, server: ExportServer, **kw: Any) -> None:
        self.server = server
        link_auth.Listener.__init__(self, **kw)

    def _authenticate(self, conn: Any) -> Any:
        return self.server._authenticate(conn, self.handshake_seconds)

    def _accepted(self, peer: Any, addr: Any) -> None:
        sock, macs = peer
        self.server._serve(sock, macs, addr)


class ExportServer:
    """Serves `root` on a TCP port to peers that prove `key` (see fs_protocol)."""

    def __init__(self, root: str, read_only: bool, key: bytes, certfile: Optional[str],
                 keyfile: Optional[str], pin: Optional[str], host: str = "0.0.0.0",
                 port: int = 0, cipher: bool = True, log: Optional[Callable[[str], None]] = None,
                 max_clients: int = MAX_CLIENTS, frame_seconds: float = 60.0,
                 handshake_seconds: float = link_auth.HANDSHAKE_SECONDS,
                 max_open: int = MAX_OPEN) -> None:
        if not key:
            raise ValueError("an export needs a key")
        if cipher and not (certfile and keyfile and pin):
            raise ValueError("an encrypted export needs the session certificate")
        self.confined = confined_paths.Confined(root)
        self.root = self.confined.root
        self.read_only = bool(read_only)
        self.key = key
        self.cipher = bool(cipher)
        self.certfile, self.keyfile, self.pin = certfile, keyfile, pin
        self.log = log or _stderr_log
        self.refusals = link_auth.RefusalLog(lambda line: self.log("fs export: " + line))
        self.frame_seconds = frame_seconds
        self.clients = threading.BoundedSemaphore(max_clients)
        self.max_open = max_open
        self.open_count = 0
        self.sessions: set = set()
        self.lock = threading.Lock()
        self.stats: Dict[str, Any] = {"calls": collections.Counter(), "connections": 0,
                                        "refused": 0, "dropped": 0}
        self.closed = False
        # (node, path, have) -> (reader, version, fetch) through this host's mount: a site proxy's
        self.peer_source: Optional[Callable[[str, str, Any], Any]] = None
        label = fs_protocol.LABEL if cipher else fs_protocol.LABEL_PLAIN
        keys = {label: key}
        try:
            self.listener = _Listener(self, lookup_key=keys.get, on_link=None,
                                      on_refused=self._refused, certfile=certfile,
                                      keyfile=keyfile, pin=pin, host=host, port=port,
                                      handshake_seconds=handshake_seconds)
        except BaseException:
            self.confined.close()
            raise
        self.port = self.listener.port

    def _refused(self, addr: Any, why: str) -> None:
        with self.lock:
            self.stats["refused"] += 1
        self.refusals.refused(_addr(addr), _one_line(why))

    def _authenticate(self, conn: Any, seconds: float) -> Tuple[Any, Any]:
        fs_protocol.tune_socket(conn)
        if self.cipher:
            keys = {fs_protocol.LABEL: self.key}
            _label, tls = link_auth.server_handshake(conn, keys.get, self.certfile,
                                                     self.keyfile, self.pin, seconds)
            return tls, None
        return conn, fs_protocol.plain_server_handshake(conn, self.key, seconds)

    def _serve(self, sock: Any, macs: Any, addr: Any) -> None:
        if self.closed or not self.clients.acquire(blocking=False):
            try:
                sock.close()
            except OSError:
                pass
            self._refused(addr, "too many clients" if not self.closed else "closing")
            return
        try:
            session = _Session(self, sock, macs, addr)
            with self.lock:
                self.stats["connections"] += 1
                self.sessions.add(session)
            try:
                session.conn.run()
            finally:
                with self.lock:
                    self.sessions.discard(session)
        finally:
            self.clients.release()

    def take_open(self) -> None:
        """Reserve one of the export's open handles/streams, or EMFILE."""
        with self.lock:
            if self.open_count >= self.max_open:
                raise fs_protocol.oserror(errno.EMFILE, "too many open files on the export")
            self.open_count += 1

    def give_open(self) -> None:
        with self.lock:
            self.open_count -= 1

    def count(self, call: str) -> None:
        with self.lock:
            self.stats["calls"][call] += 1

    def dropped(self, addr: Any, reason: str) -> None:
        with self.lock:
            self.stats["dropped"] += 1
        self.log("fs export: dropped %s: %s" % (_addr(addr), _one_line(reason)))

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.refusals.flush()
        with self.lock:
            sessions = list(self.sessions)
        for s in sessions:
            s.conn.close("export closed")
        deadline = time.monotonic() + 5
        for s in sessions:
            s.conn_done.wait(max(0.0, deadline - time.monotonic()))
        self.confined.close()


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _addr(addr: Any) -> str:
    try:
        return "%s:%d" % (addr[0], addr[1])
    except (TypeError, IndexError, ValueError):
        return str(addr)


class _Stream:
    """A stream in progress: produce() queues its next frame, returns True at the
    end. Holds one of the export's open slots until close()."""

    def __init__(self, session: _Session, req: int) -> None:
        self.session = session
        self.req = req
        self.holds_slot = True

    def produce(self) -> bool:
        raise NotImplementedError

    def cancel(self) -> None:
        self.session.send(fs_protocol.data_frame(self.req, b"", True, errno=errno.ECANCELED))
        self.close()

    def close(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            self.session.server.give_open()


class _FileStream(_Stream):
    def __init__(self, session: _Session, req: int, fd: int) -> None:
        _Stream.__init__(self, session, req)
        self.fd = fd
        self.sent = 0

    def produce(self) -> bool:
        try:
            data = os.read(self.fd, fs_protocol.CHUNK)
        except OSError as e:
            self.session.send(fs_protocol.data_frame(self.req, b"", True, errno=e.errno or errno.EIO,
                                                     size=self.sent))
            self.close()
            return True
        if data:
            self.sent += len(data)
            self.session.send(fs_protocol.data_frame(self.req, data, False))
            return False
        st = os.fstat(self.fd)
        settled = time.time() - max(st.st_mtime, st.st_ctime) > fs_protocol.SETTLE_SECONDS
        self.session.send(fs_protocol.data_frame(
            self.req, b"", True, errno=0, size=self.sent, mtime_ns=st.st_mtime_ns,
            ctime_ns=st.st_ctime_ns, settled=settled))
        self.close()
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        _Stream.close(self)


class _NameStream(_Stream):
    def __init__(self, session: _Session, req: int, raw: List[bytes]) -> None:
        _Stream.__init__(self, session, req)
        self.raw = raw
        self.pos = 0

    def produce(self) -> bool:
        piece = []
        size = 0
        while self.pos < len(self.raw) and size + len(self.raw[self.pos]) + 1 <= fs_protocol.CHUNK:
            piece.append(self.raw[self.pos])
            size += len(self.raw[self.pos]) + 1
            self.pos += 1
        eof = self.pos >= len(self.raw)
        self.session.send(fs_protocol.data_frame(self.req, b"\0".join(piece), eof, errno=0))
        return eof


class _Session(peer_relay.PeerReads):
    """One authenticated connection: its calls, handles and streams."""

    def __init__(self, server: ExportServer, sock: Any, macs: Any, addr: Any) -> None:
        self.server = server
        self.c = server.confined
        self.addr = addr
        self.read_only = server.read_only
        self.handles: Dict[int, int] = {}
        self.next_fh = 1
        self.streams: collections.OrderedDict = collections.OrderedDict()
        self.relays = {}      # read_peer's (peer_relay.py, with `cancel`)
        self.conn_done = threading.Event()
        self.conn = fs_protocol.FrameConn(sock, macs, on_frame=self.on_frame,
                                          on_close=self.on_close, producer=self.produce,
                                          pause_when_full=True,
                                          frame_seconds=server.frame_seconds)

    # -- transport hooks (all in the connection's thread) --------------------
    def send(self, frame: bytes) -> None:
        self.conn.send_frame(frame, block=False)

    def on_frame(self, body: bytes) -> None:
        msg = fs_protocol.decode(body, ("fs_call",))
        req, call = msg["req"], msg["call"]
        self.server.count(call if call in fs_protocol.CALLS else "?")
        result = None
        try:
            if self.read_only and call in fs_protocol.MUTATING:
                raise fs_protocol.oserror(errno.EROFS)
            args = fs_protocol.check_args(call, msg["args"])
            result = getattr(self, "c_" + call)(req, **args)
            err = 0
        except OSError as e:
            err = e.errno or errno.EIO
        except NotImplementedError:
            err = errno.EOPNOTSUPP
        except (ValueError, OverflowError, TypeError, UnicodeError):
            err = errno.EINVAL
        except Exception as e:      # a bug answers EIO and leaves a trace, never kills the loop
            err = errno.EIO
            self.server.log("fs export: %s failed: %s" % (
                call, _one_line("%s: %s" % (e.__class__.__name__, e))))
        if err:
            result = None
        elif result is peer_relay.LATER:
            return          # a thread replies (read_peer)
        self.send(fs_protocol.reply_frame(req, err, result))

    def produce(self) -> bool:
        if not self.streams:
            return False
        req = next(iter(self.streams))
        stream = self.streams[req]
        if stream.produce():
            del self.streams[req]
            stream.close()
        else:
            self.streams.move_to_end(req)
        return True

    def on_close(self, reason: str) -> None:
        for relay in list(self.relays.values()):
            relay.cancel()
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()
        for fd in self.handles.values():
            try:
                os.close(fd)
            except OSError:
                pass
            self.server.give_open()
        self.handles.clear()
        if reason not in ("peer closed", "export closed"):
            self.server.dropped(self.addr, reason)
        self.conn_done.set()

    # -- helpers -----------------------------------------------------------------
    def _open_regular(self, path: str, flags: int, mode: int = 0o666) -> int:
        # Devices and FIFOs are refused before they are opened (opening one can
        # block or have effects); O_NONBLOCK covers one swapped in meanwhile.
        fd = self.c.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, mode, regular=True)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise fs_protocol.oserror(errno.EISDIR)
            if not stat.S_ISREG(st.st_mode):
                raise fs_protocol.oserror(errno.EINVAL, "not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _handle(self, fh: int) -> int:
        fd = self.handles.get(fh)
        if fd is None:
            raise fs_protocol.oserror(errno.EBADF)
        return fd

    def _add_stream(self, req: int, stream: _Stream) -> None:
        if req in self.streams:
            stream.close()
            raise fs_protocol.oserror(errno.EBUSY, "request id in use")
        self.streams[req] = stream

    def _check_stream_room(self, req: int) -> None:
        if len(self.streams) >= MAX_STREAMS:
            raise fs_protocol.oserror(errno.EMFILE, "too many streams")
        if req in self.streams:
            raise fs_protocol.oserror(errno.EBUSY, "request id in use")

    # -- calls: c_<name>(req, **args) -> result -----------------------------------
    def c_getattr(self, rid: int, path: str) -> Dict[str, Any]:
        return stat_dict(self.c.lstat(path))

    def c_readdir(self, rid: int, path: str) -> Dict[str, Any]:
        fd = self.c.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        raw = [os.fsencode(n) for n in names]
        if sum(len(r) + 6 for r in raw) <= fs_protocol.CHUNK:
            return {"names": names, "more": False}
        self._check_stream_room(rid)
        self.server.take_open()
        self._add_stream(rid, _NameStream(self, rid, raw))
        return {"names": [], "more": True}

    def c_readlink(self, rid: int, path: str) -> str:
        with self.c.at(path) as (d, name):
            return os.readlink(name, dir_fd=d)

    def c_mkdir(self, rid: int, path: str, mode: int) -> None:
        with self.c.at(path) as (d, name):
            os.mkdir(name, mode, dir_fd=d)

    def c_rmdir(self, rid: int, path: str) -> None:
        if path == "":
            raise fs_protocol.oserror(errno.EBUSY)
        with self.c.at(path) as (d, name):
            os.rmdir(name, dir_fd=d)

    def c_unlink(self, rid: int, path: str) -> None:
        with self.c.at(path) as (d, name):
            os.unlink(name, dir_fd=d)

    def c_rename(self, rid: int, old: str, new: str) -> None:
        if old == "" or new == "":
            raise fs_protocol.oserror(errno.EBUSY)
        with self.c.at(old) as (d1, n1), self.c.at(new) as (d2, n2):
            os.rename(n1, n2, src_dir_fd=d1, dst_dir_fd=d2)

    def c_symlink(self, rid: int, target: str, path: str) -> None:
        with self.c.at(path) as (d, name):
            os.symlink(target, name, dir_fd=d)

    def c_chmod(self, rid: int, path: str, mode: int) -> None:
        fd = self.c.open_object(path, follow=True)
        try:
            proc = confined_paths.proc_fd_path(fd)
            if proc is not None:
                os.chmod(proc, mode)
                return
            if not confined_paths.O_PATH:
                os.chmod(fd, mode)      # without O_PATH, fd is a real descriptor
                return
        finally:
            os.close(fd)
        with self.c.at(path, follow=True) as (d, name):
            os.chmod(name, mode, dir_fd=d, follow_symlinks=False)

    def c_truncate(self, rid: int, path: str, length: int) -> None:
        fd = self._open_regular(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def c_utimens(self, rid: int, path: str, times: Optional[Tuple[float, float]]) -> None:
        with self.c.at(path) as (d, name):
            os.utime(name, times, dir_fd=d, follow_symlinks=False)

    def c_statfs(self, rid: int) -> Dict[str, Any]:
        st = os.statvfs(self.c.root_fd)
        out = {k: getattr(st, k) for k in _STATVFS_KEYS}
        if self.read_only:
            out["f_flag"] |= os.ST_RDONLY
        return out

    def _xattr_target(self, path: str) -> Tuple[int, Any]:
        """(fd, what the *xattr calls take) for the object itself, not following
        a final symlink (FUSE asks for a link's own attributes). None for a
        symlink: user attributes do not exist there."""
        fd = self.c.open_object(path, follow=False)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                return fd, None
            if not confined_paths.O_PATH:
                return fd, fd           # a real descriptor
            proc = confined_paths.proc_fd_path(fd)
            if proc is None:
                raise fs_protocol.oserror(errno.EOPNOTSUPP, "no /proc")
            return fd, proc
        except BaseException:
            os.close(fd)
            raise

    def c_getxattr(self, rid: int, path: str, name: str) -> bytes:
        fd, target = self._xattr_target(path)
        try:
            if target is None:
                raise fs_protocol.oserror(errno.ENODATA)
            return os.getxattr(target, name)
        finally:
            os.close(fd)

    def c_setxattr(self, rid: int, path: str, name: str, value: bytes) -> None:
        fd, target = self._xattr_target(path)
        try:
            if target is None:
                raise fs_protocol.oserror(errno.EPERM)
            os.setxattr(target, name, value)
        finally:
            os.close(fd)

    def c_listxattr(self, rid: int, path: str) -> List[str]:
        fd, target = self._xattr_target(path)
        try:
            return [] if target is None else os.listxattr(target)
        finally:
            os.close(fd)

    def c_removexattr(self, rid: int, path: str, name: str) -> None:
        fd, target = self._xattr_target(path)
        try:
            if target is None:
                raise fs_protocol.oserror(errno.EPERM)
            os.removexattr(target, name)
        finally:
            os.close(fd)

    def c_read_file(self, rid: int, path: str,
                    have: Optional[Tuple[int, int, int, int]]) -> Dict[str, Any]:
        self._check_stream_room(rid)
        fd = self._open_regular(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            meta = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            unchanged = have is not None and tuple(have) == meta
            result = {"unchanged": unchanged, "size": meta[0], "mtime_ns": meta[1],
                      "ctime_ns": meta[2], "ino": meta[3], "st": stat_dict(st)}
            if not unchanged:
                self.server.take_open()
                self._add_stream(rid, _FileStream(self, rid, fd))
                fd = -1
            return result
        finally:
            if fd >= 0:
                os.close(fd)

    def c_version(self, rid: int, path: str) -> Dict[str, Any]:
        fd = self._open_regular(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                "ino": st.st_ino}

    def c_read(self, rid: int, path: str, offset: int, size: int) -> bytes:
        fd = self._open_regular(path, os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def c_open_write(self, rid: int, path: str, flags: int, mode: int, create: bool) -> int:
        if len(self.handles) >= MAX_HANDLES:
            raise fs_protocol.oserror(errno.EMFILE, "too many open files")
        acc = os.O_WRONLY if flags & os.O_ACCMODE == os.O_WRONLY else os.O_RDWR
        f = acc | (flags & _WRITE_FLAGS)
        if create:
            f |= os.O_CREAT
        else:
            f &= ~os.O_EXCL
        self.server.take_open()
        try:
            fd = self._open_regular(path, f, mode)
        except BaseException:
            self.server.give_open()
            raise
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = fd
        return fh

    def c_write(self, rid: int, fh: int, offset: int, data: bytes) -> int:
        fd = self._handle(fh)
        done = 0
        view = memoryview(data)
        while done < len(data):
            n = os.pwrite(fd, view[done:], offset + done)
            if n <= 0:
                raise fs_protocol.oserror(errno.EIO, "short write")
            done += n
        return done

    def c_pread(self, rid: int, fh: int, offset: int, size: int) -> bytes:
        return os.pread(self._handle(fh), size, offset)

    def c_ftruncate(self, rid: int, fh: int, length: int) -> None:
        os.ftruncate(self._handle(fh), length)

    def c_fsync(self, rid: int, fh: int) -> None:
        os.fsync(self._handle(fh))

    def c_close_write(self, rid: int, fh: int) -> None:
        fd = self._handle(fh)
        del self.handles[fh]
        self.server.give_open()
        os.close(fd)

