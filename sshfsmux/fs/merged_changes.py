"""The merge rules for changes: names (create, mkdir, symlink, unlink, rmdir,
rename), the hints table of names held by non-local branches, and metadata
(chmod, chown, truncate, utimens). A mixin of MergedFS (merged_fs.py), which
supplies the lookups (_view, _targets' views, _note, _writable, _lock).
"""
from __future__ import annotations

import errno
import stat
import time

from sshfsmux.branches.branch import Branch, WriteHandle
from sshfsmux.fs.fuse_glue import _e, fuse_get_context
from sshfsmux.fs.fuse_glue import safe as _safe
from sshfsmux.fs.merged_handles import View

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple


if TYPE_CHECKING:
    from sshfsmux.fs.namespace_copy import NamespaceCopy


class NameChanges:
    # called when a directory is removed or renamed through this mount: the
    # node ids a kernel cache keeps of directories' paths may be stale then
    # (kernel_cache.KernelCache.forget_dirs)
    dirs_moved: Optional[Callable[[], None]] = None

    if TYPE_CHECKING:       # what MergedFS supplies (for type checkers only)
        import threading
        _lock: threading.Lock
        _hints: Dict[str, Dict[str, bytes]]
        handles: Dict[int, Any]
        create_branch: Optional[Branch]
        uid: int
        namespace: Optional[NamespaceCopy]

        def _view(self, path: str, every: bool = False) -> View: ...
        def file_view(self, path: str) -> View: ...
        def _fuse_attrs(self, a: Dict[str, Any]) -> Dict[str, Any]: ...
        def _is_chain(self, path: Optional[str]) -> bool: ...
        def _writable(self) -> None: ...
        def _listing(self, path: str, v: Optional[View] = None) -> List[str]: ...
        def _note(self, b: Branch, e: OSError) -> None: ...
        def _changed(self, path: str) -> None: ...
        def _refresh(self, paths: List[str]) -> None: ...
        def _settle(self, paths: Iterable[str], branches: Iterable[Branch]) -> None: ...
        def _dropped(self, path: str, branches: Iterable[Branch], tree: bool = False) -> None: ...
        _links: Any
        _access: Any

    # -- changes of names ----------------------------------------------
    def _ensure_parents(self, b: Branch, path: str) -> None:
        parts = path.split("/")[1:-1]
        if parts:
            # the parent first: where it is a directory, so is every one above
            # it (tar x creates each file in a directory it has: one lstat,
            # not one a level)
            try:
                if stat.S_ISDIR(b.getattr("/" + "/".join(parts))["st_mode"]):
                    return
            except OSError:
                pass        # the walk below says what is wrong, or makes it
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

    def _give_to_caller(self, b: Branch, path: str) -> None:
        """A mount run by root (allow_other, several users) makes new names
        owned by the user who made them, as a local file system does; the group
        stays the directory's when it is setgid."""
        if self.uid != 0:
            return
        uid, gid, _pid = fuse_get_context()
        if uid == 0 and gid == 0:
            return
        fn = getattr(b, "chown", None)
        if fn is None:
            return
        try:
            parent = b.getattr(path.rsplit("/", 1)[0] or "/")
            if parent["st_mode"] & stat.S_ISGID:
                gid = -1
        except OSError:
            pass
        fn(path, uid, gid)

    def _target(self) -> Branch:
        if self.create_branch is None:
            raise _e(errno.EROFS)
        return self.create_branch

    def _exists(self, path: str) -> Optional[View]:
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
        b = self._branch_for_new(path)
        b.mkdir(path, mode & 0o7777)
        self._give_to_caller(b, path)
        if self.namespace is not None:
            self.namespace.made_dir(path)
        self._changed(path)
        return 0

    @_safe
    def mknod(self, path: str, mode: int, dev: int) -> int:
        """FIFOs, sockets (bind) and, for root, devices: like any new name, in
        the local branch; a node-local object by nature (merge-semantics.md)."""
        b = self._branch_for_new(path)
        fn = getattr(b, "mknod", None)
        if fn is None:
            raise _e(errno.EPERM)
        fn(path, mode, dev)
        self._give_to_caller(b, path)
        self._changed(path)
        return 0

    @_safe
    def symlink(self, target: str, source: str) -> int:
        # mfusepy: symlink(link path, what it points to)
        b = self._branch_for_new(target)
        b.symlink(source, target)
        self._give_to_caller(b, target)
        self._changed(target)
        return 0

    @_safe
    def link(self, target: str, source: str) -> int:
        # mfusepy: link(new name, existing name); only within one local branch
        self._writable()
        if self._exists(target) is not None:
            raise _e(errno.EEXIST)
        v = self.file_view(source)
        if len(v.holders) != 1 or not hasattr(v.visible, "link"):
            raise _e(errno.EPERM)
        self._ensure_parents(v.visible, target)
        v.visible.link(source, target)
        self._refresh(self._links.linked(source, target))
        self._changed(target)
        return 0

    def _remove_in(self, b: Branch, path: str, a: Dict[str, Any]) -> None:
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
        self._dropped(path, [b for b, _ in v.holders])
        self._drop_hints(path)
        self._access.forget([path])
        self._changed(path)
        self._refresh(self._links.removed(path))
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
        self._dropped(path, [b for b, _ in v.holders], tree=True)
        self._drop_hints(path, tree=True)
        self._access.clear()
        if self.dirs_moved is not None:
            self.dirs_moved()
        self._changed(path)
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
        try:
            for b in src_branches:
                self._ensure_parents(b, new)
                b.rename(old, new)
        finally:
            self._access.clear()    # names below a renamed directory too
            if self.dirs_moved is not None and (src.is_dir or (dst is not None and dst.is_dir)):
                self.dirs_moved()
            if dst is not None:
                self._dropped(new, [b for b, _ in dst.holders], tree=dst.is_dir)
            self._dropped(old, src_branches, tree=src.is_dir)
            self._settle([new], src_branches)
        self._move_hints(old, new)
        self._changed(old)
        self._changed(new)
        self._refresh(self._links.renamed(old, new))
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
    def _targets(self, path: str) -> Tuple[View, List[Tuple[Branch, Dict[str, Any]]]]:
        v = self._view(path, every=True)
        if v.is_dir:
            return v, [(b, a) for b, a in v.holders if stat.S_ISDIR(a["st_mode"])]
        return v, v.replicas

    @_safe
    def chmod(self, path: Optional[str], mode: int) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        if stat.S_ISLNK(v.attrs["st_mode"]):
            return 0
        try:
            for b, _ in targets:
                b.chmod(path, mode & 0o7777)
        finally:
            self._access.clear()     # hard links' other names too
            self._settle([path], [b for b, _ in targets])
        self._refresh(self._links.others(path))
        self._changed(path)
        return 0

    @_safe
    def chown(self, path: Optional[str], uid: int, gid: int) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        a = v.attrs
        if uid in (-1, a.get("st_uid")) and gid in (-1, a.get("st_gid")):
            return 0
        try:
            for b, _ in targets:
                fn = getattr(b, "chown", None)
                if fn is None:
                    raise _e(errno.EPERM)
                fn(path, uid, gid)
        finally:
            self._access.clear()
        self._refresh(self._links.others(path))
        self._changed(path)
        return 0

    @_safe
    def truncate(self, path: Optional[str], length: int, fh: Optional[int] = None) -> int:
        self._writable()
        if fh is not None and fh in self.handles:
            h = self.handles[fh]
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
        self._settle([path], [b for b, _ in targets])
        self._refresh(self._links.others(path))
        self._changed(path)
        return 0

    @_safe
    def utimens(self, path: Optional[str], times: Any = None) -> int:
        self._writable()
        if path is None:
            raise _e(errno.ENOENT)
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v, targets = self._targets(path)
        now = time.time_ns()
        ns: Tuple[int, ...]       # (atime, mtime) in ns
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
        self._settle([path], [b for b, _ in targets])
        self._refresh(self._links.others(path))
        self._changed(path)
        return 0

    def _align_times(self, path: str, branches: List[Branch]) -> None:
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
