"""The merged view answered from a namespace copy (namespace_copy.py) instead
of by asking every branch: a mixin of MergedFS (merged_fs.py).

With a copy (a GMount node's), a name is looked up in the local branches
first, as always, and the remote branches that hold it are the ones the
copy names, with the size, mtime and mode the copy says: no request goes to
a peer to find a name or to learn that it is missing (issue 26). A change
then touches only those holders; afterwards the copy is told what they hold
now (`_settle`), so this mount sees its own change at once, before the
head's word comes back. The merge rules are the same: local first, then
the branch order; replicas and conflicts by size and mtime.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import stat

from sshfsmux.branches.branch import Branch
from sshfsmux.fs.fuse_glue import _e
from sshfsmux.fs.merged_handles import View
from sshfsmux.fs.namespace_copy import split

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

    from sshfsmux.fs.namespace_copy import Holder, NamespaceCopy


class NamespaceView:
    if TYPE_CHECKING:       # what MergedFS supplies (for type checkers only)
        branches: List[Branch]
        namespace: Optional[NamespaceCopy]
        uid: int
        gid: int
        lookups: int
        _virtual: Dict[str, bytes]

        def _note(self, b: Branch, e: OSError) -> None: ...
        def _classified(self, path: str, holders: List[Tuple[Branch, Dict[str, Any]]]) -> View: ...

    def missing(self, path: bytes, name: str, buf: Any) -> bool:
        """A lookup's quick answer (fuse_glue's getattr): True when `path`
        (`name` decoded) is certainly missing: the one local branch lstats
        ENOENT (into libfuse's buffer) and the copy lists its directory with
        no other node holding it; the general path's answer, without the
        exceptions it raises on the way (make, configure and compilers live
        on misses). False: ask the general path."""
        ns = self.namespace
        into = self._local_stat_into()
        if ns is None or into is None or name in self._virtual:
            return False
        before = ns.version
        if into(path, buf) != -errno.ENOENT or split(name)[0] not in ns.dirs:
            return False
        found = ns.holders(name)        # notes a name the kernel may keep (holders)
        if found is None or any(h[0] != self.branches[0].node for h in found):
            return False
        self.lookups += 1
        return ns.version == before

    def _local_stat_into(self) -> Any:
        """The one local branch's stat_into (a GMount node's export), or None.
        Local branches come first (MergedFS), so it is the first one when the
        second is not local."""
        first, rest = self.branches[0], self.branches[1:2]
        if not first.local or (rest and rest[0].local):
            return None
        return getattr(first, "stat_into", None)

    def _copy_attrs(self, h: Holder) -> Dict[str, Any]:
        """A remote holder's attributes as the copy knows them (owner: the
        mount's user, who owns what the nodes' mount services write)."""
        _node, size, mtime, mode = h
        mode = mode or (stat.S_IFREG | 0o644)
        return {"st_mode": mode, "st_size": size, "st_mtime": mtime, "st_atime": mtime,
                "st_ctime": mtime, "st_nlink": 2 if stat.S_ISDIR(mode) else 1,
                "st_uid": self.uid, "st_gid": self.gid}

    def _remote_holders(self, path: str, own: Iterable[str] = ()
                        ) -> Optional[List[Tuple[Branch, Dict[str, Any]]]]:
        """The remote branches holding `path` by the copy, in branch order
        (None while the copy lacks its directory; `own`: see ns.holders)."""
        ns = self.namespace
        assert ns is not None
        if path == "/":
            root = ("", 0, 0.0, stat.S_IFDIR | 0o755)
            return [(b, self._copy_attrs(root)) for b in self.branches if not b.local]
        found = ns.holders(path, own)
        if found is None:
            return None
        by_node = {h[0]: h for h in found}
        return [(b, self._copy_attrs(by_node[b.node])) for b in self.branches
                if not b.local and b.node in by_node]

    def _view_from_copy(self, path: str, every: bool) -> Optional[View]:
        """The merged view with the copy's remote holders; None while the
        copy lacks the directory (the caller asks every branch). A miss is
        asked again when the copy changed meanwhile: the kernel keeps a miss,
        and the change's dropping of it may have come before the miss was
        in the kernel's tables (a lookup on its way is not among them)."""
        ns = self.namespace
        assert ns is not None
        before = ns.version
        try:
            return self._copy_view(path, every)
        except OSError as e:
            if e.errno != errno.ENOENT or ns.version == before:
                raise
        return self._copy_view(path, every)

    def _copy_view(self, path: str, every: bool) -> Optional[View]:
        holders: List[Tuple[Branch, Dict[str, Any]]] = []
        failure = None
        for b in self.branches:
            if not b.local:
                continue
            try:
                a = b.getattr(path)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue
                failure = failure or e
                self._note(b, e)
                continue
            holders.append((b, a))
            if not every and stat.S_ISDIR(a["st_mode"]):
                return View(path, holders)
        remote = self._remote_holders(path)
        if remote is None:
            return None
        holders.extend(remote)
        if not holders:
            raise failure if failure is not None else _e(errno.ENOENT)
        return self._classified(path, holders)

    def _copy_names(self, path: str) -> Optional[List[str]]:
        """Names the copy lists in directory `path` that a remote branch
        holds (None while the copy lacks it)."""
        ns = self.namespace
        assert ns is not None
        listing = ns.listing(path.strip("/"))
        if listing is None:
            return None
        remote = {b.node for b in self.branches if not b.local}
        return [n for n, hs in listing.items() if any(h[0] in remote for h in hs)]

    def _copy_plus_attrs(self, path: str, names: Iterable[str]) -> Dict[str, Dict[str, Any]]:
        """readdirplus attributes of names only remote branches hold: the
        first holder's in branch order, as a lookup would find them."""
        ns = self.namespace
        assert ns is not None
        listing = ns.listing(path.strip("/")) or {}
        order = {b.node: i for i, b in enumerate(self.branches) if not b.local}
        out = {}
        for n in names:
            hs = [h for h in listing.get(n, ()) if h[0] in order]
            if hs:
                out[n] = self._copy_attrs(min(hs, key=lambda h: order[h[0]]))
        return out

    def _settle(self, paths: Iterable[str], branches: Iterable[Branch]) -> None:
        """After a change through this mount: what each remote branch it
        touched holds now under `paths`, asked of that branch alone, goes
        into the copy (one request to a holder that was just changed)."""
        ns = self.namespace
        if ns is None:
            return
        for b in branches:
            if b.local:
                continue
            for p in paths:
                try:
                    a = b.getattr(p)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                        self._note(b, e)
                        continue
                    ns.set_holders(p, b.node, None)
                    continue
                ns.set_holders(p, b.node, (b.node, int(a.get("st_size", 0)),
                                           float(a.get("st_mtime", 0)), int(a["st_mode"])))

    def _dropped(self, path: str, branches: Iterable[Branch], tree: bool = False) -> None:
        """`path` was removed from these branches (`tree`: a directory, whose
        listings below are fetched again at the next look)."""
        ns = self.namespace
        if ns is None:
            return
        for b in branches:
            if not b.local:
                ns.set_holders(path, b.node, None)
        if tree:
            ns.forget_under([path])

    def fresh_holders(self, path: str) -> List[Tuple[str, int, float, int]]:
        """Every holder of `path` (node, size, mtime, mode), the remote ones
        asked (only those the copy names; every one while the copy lacks the
        directory): what the change feed tells the head. ENOENT when none
        holds it."""
        ns = self.namespace
        # a name below a directory only this mount held (a tree it removed)
        # is nobody else's: not a listing to fetch nor every peer to ask. Only
        # here: a lookup answered so would leave its directory unwatched
        own = frozenset(b.node for b in self.branches if b.local)
        remote_held = None if ns is None else self._remote_holders(path, own)
        held = remote_held is not None
        out = []
        for b in self.branches:
            if not b.local and held:
                continue
            try:
                a = b.getattr(path)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue
                raise
            out.append((b.node, int(a.get("st_size", 0)), float(a.get("st_mtime", 0)),
                        int(a["st_mode"])))
        if remote_held and ns is not None:
            remote = [b for b, _ in remote_held]
            self._settle([path], remote)
            d, name = split(path)
            mine = {b.node for b in remote}
            out.extend(h for h in (ns.listing(d) or {}).get(name, ()) if h[0] in mine)
        if not out:
            raise _e(errno.ENOENT)
        return out
