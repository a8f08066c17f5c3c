"""Dropping what the kernel caches about files of a running FUSE mount.

When a recipe on one node finishes writing a file, every other node's mount
must show the new size and contents before make hears the exit status. The
kernel keeps attributes, names and pages of a FUSE mount for as long as the
mount's timeouts allow; libfuse 3's high-level `fuse_invalidate_path` drops
them for one path (attributes, the name's dentry, cached pages). It needs the
mount's `struct fuse *`, which only a FUSE callback can see
(`fuse_get_context()->fuse`): KernelCache.capture() takes it in the mount's
init callback, and invalidate_paths() may then run from any thread.

A mount that lets the kernel keep missing names (negative entries) must
also drop a name's negative dentry when the name appears elsewhere: libfuse's
low-level `fuse_lowlevel_notify_inval_entry(session, parent node id, name)`
does, and the high-level API gives a directory's node id as its st_ino
(without `use_ino`), so a KernelCache given the `mountpoint` stats the parent
through the mount. Never from inside a file system call: the kernel holds
the directory meanwhile.

Used by the GMount service (gmount/node.py: the "changed" call, acked to the
head) and by anything that must make a change visible now (mount caching
with timeouts). Node side: standard library plus mfusepy.
"""
from __future__ import annotations

import ctypes
import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, Optional


FUSE_ROOT_ID = 1        # the node id of a mount's root
EXPIRE_ONLY = 1         # libfuse's FUSE_LL_EXPIRE_ONLY
# The FUSE protocol minor version whose kernels can expire a name's entry
# without dropping it (FUSE_EXPIRE_ONLY, Linux 6.2)
EXPIRE_PROTO_MINOR = 38
# How long the kernel keeps a miss of a mount where every name that appears
# is announced and expired (GMount): each one kept saves a call into the mount
MISS_SECONDS = 10.0
# Directories whose node ids are kept between calls (see _parent_id)
DIR_IDS_KEPT = 4096


