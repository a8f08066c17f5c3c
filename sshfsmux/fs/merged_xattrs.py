"""Extended attributes of the merged tree: user.sshfsmux.location (the nodes
holding a complete copy), user.sshfsmux.conflict, the hints user.sshfsmux.dp and
user.sshfsmux.replication (stored in a local branch, else in the mount's hints
table), and other user.* attributes passed to the visible branch. A mixin of
MergedFS (merged_fs.py).
"""
from __future__ import annotations

import errno
import re
import stat

from sshfsmux.fs.fuse_glue import _e
from sshfsmux.fs.fuse_glue import safe as _safe
from sshfsmux.fs.merged_handles import View

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

    from sshfsmux.branches.branch import Branch

XA_LOCATION = "user.sshfsmux.location"
XA_CONFLICT = "user.sshfsmux.conflict"
XA_DP = "user.sshfsmux.dp"
XA_REPLICATION = "user.sshfsmux.replication"
# on the root only: "calls=N lookups=M", the requests this host's export
# server has served and the getattr calls this mount's FUSE file system saw
# (what one node's work costs the others: tests/gmount/test_gmount_requests.py)
XA_SERVED = "user.sshfsmux.served"
HINTS = (XA_DP, XA_REPLICATION)
COMPUTED = (XA_LOCATION, XA_CONFLICT)
XATTR_CREATE, XATTR_REPLACE = 1, 2

_DP_RE = re.compile(r"^(local|collocation:[A-Za-z0-9._-]+)$")
_REPL_RE = re.compile(r"^[1-9][0-9]{0,8}$")


