"""The names of files with hard links made through the mount, so that a
change made through one name reaches the kernel's cache of the others.

libfuse's high-level API gives every name its own kernel inode. After
link(a, b), the kernel still holds a's attributes (nlink 1, the old ctime)
for the attribute timeout, and a chmod, chown, utimens, truncate or unlink
through b leaves a's cached attributes stale the same way. The mount
remembers which names it linked together and drops the kernel's attributes
of the other names whenever one of them changes (kernel_cache.KernelCache).
Names linked behind the mount's back are not known here: their attributes
are seen within the attribute timeout, like any change made there
(docs/merge-semantics.md).

Node side: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Set


class LinkNames:
    """Groups of names (paths of the mount) that are one file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._group: Dict[str, Set[str]] = {}

    def __len__(self) -> int:
        return len(self._group)

    def others(self, path: str) -> List[str]:
        """The other names of path's file (empty: none known)."""
        if not self._group:          # the common case, without the lock
            return []
        with self._lock:
            g = self._group.get(path)
            return [n for n in g if n != path] if g else []

    def linked(self, old: str, new: str) -> List[str]:
        """link(old, new) succeeded: the names whose attributes changed
        (every name of the file but `new`, which the kernel gets fresh)."""
        with self._lock:
            g = self._group.get(old)
            if g is None:
                g = {old}
                self._group[old] = g
            g.add(new)
            self._group[new] = g
            return [n for n in g if n != new]

    def removed(self, path: str) -> List[str]:
        """path was unlinked (or replaced by a rename): the file's other names,
        whose nlink and ctime changed."""
        with self._lock:
            return self._drop(path)

    def _drop(self, path: str) -> List[str]:
        g = self._group.pop(path, None)
        if g is None:
            return []
        g.discard(path)
        out = sorted(g)
        if len(g) == 1:
            self._group.pop(next(iter(g)), None)
        return out

    def renamed(self, old: str, new: str) -> List[str]:
        """rename(old, new) succeeded (old may be a directory: the names below
        it move too): the names whose attributes changed (a replaced `new`'s
        other names; the moved file's other names, for its ctime)."""
        with self._lock:
            out = self._drop(new)
            prefix = old.rstrip("/") + "/"
            moved = [p for p in self._group if p == old or p.startswith(prefix)]
            for p in moved:
                g = self._group.pop(p)
                q = new + p[len(old):]
                g.discard(p)
                g.add(q)
                self._group[q] = g
                out += [n for n in g if n != q]
            return out
