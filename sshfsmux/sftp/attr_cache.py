"""What an SFTP branch remembers of the remote side: each path's attributes
(or the errno its lstat gave, so misses are kept too) and each directory's
names, for `ttl` seconds, dropped at once by a change made through the branch.

Keys are full remote paths (bytes). Thread-safe: FUSE calls come from many
threads.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple


class AttrCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._attr: Dict[bytes, Tuple[float, Any]] = {}
        self._dirs: Dict[bytes, Tuple[float, List[str]]] = {}

    def clear(self) -> None:
        with self._lock:
            self._attr.clear()
            self._dirs.clear()

    def invalidate(self, full: bytes, tree: bool = False) -> None:
        """Forget `full`, its parent's listing, and with `tree` all below it."""
        parent = full.rsplit(b"/", 1)[0] or b"/"
        with self._lock:
            self._attr.pop(full, None)
            self._dirs.pop(full, None)
            self._dirs.pop(parent, None)
            if tree:
                pre = full.rstrip(b"/") + b"/"
                for k in [k for k in self._attr if k.startswith(pre)]:
                    del self._attr[k]
                for k in [k for k in self._dirs if k.startswith(pre)]:
                    del self._dirs[k]

    def attrs(self, full: bytes) -> Any:
        """The attributes dict, an errno, or None when not known (or too old)."""
        with self._lock:
            c = self._attr.get(full)
        if c is None or c[0] < time.monotonic():
            return None
        return c[1]

    def remember(self, full: bytes, value: Any, now: Optional[float] = None) -> None:
        with self._lock:
            self._attr[full] = ((time.monotonic() if now is None else now) + self.ttl, value)

    def names(self, full: bytes) -> Optional[List[str]]:
        with self._lock:
            c = self._dirs.get(full)
        if c is None or c[0] < time.monotonic():
            return None
        return list(c[1])

    def remember_names(self, full: bytes, names: List[str], now: float) -> None:
        with self._lock:
            self._dirs[full] = (now + self.ttl, list(names))
