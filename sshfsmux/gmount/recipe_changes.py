"""GMount's head side of make's recipes: write-on-exit and the order of changes.

When a recipe ends, the mount of the host that ran it describes its files
for the catalog, with what its change feed holds (a failed recipe's files
are described by nobody: every mount drops them); the nodes holding those
directories hear the change, and make hears the recipe ended once the mount
on the head's host (where make runs) took it. Before a recipe starts, its
node's copy holds every change the head has sent (settle); as a make
starts, every mount's change feed reaches the catalog (sync). A mixin of GMountService (service.py).

Head side.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from gxpstyle.api.head_api import JobCalls, NodeCall
from gxpstyle.api.interfaces import STAGE_MIN_BYTES
from gxpstyle.api.services import after
from gxpstyle.protocol.wire import HEAD
from sshfsmux.gmount import file_records

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI
    from gxpstyle.api.interfaces import ReplicaAPI
    from sshfsmux.gmount.namespace_feed import NamespaceFeed
    from sshfsmux.gmount.service import Mount


# seconds a recipe's node waits for its mount's answer before it goes on
# without it (a mount that hangs must not hold make: the head then asks as
# it did before, within its own bound, replicas/service.py)
NODE_CALL_WAIT = 30.0


@dataclass
class RecipeCalls(JobCalls):
    """What a recipe's node asks the mount on its host (the mount's service is
    the node's own child): `ready` before the recipe starts (the mount has
    taken every change and listing the head sent before the recipe's exec:
    they came down the same links first; only when something sent is not
    answered yet, or inputs are to be pinned: settle decides), `changed`
    as it ends (its files described, with the change feed, for the
    catalog: the answer comes up with the end, so the head makes no call
    of its own). The inputs other hosts hold stay in the replica store
    from `ready` to `changed` (the head's own pin calls otherwise)."""
    mount: Any = None
    nid: str = ""
    sid: str = ""
    rels: List[str] = field(default_factory=list)
    pins: List[str] = field(default_factory=list)     # inputs other hosts hold
    taken: bool = False       # the `changed` answer came, and the catalog took it


class RecipeChanges:
    if TYPE_CHECKING:       # what GMountService supplies (for type checkers only)
        head: HeadAPI
        catalog: ReplicaAPI
        feed: NamespaceFeed
        mounts: Dict[str, Mount]
        _changes: List[Any]
        _by_host: Optional[Dict[str, List[Tuple[Mount, str, str]]]]
        _recipes: int

        def _mount_of(self, path: str) -> Optional[Mount]: ...
        def _name(self, nid: str) -> str: ...
        def _take_copies(self, m: Mount, items: Any) -> List[str]: ...

    def files_changed(self, node: str, paths: List[str], done: Callable[[], None],
                      complete: bool = True, calls: Optional[JobCalls] = None) -> None:
        """Write-on-exit: every live mount drops its kernel caches for `paths`
        and the mount of the host that ran the recipe (it holds what the
        recipe wrote: creates land in the local export) describes them for
        the catalog, with what its change feed holds (not `complete`: a
        failed recipe's files: every mount drops them, none describes them,
        the host's change feed still comes); done() once every mount has
        answered (or is lost) and the head host's mount took the changes.
        The recipes that end in one loop round share one `changed` call per
        mount service (two where some of them ran on its host); the host's
        mount is not called when the recipe's node called it (`calls`)."""
        if not self._changes:
            self.head.at_end(self._send_changes)
        taken = calls.sid if isinstance(calls, RecipeCalls) and calls.taken else None
        self._changes.append((node, paths, done, complete, taken))

    def _send_changes(self) -> None:
        batch, self._changes = self._changes, []
        # (mountpoint, service id) -> [described rels, other rels], each in order, once
        calls: Dict[Any, List[Dict[str, None]]] = {}
        waiting: List[Callable[[], None]] = []
        feeds: Set[Any] = set()       # (mountpoint, nid, sid): failed recipes' hosts
        barrier = False               # some recipe waits only for the head's mount
        for node, paths, done, complete, taken in batch:
            writer = self.head.node(node)
            host = writer.hostname if writer is not None else None
            if not complete:
                # the host's feed comes; every mount drops the files
                feeds.update(self._services_on(host, paths))
                host = None
            touched = False
            for p in paths:
                p = os.path.normpath(p)
                m = self._mount_of(p)
                if m is None:
                    continue
                rel = os.path.relpath(p, m.mountpoint)
                # only the holder, when there is one and others: it describes
                # them and the namespace feed tells the nodes holding the
                # directory, if anything changed; the others hold nothing of
                # it (namespace_copy.py). A failed recipe's files are
                # described by nobody: every mount drops them.
                only_holder = host is not None and len(m.services) > 1
                for nid, sid in ([(nid, sid) for _m, nid, sid in self._on_host(host, [m])]
                                 if only_holder else list(m.services.items())):
                    there = self.head.node(nid)
                    if not self.head.is_up(sid) or there is None:
                        continue
                    if sid == taken:      # its node called it as the recipe ended
                        touched = barrier = True
                        continue
                    holder = there.hostname == host
                    touched = True
                    lists = calls.setdefault((m.mountpoint, nid, sid), [{}, {}])
                    lists[0 if holder else 1][rel] = None
            if touched:
                waiting.append(done)
            else:
                done()
        pending: Set[Any] = set()

        def acted(key: Any) -> None:
            pending.discard(key)
            if not pending:
                for done in waiting:
                    done()

        sends = []
        if barrier:
            pending.add("head")
        for (mp, nid, sid), (described, others) in calls.items():
            for holder, rels in ((True, list(described)), (False, [r for r in others if r not in described])):
                if rels:
                    pending.add((sid, holder))
                    sends.append((self.mounts[mp], nid, sid, rels, holder))
        for mount, nid, sid, rels, holder in sends:
            feed = not holder and (mount.mountpoint, nid, sid) in feeds

            def answered(ok: bool, error: str, result: Dict[str, Any], m: Mount = mount,
                         nid: str = nid, sid: str = sid, rels: List[str] = rels,
                         holder: bool = holder) -> None:
                self.feed.report_taken(sid, result.get("seq") if ok else None)
                self._changed_answer(m, nid, rels, holder, ok, error, result,
                                     lambda: acted((sid, holder)))
            self.head.call_role(sid, "changed", {"paths": rels, "describe": holder, "feed": feed},
                                answered)
        if barrier:
            self.feed.node_barrier(self._sids_on_head(), lambda: acted("head"))

    def _changed_answer(self, m: Mount, nid: str, rels: List[str], holder: bool, ok: bool,
                        error: str, result: Dict[str, Any], acted: Callable[[], None]) -> None:
        if not ok:
            self.head.log("gmount: %s: changed files: %s" % (self._name(nid), error))
            acted()
            return
        changed = self._record(m, nid, rels, result.get("files") or []) if holder else []
        # and what the recipe changed besides its targets (automake's
        # .deps/*.Po renamed into place), from that node's change feed
        changed += self._take_copies(m, result.get("copies"))
        # the nodes holding these directories hear it; make (on the head's
        # host) hears the recipe ended once the mount there took it, and a
        # recipe starts once its own node's did (settle)
        self.feed.touched(m.mountpoint, changed)
        self.feed.node_barrier(self._sids_on_head(), acted)

    def _on_host(self, host: Optional[str], mounts: Iterable[Mount]) -> List[Tuple[Mount, str, str]]:
        """(mount, node id, service id) of each of `mounts` served on `host`
        (one service a host), live or not. From an index by host, made again
        when a mount or a service comes or goes (_hosts_changed): asked
        for every recipe, it cost a look at every node (O(N) a recipe)."""
        if self._by_host is None:
            self._by_host = {}
            for m in self.mounts.values():
                for nid, sid in m.services.items():
                    there = self.head.node(nid)
                    if there is not None:
                        self._by_host.setdefault(there.hostname, []).append((m, nid, sid))
        if not host:
            return []
        wanted = set(id(m) for m in mounts)
        return [found for found in self._by_host.get(host, ()) if id(found[0]) in wanted]

    def _hosts_changed(self) -> None:
        self._by_host = None

    def _sids_on_head(self) -> List[str]:
        """The mount services on the head's host, where make runs."""
        info = self.head.node(HEAD)
        host = info.hostname if info is not None else None
        return [sid for _m, _nid, sid in self._on_host(host, self.mounts.values())]

    def _services_on(self, host: Optional[str], paths: List[str]) -> List[Any]:
        """(mountpoint, node id, service id) of each live mount holding one of
        `paths` served on `host`."""
        found = [self._mount_of(os.path.normpath(p)) for p in paths]
        return [(m.mountpoint, nid, sid) for m, nid, sid in
                self._on_host(host, [m for m in found if m is not None]) if self.head.is_up(sid)]

    def _record(self, m: Mount, nid: str, rels: List[str], files: List[Any]) -> List[str]:
        """The catalog takes what node `nid`'s export holds of `rels` (the
        recipe's files, its inputs too); returns those whose entry changed,
        or that the export now holds where its replica store held a copy.
        What the recipe wrote through the mount comes in the node's change
        feed as well (_take_copies: every name written, a rewrite within one
        timestamp tick included); an input it only read is not announced:
        every node would drop its replicas of it (gmount/replica_trust.py),
        and each recipe read a pushed input again from its holder."""
        before = {rel: self.catalog.entry(os.path.join(m.mountpoint, rel)) for rel in rels}
        seen, unstored = set(), set()
        for f in file_records.parse(file_records.DescribedFile, files):
            seen.add(f.rel)
            if (nid, f.rel) in m.adopted:            # the export's own file now
                m.adopted.discard((nid, f.rel))
                unstored.add(f.rel)
            self.catalog.add(os.path.join(m.mountpoint, f.rel), nid, f.size, f.mtime, f.sha256,
                             f.mode)
        for rel in rels:
            # not a file here (removed, or a directory), unless a copy was
            # put in its replica store (an unlink through a mount removes
            # the name everywhere: _watch)
            if rel not in seen and (nid, rel) not in m.adopted:
                self.catalog.remove(os.path.join(m.mountpoint, rel), nid)
        # holders in any order (one added again goes last)
        return [rel for rel in rels
                if rel in unstored or sorted(self.catalog.entry(os.path.join(m.mountpoint, rel))
                                             or ()) != sorted(before.get(rel) or ())]

    def job_calls(self, node: str, paths: List[str], cwd: Optional[str]) -> Optional[JobCalls]:
        """A recipe on `node` whose files lie in the session's one mount, whose
        service on the host is the node's own child: the node asks it
        itself (RecipeCalls); None otherwise (the head asks, as settle and
        files_changed do without calls)."""
        if len(self.mounts) != 1:
            return None
        m = next(iter(self.mounts.values()))
        sid = m.services.get(node)
        if sid is None or not self.head.is_up(sid):
            return None
        host = self._host_of(node)
        rels, pins = [], []
        for p in paths:
            p = os.path.normpath(p)
            if self._mount_of(p) is m:
                rel = os.path.relpath(p, m.mountpoint)
                rels.append(rel)
                # what make's planner copies here (STAGE_MIN_BYTES and up) stays
                # in the replica store until the recipe ends
                reps = self.catalog.replicas(p)
                if any(self._host_of(n) != host and r[0] >= STAGE_MIN_BYTES
                       for n, r in reps.items()):
                    pins.append(rel)
        # the recipe's key: its mount holds its change feed from `ready` to
        # the `changed` of the same key (either may not come: node_calls.py)
        self._recipes += 1
        key = "%s/%d" % (node, self._recipes)
        args: Dict[str, Any] = {"paths": rels, "describe": True, "feed": False, "writer": True,
                                "job": key}
        if pins:
            args["unpin"] = pins
        # a recipe that changed nothing through the mount (its generation
        # file reads the same at the end) needs no description; with pins
        # the call unpins them
        unless = "" if pins else str(m.infos.get(sid, {}).get("generation") or "")
        calls = RecipeCalls(after=NodeCall(sid, "changed", args, NODE_CALL_WAIT, unless),
                            mount=m, nid=node, sid=sid, rels=rels, pins=pins)
        calls.after_answered = lambda status, ok, error, result: self._ended(
            calls, status, ok, error, result)
        return calls

    def _ended(self, calls: RecipeCalls, status: int, ok: bool, error: str,
               result: Dict[str, Any]) -> None:
        """The recipe's node called its mount as the recipe ended: the catalog
        takes what it describes (a success's files) and its change feed, and
        the nodes holding those directories hear it (files_changed then
        waits only for the head's mount)."""
        m = calls.mount
        if not ok or self.mounts.get(m.mountpoint) is not m:
            if ok is False:
                self.head.log("gmount: %s: changed files at the recipe's end: %s"
                              % (self._name(calls.nid), error))
            return
        if result.get("unchanged"):     # nothing changed through its mount (node_calls.py)
            calls.taken = True
            return
        changed = self._record(m, calls.nid, calls.rels, result.get("files") or []) \
            if status == 0 else []
        changed += self._take_copies(m, result.get("copies"))
        self.feed.report_taken(calls.sid, result.get("seq"))
        self.feed.touched(m.mountpoint, changed)
        calls.taken = True

    def settle(self, node: str, done: Callable[[], None], cwd: Optional[str] = None,
               calls: Optional[JobCalls] = None) -> None:
        """A recipe is about to start on `node`: done() once the mount on its
        host has taken every change the head has sent it (namespace_feed)
        and holds the listings of `cwd` and the directories above it (the
        node's agent enters cwd for the job, and its own look into a
        directory the copy lacks would ask every peer); the other nodes'
        answers are not waited for. With our `calls`, done() as soon as all
        of that is sent: the recipe's exec follows it down the same links,
        and its node asks the mount (`ready`) before the recipe starts."""
        here = self._on_host(self._host_of(node), self.mounts.values())
        inside = self._mount_of(os.path.normpath(cwd)) if cwd else None
        prefetch = [(m, sid) for m, _nid, sid in here if m is inside and self.head.is_up(sid)]
        at_node = isinstance(calls, RecipeCalls)
        one = after(1 + len(prefetch), done) if not at_node else (lambda: None)
        for m, sid in prefetch:
            rel = os.path.relpath(os.path.normpath(str(cwd)), m.mountpoint)
            parts = rel.split("/")
            keys = [""] + ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
            self.feed.prefetch(m.mountpoint, sid, keys, one)
        if not at_node:
            self.feed.node_barrier([sid for _m, _nid, sid in here], one)
            return
        assert isinstance(calls, RecipeCalls)
        unanswered = False
        for _m, _nid, sid in here:
            unanswered = self.feed.send_now(sid) or unanswered
        # the mount hears a recipe starts (its change feed waits for the
        # recipe's end); the node waits for its answer only when something
        # sent is on its way, or inputs are to be pinned
        wait = unanswered or bool(calls.pins)
        key = calls.after.args["job"] if calls.after is not None else True
        calls.before = NodeCall(calls.sid, "ready", {"pin": calls.pins, "job": key,
                                                     "notice": not wait},
                                NODE_CALL_WAIT if wait else 0.0)
        done()

    def _host_of(self, nid: str) -> Optional[str]:
        info = self.head.node(nid)
        return info.hostname if info is not None else None

    def sync(self, done: Callable[[], None]) -> None:
        """Every live mount sends what its change feed holds, the catalog takes
        it and the nodes holding those directories hear it; done() then."""
        calls = [(m, nid, sid) for m in self.mounts.values() for nid, sid in m.services.items()
                 if self.head.is_up(sid)]
        one = after(len(calls), done)
        for m, nid, sid in calls:
            def answered(ok: bool, error: str, result: Dict[str, Any], m: Mount = m,
                         nid: str = nid, sid: str = sid) -> None:
                if not ok:
                    self.head.log("gmount: %s: sync: %s" % (self._name(nid), error))
                    one()
                    return
                changed = self._take_copies(m, result.get("copies"))
                self.feed.report_taken(sid, result.get("seq"))
                self.feed.touched(m.mountpoint, changed, one)
            self.head.call_role(sid, "changed", {"paths": [], "describe": False, "feed": True},
                                answered)
