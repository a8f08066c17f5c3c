"""What FUSE ACCESS needs of a name (mode, owner, group), kept for as long as
the kernel trusts the name's attributes.

The kernel never caches an ACCESS answer: every access(2) and every chdir
into a directory of the mount asks again (make's recipes chdir once each). On
a GMount the answer comes from the merged view, which asks every peer of a
name this node's export lacks. Answering from attributes at most
`seconds` old is what the kernel does itself with its cached attributes
(fuse_glue.ATTR_SECONDS), so nothing becomes staler than it already is; a
change through this mount drops the memo at once (MergedFS: chmod, chown,
rename, unlink, rmdir; the head's "changed" call for other nodes' writes).

Standard library only, Python 3.8 syntax (runs on nodes).
"""
from __future__ import annotations

import itertools
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Optional, Tuple

MAX_NAMES = 4096        # more: start again (a memo, not a copy of the tree)


class AccessMemo:
    """path -> (st_mode, st_uid, st_gid) for at most `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._names: Dict[str, Tuple[int, Any, Any, float]] = {}
        # changed by every forget/clear: attributes read before a change are
        # not kept after it (put compares the epoch taken before the read)
        self._epochs = itertools.count(1)
        self.epoch = 0

    def get(self, path: str) -> Optional[Tuple[int, Any, Any, float]]:
        kept = self._names.get(path)
        if kept is not None and kept[3] > time.monotonic():
            return kept
        return None

    def put(self, path: str, a: Dict[str, Any], epoch: int) -> Tuple[int, Any, Any, float]:
        """Keep `a` (read after `epoch` was taken) unless something changed since."""
        kept = (a["st_mode"], a.get("st_uid"), a.get("st_gid"), time.monotonic() + self.seconds)
        if self.seconds > 0 and epoch == self.epoch:
            if len(self._names) >= MAX_NAMES:
                self._names.clear()
            self._names[path] = kept
        return kept

    def forget(self, paths: Iterable[str]) -> None:
        self.epoch = next(self._epochs)
        for p in paths:
            self._names.pop(p, None)

    def clear(self) -> None:
        self.epoch = next(self._epochs)
        self._names.clear()


GROUPS_CACHE: Dict[Tuple[int, int], set] = {}


def groups_of(uid: int, gid: int) -> set:
    """The groups of user `uid` (primary group `gid`), kept once asked."""
    key = (uid, gid)
    g = GROUPS_CACHE.get(key)
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
        GROUPS_CACHE[key] = g
    return g
