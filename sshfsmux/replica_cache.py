"""Per-mount cache of whole-file replicas of remote files.

A replica is a local copy of one version (size and whole-second mtime) of one
remote file. It is written to a temporary name (`*.part`) while it streams in and
renamed to its final name only once every byte is there, so a replica is either
complete or not visible at all; it is never modified afterwards (a new version
of the file gets a new replica). The cache directory is private to one mount
(mode 0700, made with mkdtemp) and removed when the mount ends.

Standard library only.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

PART_SUFFIX = ".part"


def default_parent() -> str:
    """$XDG_CACHE_HOME if set (and absolute), else /tmp."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return xdg
    return "/tmp"


class Entry:
    __slots__ = ("key", "file", "size", "mtime", "used")

    def __init__(self, key: str, file: str, size: int, mtime: int) -> None:
        self.key = key
        self.file = file
        self.size = size
        self.mtime = mtime
        self.used = time.monotonic()


class Download:
    """One replica being written: a private temporary file in the cache."""

    def __init__(self, cache: "ReplicaCache", key: str, size: int, mtime: int) -> None:
        self.cache = cache
        self.key = key
        self.size = size
        self.mtime = mtime
        fd, self.temp = tempfile.mkstemp(prefix=cache.file_name(key) + ".",
                                         suffix=PART_SUFFIX, dir=cache.dir)
        self.fd = fd
        self.finished = False

    def commit(self) -> "Optional[str]":
        """Publish the (complete) temporary file as the replica. Returns its
        path, or None if the cache is gone or the version was invalidated while
        it streamed in."""
        if self.finished:
            return None
        self.finished = True
        return self.cache._commit(self)

    def abort(self) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            os.unlink(self.temp)
        except OSError:
            pass


class ReplicaCache:
    """Complete replicas, keyed by an opaque string (branch name + path)."""

    def __init__(self, parent: "Optional[str]" = None, limit: "Optional[int]" = None) -> None:
        parent = parent or default_parent()
        os.makedirs(parent, mode=0o700, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="sshfsm-", dir=parent)
        os.chmod(self.dir, 0o700)
        self._lock = threading.Lock()
        self._entries: "Dict[str, Entry]" = {}
        self._generation: "Dict[str, int]" = {}
        self._pending: "Dict[int, Tuple[str, int]]" = {}
        if limit is None:
            try:
                st = os.statvfs(self.dir)
                limit = st.f_bavail * st.f_frsize // 2
            except OSError:
                limit = 1 << 30
        self.limit = max(int(limit), 1 << 20)
        self.closed = False

    # -- names ---------------------------------------------------------
    @staticmethod
    def file_name(key: str) -> str:
        return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40]

    # -- lookups -------------------------------------------------------
    def get(self, key: str, size: int, mtime: int) -> "Optional[str]":
        """Path of a complete replica of exactly this version, else None (a
        replica of another version is dropped)."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return None
            if e.size == size and e.mtime == mtime and os.path.exists(e.file):
                e.used = time.monotonic()
                return e.file
            self._drop(key)
            return None

    def has(self, key: str, size: int, mtime: int) -> bool:
        with self._lock:
            e = self._entries.get(key)
            return (e is not None and e.size == size and e.mtime == mtime
                    and os.path.exists(e.file))

    def complete(self) -> "List[Tuple[str, int, int]]":
        """(key, size, mtime) of every complete replica."""
        with self._lock:
            return [(e.key, e.size, e.mtime) for e in self._entries.values()]

    def fits(self, size: int) -> bool:
        return size <= self.limit

    # -- changes -------------------------------------------------------
    def begin(self, key: str, size: int, mtime: int) -> Download:
        if self.closed:
            raise OSError(errno.EIO, "replica cache closed")
        d = Download(self, key, size, mtime)
        with self._lock:
            self._pending[id(d)] = (key, self._generation.get(key, 0))
        return d

    def _commit(self, d: Download) -> "Optional[str]":
        with self._lock:
            key, gen = self._pending.pop(id(d), (d.key, -1))
            if self.closed or gen != self._generation.get(key, 0):
                try:
                    os.unlink(d.temp)
                except OSError:
                    pass
                return None
            final = os.path.join(self.dir, self.file_name(key))
            try:
                os.rename(d.temp, final)
            except OSError:
                try:
                    os.unlink(d.temp)
                except OSError:
                    pass
                return None
            self._entries[key] = Entry(key, final, d.size, d.mtime)
            self._evict_locked(keep=key)
            return final

    def invalidate(self, key: str) -> None:
        with self._lock:
            self._generation[key] = self._generation.get(key, 0) + 1
            self._drop(key)

    def invalidate_prefix(self, prefix: str) -> None:
        """Drop every replica whose key is prefix or under prefix + '/'."""
        with self._lock:
            for key in list(self._entries) + list(k for k, _ in self._pending.values()):
                if key == prefix or key.startswith(prefix.rstrip("/") + "/"):
                    self._generation[key] = self._generation.get(key, 0) + 1
                    self._drop(key)

    def _drop(self, key: str) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            try:
                os.unlink(e.file)
            except OSError:
                pass

    def _evict_locked(self, keep: str) -> None:
        total = sum(e.size for e in self._entries.values())
        if total <= self.limit:
            return
        for e in sorted(self._entries.values(), key=lambda e: e.used):
            if total <= self.limit:
                break
            if e.key == keep:
                continue
            total -= e.size
            self._drop(e.key)

    def close(self) -> None:
        """Remove the cache directory and everything in it."""
        with self._lock:
            self.closed = True
            self._entries.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
