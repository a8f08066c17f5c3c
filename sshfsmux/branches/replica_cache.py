"""The replica store: whole-file local copies of remote files, for SFTP and
direct branches alike.

A replica is a local copy of one version of one remote file. A version is a
tuple of integers whose first element is the size: (size, mtime) for SFTP,
(size, mtime_ns, ctime_ns, inode) for the direct data channel. A replica is
written to a temporary name (TMP_PREFIX...) while it streams in; commit()
verifies its length against the version and renames it to its final name
(hash of the key, then the version), so a replica is either complete or not
visible at all, and never modified afterwards (a new version of the file gets
a new replica, and the old one goes). A change of the file through the mount
(invalidate) while a replica streams in makes that commit fail.

Two kinds of store:
- ReplicaCache(parent): private to one mount (a fresh mkdtemp directory, 0700)
  and removed when the mount ends (sshfsm; a direct branch without a cache
  directory).
- ReplicaCache.persistent(dir): a directory that outlives the mount (GMount's
  per-session cache): complete replicas found there are used again, damaged
  ones (length not the one in their name) and stale temporary files removed.

Space: at most `limit` bytes of replicas (`-o cache_size=`; default: half the
free space where the store is when it opens). To make room the least recently
used replica goes first, but never one that is pinned (the head pins a running
recipe's inputs on its node, pin()/unpin()) nor one open for reading in this
process (its space would not come back before it is closed anyway). A copy
the head planned (adopt) that still does not fit fails with ENOSPC naming the
store, and is removed; a replica read through the mount is written anyway (it
is being read) and the store shrinks back at the next replica made or unpin.

Standard library only, Python 3.8 syntax (runs on nodes).
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Optional, Set, Tuple

TMP_PREFIX = ".tmp-"        # temporary files: TMP_PREFIX...PART_SUFFIX
PART_SUFFIX = ".part"
UNSETTLED_SUFFIX = ".u"    # a replica of unsettled times (ReplicaCache.settled)
TMP_MAX_AGE = 3600.0        # leftovers of a crashed run older than this are removed
HASH_CHARS = 40


def default_parent() -> str:
    """$XDG_CACHE_HOME if set (and absolute), else /tmp."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return xdg
    return "/tmp"