class Xattrs:
    if TYPE_CHECKING:       # what MergedFS supplies (for type checkers only)
        import threading
        _lock: threading.Lock
        _hints: Dict[str, Dict[str, bytes]]
        node: str
        lookups: int
        served: Optional[Callable[[], Dict[str, int]]]

        def _view(self, path: str, every: bool = False) -> View: ...
        def _is_chain(self, path: Optional[str]) -> bool: ...
        def _writable(self) -> None: ...

    # -- where a file is -------------------------------------------------
    @staticmethod
    def copies(v: View) -> List[Tuple[Branch, int, float]]:
        """The branches holding a complete copy of the visible version of a
        name that is not a directory, with its size and mtime: what
        user.sshfsmux.location names and what the GMount change feed tells
        the head's replica catalog (gmount/node.py), one list so that the
        two agree by construction."""
        size = v.attrs["st_size"]
        out: List[Tuple[Branch, int, float]] = []
        for b, a in v.replicas:
            if a["st_size"] == size and all(b.node != c.node for c, _, _ in out):
                out.append((b, int(size), float(a["st_mtime"])))
        return out

    def file_copies(self, path: str) -> List[Tuple[str, int, float]]:
        """(node, size, mtime) of every complete copy of `path` (copies()),
        none for anything but a regular file; OSError ENOENT when no branch
        holds the name."""
        v = self._view(path, every=True)
        if not stat.S_ISREG(v.attrs["st_mode"]):
            return []
        return [(b.node, size, mtime) for b, size, mtime in self.copies(v)]

    # -- extended attributes -------------------------------------------
    def _location(self, path: str, v: View) -> bytes:
        nodes: List[str] = []
        if v.is_dir:
            for b, a in v.holders:
                if stat.S_ISDIR(a["st_mode"]) and b.node not in nodes:
                    nodes.append(b.node)
            return ",".join(nodes).encode()
        replica_here = False
        for b, size, mtime in self.copies(v):
            nodes.append(b.node)
            # an sshfsm branch's local replica of its file (a cache of this
            # mount's own, not a copy the catalog places recipes by)
            has = getattr(b, "has_replica", None)
            if has is not None and has(path, size, int(mtime)):
                replica_here = True
        if replica_here and self.node not in nodes:
            nodes.append(self.node)
        return ",".join(nodes).encode()

    def _hint_get(self, path: str, v: View, name: str) -> Optional[bytes]:
        if v.visible.local:
            try:
                return v.visible.getxattr(path, name)
            except OSError as e:
                if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                    raise
        with self._lock:
            return self._hints.get(path, {}).get(name)

    @_safe
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if self._is_chain(path):
            raise _e(errno.ENODATA)
        if name == "security.capability":
            # the kernel's question before each write of an open file (it
            # exists): only user.* names are ever answered
            raise _e(errno.ENODATA)
        if not name.startswith("user."):
            self._view(path)          # ENOENT first, like the kernel would
            raise _e(errno.ENODATA)
        if name == XA_SERVED and path == "/":
            # the total, then each kind of request (what asked, when a test fails)
            kinds = dict(self.served()) if self.served else {}
            return " ".join(["calls=%d lookups=%d" % (sum(kinds.values()), self.lookups)] + [
                "%s=%d" % kv for kv in sorted(kinds.items())]).encode()
        if name == XA_LOCATION:
            return self._location(path, self._view(path, every=True))
        if name == XA_CONFLICT:
            v = self._view(path, every=True)
            if v.is_dir or not v.conflicts:
                raise _e(errno.ENODATA)
            return ",".join(b.name for b, _ in v.conflicts).encode()
        v = self._view(path)
        if name in HINTS:
            val = self._hint_get(path, v, name)
            if val is None:
                raise _e(errno.ENODATA)
            return val
        return v.visible.getxattr(path, name)

    @_safe
    def listxattr(self, path: str) -> List[str]:
        if self._is_chain(path):
            return []
        v = self._view(path)
        names: List[str] = []
        try:
            names = [n for n in v.visible.listxattr(path) if n.startswith("user.")]
        except OSError as e:
            if e.errno not in (errno.ENOTSUP, errno.ENODATA):
                raise
        with self._lock:
            for n in self._hints.get(path, {}):
                if n not in names:
                    names.append(n)
        return names

    def _xattr_target(self, path: str, name: str) -> View:
        """The view an xattr change applies to, after the checks both setxattr
        and removexattr make: not the chain file, user.* only, not computed."""
        if self._is_chain(path):
            raise _e(errno.EPERM)
        v = self._view(path)
        if not name.startswith("user."):
            raise _e(errno.ENOTSUP)
        if name in COMPUTED:
            raise _e(errno.EPERM)
        self._writable()
        return v

    @_safe
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        v = self._xattr_target(path, name)
        if name in HINTS:
            text = value.decode("ascii", "replace").strip()
            if name == XA_DP and not _DP_RE.match(text):
                raise _e(errno.EINVAL)
            if name == XA_REPLICATION and not _REPL_RE.match(text):
                raise _e(errno.EINVAL)
            value = text.encode()
            cur = self._hint_get(path, v, name)
            if options & XATTR_CREATE and cur is not None:
                raise _e(errno.EEXIST)
            if options & XATTR_REPLACE and cur is None:
                raise _e(errno.ENODATA)
            if v.visible.local:
                try:
                    v.visible.setxattr(path, name, value)
                    with self._lock:
                        self._hints.get(path, {}).pop(name, None)
                    return 0
                except OSError as e:
                    if e.errno not in (errno.ENOTSUP, errno.EPERM):
                        raise
            with self._lock:
                self._hints.setdefault(path, {})[name] = value
            return 0
        fn = v.visible.setxattr
        try:
            fn(path, name, value, options)   # type: ignore[call-arg]
        except TypeError:
            fn(path, name, value)
        return 0

    @_safe
    def removexattr(self, path: str, name: str) -> int:
        v = self._xattr_target(path, name)
        if name in HINTS:
            found = False
            with self._lock:
                d = self._hints.get(path)
                if d and name in d:
                    del d[name]
                    found = True
            if v.visible.local:
                try:
                    v.visible.removexattr(path, name)
                    found = True
                except OSError as e:
                    if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                        raise
            if not found:
                raise _e(errno.ENODATA)
            return 0
        v.visible.removexattr(path, name)
        return 0
