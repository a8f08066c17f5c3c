"""A branch on a local directory.

Every path is confined to the branch root: ".." or empty components are refused
with EACCES, and a path whose directories resolve (through symlinks) outside the
root is refused with EACCES. The last component is never followed: symlinks are
reported as symlinks (the kernel follows them in the merged namespace) and files
are opened with O_NOFOLLOW. Paths listed in `exclude` (the mountpoint of the
merged mount, the replica cache) do not exist as far as the branch is concerned,
so a branch that contains the mountpoint never recurses into its own mount.

Extended attributes: user.* only (other namespaces: ENODATA / ENOTSUP).

Standard library only.
"""
from __future__ import annotations

import errno
import os
import socket
import stat

from .branch import Branch, ReadHandle, WriteHandle, stat_dict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

# flags a branch passes to open(2); the kernel already resolved O_APPEND into
# offsets, so it must not be applied twice.
_PASS_FLAGS = (os.O_ACCMODE | os.O_CREAT | os.O_EXCL | os.O_TRUNC
               | getattr(os, "O_SYNC", 0) | getattr(os, "O_DSYNC", 0))


def _err(code: int, path: str = "") -> OSError:
    return OSError(code, os.strerror(code), path) if path else OSError(code, os.strerror(code))


class LocalReadHandle(ReadHandle):
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def fd_for(self, size: int, offset: int) -> "Tuple[int, int]":
        """(fd, size) the kernel may read this range from (libfuse preads it)."""
        return self.fd, size

    def fstat(self) -> "Dict[str, Any]":
        return _attrs(os.fstat(self.fd))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class LocalWriteHandle(LocalReadHandle, WriteHandle):
    fd_for = None  # type: ignore[assignment]   # reads of a file open for writing go through read()

    def write(self, data: bytes, offset: int) -> int:
        return os.pwrite(self.fd, data, offset)

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)

    def flush(self) -> None:
        pass

    def fsync(self) -> None:
        os.fsync(self.fd)


def _attrs(st: os.stat_result) -> "Dict[str, Any]":
    d = stat_dict(st)
    d["st_mtime_ns"] = st.st_mtime_ns
    d["st_atime_ns"] = st.st_atime_ns
    d["st_ctime_ns"] = st.st_ctime_ns
    return d


def _user_xattr(name: str) -> bool:
    return name.startswith("user.")


class LocalBranch(Branch):
    local = True

    def __init__(self, root: str, node: "Optional[str]" = None,
                 exclude: "Iterable[str]" = (), name: "Optional[str]" = None) -> None:
        if not os.path.isdir(root):
            raise _err(errno.ENOTDIR if os.path.exists(root) else errno.ENOENT, root)
        self.root = os.path.abspath(root)
        self.realroot = os.path.realpath(root)
        self.node = node or socket.gethostname()
        self.name = name or self.root
        self.exclude: "Set[str]" = set()
        for p in exclude:
            self.add_exclude(p)
        self.writable = os.access(self.realroot, os.W_OK)

    def add_exclude(self, path: str) -> None:
        real = os.path.realpath(path)
        if real != self.realroot and real.startswith(self.realroot.rstrip("/") + "/"):
            self.exclude.add(real)

    # -- confinement ---------------------------------------------------
    def _inside(self, real: str) -> bool:
        return real == self.realroot or real.startswith(self.realroot.rstrip("/") + "/")

    def _path(self, path: str) -> str:
        """Real path of `path` (last component not followed), confined."""
        if not path.startswith("/"):
            raise _err(errno.EACCES, path)
        if path == "/":
            return self.realroot
        comps = path[1:].split("/")
        for c in comps:
            if c in ("", ".", ".."):
                raise _err(errno.EACCES, path)
        if len(comps) == 1:
            parent = self.realroot
        else:
            parent = os.path.realpath(os.path.join(self.realroot, *comps[:-1]))
            if not self._inside(parent):
                raise _err(errno.EACCES, path)
        full = os.path.join(parent, comps[-1])
        if self.exclude and (full in self.exclude or parent in self.exclude
                             or any(full.startswith(x + "/") for x in self.exclude)):
            raise _err(errno.ENOENT, path)
        return full

    # -- metadata ------------------------------------------------------
    def getattr(self, path: str) -> "Dict[str, Any]":
        return _attrs(os.lstat(self._path(path)))

    def readdir(self, path: str) -> "List[str]":
        real = self._path(path)
        names = os.listdir(real)
        if self.exclude:
            names = [n for n in names if os.path.join(real, n) not in self.exclude]
        return names

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._path(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._path(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._path(old), self._path(new))

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, self._path(path))

    def link(self, old: str, new: str) -> None:
        os.link(self._path(old), self._path(new), follow_symlinks=False)

    def chmod(self, path: str, mode: int) -> None:
        real = self._path(path)
        if stat.S_ISLNK(os.lstat(real).st_mode):
            return  # Linux has no symlink modes
        os.chmod(real, mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._path(path), uid, gid, follow_symlinks=False)

    def truncate(self, path: str, length: int) -> None:
        real = self._path(path)
        fd = os.open(real, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def utimens(self, path: str, times: "Optional[Tuple[float, float]]") -> None:
        real = self._path(path)
        if times is None:
            os.utime(real, None, follow_symlinks=False)
        else:
            os.utime(real, ns=(int(round(times[0] * 1e9)), int(round(times[1] * 1e9))),
                     follow_symlinks=False)

    def utimens_ns(self, path: str, ns: "Tuple[int, int]") -> None:
        os.utime(self._path(path), ns=ns, follow_symlinks=False)

    def statfs(self) -> "Dict[str, Any]":
        st = os.statvfs(self.realroot)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                             "f_bavail", "f_files", "f_ffree", "f_favail",
                                             "f_flag", "f_namemax")}

    # -- data ----------------------------------------------------------
    def open_read(self, path: str) -> ReadHandle:
        fd = os.open(self._path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return LocalReadHandle(fd)

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        fl = (flags & _PASS_FLAGS) | os.O_NOFOLLOW | os.O_CLOEXEC
        if (fl & os.O_ACCMODE) == os.O_RDONLY:
            fl = (fl & ~os.O_ACCMODE) | os.O_WRONLY
        if create:
            fl |= os.O_CREAT
        else:
            fl &= ~(os.O_CREAT | os.O_EXCL)
        fd = os.open(self._path(path), fl, mode & 0o7777)
        return LocalWriteHandle(fd)

    # -- extended attributes ------------------------------------------
    def getxattr(self, path: str, name: str) -> bytes:
        if not _user_xattr(name):
            raise _err(errno.ENODATA)
        return os.getxattr(self._path(path), name, follow_symlinks=False)

    def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        if not _user_xattr(name):
            raise _err(errno.ENOTSUP)
        os.setxattr(self._path(path), name, value, flags, follow_symlinks=False)

    def listxattr(self, path: str) -> "List[str]":
        try:
            names = os.listxattr(self._path(path), follow_symlinks=False)
        except OSError as e:
            if e.errno in (errno.ENOTSUP, errno.EPERM):
                return []
            raise
        return [n for n in names if _user_xattr(n)]

    def removexattr(self, path: str, name: str) -> None:
        if not _user_xattr(name):
            raise _err(errno.ENOTSUP)
        os.removexattr(self._path(path), name, follow_symlinks=False)
