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
import itertools
import os
import socket
import stat
import threading
import time

from sshfsmux.branches.branch import Branch, ReadHandle, WriteHandle
from sshfsmux.branches.confined_paths import Confined
from sshfsmux.branches.local_syscalls import (
    AT_SYMLINK_NOFOLLOW,
    DIR_FLAGS,
    OPENAT2_CHUNK,
    libc_stat,
    open_beneath,
    openat2,
    process_umask,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

# flags a branch passes to open(2); the kernel already resolved O_APPEND into
# offsets, so it must not be applied twice.
# O_APPEND too: a write then lands at the file's end whatever offset the
# kernel gives (its idea of the size is stale when another node appended:
# recipes on several nodes doing `echo $@ >> build.log`)
_PASS_FLAGS = (os.O_ACCMODE | os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND
               | getattr(os, "O_SYNC", 0) | getattr(os, "O_DSYNC", 0))


_monotonic = time.monotonic
_GENERAL = 1        # stat_into: take the general path
# how long stat_into keeps a parent directory open for the next names in it
# (per FUSE thread): a directory renamed or replaced behind the mount's back
# is looked up again within this, as the kernel does its own cached names
# (fuse_glue.ATTR_SECONDS); a rename or rmdir through the branch drops it
PARENT_SECONDS = 1.0


def _err(code: int, path: str = "") -> OSError:
    return OSError(code, os.strerror(code), path) if path else OSError(code, os.strerror(code))


class LocalReadHandle(ReadHandle):
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def fd_for(self, size: int, offset: int) -> Tuple[int, int]:
        """(fd, size) the kernel may read this range from (libfuse preads it)."""
        return self.fd, size

    def fstat(self) -> Dict[str, Any]:
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


def _attrs(st: os.stat_result) -> Dict[str, Any]:
    # stat_dict's keys plus nanosecond times, written out: on the hot path
    d = {"st_mode": st.st_mode, "st_size": st.st_size, "st_mtime": st.st_mtime,
         "st_atime": st.st_atime, "st_ctime": st.st_ctime, "st_nlink": st.st_nlink,
         "st_uid": st.st_uid, "st_gid": st.st_gid, "st_mtime_ns": st.st_mtime_ns,
         "st_atime_ns": st.st_atime_ns, "st_ctime_ns": st.st_ctime_ns}
    if st.st_rdev:
        d["st_rdev"] = st.st_rdev
    return d


def _user_xattr(name: str) -> bool:
    return name.startswith("user.")


class LocalBranch(Branch):
    local = True

    def __init__(self, root: str, node: Optional[str] = None,
                 exclude: Iterable[str] = (), name: Optional[str] = None) -> None:
        if not os.path.isdir(root):
            raise _err(errno.ENOTDIR if os.path.exists(root) else errno.ENOENT, root)
        self.root = os.path.abspath(root)
        self.realroot = os.path.realpath(root)
        self.node = node or socket.gethostname()
        self.name = name or self.root
        self.exclude: Set[str] = set()
        self._rel_exclude: Set[str] = set()   # the same, as paths of the branch
        for p in exclude:
            self.add_exclude(p)
        self.writable = os.access(self.realroot, os.W_OK)
        self.root_fd = os.open(self.realroot, DIR_FLAGS)
        self._walker = Confined(self.realroot)
        # the kernel already applied the caller's umask to every mode it
        # passes; a mount run inside a process with its own umask (a GMount
        # in the agent) must not apply that one too: new names get their
        # mode set exactly when the umask would take bits off
        self._umask = process_umask()
        # stat_into's open parent directory, one per FUSE thread (so no fd is
        # closed while another thread stats in it): [dir, fd, generation,
        # deadline, thread id]; every such list, to close them with the
        # branch or when their thread has gone (libfuse ends idle workers)
        self._parent = threading.local()
        self._parents: List[List[Any]] = []
        self._parents_lock = threading.Lock()
        self._generations = itertools.count(1)     # next() is atomic
        self._generation = 0       # changed by rename and rmdir: parents reopen

    def add_exclude(self, path: str) -> None:
        real = os.path.realpath(path)
        if real != self.realroot and real.startswith(self.realroot.rstrip("/") + "/"):
            self.exclude.add(real)
            self._rel_exclude.add(real[len(self.realroot.rstrip("/")):])

    # -- confinement ---------------------------------------------------
    def _inside(self, real: str) -> bool:
        return real == self.realroot or real.startswith(self.realroot.rstrip("/") + "/")

    def _excluded(self, path: str) -> bool:
        for x in self._rel_exclude:
            if path == x or path.startswith(x + "/"):
                return True
        return False

    def _at(self, path: str) -> Tuple[int, str]:
        """(directory fd, name) of `path`, confined; the caller closes the fd
        unless it is self.root_fd. The last component is never followed.
        Directories are opened relative to the root (openat2 RESOLVE_BENEATH
        where the kernel has it, else one component at a time), so a path may
        be longer than PATH_MAX from the root, as on a local file system."""
        if not path.startswith("/"):
            raise _err(errno.EACCES, path)
        if path == "/":
            return self.root_fd, "."
        comps = path[1:].split("/")
        for c in comps:
            if c in ("", ".", ".."):
                raise _err(errno.EACCES, path)
        if self._rel_exclude and self._excluded(path):
            raise _err(errno.ENOENT, path)
        name = comps.pop()
        if not comps:
            return self.root_fd, name
        if len(comps) == 1:
            # one directory: a plain openat that refuses a symlink
            try:
                fd = os.open(comps[0], DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.root_fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                fd = -1
        else:
            fd = open_beneath(self.root_fd, comps) if openat2 is not None else -1
        if fd < 0:
            # a symlink among the directories (or no openat2): expand it, confined
            fd = self._walker.walk(comps)
            if self._rel_exclude:
                real = os.readlink("/proc/self/fd/%d" % fd) if os.path.isdir("/proc/self/fd") else ""
                full = os.path.join(real, name)
                if full in self.exclude or real in self.exclude or any(
                        full.startswith(x + "/") for x in self.exclude):
                    os.close(fd)
                    raise _err(errno.ENOENT, path)
        return fd, name

    def _done(self, fd: int) -> None:
        if fd != self.root_fd:
            os.close(fd)

    def _one(self, path: str, fn: Any) -> Any:
        """fn(name, directory fd) for `path`, confined (see _at)."""
        d, name = self._at(path)
        try:
            return fn(name, d)
        finally:
            self._done(d)

    def _dir_fd(self, path: str) -> int:
        """An fd of the directory `path` itself (never a symlink), for listing."""
        return self._one(path, lambda n, d: os.open(
            n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d))

    def _hidden(self, path: str, names: Iterable[str]) -> Set[str]:
        """The names of directory `path` that the exclude list hides."""
        if not self._rel_exclude:
            return set()
        base = path.rstrip("/") + "/"
        return {n for n in names if base + n in self._rel_exclude}

    # -- metadata ------------------------------------------------------
    def getattr(self, path: str) -> Dict[str, Any]:
        d, name = self._at(path)
        try:
            return _attrs(os.stat(name, dir_fd=d, follow_symlinks=False))
        finally:
            if d != self.root_fd:
                os.close(d)

    def stat_into(self, path: bytes, buf: Any) -> int:
        """lstat of `path` (as libfuse passes it) written into the struct stat
        at `buf`: 0, -ENOENT (also for ENOTDIR, as getattr's callers want),
        or _GENERAL when anything is unusual (root, odd components, excludes,
        a symlink among the directories, other errors): getattr then decides.
        Confined as _at: one directory is opened O_NOFOLLOW, deeper ones by
        openat2 RESOLVE_BENEATH with no symlinks."""
        if libc_stat is None or self._rel_exclude or len(path) < 2:
            return _GENERAL
        # find, not `in`: bytes' `in` first tries its argument as an integer
        # and makes (and drops) a TypeError, twice per call
        if path.find(b"//") >= 0 or path.find(b"/.") >= 0:
            return _GENERAL             # "." and ".." (and dot names: rare, general)
        openat, fstatat, close, get_errno = libc_stat
        i = path.rfind(b"/")
        if i == 0:
            rc = fstatat(self.root_fd, path[1:], buf, AT_SYMLINK_NOFOLLOW)
        else:
            d = path[1:i]
            # a stat storm asks for many names of one directory: its fd is
            # kept open (per thread) instead of an openat and a close per name
            kept = getattr(self._parent, "kept", None)
            if (kept is not None and kept[0] == d and kept[2] == self._generation
                    and _monotonic() < kept[3]):
                rc = fstatat(kept[1], path[i + 1:], buf, AT_SYMLINK_NOFOLLOW)
                if rc < 0:
                    return -errno.ENOENT if get_errno() in (errno.ENOENT, errno.ENOTDIR) else _GENERAL
                return 0
            generation = self._generation
            if d.find(b"/") < 0:
                fd = openat(self.root_fd, d, DIR_FLAGS | os.O_NOFOLLOW)
            elif openat2 is not None and len(d) < OPENAT2_CHUNK:
                fd = openat2(self.root_fd, d)
                if fd < 0:
                    return -errno.ENOENT if -fd == errno.ENOENT else _GENERAL
            else:
                return _GENERAL
            if fd < 0:
                return -errno.ENOENT if get_errno() == errno.ENOENT else _GENERAL
            rc = fstatat(fd, path[i + 1:], buf, AT_SYMLINK_NOFOLLOW)
            e = get_errno() if rc < 0 else 0
            self._keep_parent(kept, d, fd, generation)
            if rc < 0:
                return -errno.ENOENT if e in (errno.ENOENT, errno.ENOTDIR) else _GENERAL
            return 0
        if rc < 0:
            return -errno.ENOENT if get_errno() in (errno.ENOENT, errno.ENOTDIR) else _GENERAL
        return 0

    def _keep_parent(self, kept: Optional[List[Any]], d: bytes, fd: int, generation: int) -> None:
        """This thread's open parent directory is now `d` (fd), the one it
        had before is closed: only this thread ever uses its own."""
        if kept is None:
            kept = [b"", -1, 0, 0.0, threading.get_native_id()]
            self._parent.kept = kept
            with self._parents_lock:
                self._close_gone_threads_parents()
                self._parents.append(kept)
        old = kept[1]
        kept[:4] = [d, fd, generation, _monotonic() + PARENT_SECONDS]
        if old >= 0:
            os.close(old)

    def _close_gone_threads_parents(self) -> None:
        """libfuse ends a worker thread that finds too many idle ones and
        starts new ones in a burst: each new thread keeps a parent of its
        own, so the kept parents of threads that have ended are closed here
        (a thread that has ended never uses its fd again; without this, a
        busy mount ran out of file descriptors). Linux only (/proc)."""
        if not os.path.isdir("/proc/self/task"):
            return
        live = []
        for k in self._parents:
            if os.path.exists("/proc/self/task/%d" % k[4]):
                live.append(k)
            elif k[1] >= 0:
                fd, k[1] = k[1], -1
                os.close(fd)
        self._parents[:] = live

    def _forget_parents(self) -> None:
        """A directory was renamed or removed through the branch (called
        after the change, so a parent opened before it is not kept as new):
        every thread's kept parent is reopened before its next use."""
        self._generation = next(self._generations)

    def readdir(self, path: str) -> List[str]:
        fd = self._dir_fd(path)
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        hidden = self._hidden(path, names)
        return [n for n in names if n not in hidden] if hidden else names

    def readdir_attrs(self, path: str) -> Dict[str, Dict[str, Any]]:
        """Every name of a directory with its attributes (lstat), for readdirplus."""
        fd = self._dir_fd(path)
        out = {}
        try:
            for n in os.listdir(fd):
                try:
                    out[n] = _attrs(os.stat(n, dir_fd=fd, follow_symlinks=False))
                except OSError:
                    pass        # gone meanwhile: the kernel will look it up
        finally:
            os.close(fd)
        for n in self._hidden(path, out):
            del out[n]
        return out

    def readlink(self, path: str) -> str:
        return self._one(path, lambda n, d: os.readlink(n, dir_fd=d))

    def _exact_mode(self, name: str, d: int, mode: int) -> None:
        """A name just made: its permission bits as asked, whatever our umask."""
        if mode & self._umask & 0o7777:
            os.chmod(name, mode & 0o7777, dir_fd=d, follow_symlinks=False)

    def mkdir(self, path: str, mode: int) -> None:
        def make(n: str, d: int) -> None:
            os.mkdir(n, mode, dir_fd=d)
            self._exact_mode(n, d, mode)
        self._one(path, make)

    def mknod(self, path: str, mode: int, dev: int) -> None:
        """FIFOs and sockets (and devices, for root): node-local by nature."""
        def make(n: str, d: int) -> None:
            os.mknod(n, mode, dev, dir_fd=d)
            self._exact_mode(n, d, mode)
        self._one(path, make)

    def rmdir(self, path: str) -> None:
        try:
            self._one(path, lambda n, d: os.rmdir(n, dir_fd=d))
        finally:
            self._forget_parents()

    def unlink(self, path: str) -> None:
        self._one(path, lambda n, d: os.unlink(n, dir_fd=d))

    def _two(self, old: str, new: str, fn: Any) -> None:
        d1, n1 = self._at(old)
        try:
            d2, n2 = self._at(new)
            try:
                fn(n1, n2, d1, d2)
            finally:
                self._done(d2)
        finally:
            self._done(d1)

    def rename(self, old: str, new: str) -> None:
        try:
            self._two(old, new, lambda a, b, d1, d2: os.rename(a, b, src_dir_fd=d1, dst_dir_fd=d2))
        finally:
            self._forget_parents()

    def symlink(self, target: str, path: str) -> None:
        self._one(path, lambda n, d: os.symlink(target, n, dir_fd=d))

    def link(self, old: str, new: str) -> None:
        self._two(old, new, lambda a, b, d1, d2: os.link(a, b, src_dir_fd=d1, dst_dir_fd=d2,
                                                         follow_symlinks=False))

    def chmod(self, path: str, mode: int) -> None:
        d, name = self._at(path)
        try:
            if stat.S_ISLNK(os.stat(name, dir_fd=d, follow_symlinks=False).st_mode):
                return  # Linux has no symlink modes
            os.chmod(name, mode, dir_fd=d)
        finally:
            self._done(d)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self._one(path, lambda n, d: os.chown(n, uid, gid, dir_fd=d, follow_symlinks=False))

    def truncate(self, path: str, length: int) -> None:
        fd = self._open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def utimens(self, path: str, times: Optional[Tuple[float, float]]) -> None:
        if times is None:
            self._one(path, lambda n, d: os.utime(n, None, dir_fd=d, follow_symlinks=False))
        else:
            self.utimens_ns(path, (int(round(times[0] * 1e9)), int(round(times[1] * 1e9))))

    def utimens_ns(self, path: str, ns: Tuple[int, int]) -> None:
        self._one(path, lambda n, d: os.utime(n, ns=ns, dir_fd=d, follow_symlinks=False))

    def statfs(self) -> Dict[str, Any]:
        st = os.statvfs(self.realroot)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                             "f_bavail", "f_files", "f_ffree", "f_favail",
                                             "f_flag", "f_namemax")}

    # -- data ----------------------------------------------------------
    def _open(self, path: str, flags: int, mode: int = 0o666) -> int:
        return self._one(path, lambda n, d: os.open(n, flags, mode, dir_fd=d))

    def open_read(self, path: str) -> ReadHandle:
        return LocalReadHandle(self._open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        fl = (flags & _PASS_FLAGS) | os.O_NOFOLLOW | os.O_CLOEXEC
        if (fl & os.O_ACCMODE) == os.O_RDONLY:
            fl = (fl & ~os.O_ACCMODE) | os.O_WRONLY
        if create:
            fl |= os.O_CREAT
        else:
            fl &= ~(os.O_CREAT | os.O_EXCL)
        mode &= 0o7777
        if create and mode & self._umask:
            # made here (O_EXCL) -> the mode exactly; there already -> as it is
            try:
                fd = self._open(path, fl | os.O_EXCL, mode)
            except FileExistsError:
                if fl & os.O_EXCL:
                    raise
            else:
                os.fchmod(fd, mode)
                return LocalWriteHandle(fd)
        return LocalWriteHandle(self._open(path, fl, mode))

    def _xpath(self, path: str) -> Tuple[int, str]:
        """(fd to close or -1, a path string for the xattr calls, which have
        no dir_fd form): the directory through /proc, the name not followed."""
        d, name = self._at(path)
        if d == self.root_fd:
            return -1, self.realroot if name == "." else os.path.join(self.realroot, name)
        return d, "/proc/self/fd/%d/%s" % (d, name)

    # -- extended attributes ------------------------------------------
    def getxattr(self, path: str, name: str) -> bytes:
        if not _user_xattr(name):
            raise _err(errno.ENODATA)
        fd, p = self._xpath(path)
        try:
            return os.getxattr(p, name, follow_symlinks=False)
        finally:
            if fd >= 0:
                os.close(fd)

    def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        if not _user_xattr(name):
            raise _err(errno.ENOTSUP)
        fd, p = self._xpath(path)
        try:
            os.setxattr(p, name, value, flags, follow_symlinks=False)
        finally:
            if fd >= 0:
                os.close(fd)

    def listxattr(self, path: str) -> List[str]:
        fd, p = self._xpath(path)
        try:
            names = os.listxattr(p, follow_symlinks=False)
        except OSError as e:
            if e.errno in (errno.ENOTSUP, errno.EPERM):
                return []
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        return [n for n in names if _user_xattr(n)]

    def removexattr(self, path: str, name: str) -> None:
        if not _user_xattr(name):
            raise _err(errno.ENOTSUP)
        fd, p = self._xpath(path)
        try:
            os.removexattr(p, name, follow_symlinks=False)
        finally:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        # after the mount's threads are done: their kept parents go too
        self._forget_parents()
        for kept in self._parents:
            fd, kept[1] = kept[1], -1
            if fd >= 0:
                os.close(fd)
        if self.root_fd >= 0:
            fd, self.root_fd = self.root_fd, -1
            os.close(fd)
        self._walker.close()
