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
- rename: within each branch holding the source (its parent made there if needed);
  the target is first removed from branches not holding the source (one meaning).
- xattrs: user.sshfsmux.location (nodes holding a complete copy),
  user.sshfsmux.conflict, hints user.sshfsmux.dp / user.sshfsmux.replication,
  other user.* passed to the visible branch.
- /.sshfsmux-chain, /.sshfsmux-branches: virtual read-only files (hidden from
  readdir): host:mountpoint of this mount and every mount of ours it is built
  on; host:path of their branches (a new mount refuses to sit in any of them).

Every error is an OSError with its errno; anything else is EIO and a log line.

run_fuse(fs, mountpoint) mounts a MergedFS and serves it (sshfsm, gxpc mount).
"""
from __future__ import annotations

import errno
import functools
import itertools
import os
import socket
import stat
import threading
import time

from sshfsmux.branches.branch import Branch, ReadHandle, WriteHandle
from sshfsmux.fs.access_memo import AccessMemo
from sshfsmux.fs.access_memo import groups_of as _groups_of

# run_fuse is this module's too (see above)
from sshfsmux.fs.fuse_glue import ATTR_SECONDS, Operations, _e, fuse_get_context, hand_over, run_fuse  # noqa: F401
from sshfsmux.fs.fuse_glue import safe as _safe
from sshfsmux.fs.kernel_cache import EXPIRE_PROTO_MINOR
from sshfsmux.fs.link_names import LinkNames
from sshfsmux.fs.merged_changes import NameChanges
from sshfsmux.fs.merged_handles import MultiWriteHandle, View, _VirtualHandle
from sshfsmux.fs.merged_namespace import NamespaceView
from sshfsmux.fs.merged_xattrs import XA_CONFLICT, XA_LOCATION, Xattrs  # noqa: F401

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

FUSE_CAP_SPLICE_WRITE = 1 << 7
CHAIN_NAME = ".sshfsmux-chain"
CHAIN_PATH = "/" + CHAIN_NAME
BRANCHES_NAME = ".sshfsmux-branches"
BRANCHES_PATH = "/" + BRANCHES_NAME


class MergedFS(NameChanges, Xattrs, NamespaceView, Operations):
    use_ns = True

    def __init__(self, branches: List[Branch], mount_id: str = "",
                 chain: Optional[List[str]] = None, readonly: bool = False,
                 log: Optional[Callable[[str], None]] = None, debug: bool = False,
                 node: Optional[str] = None,
                 on_ready: Optional[Callable[[], None]] = None,
                 mountpoint: Optional[str] = None, read_only: Optional[bool] = None,
                 branch_places: Optional[List[str]] = None) -> None:
        """`mount_id` ("host:mountpoint", the first line of /.sshfsmux-chain)
        defaults to this host and `mountpoint`; `read_only` is `readonly`."""
        if not branches:
            raise ValueError("no branches")
        locals_ = [b for b in branches if b.local]
        self.branches = locals_ + [b for b in branches if not b.local]
        self.readonly = bool(readonly or read_only)
        self._single = self.branches[0] if len(self.branches) == 1 else None
        # one branch that can lstat into libfuse's struct stat itself: the
        # cold-stat path of a node's own export (fuse_glue getattr_fuse_3);
        # -d keeps the general path, which logs
        self.stat_into = (getattr(self._single, "stat_into", None)
                          if self._single is not None and not debug else None)
        self.debug = debug
        self.log = log or (lambda msg: None)
        self.node = node or socket.gethostname()
        if not mount_id and mountpoint:
            mount_id = "%s:%s" % (socket.gethostname(), os.path.realpath(mountpoint))
        self.mount_id = mount_id
        lines = [x for x in dict.fromkeys([mount_id] + list(chain or [])) if x]
        self.chain = ("\n".join(lines) + "\n").encode() if lines else b""
        places = [x for x in dict.fromkeys(branch_places or []) if x]
        # the read-only virtual files at the root, hidden from readdir
        self._virtual: Dict[str, bytes] = {}
        if self.chain:
            self._virtual[CHAIN_PATH] = self.chain
        if places:
            self._virtual[BRANCHES_PATH] = ("\n".join(places) + "\n").encode("utf-8", "surrogateescape")
        self.on_ready = on_ready
        # a path after a write handle closes, an unlink, a rename (to the catalog)
        self.on_change: Optional[Callable[[str], None]] = None
        self.uid, self.gid = os.getuid(), os.getgid()
        self.started_ns = time.time_ns()
        writable = [b for b in self.branches if b.writable]
        self.create_branch = next((b for b in writable if b.local), writable[0] if writable else None)
        self.handles: Dict[int, ReadHandle] = {}     # open files by fh (fuse_glue reads them too)
        self._dirs: Dict[int, List[Tuple[str, Optional[Dict[str, Any]]]]] = {}   # readdirplus
        self._fh = itertools.count(1)
        self._lock = threading.Lock()
        self._hints: Dict[str, Dict[str, bytes]] = {}
        self._conflicts_logged: set = set()
        self._branch_errors_logged: set = set()
        # hard links made here, and the kernel's caches of the mount (taken
        # in init): a change through one name drops the others' attributes
        self._links = LinkNames()
        self._kernel: Any = None
        self._access = AccessMemo(ATTR_SECONDS)
        # a GMount node's copy of the directories it looked into (namespace_copy.py):
        # with it, remote branches are asked only for names the copy says they hold
        self.namespace: Any = None
        # how long the kernel keeps a miss where kernel_cache can expire its
        # entry (set by a mount whose every change is announced; else the mount option's)
        self.miss_seconds = 0.0
        self.lookups = 0            # getattr calls that reached this file system
        # requests this host's export server has served (user.sshfsmux.served)
        self.served: Optional[Callable[[], Dict[str, int]]] = None

    def forget_access(self, paths: List[str]) -> None:
        """Names changed elsewhere (the head's "changed" call): their access
        answers are asked again."""
        self._access.forget(paths)

    def _refresh(self, paths: List[str]) -> None:
        """Drop the kernel's cached attributes of these names (other names of
        a file just changed through one of them)."""
        if paths and self._kernel is not None:
            self._kernel.invalidate_paths(paths)

    def _changed(self, path: str) -> None:
        cb = self.on_change
        if cb is not None:
            try:
                cb(path)
            except Exception:
                pass

    # -- lifecycle -----------------------------------------------------
    def init_with_config(self, conn: Any, config: Any) -> None:
        # writes of up to 1 MiB per call (the kernel's default is 128 KiB):
        # fewer trips through Python for big sequential writes
        if conn is not None:
            try:
                conn.max_write = 1 << 20
                # read_buf hands libfuse (fd, offset): let it splice from the
                # fd into /dev/fuse instead of copying through its buffer
                conn.want |= conn.capable & FUSE_CAP_SPLICE_WRITE
                if self.miss_seconds and config is not None and conn.proto_minor >= EXPIRE_PROTO_MINOR:
                    config.negative_timeout = self.miss_seconds
            except Exception:
                pass
        try:
            from sshfsmux.fs.kernel_cache import KernelCache
            self._kernel = KernelCache.capture()
        except Exception:
            pass
        if self.on_ready is not None:
            try:
                self.on_ready()
            except Exception:
                pass

    def destroy(self, path: str) -> None:
        with self._lock:
            handles, self.handles = list(self.handles.values()), {}
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
        if self._single is not None:
            # one branch: nothing to merge (most own-export mounts)
            try:
                return View(path, [(self._single, self._single.getattr(path))])
            except OSError as e:
                if e.errno == errno.ENOTDIR:
                    raise _e(errno.ENOENT)
                if e.errno != errno.ENOENT:
                    self._note(self._single, e)
                raise
        if self.namespace is not None:
            found = self._view_from_copy(path, every)
            if found is not None:
                return found
            self.namespace.looked_up(path)
        holders: List[Tuple[Branch, Dict[str, Any]]] = []
        failure = None
        asked: Optional[Dict[int, Callable[[], Dict[str, Any]]]] = None
        for i, b in enumerate(self.branches):
            if asked is None and hasattr(b, "getattr_begin"):
                # the remote branches are asked at once (one round trip for a
                # missing name, not one per peer); answers are taken in order
                asked = {id(r): r.getattr_begin(path) for r in self.branches[i:]
                         if hasattr(r, "getattr_begin")}
            get = asked.get(id(b)) if asked else None
            if get is None:
                get = functools.partial(b.getattr, path)
            try:
                a = get()
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
        if not holders and failure is None and self.namespace is not None:
            # the listing came meanwhile: its answer (the kernel keeps a miss)
            found = self._view_from_copy(path, every)
            if found is not None:
                return found
        if not holders:
            raise failure if failure is not None else _e(errno.ENOENT)
        return self._classified(path, holders)

    def _classified(self, path: str, holders: List[Tuple[Branch, Dict[str, Any]]]) -> View:
        """The view of `path`'s holders: replicas and conflicts of the first."""
        v = View(path, holders)
        for b, a in holders[1:]:
            (v.replicas if self._same(path, v.visible, v.attrs, b, a) else v.conflicts).append((b, a))
        if v.conflicts and not v.is_dir and path not in self._conflicts_logged:
            self._conflicts_logged.add(path)
            self.log("conflict: %s: %s differ%s from %s (showing %s)" % (
                path, ", ".join(b.name for b, _ in v.conflicts),
                "s" if len(v.conflicts) == 1 else "", v.visible.name, v.visible.name))
        return v

    def _single_attrs(self, path: str) -> Dict[str, Any]:
        # _view's answer for one branch, without building the View
        try:
            return self._single.getattr(path)  # type: ignore[union-attr]
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                raise _e(errno.ENOENT)
            if e.errno != errno.ENOENT:
                self._note(self._single, e)  # type: ignore[arg-type]
            raise

    def file_view(self, path: str) -> View:
        """Every branch's answer for `path` (the holders of a file, in branch order)."""
        return self._view(path, every=True)

    @staticmethod
    def _same(path: str, b1: Branch, a1: Dict[str, Any], b2: Branch, a2: Dict[str, Any]) -> bool:
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

    def _fuse_attrs(self, a: Dict[str, Any]) -> Dict[str, Any]:
        d = dict(a)
        for k in ("st_atime", "st_mtime", "st_ctime"):
            ns = a.get(k + "_ns")
            d[k] = int(ns) if ns is not None else int(round(float(a.get(k, 0)) * 1e9))
            d.pop(k + "_ns", None)
        d.setdefault("st_nlink", 1)
        d["st_blocks"] = (int(a.get("st_size", 0)) + 511) // 512
        return d

    def _chain_attrs(self, path: str = CHAIN_PATH) -> Dict[str, Any]:
        t = self.started_ns
        return {"st_mode": stat.S_IFREG | 0o444, "st_size": len(self._virtual.get(path, b"")),
                "st_nlink": 1,
                "st_uid": self.uid, "st_gid": self.gid, "st_atime": t, "st_mtime": t,
                "st_ctime": t, "st_blocks": 1}

    def _is_chain(self, path: Optional[str]) -> bool:
        return path in self._virtual

    def _writable(self) -> None:
        if self.readonly:
            raise _e(errno.EROFS)

    def _listing(self, path: str, v: Optional[View] = None) -> List[str]:
        v = v or self._view(path, every=True)
        if not v.is_dir:
            raise _e(errno.ENOTDIR)
        names = set()
        ok = False
        failure = None
        held = self._copy_names(path) if self.namespace is not None else None
        if held is not None:
            names.update(held)
            ok = True
        for b, a in v.holders:
            if not stat.S_ISDIR(a["st_mode"]) or (held is not None and not b.local):
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
    def getattr(self, path: Optional[str], fh: Optional[int] = None) -> Dict[str, Any]:
        return self._fuse_attrs(self.raw_getattr(path, fh))

    @_safe
    def raw_getattr(self, path: Optional[str], fh: Optional[int] = None) -> Dict[str, Any]:
        """The visible branch's attributes as it gave them (fuse_glue fills
        struct stat from them; getattr converts them for Python callers)."""
        if path in self._virtual:
            return self._chain_attrs(path)  # type: ignore[arg-type]
        self.lookups += 1
        if self._single is not None and path is not None:
            return self._view(path).attrs if path == "/" else self._single_attrs(path)
        if path is None:
            h = self.handles.get(fh) if fh is not None else None
            if h is not None and hasattr(h, "fstat"):
                return h.fstat()
            raise _e(errno.ENOENT)
        return self._view(path).attrs

    @_safe
    def readdir(self, path: str, fh: int) -> List[str]:
        return [".", ".."] + self._listing(path)

    @_safe
    def opendir(self, path: str) -> int:
        with self._lock:
            return next(self._fh)

    @_safe
    def releasedir(self, path: Optional[str], fh: int) -> int:
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    @_safe
    def readdir_plus(self, path: str, fh: int,
                     offset: int = 0) -> List[Tuple[str, Optional[Dict[str, Any]]]]:
        """readdir with the attributes of every name a local branch holds:
        local branches come first, so the first local holder's attributes are
        the visible ones. Names only remote branches hold come without (the
        kernel looks them up, which asks the merge rules). The listing is made
        at offset 0 and kept with the open directory for the calls that go on."""
        if offset:
            with self._lock:
                kept = self._dirs.get(fh)
            if kept is not None:
                return kept
        out = self._plus_listing(path)
        if fh:
            with self._lock:
                self._dirs[fh] = out
        return out

    def _plus_listing(self, path: str) -> List[Tuple[str, Optional[Dict[str, Any]]]]:
        v = self._view(path, every=True)
        names = self._listing(path, v)
        attrs: Dict[str, Dict[str, Any]] = {}
        for b, a in v.holders:
            fn = getattr(b, "readdir_attrs", None)
            if not b.local or fn is None:
                break
            if stat.S_ISDIR(a["st_mode"]):
                try:
                    for n, na in fn(path).items():
                        attrs.setdefault(n, na)
                except OSError as e:
                    self._note(b, e)
                    break
        if self.namespace is not None:
            attrs.update(self._copy_plus_attrs(path, [n for n in names if n not in attrs]))
        out: List[Tuple[str, Optional[Dict[str, Any]]]] = [(".", None), ("..", None)]
        out.extend((n, attrs.get(n)) for n in names)
        return out

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
        # from attributes at most the attribute timeout old (access_memo.py)
        memo = self._access
        kept = memo.get(path)
        if kept is None:
            epoch = memo.epoch
            kept = memo.put(path, self._view(path).attrs, epoch)
        mode, owner, group = kept[0], kept[1], kept[2]
        if amode == os.F_OK:
            return 0
        if amode & os.W_OK and self.readonly:
            raise _e(errno.EROFS)
        uid, gid, _pid = fuse_get_context()
        if uid == 0:
            if amode & os.X_OK and not stat.S_ISDIR(mode) and not mode & 0o111:
                raise _e(errno.EACCES)
            return 0
        if owner == uid:
            bits = (mode >> 6) & 7
        elif group == gid or group in _groups_of(uid, gid):
            bits = (mode >> 3) & 7
        else:
            bits = mode & 7
        want = ((4 if amode & os.R_OK else 0) | (2 if amode & os.W_OK else 0)
                | (1 if amode & os.X_OK else 0))
        if want & ~bits:
            raise _e(errno.EACCES)
        return 0

    @_safe
    def statfs(self, path: str) -> Dict[str, Any]:
        b = self.create_branch or self.branches[0]
        return b.statfs()

    # -- files -----------------------------------------------------------
    def _new_fh(self, h: ReadHandle) -> int:
        with self._lock:
            fh = next(self._fh)
            self.handles[fh] = h
        return fh

    def _handle(self, fh: int) -> ReadHandle:
        h = self.handles.get(fh)
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
            v = self.file_view(path)
            if v.is_dir:
                raise _e(errno.EISDIR)
            return self._new_fh(self._reader(path, v).open_read(path))
        self._writable()
        v = self.file_view(path)
        if v.is_dir:
            raise _e(errno.EISDIR)
        pairs: List[Tuple[Branch, WriteHandle]] = []
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
        try:
            self._give_to_caller(b, path)
        except OSError:
            h.close()
            raise
        return self._new_fh(MultiWriteHandle(self, path, [(b, h)]))

    @_safe
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self._handle(fh).read(size, offset)

    @_safe
    def read_buf(self, path: Optional[str], bufpp: Any, size: int, offset: int, fh: int) -> int:
        """Like read, but a range that is in a local file (a replica, a local
        branch) is handed to libfuse as (fd, offset): the data never passes
        through Python."""
        return hand_over(bufpp, self._handle(fh), size, offset)

    @_safe
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._writable()
        h = self._handle(fh)
        if not isinstance(h, WriteHandle):
            raise _e(errno.EBADF)
        return h.write(data, offset)

    @_safe
    def flush(self, path: str, fh: int) -> int:
        h = self.handles.get(fh)
        if isinstance(h, WriteHandle):
            h.flush()
        return 0

    @_safe
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        h = self.handles.get(fh)
        if isinstance(h, WriteHandle):
            h.fsync()
        return 0

    @_safe
    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self.handles.pop(fh, None)
        if h is not None:
            try:
                h.close()
            finally:
                if isinstance(h, MultiWriteHandle):
                    self._settle([h.path], [b for b, _ in h.pairs])
            if isinstance(h, MultiWriteHandle):
                self._changed(h.path)
                self._refresh(self._links.others(h.path))
        return 0


def link_escapes(path: str, target: str) -> bool:
    """True when symlink `path` (mount-relative) points outside the mount: an
    absolute target, or a relative one that climbs above the root."""
    import posixpath
    if not target or target.startswith("/"):
        return True
    base = posixpath.dirname(path.lstrip("/"))
    joined = posixpath.normpath(posixpath.join(base, target))
    return joined == ".." or joined.startswith("../")