def make_private_dir(path: str, parents: bool) -> None:
    """`path` made mode 0700 (private state) if it is missing; without `parents`
    a missing parent is refused, as mkdir(1) does, else those are made 0700 too
    (never with the mode the process's umask would leave: sshfsm's is 0)."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        return
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not parents or parent == os.path.abspath(path):
            raise FileNotFoundError(errno.ENOENT, "%s: no such directory (only the last "
                                    "directory of cache_dir is made)" % parent) from None
    make_private_dir(parent, parents=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:HASH_CHARS]


def final_name(h: str, version: Tuple[int, ...]) -> str:
    return ".".join([h] + [str(int(v)) for v in version])


class Entry:
    __slots__ = ("key", "file", "version", "used")

    def __init__(self, key: Optional[str], file: str, version: Tuple[int, ...]) -> None:
        self.key = key          # None for a replica found on disk (only its hash is known)
        self.file = file
        self.version = version
        self.used = time.monotonic()

    @property
    def size(self) -> int:
        return self.version[0]


class Download:
    """One replica being written: a private temporary file in the store."""

    def __init__(self, cache: ReplicaCache, key: str, version: Tuple[int, ...]) -> None:
        self.cache = cache
        self.key = key
        self.version = version
        self.size = version[0]
        fd, self.temp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=PART_SUFFIX, dir=cache.dir)
        self.fd = fd
        self.finished = False

    def commit(self, settled: bool = True) -> Optional[str]:
        """Publish the temporary file as the replica if it is complete (its
        length is the version's size). Returns its path, or None if it is not,
        the store is closed, or the file was changed while it streamed in.
        Not `settled`: the file's times had not settled, so its version does
        not tell a later change apart (ReplicaCache.settled)."""
        if self.finished:
            return None
        self.finished = True
        return self.cache._commit(self, settled)

    def abort(self) -> None:
        if self.finished:
            return
        self.finished = True
        _unlink(self.temp)


def human(n: int) -> str:
    """512.0 MiB."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return ("%d %s" % (x, unit)) if unit == "B" else ("%.1f %s" % (x, unit))
        x /= 1024
    return "%d B" % n


def _open_files() -> Set[str]:
    """Paths this process has open (Linux: /proc/self/fd). The stores' readers
    (the branches) open replicas by path and keep the descriptor while a file
    is read through the mount; evicting such a replica would free nothing."""
    found: Set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            found.add(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    return found


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class ReplicaCache:
    """Complete replicas, keyed by an opaque string (branch and path)."""

    def __init__(self, parent: Optional[str] = None, limit: Optional[int] = None,
                 directory: Optional[str] = None) -> None:
        self.private = directory is None
        if directory is None:
            # -o cache_dir=DIR is made if missing, under a parent that exists;
            # the default ($XDG_CACHE_HOME) is made with its parents
            make_private_dir(parent or default_parent(), parents=parent is None)
            self.dir = tempfile.mkdtemp(prefix="sshfsm-", dir=parent or default_parent())
        else:
            make_private_dir(directory, parents=True)
            self.dir = directory
        os.chmod(self.dir, 0o700)
        self._real = os.path.realpath(self.dir)     # as /proc/self/fd names its files
        self._lock = threading.Lock()
        self._entries: Dict[str, Entry] = {}  # key hash -> replica
        self._generation: Dict[str, int] = {}  # key hash -> changes seen
        self._pending: Dict[int, Tuple[str, int, str]] = {}  # download -> (hash, generation, key)
        self._pins: Dict[str, int] = {}       # key hash -> running recipes needing it
        # replicas of files whose times had not settled: a change within the
        # same timestamp keeps the version, so only a caller told of every
        # change (invalidate) may serve them
        self._unsettled: Set[str] = set()
        if limit is None:
            try:
                st = os.statvfs(self.dir)
                limit = st.f_bavail * st.f_frsize // 2
            except OSError:
                limit = 1 << 30
        self.limit = max(int(limit), 1 << 20)
        self.closed = False
        if not self.private:
            self._load()

    @classmethod
    def persistent(cls, directory: str, limit: Optional[int] = None) -> ReplicaCache:
        """A store in `directory` that is kept when it is closed."""
        return cls(limit=limit, directory=directory)

    def _load(self) -> None:
        now = time.time()
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            try:
                st = os.lstat(path)
                if name.startswith(TMP_PREFIX):
                    if now - st.st_mtime > TMP_MAX_AGE:
                        os.unlink(path)
                    continue
                parts = name.split(".")
                if name.endswith(UNSETTLED_SUFFIX):
                    os.unlink(path)
                    continue
                if len(parts) < 3 or len(parts[0]) != HASH_CHARS:
                    continue
                version = tuple(int(x) for x in parts[1:])
                # a length that is not the one in the name: damaged (a crash
                # before the data reached the disk): never served
                if (not stat.S_ISREG(st.st_mode) or st.st_size != version[0]
                        or parts[0] in self._entries):
                    os.unlink(path)
                    continue
                self._entries[parts[0]] = Entry(None, path, version)
            except (OSError, ValueError):
                continue

    # -- lookups -------------------------------------------------------
    def get(self, key: str, *version: int) -> Optional[str]:
        """Path of a complete replica of exactly this version, else None (a
        replica of another version is dropped)."""
        h = key_hash(key)
        with self._lock:
            e = self._entries.get(h)
            if e is None:
                return None
            if e.version == tuple(version) and os.path.exists(e.file):
                e.used = time.monotonic()
                return e.file
            self._drop(h)
            return None

    def current(self, key: str) -> Optional[Tuple[Tuple[int, ...], str]]:
        """(version, path) of the replica of `key`, whatever its version."""
        with self._lock:
            e = self._entries.get(key_hash(key))
            if e is None:
                return None
            e.used = time.monotonic()
            return e.version, e.file

    def settled(self, key: str) -> bool:
        """Whether the replica of `key` (if any) can be told from a later
        version by its version alone."""
        with self._lock:
            return key_hash(key) not in self._unsettled

    def has(self, key: str, *version: int) -> bool:
        with self._lock:
            e = self._entries.get(key_hash(key))
            return e is not None and e.version == tuple(version) and os.path.exists(e.file)

    def fits(self, size: int) -> bool:
        return size <= self.limit

    # -- changes -------------------------------------------------------
    def begin(self, key: str, *version: int) -> Download:
        if self.closed:
            raise OSError(errno.EIO, "replica cache closed")
        if not version or version[0] < 0:
            raise ValueError("a version starts with the size")
        d = Download(self, key, tuple(version))
        with self._lock:
            h = key_hash(key)
            self._pending[id(d)] = (h, self._generation.get(h, 0), key)
        return d

    def _commit(self, d: Download, settled: bool = True) -> Optional[str]:
        with self._lock:
            h, gen, _ = self._pending.pop(id(d), (key_hash(d.key), -1, d.key))
            try:
                complete = os.stat(d.temp).st_size == d.size
            except OSError:
                complete = False
            if self.closed or not complete or gen != self._generation.get(h, 0):
                _unlink(d.temp)
                return None
            # one of unsettled times is not kept for the next mount, which
            # will not have heard of the changes meanwhile (_load drops it)
            final = os.path.join(self.dir, final_name(h, d.version)
                                 + ("" if settled else UNSETTLED_SUFFIX))
            try:
                os.rename(d.temp, final)
            except OSError:
                _unlink(d.temp)
                return None
            old = self._entries.get(h)
            if old is not None and old.file != final:
                _unlink(old.file)
            self._entries[h] = Entry(d.key, final, d.version)
            if settled:
                self._unsettled.discard(h)
            else:
                self._unsettled.add(h)
            self._evict_locked(keep=h)
            return final

    def adopt(self, key: str, version: Tuple[int, ...], file: str) -> Optional[str]:
        """Take `file`, a complete copy of `key` at `version` made elsewhere on
        this host (a transfer the head planned, verified by its SHA-256), as
        the replica: renamed into the store, so it must be on the store's file
        system. Returns its path, or None (the length is not the version's,
        the store is closed); `file` is gone either way. OSError ENOSPC if it
        does not fit beside the replicas that may not be evicted."""
        h = key_hash(key)
        with self._lock:
            try:
                complete = os.stat(file).st_size == version[0]
            except OSError:
                complete = False
            final = os.path.join(self.dir, final_name(h, version))
            if self.closed or not complete:
                _unlink(file)
                return None
            if not self._make_room(version[0], keep=h):
                _unlink(file)
                raise OSError(errno.ENOSPC, "%s (ENOSPC): the replica store %s is full: "
                              "cache_size %s, %s pinned by running recipes or open"
                              % (os.strerror(errno.ENOSPC), self.dir, human(self.limit),
                                 human(self._held_bytes(h))))
            try:
                os.chmod(file, 0o600)
                os.rename(file, final)
            except OSError:
                _unlink(file)
                return None
            old = self._entries.get(h)
            if old is not None and old.file != final:
                _unlink(old.file)
            self._entries[h] = Entry(key, final, tuple(version))
            self._evict_locked(keep=h)
            return final

    def invalidate(self, key: str) -> None:
        h = key_hash(key)
        with self._lock:
            # only a download under way needs to know (begin takes the
            # generation): counting every name a mount ever heard changed
            # grew with the namespace
            if any(p[0] == h for p in self._pending.values()):
                self._generation[h] = self._generation.get(h, 0) + 1
            self._drop(h)

    def invalidate_prefix(self, prefix: str) -> None:
        """Drop every replica whose key is prefix or under prefix + '/' (of
        those whose key is known: made by this store)."""
        pre = prefix.rstrip("/") + "/"
        with self._lock:
            for h, e in list(self._entries.items()):
                if e.key is not None and (e.key == prefix or e.key.startswith(pre)):
                    self._drop(h)
            for h, _, key in list(self._pending.values()):
                if key == prefix or key.startswith(pre):
                    self._generation[h] = self._generation.get(h, 0) + 1

    def _drop(self, h: str) -> None:
        self._unsettled.discard(h)
        e = self._entries.pop(h, None)
        if e is not None:
            _unlink(e.file)

    # -- space -----------------------------------------------------------
    def pin(self, keys: Iterable[str]) -> None:
        """A running recipe needs these files' replicas: never evicted until
        unpin() (counted: two recipes pinning one file need two unpins)."""
        with self._lock:
            for k in keys:
                h = key_hash(k)
                self._pins[h] = self._pins.get(h, 0) + 1

    def unpin(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                h = key_hash(k)
                n = self._pins.get(h, 0) - 1
                if n > 0:
                    self._pins[h] = n
                else:
                    self._pins.pop(h, None)
            self._make_room(0, keep="")

    def pinned(self, key: str) -> bool:
        with self._lock:
            return key_hash(key) in self._pins

    def used(self) -> int:
        """Bytes of complete replicas in the store."""
        with self._lock:
            return sum(e.size for e in self._entries.values())

    def _open_replicas(self) -> Set[str]:
        """Key hashes of the replicas open in this process."""
        pre = self._real + "/"
        return set(os.path.basename(p).split(".")[0] for p in _open_files() if p.startswith(pre))

    def _held_bytes(self, keep: str) -> int:
        """Bytes that may not be evicted now (pinned or open), `keep` aside."""
        opened = self._open_replicas()
        return sum(e.size for h, e in self._entries.items()
                   if h != keep and (h in self._pins or h in opened))

    def _make_room(self, size: int, keep: str) -> bool:
        """Evict, least recently used first, until `size` more bytes fit
        beside the rest (the replica `keep` counts as gone: it is the one
        being replaced or just made); False if the replicas that may not go
        leave too little."""
        total = sum(e.size for h, e in self._entries.items() if h != keep)
        if total + size <= self.limit:
            return True
        opened = self._open_replicas()
        for h, e in sorted(self._entries.items(), key=lambda he: he[1].used):
            if total + size <= self.limit:
                break
            if h == keep or h in self._pins or h in opened:
                continue
            total -= e.size
            self._drop(h)
        return total + size <= self.limit

    def _evict_locked(self, keep: str) -> None:
        self._make_room(self._entries[keep].size if keep in self._entries else 0, keep)

    def close(self) -> None:
        """A private store is removed with everything in it; a persistent one
        keeps its complete replicas."""
        with self._lock:
            self.closed = True
            self._entries.clear()
        if self.private:
            shutil.rmtree(self.dir, ignore_errors=True)

