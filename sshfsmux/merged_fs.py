"""The merged tree: one FUSE filesystem over a list of branches.

The rules (docs/merge-semantics.md says the same, with examples):

- Order: local branches first (in the order given), then remote ones (in the
  order given). A lookup answers from the first branch that has the name.
- Directories present in several branches are one directory (their union).
- A regular file present in several branches is one file with replicas when
  size and mtime (whole seconds) agree; otherwise it is a conflict: the first
  branch's version is visible, the others are hidden, getxattr
  user.sshfsmux.conflict names the branches whose version differs, and the
  mount logs one line (once per name).
- readdir: the sorted union, no duplicates, never internal names.
- create/mkdir/symlink: in the first writable local branch (else the first
  writable branch), creating missing parent directories there with the modes of
  the merged view.
- write/truncate/chmod/utimens of an existing file: every branch holding the
  visible version (replicas stay replicas: mtimes are re-aligned after a write).
- unlink/rmdir: the name goes from every branch holding it (rmdir: ENOTEMPTY if
  the merged directory is not empty).
- rename: within each branch holding the source (its parent made there if
  needed); the target is first removed from branches that do not hold the
  source, so the name has one meaning afterwards.
- xattrs: user.sshfsmux.location (nodes holding a complete copy),
  user.sshfsmux.conflict, hints user.sshfsmux.dp / user.sshfsmux.replication,
  other user.* passed to the visible branch.
- /.sshfsmux-chain: a virtual read-only file (hidden from readdir) listing
  host:mountpoint of this mount and of every mount of ours it is built on.
- /.sshfsmux-branches: the same for the branches: host:path of every branch
  of this mount and of the mounts it is built on (so that a new mount can
  refuse to sit inside any of them, or to contain any of them).

Every error is an OSError with a proper errno; anything else becomes EIO with
one log line, never a traceback to the caller.

run_fuse(fs, mountpoint) mounts a MergedFS and serves it (sshfsm, gxpc mount).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import os
import re
import socket
import stat
import threading
import time


def _prefer_libfuse3() -> None:
    """mfusepy loads libfuse 2 when both are installed (common: bindfs and
    many desktop tools pull in libfuse2). Our mounts are written for libfuse 3
    (max_threads, rename flags, fuse_config): point mfusepy at it unless the
    user chose a library with FUSE_LIBRARY_PATH."""
    if os.environ.get("FUSE_LIBRARY_PATH"):
        return
    from ctypes.util import find_library
    path = find_library("fuse3")
    if path:
        os.environ["FUSE_LIBRARY_PATH"] = path


_prefer_libfuse3()

from mfusepy import FuseOSError, Operations, fuse_get_context  # noqa: E402

from .branch import Branch, ReadHandle, WriteHandle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

CHAIN_NAME = ".sshfsmux-chain"
CHAIN_PATH = "/" + CHAIN_NAME
BRANCHES_NAME = ".sshfsmux-branches"
BRANCHES_PATH = "/" + BRANCHES_NAME
XA_LOCATION = "user.sshfsmux.location"
XA_CONFLICT = "user.sshfsmux.conflict"
XA_DP = "user.sshfsmux.dp"
XA_REPLICATION = "user.sshfsmux.replication"
HINTS = (XA_DP, XA_REPLICATION)
COMPUTED = (XA_LOCATION, XA_CONFLICT)
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
XATTR_CREATE, XATTR_REPLACE = 1, 2

_DP_RE = re.compile(r"^(local|collocation:[A-Za-z0-9._-]+)$")
_REPL_RE = re.compile(r"^[1-9][0-9]{0,8}$")


# libfuse's struct fuse_buf / fuse_bufvec (buf[] is inline, one element here)
class _FuseBuf(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class _FuseBufVec(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", _FuseBuf * 1)]


FUSE_BUF_IS_FD, FUSE_BUF_FD_SEEK = 1 << 1, 1 << 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def _e(code: int) -> FuseOSError:
    return FuseOSError(code)


class View:
    """What the branches hold under one name."""
    __slots__ = ("path", "holders", "visible", "attrs", "replicas", "conflicts")

    def __init__(self, path: str, holders: "List[Tuple[Branch, Dict[str, Any]]]") -> None:
        self.path = path
        self.holders = holders
        self.visible, self.attrs = holders[0]
        self.replicas = [holders[0]]      # holders of the visible version
        self.conflicts = []               # holders of another version (or type)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.attrs["st_mode"])


class _VirtualHandle(ReadHandle):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int, offset: int) -> bytes:
        return self.data[offset:offset + size]


class MultiWriteHandle(WriteHandle):
    """One open file written in every branch holding its visible version."""

    def __init__(self, fs: "MergedFS", path: str,
                 pairs: "List[Tuple[Branch, WriteHandle]]") -> None:
        self.fs = fs
        self.path = path
        self.pairs = pairs
        self.written = False

    def read(self, size: int, offset: int) -> bytes:
        return self.pairs[0][1].read(size, offset)

    def write(self, data: bytes, offset: int) -> int:
        self.written = True
        n = self.pairs[0][1].write(data, offset)
        for _, h in self.pairs[1:]:
            h.write(data, offset)
        return n

    def _all(self, what: str, *args: "Any") -> None:
        first = None
        for _, h in self.pairs:
            try:
                getattr(h, what)(*args)
            except OSError as e:
                if first is None:
                    first = e
        if first is not None:
            raise first

    def truncate(self, length: int) -> None:
        self.written = True
        self._all("truncate", length)

    def flush(self) -> None:
        self._all("flush")

    def fsync(self) -> None:
        self._all("fsync")

    def fstat(self) -> "Dict[str, Any]":
        h = self.pairs[0][1]
        if hasattr(h, "fstat"):
            return h.fstat()
        raise _e(errno.ENOENT)

    def close(self) -> None:
        try:
            self._all("close")
        finally:
            if len(self.pairs) > 1 and self.written:
                self.fs._align_times(self.path, [b for b, _ in self.pairs])


def _safe(fn: "Callable") -> "Callable":
    """Errors out as errno, never a traceback; -d logs every operation."""
    name = fn.__name__

    @functools.wraps(fn)
    def op(self: "MergedFS", *args: "Any") -> "Any":
        if self.debug:
            shown = tuple(("<%d bytes>" % len(a)) if isinstance(a, (bytes, bytearray)) else a
                          for a in args)
            try:
                r = fn(self, *args)
            except OSError as e:
                code = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO
                self.log("%s%r -> %s" % (name, shown, errno.errorcode.get(code, code)))
                raise _e(code)
            except Exception as e:
                self.log("%s%r -> EIO (internal error: %s: %s)" % (name, shown, type(e).__name__, e))
                raise _e(errno.EIO)
            res = ("<%d bytes>" % len(r)) if isinstance(r, (bytes, bytearray)) else (
                "ok" if r in (None, 0) else r if not isinstance(r, (list, dict)) else
                "<%d entries>" % len(r))
            self.log("%s%r -> %s" % (name, shown, res))
            return r
        try:
            return fn(self, *args)
        except OSError as e:
            if isinstance(e.errno, int) and e.errno > 0:
                if type(e) is not FuseOSError:
                    raise _e(e.errno)
                raise
            raise _e(errno.EIO)
        except Exception as e:
            self.log("internal error in %s: %s: %s" % (name, type(e).__name__, e))
            raise _e(errno.EIO)
    return op


class MergedFS(Operations):
    use_ns = True

    def __init__(self, branches: "List[Branch]", mount_id: str = "",
                 chain: "Optional[List[str]]" = None, readonly: bool = False,
                 log: "Optional[Callable[[str], None]]" = None, debug: bool = False,
                 node: "Optional[str]" = None,
                 on_ready: "Optional[Callable[[], None]]" = None,
                 mountpoint: "Optional[str]" = None, read_only: "Optional[bool]" = None,
                 branch_places: "Optional[List[str]]" = None) -> None:
        """`mount_id` ("host:mountpoint", the first line of /.sshfsmux-chain)
        defaults to this host and `mountpoint`; `read_only` is `readonly`."""
        if not branches:
            raise ValueError("no branches")
        locals_ = [b for b in branches if b.local]
        self.branches = locals_ + [b for b in branches if not b.local]
        self.readonly = bool(readonly or read_only)
        self.debug = debug
        self.log = log or (lambda msg: None)
        self.node = node or socket.gethostname()
        if not mount_id and mountpoint:
            mount_id = "%s:%s" % (socket.gethostname(), os.path.realpath(mountpoint))
        self.mount_id = mount_id
        lines = [mount_id] if mount_id else []
        for line in chain or []:
            if line and line not in lines:
                lines.append(line)
        self.chain = ("\n".join(lines) + "\n").encode() if lines else b""
        places = []  # type: List[str]
        for line in branch_places or []:
            if line and line not in places:
                places.append(line)
        # the read-only virtual files at the root, hidden from readdir
        self._virtual = {}  # type: Dict[str, bytes]
        if self.chain:
            self._virtual[CHAIN_PATH] = self.chain
        if places:
            self._virtual[BRANCHES_PATH] = ("\n".join(places) + "\n").encode("utf-8", "surrogateescape")
        self.on_ready = on_ready
        self.uid, self.gid = os.getuid(), os.getgid()
        self.started_ns = time.time_ns()
        writable = [b for b in self.branches if b.writable]
        self.create_branch = next((b for b in writable if b.local), writable[0] if writable else None)
        self._handles = {}  # type: Dict[int, ReadHandle]
        self._fh = itertools.count(1)
        self._lock = threading.Lock()
        self._hints = {}  # type: Dict[str, Dict[str, bytes]]
        self._conflicts_logged = set()  # type: set
        self._branch_errors_logged = set()  # type: set

    # -- lifecycle -----------------------------------------------------
    def init_with_config(self, conn: "Any", config: "Any") -> None:
        # writes of up to 1 MiB per call (the kernel's default is 128 KiB):
        # fewer trips through Python for big sequential writes
        if conn is not None:
            try:
                conn.max_write = 1 << 20
            except Exception:
                pass
        if self.on_ready is not None:
            try:
                self.on_ready()
            except Exception:
                pass

    def destroy(self, path: str) -> None:
        with self._lock:
            handles, self._handles = list(self._handles.values()), {}
        for h in handles:
            try:
                h.close()
            except Exception:
                pass

    # -- lookups -------------------------------------------------------
    def _note(self, b: Branch, e: OSError) -> None:
        key = (b.name, e.errno)
        if key not in self._branch_errors_logged:
            self._branch_errors_logged.add(key)
            self.log("branch %s: %s" % (b.name, e.strerror or e))

    def _view(self, path: str, every: bool = False) -> View:
        """The branches holding `path`. Unless `every`, a directory found first
        is not looked up further (its attributes are the first branch's)."""
        holders = []  # type: List[Tuple[Branch, Dict[str, Any]]]
        failure = None
        for b in self.branches:
            try:
                a = b.getattr(path)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue
                if failure is None:
                    failure = e
                self._note(b, e)
                continue
            holders.append((b, a))
            if not every and len(holders) == 1 and stat.S_ISDIR(a["st_mode"]):
                break
        if not holders:
            raise failure if failure is not None else _e(errno.ENOENT)
        v = View(path, holders)
        for b, a in holders[1:]:
            (v.replicas if self._same(path, v.visible, v.attrs, b, a) else v.conflicts).append((b, a))
        if v.conflicts and not v.is_dir and path not in self._conflicts_logged:
            self._conflicts_logged.add(path)
            self.log("conflict: %s: %s differ%s from %s (showing %s)" % (
                path, ", ".join(b.name for b, _ in v.conflicts),
                "s" if len(v.conflicts) == 1 else "", v.visible.name, v.visible.name))
        return v

    def _file_view(self, path: str) -> View:
        return self._view(path, every=True)

    @staticmethod
    def _same(path: str, b1: Branch, a1: "Dict[str, Any]", b2: Branch, a2: "Dict[str, Any]") -> bool:
        m1, m2 = a1["st_mode"], a2["st_mode"]
        if stat.S_IFMT(m1) != stat.S_IFMT(m2):
            return False
        if stat.S_ISDIR(m1):
            return True
        if stat.S_ISREG(m1):
            return a1["st_size"] == a2["st_size"] and int(a1["st_mtime"]) == int(a2["st_mtime"])
        if stat.S_ISLNK(m1):
            try:
                return b1.readlink(path) == b2.readlink(path)
            except OSError:
                return False
        return True

    def _fuse_attrs(self, a: "Dict[str, Any]") -> "Dict[str, Any]":
        d = dict(a)
        for k in ("st_atime", "st_mtime", "st_ctime"):
            ns = a.get(k + "_ns")
            d[k] = int(ns) if ns is not None else int(round(float(a.get(k, 0)) * 1e9))
            d.pop(k + "_ns", None)
        d.setdefault("st_nlink", 1)
        d["st_blocks"] = (int(a.get("st_size", 0)) + 511) // 512
        return d

    def _chain_attrs(self, path: str = CHAIN_PATH) -> "Dict[str, Any]":
        t = self.started_ns
        return {"st_mode": stat.S_IFREG | 0o444, "st_size": len(self._virtual.get(path, b"")),
                "st_nlink": 1,
                "st_uid": self.uid, "st_gid": self.gid, "st_atime": t, "st_mtime": t,
                "st_ctime": t, "st_blocks": 1}

    def _is_chain(self, path: "Optional[str]") -> bool:
        return path in self._virtual

    def _writable(self) -> None:
        if self.readonly:
            raise _e(errno.EROFS)

    def _listing(self, path: str, v: "Optional[View]" = None) -> "List[str]":
        v = v or self._view(path, every=True)
        if not v.is_dir:
            raise _e(errno.ENOTDIR)
        names = set()
        ok = False
        failure = None
        for b, a in v.holders:
            if not stat.S_ISDIR(a["st_mode"]):
                continue
            try:
                names.update(b.readdir(path))
                ok = True
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue
                failure = failure or e
                self._note(b, e)
        if not ok and failure is not None:
            raise failure
        names.discard(".")
        names.discard("..")
        if path == "/":
            names.discard(CHAIN_NAME)
            names.discard(BRANCHES_NAME)
        return sorted(names)

    # -- attributes ----------------------------------------------------
    @_safe
    def getattr(self, path: "Optional[str]", fh: "Optional[int]" = None) -> "Dict[str, Any]":
        if self._is_chain(path):
            return self._chain_attrs(path)  # type: ignore[arg-type]
        if path is None:
            h = self._handles.get(fh) if fh is not None else None
            if h is not None and hasattr(h, "fstat"):
                return self._fuse_attrs(h.fstat())
            raise _e(errno.ENOENT)
        return self._fuse_attrs(self._view(path).attrs)

    @_safe
    def readdir(self, path: str, fh: int) -> "List[str]":
        return [".", ".."] + self._listing(path)

    @_safe
    def readlink(self, path: str) -> str:
        v = self._view(path)
        target = v.visible.readlink(path)
        if link_escapes(path, target):
            # The kernel would follow it outside the export (issue #8): refuse.
            self.log("refused symlink %s -> %s: it leads out of the export" % (path, target))
            raise _e(errno.EACCES)
        return target

    @_safe
    def access(self, path: str, amode: int) -> int:
        if self._is_chain(path):
            if amode & (os.W_OK | os.X_OK):
                raise _e(errno.EACCES)
            return 0
        a = self._view(path).attrs
        if amode == os.F_OK:
            return 0
        if amode & os.W_OK and self.readonly:
            raise _e(errno.EROFS)
        uid, gid, _pid = fuse_get_context()
        mode = a["st_mode"]
        if uid == 0:
            if amode & os.X_OK and not stat.S_ISDIR(mode) and not mode & 0o111:
                raise _e(errno.EACCES)
            return 0
        if a.get("st_uid") == uid:
            bits = (mode >> 6) & 7
        elif a.get("st_gid") == gid or a.get("st_gid") in _groups_of(uid, gid):
            bits = (mode >> 3) & 7
        else:
            bits = mode & 7
        want = ((4 if amode & os.R_OK else 0) | (2 if amode & os.W_OK else 0)
                | (1 if amode & os.X_OK else 0))
        if want & ~bits:
            raise _e(errno.EACCES)
        return 0

    @_safe
    def statfs(self, path: str) -> "Dict[str, Any]":
        b = self.create_branch or self.branches[0]
        return b.statfs()

    # -- changes of names ----------------------------------------------
    def _ensure_parents(self, b: Branch, path: str) -> None:
        parts = path.split("/")[1:-1]
        cur = ""
        for p in parts:
            cur += "/" + p
            try:
                a = b.getattr(cur)
            except OSError as e:
                if e.errno not in (errno.ENOENT,):
                    raise
            else:
                if not stat.S_ISDIR(a["st_mode"]):
                    raise _e(errno.ENOTDIR)
                continue
            mode = 0o755
            try:
                mv = self._view(cur)
                if not mv.is_dir:
                    raise _e(errno.ENOTDIR)
                mode = mv.attrs["st_mode"] & 0o7777
            except OSError as e:
                if e.errno == errno.ENOTDIR:
                    raise
            try:
                b.mkdir(cur, mode)
            except OSError as e:
                if e.errno != errno.EEXIST:
                    raise

    def _target(self) -> Branch:
        if self.create_branch is None:
            raise _e(errno.EROFS)
        return self.create_branch

    def _exists(self, path: str) -> "Optional[View]":
        try:
            return self._view(path)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise

    def _branch_for_new(self, path: str) -> Branch:
        """The branch a new name goes to (its parents made there); EEXIST if the
        name is already visible."""
        self._writable()
        if self._is_chain(path) or self._exists(path) is not None:
            raise _e(errno.EEXIST)
        b = self._target()
        self._ensure_parents(b, path)
        return b

    @_safe
    def mkdir(self, path: str, mode: int) -> int:
        self._branch_for_new(path).mkdir(path, mode & 0o7777)
        return 0

    @_safe
    def symlink(self, target: str, source: str) -> int:
        # mfusepy: symlink(link path, what it points to)
        self._branch_for_new(target).symlink(source, target)
        return 0

    @_safe
    def link(self, target: str, source: str) -> int:
        # mfusepy: link(new name, existing name); only within one local branch
        self._writable()
        if self._exists(target) is not None:
            raise _e(errno.EEXIST)
        v = self._file_view(source)
        if len(v.holders) != 1 or not hasattr(v.visible, "link"):
            raise _e(errno.EPERM)
        self._ensure_parents(v.visible, target)
        v.visible.link(source, target)
        return 0

    def _remove_in(self, b: Branch, path: str, a: "Dict[str, Any]") -> None:
        if stat.S_ISDIR(a["st_mode"]):
            b.rmdir(path)
        else:
            b.unlink(path)

    @_safe
    def unlink(self, path: str) -> int:
        self._writable()
        if self._is_chain(path):
            raise _e(errno.EACCES)
        v = self._view(path, every=True)
        if v.is_dir:
            raise _e(errno.EISDIR)
        first = None
        for b, a in v.holders:
            try:
                self._remove_in(b, path, a)
            except OSError as e:
                if e.errno == errno.ENOENT or (stat.S_ISDIR(a["st_mode"]) and b is not v.visible):
                    continue   # a hidden non-empty directory of that name stays
                first = first or e
        self._drop_hints(path)
        if first is not None:
            raise first
        return 0

    @_safe
    def rmdir(self, path: str) -> int:
        self._writable()
        if path == "/":
            raise _e(errno.EBUSY)
        v = self._view(path, every=True)
        if not v.is_dir:
            raise _e(errno.ENOTDIR)
        if self._listing(path, v):
            raise _e(errno.ENOTEMPTY)
        first = None
        for b, a in v.holders:
            try:
                self._remove_in(b, path, a)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    first = first or e
        self._drop_hints(path, tree=True)
        if first is not None:
            raise first
        return 0

    @_safe
    def rename(self, old: str, new: str) -> int:
        return self._rename(old, new, 0)

    def rename2(self, old: str, new: str, flags: int) -> int:
        return self._safe_rename(old, new, flags)

    @_safe
    def _safe_rename(self, old: str, new: str, flags: int) -> int:
        return self._rename(old, new, flags)

    def _rename(self, old: str, new: str, flags: int) -> int:
        RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
        if flags & ~RENAME_NOREPLACE or flags & RENAME_EXCHANGE:
            raise _e(errno.EINVAL)
        self._writable()
        if self._is_chain(old) or self._is_chain(new):
            raise _e(errno.EACCES)
        if old == new:
            return 0
        if new.startswith(old.rstrip("/") + "/"):
            raise _e(errno.EINVAL)
        src = self._view(old, every=True)
        dst = None
        try:
            dst = self._view(new, every=True)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
        if dst is not None:
            if flags & RENAME_NOREPLACE:
                raise _e(errno.EEXIST)
            if src.is_dir and not dst.is_dir:
                raise _e(errno.ENOTDIR)
            if not src.is_dir and dst.is_dir:
                raise _e(errno.EISDIR)
            if dst.is_dir and self._listing(new, dst):
                raise _e(errno.ENOTEMPTY)
        src_branches = [b for b, _ in src.holders]
        src_type = {id(b): stat.S_IFMT(a["st_mode"]) for b, a in src.holders}
        if dst is not None:
            for b, a in dst.holders:
                # the name must mean one thing afterwards: drop the target where
                # the source does not replace it (or would not fit its type)
                if id(b) in src_type and src_type[id(b)] == stat.S_IFMT(a["st_mode"]):
                    continue
                try:
                    self._remove_in(b, new, a)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise
        for b in src_branches:
            self._ensure_parents(b, new)
            b.rename(old, new)
        self._move_hints(old, new)
        return 0

    # -- hints table (for names held by non-local branches) -------------
    def _drop_hints(self, path: str, tree: bool = False) -> None:
        with self._lock:
            self._hints.pop(path, None)
            if tree:
                pre = path.rstrip("/") + "/"
                for k in [k for k in self._hints if k.startswith(pre)]:
                    del self._hints[k]

    def _move_hints(self, old: str, new: str) -> None:
        with self._lock:
            self._hints.pop(new, None)
            pre = old.rstrip("/") + "/"
            moved = {}
            for k in list(self._hints):
                if k == old:
                    moved[new] = self._hints.pop(k)
                elif k.startswith(pre):
                    moved[new.rstrip("/") + "/" + k[len(pre):]] = self._hints.pop(k)
            self._hints.update(moved)

    # -- metadata changes ----------------------------------------------
    def _targets(self, path: str) -> "Tuple[View, List[Tuple[Branch, Dict[str, Any]]]]":
        v = self._view(path, every=True)
        if v.is_dir:
            return v, [(b, a) for b, a in v.holders if stat.S_ISDIR(a["st_mode"])]
        return v, v.replicas

    @_safe
    def chmod(self, path: "Optional[str]", mode: int) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        if stat.S_ISLNK(v.attrs["st_mode"]):
            return 0
        for b, _ in targets:
            b.chmod(path, mode & 0o7777)
        return 0

    @_safe
    def chown(self, path: "Optional[str]", uid: int, gid: int) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        a = v.attrs
        if uid in (-1, a.get("st_uid")) and gid in (-1, a.get("st_gid")):
            return 0
        for b, _ in targets:
            fn = getattr(b, "chown", None)
            if fn is None:
                raise _e(errno.EPERM)
            fn(path, uid, gid)
        return 0

    @_safe
    def truncate(self, path: "Optional[str]", length: int, fh: "Optional[int]" = None) -> int:
        self._writable()
        if fh is not None and fh in self._handles:
            h = self._handles[fh]
            if isinstance(h, WriteHandle):
                h.truncate(length)
                return 0
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EACCES)
        v, targets = self._targets(path)
        if v.is_dir:
            raise _e(errno.EISDIR)
        for b, _ in targets:
            b.truncate(path, length)
        if len(targets) > 1:
            self._align_times(path, [b for b, _ in targets])
        return 0

    @_safe
    def utimens(self, path: "Optional[str]", times: "Any" = None) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        now = time.time_ns()
        if times is None:
            ns = (now, now)
        else:
            cur = self._fuse_attrs(v.attrs)
            ns = tuple(cur[k] if t is None else now if t == "now" else int(t)
                       for t, k in zip(times, ("st_atime", "st_mtime")))
        for b, _ in targets:
            fn = getattr(b, "utimens_ns", None)
            if fn is not None:
                fn(path, ns)
            else:
                b.utimens(path, (ns[0] / 1e9, ns[1] / 1e9))
        return 0

    def _align_times(self, path: str, branches: "List[Branch]") -> None:
        """Give every copy the first one's mtime, so replicas stay replicas."""
        try:
            a = branches[0].getattr(path)
        except OSError:
            return
        ns = (a.get("st_atime_ns") or int(a["st_atime"] * 1e9),
              a.get("st_mtime_ns") or int(a["st_mtime"] * 1e9))
        for b in branches[1:]:
            try:
                fn = getattr(b, "utimens_ns", None)
                if fn is not None:
                    fn(path, ns)
                else:
                    b.utimens(path, (ns[0] / 1e9, ns[1] / 1e9))
            except OSError as e:
                self._note(b, e)

    # -- files -----------------------------------------------------------
    def _new_fh(self, h: ReadHandle) -> int:
        with self._lock:
            fh = next(self._fh)
            self._handles[fh] = h
        return fh

    def _handle(self, fh: int) -> ReadHandle:
        h = self._handles.get(fh)
        if h is None:
            raise _e(errno.EBADF)
        return h

    @_safe
    def open(self, path: str, flags: int) -> int:
        acc = flags & os.O_ACCMODE
        if self._is_chain(path):
            if acc != os.O_RDONLY or flags & os.O_TRUNC:
                raise _e(errno.EACCES)
            return self._new_fh(_VirtualHandle(self._virtual[path]))
        if acc == os.O_RDONLY and not flags & os.O_TRUNC:
            v = self._file_view(path)
            if v.is_dir:
                raise _e(errno.EISDIR)
            return self._new_fh(self._reader(path, v).open_read(path))
        self._writable()
        v = self._file_view(path)
        if v.is_dir:
            raise _e(errno.EISDIR)
        pairs = []  # type: List[Tuple[Branch, WriteHandle]]
        try:
            for b, _ in v.replicas:
                pairs.append((b, b.open_write(path, flags, 0, False)))
        except OSError:
            for _, h in pairs:
                try:
                    h.close()
                except OSError:
                    pass
            raise
        h = MultiWriteHandle(self, path, pairs)
        h.written = bool(flags & os.O_TRUNC)
        return self._new_fh(h)

    def _reader(self, path: str, v: View) -> Branch:
        """Where to read the visible version: a local branch, else a branch whose
        complete replica we already have, else the first."""
        for b, _ in v.replicas:
            if b.local:
                return b
        size, mtime = v.attrs["st_size"], int(v.attrs["st_mtime"])
        for b, _ in v.replicas:
            has = getattr(b, "has_replica", None)
            if has is not None and has(path, size, mtime):
                return b
        return v.visible

    @_safe
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        self._writable()
        if self._is_chain(path):
            raise _e(errno.EEXIST)
        b = self._target()
        self._ensure_parents(b, path)
        h = b.open_write(path, flags | os.O_CREAT, mode & 0o7777, True)
        return self._new_fh(MultiWriteHandle(self, path, [(b, h)]))

    @_safe
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self._handle(fh).read(size, offset)

    @_safe
    def read_buf(self, path: "Optional[str]", bufpp: "Any", size: int, offset: int, fh: int) -> int:
        """Like read, but a range that is in a local file (a replica, a local
        branch) is handed to libfuse as (fd, offset): the data never passes
        through Python."""
        h = self._handle(fh)
        fd_for = getattr(h, "fd_for", None)
        bv = _libc.malloc(ctypes.sizeof(_FuseBufVec))
        if not bv:
            raise _e(errno.ENOMEM)
        vec = _FuseBufVec.from_address(bv)
        vec.count, vec.idx, vec.off = 1, 0, 0
        b = vec.buf[0]
        try:
            if fd_for is not None:
                fd, n = fd_for(size, offset)
                b.size, b.flags, b.mem, b.fd, b.pos = n, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, None, fd, offset
            else:
                data = h.read(size, offset)
                mem = _libc.malloc(max(1, len(data)))
                if not mem:
                    raise _e(errno.ENOMEM)
                ctypes.memmove(mem, data, len(data))
                b.size, b.flags, b.mem, b.fd, b.pos = len(data), 0, mem, -1, 0
        except BaseException:
            _libc.free(ctypes.c_void_p(bv))
            raise
        bufpp[0] = ctypes.cast(ctypes.c_void_p(bv), type(bufpp[0]))
        return 0

    @_safe
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._writable()
        h = self._handle(fh)
        if not isinstance(h, WriteHandle):
            raise _e(errno.EBADF)
        return h.write(data, offset)

    @_safe
    def flush(self, path: str, fh: int) -> int:
        h = self._handles.get(fh)
        if isinstance(h, WriteHandle):
            h.flush()
        return 0

    @_safe
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        h = self._handles.get(fh)
        if isinstance(h, WriteHandle):
            h.fsync()
        return 0

    @_safe
    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._handles.pop(fh, None)
        if h is not None:
            h.close()
        return 0

    # -- extended attributes -------------------------------------------
    def _location(self, path: str, v: View) -> bytes:
        nodes = []  # type: List[str]
        if v.is_dir:
            for b, a in v.holders:
                if stat.S_ISDIR(a["st_mode"]) and b.node not in nodes:
                    nodes.append(b.node)
        else:
            size, mtime = v.attrs["st_size"], int(v.attrs["st_mtime"])
            replica_here = False
            for b, a in v.replicas:
                if a["st_size"] != size:
                    continue
                if b.node not in nodes:
                    nodes.append(b.node)
                has = getattr(b, "has_replica", None)
                if has is not None and has(path, size, mtime):
                    replica_here = True
            if replica_here and self.node not in nodes:
                nodes.append(self.node)
        return ",".join(nodes).encode()

    def _hint_get(self, path: str, v: View, name: str) -> "Optional[bytes]":
        if v.visible.local:
            try:
                return v.visible.getxattr(path, name)
            except OSError as e:
                if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                    raise
        with self._lock:
            return self._hints.get(path, {}).get(name)

    @_safe
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if self._is_chain(path):
            raise _e(errno.ENODATA)
        if not name.startswith("user."):
            self._view(path)          # ENOENT first, like the kernel would
            raise _e(errno.ENODATA)
        if name == XA_LOCATION:
            return self._location(path, self._view(path, every=True))
        if name == XA_CONFLICT:
            v = self._view(path, every=True)
            if v.is_dir or not v.conflicts:
                raise _e(errno.ENODATA)
            return ",".join(b.name for b, _ in v.conflicts).encode()
        v = self._view(path)
        if name in HINTS:
            val = self._hint_get(path, v, name)
            if val is None:
                raise _e(errno.ENODATA)
            return val
        return v.visible.getxattr(path, name)

    @_safe
    def listxattr(self, path: str) -> "List[str]":
        if self._is_chain(path):
            return []
        v = self._view(path)
        names = []  # type: List[str]
        try:
            names = [n for n in v.visible.listxattr(path) if n.startswith("user.")]
        except OSError as e:
            if e.errno not in (errno.ENOTSUP, errno.ENODATA):
                raise
        with self._lock:
            for n in self._hints.get(path, {}):
                if n not in names:
                    names.append(n)
        return names

    def _xattr_target(self, path: str, name: str) -> View:
        """The view an xattr change applies to, after the checks both setxattr
        and removexattr make: not the chain file, user.* only, not computed."""
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v = self._view(path)
        if not name.startswith("user."):
            raise _e(errno.ENOTSUP)
        if name in COMPUTED:
            raise _e(errno.EPERM)
        self._writable()
        return v

    @_safe
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        v = self._xattr_target(path, name)
        if name in HINTS:
            text = value.decode("ascii", "replace").strip()
            if name == XA_DP and not _DP_RE.match(text):
                raise _e(errno.EINVAL)
            if name == XA_REPLICATION and not _REPL_RE.match(text):
                raise _e(errno.EINVAL)
            value = text.encode()
            cur = self._hint_get(path, v, name)
            if options & XATTR_CREATE and cur is not None:
                raise _e(errno.EEXIST)
            if options & XATTR_REPLACE and cur is None:
                raise _e(errno.ENODATA)
            if v.visible.local:
                try:
                    v.visible.setxattr(path, name, value)
                    with self._lock:
                        self._hints.get(path, {}).pop(name, None)
                    return 0
                except OSError as e:
                    if e.errno not in (errno.ENOTSUP, errno.EPERM):
                        raise
            with self._lock:
                self._hints.setdefault(path, {})[name] = value
            return 0
        fn = v.visible.setxattr
        try:
            fn(path, name, value, options)   # type: ignore[call-arg]
        except TypeError:
            fn(path, name, value)
        return 0

    @_safe
    def removexattr(self, path: str, name: str) -> int:
        v = self._xattr_target(path, name)
        if name in HINTS:
            found = False
            with self._lock:
                d = self._hints.get(path)
                if d and name in d:
                    del d[name]
                    found = True
            if v.visible.local:
                try:
                    v.visible.removexattr(path, name)
                    found = True
                except OSError as e:
                    if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                        raise
            if not found:
                raise _e(errno.ENODATA)
            return 0
        v.visible.removexattr(path, name)
        return 0


