"""A branch on another agent's export, over the direct data channel
(SSHFSM-Direct): file data moves over one authenticated TCP connection to the
exporting agent instead of through SSH.

    branch = DirectBranch(host, port, key, pin, node, cipher=True, cache_dir=...)

`key` is fs_protocol.data_channel_key(session secret); `pin` the session
certificate's SHA-256 (unused with cipher=False, which keeps the mutual HMAC
authentication and authenticates every frame, but sends data in clear).

One persistent connection carries every call (direct_channel). Where the
export's host cannot be reached directly (another site), `via_tree`
opens the connection along the session's tree instead, found by trying
(transport.connect); TLS and the proofs run end to end over it the same. If it drops, the
next call connects again (once per call); a call that may already have reached
the server is sent again only if it is idempotent, else it fails with EIO. A
call without an answer within `timeout` fails with EIO and closes the
connection; for RETRY_SECONDS afterwards every call fails at once (EIO), so a
host that is gone costs one timeout, not one per access.

Reads. open_read asks for the whole file once ("read_file"): the server streams
it into a replica download of the replica store (replica_cache; direct_files
says when a replica is committed), and reads are served from it as soon as the
bytes they need have arrived. The next open_read of the same path sends the
replica's version (size, mtime, ctime, inode); while the server finds it
unchanged it answers without data and the replica is read locally. The store is
shared by the branches of one mount (`cache`), else the branch's own: in
`cache_dir` (kept) or private (removed on close).

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import os
import threading
import time

from gxpstyle.transport import link_auth
from sshfsmux.branches.branch import STAT_KEYS, Branch, ReadHandle, WriteHandle
from sshfsmux.branches.replica_cache import TMP_PREFIX, ReplicaCache  # noqa: F401  (TMP_PREFIX: tests)
from sshfsmux.direct import protocol as fs_protocol
from sshfsmux.direct.channel import _Channel, _ConnectionLost, _DirList, _oserror, _Pending, _rel, _Timeout
from sshfsmux.direct.files import HAVE_KEYS, _Fetch, _RemoteFile, _ReplicaReader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

CALL_SECONDS = 20.0         # default: a call, or a stream standing still, longer than this fails
MAX_CALL_SECONDS = 3600.0
RETRY_SECONDS = 5.0         # after the export stopped answering, calls fail at once this long


def tree_way(host: Any, node_id: Optional[str], port: int,
             log: Optional[Callable[[str], None]] = None) -> Optional[Callable[[float], Any]]:
    """How a peer's export is reached when no direct connection can be made:
    a stream along the session's tree to its agent (`host`: the node side's
    NodeHost, whose open_stream gives it); None without a host or a peer id."""
    if not node_id or host is None:
        return None

    def through_tree(timeout: float) -> Any:
        sock = host.open_stream(node_id, port, timeout)
        if log is not None:
            log("data channel to %s: along the tree (no direct connection)" % node_id)
        return sock
    return through_tree


class _Resuming(ReadHandle):
    """A reader of a file streaming in from a site proxy: if that stream fails
    (the proxy died mid-read), the holder itself serves the rest, at the same
    version (another version would mix two files: EIO)."""

    def __init__(self, inner: ReadHandle, version: Tuple[int, ...],
                 reopen: Callable[[], Tuple[ReadHandle, Tuple[int, ...], Any]],
                 stats: Dict[str, int]) -> None:
        self.inner, self.version, self.reopen, self.stats = inner, version, reopen, stats
        self.lock = threading.Lock()
        self.resumed = False

    def read(self, size: int, offset: int) -> bytes:
        inner = self.inner
        try:
            return inner.read(size, offset)
        except OSError:
            with self.lock:
                if self.inner is inner:          # not resumed by another reader meanwhile
                    if self.resumed:
                        raise
                    self.resumed = True
                    fresh, version, _fetch = self.reopen()
                    if tuple(version) != tuple(self.version):
                        fresh.close()
                        raise _oserror(errno.EIO, "the file changed while its proxy failed")
                    self.inner = fresh
                    self.stats["resumed"] = self.stats.get("resumed", 0) + 1
                    inner.close()
                fresh = self.inner
            return fresh.read(size, offset)

    def close(self) -> None:
        self.inner.close()


# --- the branch -----------------------------------------------------------------

class DirectBranch(Branch):
    """A remote export reached over the direct data channel."""

    def __init__(self, host: Optional[str], port: int, key: bytes, pin: Optional[str], node: str,
                 cipher: bool = True, cache_dir: Optional[str] = None,
                 timeout: float = CALL_SECONDS,
                 connect_timeout: float = link_auth.HANDSHAKE_SECONDS,
                 writable: bool = True, cache: Optional[ReplicaCache] = None,
                 via_tree: Optional[Callable[[float], Any]] = None) -> None:
        self.host, self.port, self.key, self.pin = host, port, key, pin
        # the way when the direct one fails (a socket to the export along the
        # session's tree); once it had to be taken, the branch keeps to it
        self.via_tree = via_tree
        self.tree_only = False
        self.node = node
        self.name = "direct:%s" % node
        self.local = False
        self.writable = writable
        self.cipher = cipher
        if not 0 < timeout <= MAX_CALL_SECONDS:
            raise ValueError("timeout %r out of range" % timeout)
        self.timeout = timeout
        self.connect_timeout = min(connect_timeout, timeout)
        self._retry_at = 0.0        # no new connection before this (monotonic)
        self._chan: Optional[_Channel] = None
        self._chan_lock = threading.Lock()
        # one store for every branch of a mount (`cache`), else one of its own:
        # in `cache_dir` and kept, or private and removed with the branch
        self._own_cache = cache is None
        if cache is None:
            cache = ReplicaCache.persistent(cache_dir) if cache_dir else ReplicaCache()
        self.cache = cache
        self.cache_dir = cache.dir
        self.stats = {"connects": 0, "streams": 0, "reused": 0}
        # rel -> the site proxy's branch that reads this holder's file `rel`
        # for this mount, or None (site_cache.py); None: no proxying
        self.site_proxy: Optional[Callable[[str], Optional[DirectBranch]]] = None
        # rel -> (size, mtime) of this holder's file as the mount's namespace
        # copy names it, or None. Set only where every change of the holder's
        # files is announced to the mount, which then drops their replicas
        # (drop_replicas): GMount's node. A replica whose version those match
        # is opened with no request, and replicas of files whose times had
        # not settled are kept for it
        self.known: Optional[Callable[[str], Optional[Tuple[int, float]]]] = None
        # replica keys read from the holder during this mount's life, and not
        # dropped since: a replica a store kept from before (changes made
        # meanwhile reached no one here) is not opened without asking
        self._read_here: Set[str] = set()
        # fetches under way (key -> fetch, a descriptor of its replica file)
        self._inflight: Dict[str, Tuple[_Fetch, int]] = {}
        self._inflight_lock = threading.Lock()
        self._opening: Dict[str, List[Any]] = {}     # key -> [its opener's lock, users]

    # -- connection ------------------------------------------------------------
    def _channel(self) -> _Channel:
        with self._chan_lock:
            ch = self._chan
            if ch is not None and ch.dead is None:
                return ch
            if time.monotonic() < self._retry_at:
                raise _oserror(errno.EIO, "%s is not answering" % self.node)
            try:
                ch = _Channel(None if self.tree_only else self.host, self.port, self.key,
                              self.pin, self.cipher, self.connect_timeout, self.timeout,
                              self._through_tree if self.via_tree is not None else None)
            except link_auth.AuthError as e:
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise _oserror(errno.EACCES, "data channel to %s refused: %s" % (self.node, e))
            except OSError as e:
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise _oserror(errno.EIO, "data channel to %s: %s" % (self.node, e))
            self.stats["connects"] += 1
            self._chan = ch
            return ch

    def _through_tree(self, timeout: float) -> Any:
        """The direct connection failed (found by trying): the tree carries it."""
        assert self.via_tree is not None
        sock = self.via_tree(timeout)
        self.tree_only = True
        self.stats["tree"] = self.stats.get("tree", 0) + 1
        return sock

    def _call(self, call: str, args: Dict[str, Any],
              make: Optional[Callable[[], _Pending]] = None) -> Tuple[Any, _Channel]:
        for attempt in (0, 1):
            ch = self._channel()
            p = make() if make is not None else _Pending()
            try:
                ch.submit(call, args, p)
                return p.wait(self.timeout), ch
            except _Timeout:
                self.not_answering("no reply")
                raise
            except _ConnectionLost as e:
                if attempt == 0 and (not e.sent or call in fs_protocol.IDEMPOTENT):
                    continue
                raise _oserror(errno.EIO, "data channel to %s lost: %s" % (self.node, e))
        raise _oserror(errno.EIO)       # not reached

    def not_answering(self, why: str) -> None:
        """The export stopped answering: drop the connection, and fail every call
        at once for RETRY_SECONDS instead of waiting for it again."""
        self._retry_at = time.monotonic() + RETRY_SECONDS
        with self._chan_lock:
            ch = self._chan
        if ch is not None:
            ch.close(why)

    def _do(self, call: str, **args: Any) -> Any:
        return self._call(call, args)[0]

    def close(self) -> None:
        with self._chan_lock:
            ch, self._chan = self._chan, None
        if ch is not None:
            ch.close("branch closed")
            ch.conn.join(5)
        with self._inflight_lock:
            fds = [fd for _f, fd in self._inflight.values()]
            self._inflight.clear()
        for fd in fds:
            os.close(fd)
        if self._own_cache:
            self.cache.close()

    # -- replicas --------------------------------------------------------------
    def replica_key(self, rel: str) -> str:
        """The replica store's key of wire path `rel` ("a/b") read through this
        branch (the key adopt, reads and pins use)."""
        return "%s\0%s" % (self.node, rel)

    def _forget(self, *rels: str) -> None:
        for rel in rels:
            key = self.replica_key(rel)
            self._read_here.discard(key)
            self.cache.invalidate(key)

    def drop_replicas(self, rels: List[str]) -> None:
        """This holder's files `rels` ("a/b") changed: their replicas go, and
        a fetch of one under way is not kept."""
        self._forget(*rels)

    def version(self, path: str) -> Tuple[int, ...]:
        """The export's version of `path` now (what read_file's `have` compares)."""
        r = self._do("version", path=_rel(path))
        try:
            return tuple(int(r[k]) for k in HAVE_KEYS)
        except (TypeError, KeyError, ValueError):
            raise _oserror(errno.EIO, "bad reply")

    def adopt(self, path: str, file: str) -> Optional[str]:
        """Make `file` (a complete copy of `path` on this host) this branch's
        replica of it, at the version the export has now; its path, or None."""
        return self.cache.adopt(self.replica_key(_rel(path)), self.version(path), file)

    # -- Branch ----------------------------------------------------------------
    def getattr(self, path: str) -> Dict[str, Any]:
        return self._stat_reply(self._do("getattr", path=_rel(path)))

    @staticmethod
    def _stat_reply(r: Any) -> Dict[str, Any]:
        try:
            return {k: r[k] for k in STAT_KEYS}
        except (TypeError, KeyError):
            raise _oserror(errno.EIO, "bad reply")

    def getattr_begin(self, path: str) -> Callable[[], Dict[str, Any]]:
        """Send a getattr now and return what waits for its answer: the merged
        tree asks every peer at once, so a missing name costs one round trip,
        not one per peer. Anything unusual (no connection, a lost one) falls
        back to getattr, with its retry rules."""
        rel = _rel(path)
        try:
            ch = self._channel()
            p = _Pending()
            ch.submit("getattr", {"path": rel}, p)
        except OSError:
            return lambda: self.getattr(path)

        def finish() -> Dict[str, Any]:
            try:
                return self._stat_reply(p.wait(self.timeout))
            except _Timeout:
                self.not_answering("no reply")
                raise
            except _ConnectionLost:
                return self.getattr(path)
        return finish

    def readdir(self, path: str) -> List[str]:
        holder: List[_DirList] = []

        def make() -> _Pending:
            holder.append(_DirList())
            return holder[-1]
        self._call("readdir", {"path": _rel(path)}, make)
        return holder[-1].names

    def readlink(self, path: str) -> str:
        r = self._do("readlink", path=_rel(path))
        if not isinstance(r, str):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def mkdir(self, path: str, mode: int) -> None:
        self._do("mkdir", path=_rel(path), mode=mode & 0o7777)

    def rmdir(self, path: str) -> None:
        self._do("rmdir", path=_rel(path))

    def unlink(self, path: str) -> None:
        rel = _rel(path)
        self._forget(rel)
        self._do("unlink", path=rel)

    def rename(self, old: str, new: str) -> None:
        o, n = _rel(old), _rel(new)
        self._forget(o, n)
        self._do("rename", old=o, new=n)

    def symlink(self, target: str, path: str) -> None:
        self._do("symlink", target=target, path=_rel(path))

    def chmod(self, path: str, mode: int) -> None:
        self._do("chmod", path=_rel(path), mode=mode & 0o7777)

    def truncate(self, path: str, length: int) -> None:
        rel = _rel(path)
        self._forget(rel)
        self._do("truncate", path=rel, length=length)

    def utimens(self, path: str, times: Optional[Tuple[float, float]]) -> None:
        self._do("utimens", path=_rel(path), times=None if times is None else list(times))

    def statfs(self) -> Dict[str, Any]:
        r = self._do("statfs")
        if not isinstance(r, dict):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def getxattr(self, path: str, name: str) -> bytes:
        r = self._do("getxattr", path=_rel(path), name=name)
        if not isinstance(r, bytes):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        self._do("setxattr", path=_rel(path), name=name, value=bytes(value))

    def listxattr(self, path: str) -> List[str]:
        r = self._do("listxattr", path=_rel(path))
        if not isinstance(r, list):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def removexattr(self, path: str, name: str) -> None:
        self._do("removexattr", path=_rel(path), name=name)

    def read_range(self, path: str, size: int, offset: int) -> bytes:
        """One range of a file without a replica (the "read" call)."""
        r = self._do("read", path=_rel(path), offset=offset, size=min(size, fs_protocol.MAX_IO))
        if not isinstance(r, bytes):
            raise _oserror(errno.EIO, "bad reply")
        return r

    def open_read(self, path: str) -> ReadHandle:
        rel = _rel(path)
        proxy = self.site_proxy(rel) if self.site_proxy is not None else None
        if proxy is not None:
            try:
                handle, version, fetch = self.open_versioned(path, via=proxy)
            except OSError:
                # the site's proxy is gone or failed: the holder itself serves
                # (WAN bytes, never a failed read: site_cache.py)
                self.stats["proxy_failed"] = self.stats.get("proxy_failed", 0) + 1
            else:
                if fetch is None:
                    return handle
                return _Resuming(handle, version, lambda: self.open_versioned(path), self.stats)
        return self.open_versioned(path)[0]

    def open_versioned(self, path: str, via: Optional[DirectBranch] = None
                       ) -> Tuple[ReadHandle, Tuple[int, ...], Optional[_Fetch]]:
        """A reader of `path`, the holder's version it reads, and the fetch
        still filling it (None: a complete replica). Through `via`, a site
        proxy's branch (read_peer, site_cache.py), else from this export
        (read_file). A fetch of the same file under way is joined, not repeated."""
        key = self.replica_key(_rel(path))
        kept = self._known_replica(path, key) if via is None else None
        if kept is not None:
            return kept
        # one opener of a file at a time: the others wait for its answer and
        # join its fetch (a site proxy's readers come at once)
        with self._inflight_lock:
            opening = self._opening.setdefault(key, [threading.Lock(), 0])
            opening[1] += 1
        try:
            with opening[0]:
                return self._join(key) or self._open_versioned(path, via)
        finally:
            with self._inflight_lock:
                opening[1] -= 1
                if not opening[1]:
                    del self._opening[key]

    def _known_replica(self, path: str, key: str
                       ) -> Optional[Tuple[ReadHandle, Tuple[int, ...], Optional[_Fetch]]]:
        """The replica, opened with no request to the holder, when the
        namespace copy names the size and mtime it was fetched at (the mount
        drops a replica at every change of its file: `known`). None: ask."""
        known = self.known(_rel(path)) if self.known is not None and key in self._read_here \
            else None
        cand = self.cache.current(key) if known is not None else None
        if known is None or cand is None or len(cand[0]) != len(HAVE_KEYS):
            return None
        size, mtime_ns = cand[0][0], cand[0][1]
        if size != known[0] or abs(mtime_ns - known[1] * 1e9) >= 1000:
            return None
        try:
            fd = os.open(cand[1], os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        self.stats["known"] = self.stats.get("known", 0) + 1
        return _ReplicaReader(fd, None, self.timeout), tuple(cand[0]), None

    def _open_versioned(self, path: str, via: Optional[DirectBranch]
                        ) -> Tuple[ReadHandle, Tuple[int, ...], Optional[_Fetch]]:
        rel = _rel(path)
        key = self.replica_key(rel)
        chan = via if via is not None else self
        for _ in range(2):
            cand = self.cache.current(key)
            # a replica of unsettled times: its version is no proof
            if cand is not None and (len(cand[0]) != len(HAVE_KEYS)
                                     or not self.cache.settled(key)):
                cand = None
            have = dict(zip(HAVE_KEYS, cand[0])) if cand is not None else None
            fetches: List[_Fetch] = []

            # Bound now, as a default: each pass of the loop has its own list.
            def make(fetches: List[_Fetch] = fetches) -> _Pending:
                fetches.append(_Fetch(chan, key))
                return fetches[-1]
            args = {"path": rel, "have": have}
            if via is not None:
                args["node"] = self.node
            try:
                result, _ch = chan._call("read_peer" if via is not None else "read_file", args, make)
            except BaseException:
                for f in fetches:
                    f.drop_reader()
                raise
            for f in fetches[:-1]:
                f.drop_reader()
            fetch = fetches[-1]
            if self.known is not None:
                self._read_here.add(key)
            if result.get("unchanged") is True:
                if cand is None:
                    raise _oserror(errno.EIO, "bad reply")
                try:
                    fd = os.open(cand[1], os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    self._forget(rel)
                    continue
                self.stats["reused"] += 1
                return _ReplicaReader(fd, None, self.timeout), tuple(cand[0]), None
            fd = fetch.take_reader()
            if fd < 0:
                raise _oserror(errno.EIO, fetch.failed or "stream failed")
            self.stats["streams" if via is None else "proxied"] = \
                self.stats.get("streams" if via is None else "proxied", 0) + 1
            self._track(key, fetch, fd)
            assert fetch.meta is not None
            return _ReplicaReader(fd, fetch, self.timeout), fetch.meta, fetch
        raise _oserror(errno.EIO, "replica vanished")

    def _join(self, key: str) -> Optional[Tuple[ReadHandle, Tuple[int, ...], _Fetch]]:
        """A reader of the fetch of `key` under way, if there is one."""
        with self._inflight_lock:
            entry = self._inflight.get(key)
            if entry is None or entry[0].complete or entry[0].failed is not None:
                return None
            fetch, fd = entry
            assert fetch.meta is not None
            self.stats["joined"] = self.stats.get("joined", 0) + 1
            return _ReplicaReader(os.dup(fd), fetch, self.timeout), fetch.meta, fetch

    def _track(self, key: str, fetch: _Fetch, fd: int) -> None:
        """Readers that come while `fetch` runs join it (_join)."""
        with self._inflight_lock:
            old = self._inflight.pop(key, None)
            self._inflight[key] = (fetch, os.dup(fd))
        if old is not None:
            os.close(old[1])
        fetch.when_over(lambda: self._untrack(key, fetch))

    def _untrack(self, key: str, fetch: _Fetch) -> None:
        with self._inflight_lock:
            entry = self._inflight.get(key)
            if entry is None or entry[0] is not fetch:
                return
            del self._inflight[key]
        os.close(entry[1])

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        rel = _rel(path)
        self._forget(rel)
        fh, ch = self._call("open_write", {"path": rel, "flags": flags & 0x7FFFFFFF,
                                           "mode": mode & 0o7777, "create": bool(create)})
        if isinstance(fh, bool) or not isinstance(fh, int):
            raise _oserror(errno.EIO, "bad reply")
        return _RemoteFile(self, ch, fh)
