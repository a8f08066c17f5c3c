"""A branch on a remote directory, over SFTP against a stock sshd (Paramiko):
nothing of ours runs on the remote.

The pieces: ssh_connect (reaching the host like `ssh -o BatchMode=yes`),
sftp_session (the request multiplexer, every request bounded by the mount's
timeout), sftp_streaming (pipelined writes, whole-file streaming into replicas).

Metadata is cached for ATTR_TTL seconds (positive and negative), invalidated by
every change made through this branch. A host that stops answering fails every
request within the timeout; with `reconnect` the branch opens a new connection
on the next access, but not within RETRY_SECONDS of the failure, so accesses
meanwhile fail at once instead of waiting again.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
import time

import paramiko
from paramiko.message import Message
from paramiko.sftp import (
    CMD_CLOSE,
    CMD_EXTENDED,
    CMD_LSTAT,
    CMD_MKDIR,
    CMD_NAME,
    CMD_OPEN,
    CMD_OPENDIR,
    CMD_READDIR,
    CMD_READLINK,
    CMD_REALPATH,
    CMD_REMOVE,
    CMD_RENAME,
    CMD_RMDIR,
    CMD_SETSTAT,
    CMD_STAT,
    CMD_SYMLINK,
)
from paramiko.sftp_attr import SFTPAttributes

from sshfsmux.branches.branch import Branch, ReadHandle, WriteHandle
from sshfsmux.branches.local_branch import LocalReadHandle
from sshfsmux.sftp.attr_cache import AttrCache
from sshfsmux.sftp.session import (
    DEFAULT_TIMEOUT,
    FX_EOF,
    FX_FAILURE,
    RETRY_SECONDS,
    SSH_FXF_CREAT,
    SSH_FXF_EXCL,
    SSH_FXF_READ,
    SSH_FXF_TRUNC,
    SSH_FXF_WRITE,
    ConnectionLost,
    SftpSession,
    StatusError,
    _dec,
    _enc,
    _err,
    _handle_of,
)
from sshfsmux.sftp.ssh_connect import ConnectError, SshParams, connect_transport, parse_spec
from sshfsmux.sftp.streaming import DirectReadHandle, SftpWriteHandle, StreamReadHandle, _Stream, read_range

__all__ = ["ConnectError", "SftpBranch"]

ATTR_TTL = 5.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


class SftpBranch(Branch):
    local = False
    writable = True

    def __init__(self, spec: str, port: Optional[int] = None,
                 identity_file: Optional[str] = None, reconnect: bool = False,
                 cache: Any = None, server_alive: int = 0,
                 connect: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.spec = spec
        self.name = spec
        user, host, path = parse_spec(spec)
        self.node = host
        self.host = host
        self.params = SshParams(host, user=user, port=port, identity_file=identity_file)
        if server_alive:
            self.params.server_alive = server_alive
        self.timeout = timeout
        # a connection attempt is a request too: bounded the same way
        self.params.connect_timeout = min(self.params.connect_timeout, timeout)
        self._retry_at = 0.0      # no reconnect attempt before this (monotonic)
        self.reconnect = reconnect
        self.cache = cache
        self.remote_path = path
        self._conn_lock = threading.Lock()
        self._sess: Optional[SftpSession] = None
        self._transport: Optional[paramiko.Transport] = None
        self._reconnected = 0
        self._seen = AttrCache(ATTR_TTL)
        self._cache_lock = threading.Lock()     # the writers' books
        self._writers: Dict[bytes, set] = {}
        self._streams: Dict[Tuple[str, int, int], _Stream] = {}
        self._streams_lock = threading.Lock()
        self.root = b"/"
        self.remote_uid = self.remote_gid = -1
        self.local_uid, self.local_gid = os.getuid(), os.getgid()
        if connect:
            self.connect()

    # -- connection ----------------------------------------------------
    def connect(self) -> None:
        """Connect, log in, start SFTP and find the branch root (ConnectError /
        OSError on failure)."""
        sess = self._open_session()
        try:
            t, data = sess.request(CMD_REALPATH, _enc(self.remote_path or "."))
        except OSError as e:
            assert e.errno is not None     # request raises StatusError or ConnectionLost: both have one
            raise OSError(e.errno, os.strerror(e.errno), self.spec)
        m = Message(data)
        m.get_int()
        self.root = m.get_string()
        try:
            t, data = sess.request(CMD_STAT, self.root)
        except OSError as e:
            assert e.errno is not None     # request raises StatusError or ConnectionLost: both have one
            raise OSError(e.errno, os.strerror(e.errno), self.spec)
        a = SFTPAttributes._from_msg(Message(data))
        if not stat.S_ISDIR(a.st_mode or 0):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.spec)
        try:
            t, data = sess.request(CMD_STAT, b".")
            h = SFTPAttributes._from_msg(Message(data))
            self.remote_uid, self.remote_gid = h.st_uid, h.st_gid
        except OSError:
            self.remote_uid, self.remote_gid = a.st_uid, a.st_gid

    def _open_session(self) -> SftpSession:
        t = connect_transport(self.params)
        try:
            sess = SftpSession(t, self.params.connect_timeout, self.timeout)
        except ConnectError:
            t.close()
            raise
        except Exception as e:
            t.close()
            raise ConnectError("cannot start SFTP: %s" % e)
        self._transport, self._sess = t, sess
        return sess

    def _session(self) -> SftpSession:
        sess = self._sess
        if sess is not None and sess.alive:
            return sess
        if not self.reconnect:
            raise ConnectionLost("connection to %s lost" % self.host)
        with self._conn_lock:
            if self._sess is not None and self._sess.alive:
                return self._sess
            old = self._sess
            if old is not None and old.timed_out:
                # a host that stopped answering gets a pause before the next try,
                # so that accesses meanwhile fail at once instead of waiting again
                self._retry_at = max(self._retry_at, old.dead_at + RETRY_SECONDS)
            if time.monotonic() < self._retry_at:
                raise ConnectionLost("%s is not answering" % self.host)
            if old is not None:
                old.close()
                try:
                    old.transport.close()
                except Exception:
                    pass
            try:
                sess = self._open_session()
            except (ConnectError, OSError, paramiko.SSHException, EOFError) as e:
                self._sess = None
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise ConnectionLost("reconnect to %s failed: %s" % (self.host, e))
            self._reconnected += 1
            self._seen.clear()
            return sess

    def _call_on(self, sess: SftpSession, t: int, *args: Any) -> Tuple[int, bytes]:
        return sess.request(t, *args)

    def _call(self, t: int, *args: Any) -> Tuple[int, bytes]:
        sess = self._session()
        try:
            return sess.request(t, *args)
        except ConnectionLost:
            if not self.reconnect:
                raise
        sess = self._session()   # re-open the connection once, then retry
        return sess.request(t, *args)

    def close(self) -> None:
        with self._streams_lock:
            streams = list(self._streams.values())
        for s in streams:
            with s.cond:
                s.cancelled = True
                s.cond.notify_all()
        sess, self._sess = self._sess, None
        if sess is not None:
            sess.close()
        if self._transport is not None:
            try:
                self._transport.close()
            except Exception:
                pass

    # -- paths and caches ----------------------------------------------
    def _full(self, path: str) -> bytes:
        if path == "/":
            return self.root
        p = _enc(path)
        return p if self.root == b"/" else self.root + p

    def _key(self, path: str) -> str:
        return self.name + "|" + path

    def _attrs(self, a: SFTPAttributes) -> Dict[str, Any]:
        mode = a.st_mode or 0
        mt = float(a.st_mtime or 0)
        uid, gid = a.st_uid, a.st_gid
        if uid == self.remote_uid:
            uid = self.local_uid
        if gid == self.remote_gid:
            gid = self.local_gid
        return {"st_mode": mode, "st_size": a.st_size or 0, "st_mtime": mt,
                "st_atime": float(a.st_atime if a.st_atime is not None else mt),
                "st_ctime": mt, "st_nlink": 2 if stat.S_ISDIR(mode) else 1,
                "st_uid": uid if uid is not None else self.local_uid,
                "st_gid": gid if gid is not None else self.local_gid}

    def _invalidate(self, full: bytes, tree: bool = False) -> None:
        self._seen.invalidate(full, tree)

    def _drop_replicas(self, path: str, tree: bool = False) -> None:
        if self.cache is None:
            return
        if tree:
            self.cache.invalidate_prefix(self._key(path))
        else:
            self.cache.invalidate(self._key(path))

    # -- metadata ------------------------------------------------------
    def getattr(self, path: str) -> Dict[str, Any]:
        full = self._full(path)
        writers = self._writers.get(full)
        if writers:
            for w in list(writers):
                w.wait()      # sizes are never behind the writes sent
        else:
            c = self._seen.attrs(full)
            if c is not None:
                if isinstance(c, int):
                    raise _err(c, path)
                return c
            # a missing or non-directory ancestor answers without a round trip
            if path != "/":
                anc = full
                while True:
                    anc = anc.rsplit(b"/", 1)[0]
                    if len(anc) < len(self.root) or not anc:
                        break
                    ca = self._seen.attrs(anc)
                    if ca is None:
                        continue
                    if isinstance(ca, int) or not stat.S_ISDIR(ca["st_mode"]):
                        raise _err(errno.ENOENT, path)
                    break
        return self._lstat(full, path)

    def _lstat(self, full: bytes, path: str) -> Dict[str, Any]:
        try:
            t, data = self._call(CMD_LSTAT, full)
        except StatusError as e:
            if e.errno == errno.ENOENT:
                self._seen.remember(full, errno.ENOENT)
            raise _err(e.errno, path)
        d = self._attrs(SFTPAttributes._from_msg(Message(data)))
        self._seen.remember(full, d)
        return d

    def readdir(self, path: str) -> List[str]:
        full = self._full(path)
        known = self._seen.names(full)
        if known is not None:
            return known
        sess = self._session()
        t, data = sess.request(CMD_OPENDIR, full)
        h = _handle_of(data)
        names: List[str] = []
        now = time.monotonic()
        base = full if full.endswith(b"/") else full + b"/"
        try:
            while True:
                try:
                    t, data = sess.request(CMD_READDIR, h)
                except StatusError as e:
                    if e.code == FX_EOF:
                        break
                    raise
                if t != CMD_NAME:
                    break
                m = Message(data)
                for _ in range(m.get_int()):
                    fn = m.get_string()
                    m.get_string()  # longname
                    a = SFTPAttributes._from_msg(m)
                    if fn in (b".", b".."):
                        continue
                    names.append(_dec(fn))
                    self._seen.remember(base + fn, self._attrs(a), now)
        finally:
            try:
                sess.request(CMD_CLOSE, h)
            except OSError:
                pass
        self._seen.remember_names(full, names, now)
        return list(names)

    def readlink(self, path: str) -> str:
        t, data = self._call(CMD_READLINK, self._full(path))
        m = Message(data)
        m.get_int()
        return _dec(m.get_string())

    def _exists(self, full: bytes) -> Optional[Dict[str, Any]]:
        try:
            t, data = self._call(CMD_LSTAT, full)
        except StatusError:
            return None
        return self._attrs(SFTPAttributes._from_msg(Message(data)))

    def mkdir(self, path: str, mode: int) -> None:
        full = self._full(path)
        a = SFTPAttributes()
        a.st_mode = mode & 0o7777
        try:
            self._call(CMD_MKDIR, full, a)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE and self._exists(full) is not None:
                raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)
        if mode & 0o022:
            # the server's umask may have taken bits the caller asked for
            try:
                self.chmod(path, mode & 0o7777)
            except OSError:
                pass

    def rmdir(self, path: str) -> None:
        full = self._full(path)
        try:
            self._call(CMD_RMDIR, full)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and not stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.ENOTDIR, path)
                if st is not None:
                    raise _err(errno.ENOTEMPTY, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full, tree=True)
        self._drop_replicas(path, tree=True)

    def unlink(self, path: str) -> None:
        full = self._full(path)
        try:
            self._call(CMD_REMOVE, full)
        except StatusError as e:
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.EISDIR, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)
            self._drop_replicas(path)

    def rename(self, old: str, new: str) -> None:
        fo, fn = self._full(old), self._full(new)
        sess = self._session()
        try:
            if "posix-rename@openssh.com" in sess.extensions:
                self._call(CMD_EXTENDED, "posix-rename@openssh.com", fo, fn)
            else:
                self._call(CMD_RENAME, fo, fn)
        except StatusError as e:
            if e.code == FX_FAILURE:
                so, sn = self._exists(fo), self._exists(fn)
                if so is not None and sn is not None:
                    if stat.S_ISDIR(sn["st_mode"]) and not stat.S_ISDIR(so["st_mode"]):
                        raise _err(errno.EISDIR, new)
                    if stat.S_ISDIR(so["st_mode"]) and not stat.S_ISDIR(sn["st_mode"]):
                        raise _err(errno.ENOTDIR, new)
                    if stat.S_ISDIR(sn["st_mode"]):
                        raise _err(errno.ENOTEMPTY, new)
                    raise _err(errno.EEXIST, new)
            raise _err(e.errno, old)
        finally:
            self._invalidate(fo, tree=True)
            self._invalidate(fn, tree=True)
            self._drop_replicas(old, tree=True)
            self._drop_replicas(new, tree=True)

    def symlink(self, target: str, path: str) -> None:
        full = self._full(path)
        try:
            # OpenSSH's sftp-server takes (target, linkpath), like paramiko sends it
            self._call(CMD_SYMLINK, _enc(target), full)
        except StatusError as e:
            if e.code == FX_FAILURE and self._exists(full) is not None:
                raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)

    def _setstat(self, path: str, a: SFTPAttributes) -> None:
        full = self._full(path)
        try:
            self._call(CMD_SETSTAT, full, a)
        except StatusError as e:
            raise _err(e.errno if e.code != FX_FAILURE else errno.EPERM, path)
        finally:
            self._invalidate(full)

    def chmod(self, path: str, mode: int) -> None:
        a = SFTPAttributes()
        a.st_mode = mode & 0o7777
        self._setstat(path, a)

    def chown(self, path: str, uid: int, gid: int) -> None:
        cur = self.getattr(path)
        a = SFTPAttributes()
        ruid = cur["st_uid"] if uid < 0 else uid
        rgid = cur["st_gid"] if gid < 0 else gid
        a.st_uid = self.remote_uid if ruid == self.local_uid else ruid
        a.st_gid = self.remote_gid if rgid == self.local_gid else rgid
        try:
            self._setstat(path, a)
        except OSError as e:
            if e.errno == errno.EACCES:
                raise _err(errno.EPERM, path)
            raise

    def truncate(self, path: str, length: int) -> None:
        a = SFTPAttributes()
        a.st_size = length
        self._setstat(path, a)
        self._drop_replicas(path)

    def utimens(self, path: str, times: Optional[Tuple[float, float]]) -> None:
        a = SFTPAttributes()
        if times is None:
            now = int(time.time())
            a.st_atime, a.st_mtime = now, now
        else:
            a.st_atime, a.st_mtime = int(times[0]), int(times[1])
        self._setstat(path, a)
        self._drop_replicas(path)

    def statfs(self) -> Dict[str, Any]:
        sess = self._session()
        if "statvfs@openssh.com" not in sess.extensions:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 0, "f_bfree": 0,
                    "f_bavail": 0, "f_files": 0, "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
        t, data = self._call(CMD_EXTENDED, "statvfs@openssh.com", self.root)
        m = Message(data)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                "f_ffree", "f_favail", "f_fsid", "f_flag", "f_namemax")
        d = {k: m.get_int64() for k in keys}
        d.pop("f_fsid")
        d.pop("f_flag")
        return d

    # -- data ----------------------------------------------------------
    def open_read(self, path: str) -> ReadHandle:
        full = self._full(path)
        writers = self._writers.get(full)
        for w in list(writers or ()):
            w.wait()
        st = self._lstat(full, path)      # fresh: close-to-open consistency
        if stat.S_ISDIR(st["st_mode"]):
            raise _err(errno.EISDIR, path)
        size, mtime = st["st_size"], int(st["st_mtime"])
        cache = self.cache
        # a file open for writing here changes under any replica: read it directly
        if (cache is None or writers or not cache.fits(size)
                or not stat.S_ISREG(st["st_mode"])):
            sess = self._session()
            t, data = sess.request(CMD_OPEN, full, SSH_FXF_READ, SFTPAttributes())
            return DirectReadHandle(sess, _handle_of(data))
        key = self._key(path)
        f = cache.get(key, size, mtime)
        if f is not None:
            try:
                return LocalReadHandle(os.open(f, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                pass
        with self._streams_lock:
            s = self._streams.get((key, size, mtime))
            if s is not None:
                with s.cond:
                    if not s.cancelled and (not s.finished or s.fd >= 0):
                        s.refs += 1
                        return StreamReadHandle(s)
            try:
                s = _Stream(self, full, key, size, mtime)
            except StatusError as e:
                raise _err(e.errno, path)
            self._streams[(key, size, mtime)] = s
        return StreamReadHandle(s)

    def _stream_done(self, s: _Stream) -> None:
        with self._streams_lock:
            if self._streams.get((s.key, s.size, s.mtime)) is s:
                del self._streams[(s.key, s.size, s.mtime)]

    def has_replica(self, path: str, size: int, mtime: int) -> bool:
        return self.cache is not None and self.cache.has(self._key(path), size, mtime)

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        full = self._full(path)
        pf = SSH_FXF_WRITE
        if (flags & os.O_ACCMODE) == os.O_RDWR:
            pf |= SSH_FXF_READ
        if create:
            pf |= SSH_FXF_CREAT
            if flags & os.O_EXCL:
                pf |= SSH_FXF_EXCL
        if flags & os.O_TRUNC:
            pf |= SSH_FXF_TRUNC
        a = SFTPAttributes()
        if create:
            a.st_mode = mode & 0o7777
        self._drop_replicas(path)
        sess = self._session()
        try:
            t, data = sess.request(CMD_OPEN, full, pf, a)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.EISDIR, path)
                if st is not None and create and flags & os.O_EXCL:
                    raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        self._invalidate(full)
        h = SftpWriteHandle(self, full, path, sess, _handle_of(data))
        with self._cache_lock:
            self._writers.setdefault(full, set()).add(h)
        return h

    def _writer_closed(self, h: SftpWriteHandle) -> None:
        with self._cache_lock:
            s = self._writers.get(h.full)
            if s is not None:
                s.discard(h)
                if not s:
                    del self._writers[h.full]
        self._invalidate(h.full)
        self._drop_replicas(h.path)

    # -- chain of cascaded mounts ----------------------------------------
    def read_small(self, path: bytes, limit: int = 1 << 20) -> Optional[bytes]:
        """Content of a small remote file by absolute remote path, or None."""
        try:
            sess = self._session()
            t, data = sess.request(CMD_OPEN, path, SSH_FXF_READ, SFTPAttributes())
        except OSError:
            return None
        h = _handle_of(data)
        try:
            # Whole or nothing: a read that fails halfway is no file's content.
            return read_range(sess, h, limit, 0)
        except OSError:
            return None
        finally:
            try:
                sess.request(CMD_CLOSE, h)
            except OSError:
                pass