_groups_cache = {}  # type: Dict[Tuple[int, int], set]


def _groups_of(uid: int, gid: int) -> set:
    key = (uid, gid)
    g = _groups_cache.get(key)
    if g is None:
        g = {gid}
        if uid == os.getuid():
            g.update(os.getgroups())
        else:
            try:
                import pwd
                g.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
            except (KeyError, OSError):
                pass
        _groups_cache[key] = g
    return g


# --------------------------------------------------------------------------
# running it
# --------------------------------------------------------------------------

def fuse_class() -> type:
    """mfusepy's FUSE with three fixes: UTIME_NOW/UTIME_OMIT kept apart from
    real times, rename flags (RENAME_NOREPLACE/EXCHANGE) passed on instead of
    dropped, and read_buf that accepts the NULL path of an unlinked open file."""
    import mfusepy

    class _FUSE(mfusepy.FUSE):
        def utimens_fuse_3(self, path, buf, fip):  # type: ignore[no-untyped-def]
            times = None
            if buf:
                def conv(ts):  # type: ignore[no-untyped-def]
                    if ts.tv_nsec == UTIME_NOW:
                        return "now"
                    if ts.tv_nsec == UTIME_OMIT:
                        return None
                    return ts.tv_sec * 10 ** 9 + ts.tv_nsec
                times = (conv(buf.contents.actime), conv(buf.contents.modtime))
            return self.operations.utimens(
                None if path is None else path.decode(self.encoding, self.errors), times)

        def read_buf(self, path, bufpp, size, offset, fip):  # type: ignore[no-untyped-def]
            return self.operations.read_buf(
                None if path is None else path.decode(self.encoding, self.errors),
                bufpp, size, offset, fip.contents.fh)

        def rename_fuse_3(self, old, new, flags):  # type: ignore[no-untyped-def]
            return self.operations.rename2(old.decode(self.encoding, self.errors),
                                           new.decode(self.encoding, self.errors), flags)

    return _FUSE


def link_escapes(path: str, target: str) -> bool:
    """True when symlink `path` (mount-relative) points outside the mount: an
    absolute target, or a relative one that climbs above the root."""
    import posixpath
    if not target or target.startswith("/"):
        return True
    base = posixpath.dirname(path.lstrip("/"))
    joined = posixpath.normpath(posixpath.join(base, target))
    return joined == ".." or joined.startswith("../")


def run_fuse(fs: MergedFS, mountpoint: str, foreground: bool = True, **options: "Any") -> None:
    """Mount `fs` at `mountpoint` and serve it until it is unmounted (blocks).
    Options go to libfuse (-o); defaults: fsname=sshfsmux, subtype=sshfsm,
    hard_remove (no .fuse_hidden files in the branches), max_threads=64 (readers
    waiting for a stream must not starve everything else), ro if fs is
    read-only. libfuse's nonzero status (also after SIGTERM) raises RuntimeError."""
    opts = dict(fsname="sshfsmux", subtype="sshfsm", hard_remove=True, max_threads=64)
    if fs.readonly:
        opts["ro"] = True
    opts.update(options)
    fuse_class()(fs, mountpoint, foreground=foreground, **opts)