def _expire_entry(lib: Any) -> Any:
    """libfuse's fuse_lowlevel_notify_expire_entry (3.13 on), or None.
    Expiring a name's entry makes the kernel ask the mount at its next
    lookup; a name that still exists under the same node id keeps its
    dentry (a process working in a directory keeps its current directory),
    where an invalidation drops it at once (getcwd: ENOENT). libfuse 3.13 to
    3.15 take a fifth argument (the flags, EXPIRE_ONLY), 3.16 on ask the
    same with four and check the kernel's support (-ENOSYS without): the
    fifth is passed to both and ignored by the latter."""
    fn = getattr(lib, "fuse_lowlevel_notify_expire_entry", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t,
                   ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


class KernelCache:
    """The kernel caches of one running mount."""

    def __init__(self, lib: Any, fuse: Optional[int], mountpoint: str = "",
                 dir_held: Optional[Callable[[str], bool]] = None) -> None:
        self.lib = lib
        self.fuse = fuse
        # whether this mount has looked into a directory ("/a/b"): the kernel
        # holds no name of one it has not (and stat'ing it could ask the peers)
        self.dir_held = dir_held
        # names' dentries (negative ones too) are dropped when set
        self.mountpoint = mountpoint
        self.session: Optional[int] = None
        self._expire: Any = None
        self._dir_ids: Dict[str, int] = {}     # directory path -> its node id
        self._inval_inode: Any = None
        if lib is not None:
            fn = lib.fuse_invalidate_path
            fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            fn.restype = ctypes.c_int
            if mountpoint and fuse and hasattr(lib, "fuse_lowlevel_notify_inval_entry"):
                lib.fuse_get_session.argtypes = [ctypes.c_void_p]
                lib.fuse_get_session.restype = ctypes.c_void_p
                entry = lib.fuse_lowlevel_notify_inval_entry
                entry.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
                entry.restype = ctypes.c_int
                self.session = lib.fuse_get_session(fuse)
                self._expire = _expire_entry(lib)
                self._inval_inode = getattr(lib, "fuse_lowlevel_notify_inval_inode", None)
                if self._inval_inode is not None:
                    self._inval_inode.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64,
                                                  ctypes.c_int64]
                    self._inval_inode.restype = ctypes.c_int

    @classmethod
    def capture(cls, mountpoint: str = "",
                dir_held: Optional[Callable[[str], bool]] = None) -> KernelCache:
        """Call from the mount's init callback (FUSE's own thread); with
        `mountpoint`, names' dentries are dropped too (see above)."""
        try:
            import mfusepy
            lib = mfusepy._libfuse
            ctx = lib.fuse_get_context()
            fuse = ctx.contents.fuse if ctx else None
            if not hasattr(lib, "fuse_invalidate_path"):   # libfuse 2: nothing to call
                return cls(None, None)
            return cls(lib, fuse, mountpoint, dir_held)
        except Exception:
            return cls(None, None)

    @property
    def usable(self) -> bool:
        return self.lib is not None and bool(self.fuse)

    @property
    def expires(self) -> bool:
        """Names' entries are expired, not dropped (see _expire_entry)."""
        return self.session is not None and self._expire is not None

    def forget_dirs(self) -> None:
        """Forget the directories' node ids kept (a directory was removed or
        renamed through the mount: its path may name another node now)."""
        self._dir_ids = {}

    def invalidate_paths(self, paths: Iterable[str],
                         exists: Optional[Callable[[str], bool]] = None,
                         gone: Optional[Callable[[str], bool]] = None) -> int:
        """Drop the kernel's caches for each path (relative to the mount's
        root, starting with '/') and for its directory (its times and size
        changed with the name). Returns how many the kernel had cached; a path
        it never saw (ENOENT) is not an error: nothing was cached to go stale.
        A path the kernel did not know and that `exists` says is not there
        either (make's candidate names a recipe never made) leaves its
        directory alone: dropping a recipe's cwd's attributes for it would
        cost the next chdir a lookup on every peer. A name the kernel holds
        that `gone` says no longer exists anywhere loses its dentry too: its
        attributes alone would leave the kernel sure it exists for the
        entry timeout (an open with O_CREAT then reaches the old inode and
        fails: "Directory nonexistent")."""
        if not self.usable:
            return 0
        dropped = 0
        seen = set()
        ids: Dict[str, int] = {"/": FUSE_ROOT_ID}     # this call's (misses too)
        for p in paths:
            if p in seen:
                continue
            seen.add(p)
            rc = self._drop(p)
            if rc == 0:
                dropped += 1
                if self.session and gone is not None and gone(p):
                    self._drop_entry(p, ids)
            elif rc == -errno.ENOENT:
                # a name this node's export holds was made through this
                # mount (the kernel's entry for it is that very change's) or
                # behind its back (the timeout bounds it): its dentry stays;
                # dropping it could race the create and give the name a new
                # inode under a reader (cp: "replaced while being copied")
                here = exists(p) if exists is not None else False
                if self.session and not here:
                    self._drop_entry(p, ids)
                if exists is not None and not here:
                    continue
            d = os.path.dirname(p) or "/"
            if d not in seen:
                seen.add(d)
                dropped += self._drop(d) == 0
        return dropped

    def _drop_entry(self, path: str, ids: Dict[str, int]) -> None:
        """The dentry of a name the kernel holds no inode of (a negative one,
        if any), or of a name gone everywhere: expired where the kernel can
        (the next lookup asks the mount; a name found under the same node id
        keeps its dentry, so a lookup answered meanwhile loses nothing), else
        dropped. A dropped directory's dentry would leave the processes
        working in it without a current directory (getcwd: ENOENT): so only
        names believed missing or gone come here. `ids`: this call's
        parents' node ids (_parent_id)."""
        d, name = os.path.split(path)
        d = d or "/"
        raw = name.encode("utf-8", "surrogateescape")
        if not raw:
            return
        parent = self._parent_id(d, ids)
        if parent:
            self._drop_name(parent, raw)

    def _parent_id(self, d: str, ids: Dict[str, int]) -> int:
        """The node id of directory `d`, 0 if the kernel holds none. Found ids
        are kept between calls: the stat that finds one is answered by the
        mount itself once the directory's attributes were dropped (the end of
        each call drops them), a FUSE call per announcement. libfuse gives a
        path the node id it had while the kernel holds that node, unless the
        path is removed or renamed through the mount (forget_dirs); a kept id
        the kernel no longer holds is found again."""
        if d in ids:
            return ids[d]
        found = self._dir_ids.get(d, 0)
        if found and not self._holds_node(found):
            found = 0
            self._dir_ids.pop(d, None)      # not asked again if the directory is gone
        if not found and (self.dir_held is None or self.dir_held(d)):
            # a directory this mount never looked into holds no name of it in
            # the kernel (and stat'ing it could ask every peer); the stat of
            # one it did is the kernel's own answer, or one call answered
            # from the copy
            try:
                found = os.lstat(self.mountpoint + d).st_ino
            except OSError:
                pass            # gone: so are the names under it
            if found and self._inval_inode is not None:
                if len(self._dir_ids) >= DIR_IDS_KEPT:
                    self._dir_ids = {}
                self._dir_ids[d] = found
        ids[d] = found
        return found

    def _holds_node(self, node: int) -> bool:
        """Whether the kernel holds node id `node`, asked by dropping its
        attributes (a directory whose names change loses them anyway)."""
        return int(self._inval_inode(self.session, node, -1, 0)) != -errno.ENOENT

    def _drop_name(self, parent: int, raw: bytes) -> int:
        """Expire (or drop) the kernel's entry of name `raw` in directory node
        `parent`: 0, or -ENOENT when the kernel holds no such node."""
        if self._expire is not None:
            rc = int(self._expire(self.session, parent, raw, len(raw), EXPIRE_ONLY))
            if rc != -errno.ENOSYS:
                return rc
            self._expire = None     # libfuse sees a kernel without it
        return int(self.lib.fuse_lowlevel_notify_inval_entry(self.session, parent, raw, len(raw)))

    def _drop(self, path: str) -> int:
        # 0, -ENOENT (never seen), or e.g. -ENOSYS on an old kernel (the
        # timeouts still bound staleness)
        return int(self.lib.fuse_invalidate_path(self.fuse, path.encode("utf-8", "surrogateescape")))
