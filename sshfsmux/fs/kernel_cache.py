"""Dropping what the kernel caches about files of a running FUSE mount.

When a recipe on one node finishes writing a file, every other node's mount
must show the new size and contents before make hears the exit status. The
kernel keeps attributes, names and pages of a FUSE mount for as long as the
mount's timeouts allow; libfuse 3's high-level `fuse_invalidate_path` drops
them for one path (attributes, the name's dentry, cached pages). It needs the
mount's `struct fuse *`, which only a FUSE callback can see
(`fuse_get_context()->fuse`): KernelCache.capture() takes it in the mount's
init callback, and invalidate_paths() may then run from any thread.

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
    from typing import Any, Callable, Iterable, Optional


class KernelCache:
    """The kernel caches of one running mount."""

    def __init__(self, lib: Any, fuse: Optional[int]) -> None:
        self.lib = lib
        self.fuse = fuse
        if lib is not None:
            fn = lib.fuse_invalidate_path
            fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            fn.restype = ctypes.c_int

    @classmethod
    def capture(cls) -> KernelCache:
        """Call from the mount's init callback (FUSE's own thread)."""
        try:
            import mfusepy
            lib = mfusepy._libfuse
            ctx = lib.fuse_get_context()
            fuse = ctx.contents.fuse if ctx else None
            if not hasattr(lib, "fuse_invalidate_path"):   # libfuse 2: nothing to call
                return cls(None, None)
            return cls(lib, fuse)
        except Exception:
            return cls(None, None)

    @property
    def usable(self) -> bool:
        return self.lib is not None and bool(self.fuse)

    def invalidate_paths(self, paths: Iterable[str],
                         exists: Optional[Callable[[str], bool]] = None) -> int:
        """Drop the kernel's caches for each path (relative to the mount's
        root, starting with '/') and for its directory (its times and size
        changed with the name). Returns how many the kernel had cached; a path
        it never saw (ENOENT) is not an error: nothing was cached to go stale.
        A path the kernel did not know and that `exists` says is not there
        either (make's candidate names a recipe never made) leaves its
        directory alone: dropping a recipe's cwd's attributes for it would
        cost the next chdir a lookup on every peer."""
        if not self.usable:
            return 0
        dropped = 0
        seen = set()
        for p in paths:
            if p in seen:
                continue
            seen.add(p)
            rc = self._drop(p)
            if rc == 0:
                dropped += 1
            elif rc == -errno.ENOENT and exists is not None and not exists(p):
                continue
            d = os.path.dirname(p) or "/"
            if d not in seen:
                seen.add(d)
                dropped += self._drop(d) == 0
        return dropped

    def _drop(self, path: str) -> int:
        # 0, -ENOENT (never seen), or e.g. -ENOSYS on an old kernel (the
        # timeouts still bound staleness)
        return int(self.lib.fuse_invalidate_path(self.fuse, path.encode("utf-8", "surrogateescape")))
