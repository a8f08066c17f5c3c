"""GMount's head side of the nodes' namespace copies (sshfsmux/fs/namespace_copy.py).

A node's mount asks for a directory's listing the first time it looks into
it (a `dirs` message: the keys of the directories, "" for the root, "a/b"
below). The head answers from the replica catalog, every name with its
holders (node name, size, mtime, mode; copies in replica stores are not
exports and are left out), with a `listing` call, and from then on keeps
that node among the directory's subscribers: every change the catalog takes
under it (a mount's change feed, a recipe's outputs, a node lost) goes to
each subscriber as an `ns` call, the changes of one loop round in one call
per node, one call at a time per node (what changes meanwhile goes in its
next call, once the last is answered), numbered per node: a node that finds a number skipped drops its
copy and fetches the listings again (`GXP_TEST_NS_DROP=HOST:N` in the
daemon's environment skips the Nth call to HOST's mount, for tests). Before
every node's export is in the catalog (the scans after a mount), listings
wait.

Memory: a set of service ids per directory some node looked into.

Head side.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from gxpstyle.api.interfaces import ReplicaAPI
from gxpstyle.api.services import after

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

Entries = Dict[str, List[List[Any]]]     # name -> [[node name, size, mtime, mode], ...]
DROP_ENV = "GXP_TEST_NS_DROP"


def key_of(rel: str) -> Tuple[str, str]:
    """A path below the mountpoint ("a/b/c") as (directory key "a/b", name "c")."""
    d, name = os.path.split(rel.strip("/"))
    return d, name


class MountFeed:
    """One mount's subscriptions and the names changed since the last send."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self.by_dir: Dict[str, Set[str]] = {}       # key -> service ids holding a copy
        self.by_sid: Dict[str, Set[str]] = {}
        self.changed: Dict[str, Set[str]] = {}      # key -> names changed this round
        self.ready = False                          # every scan is in the catalog
        self.waiting: List[Tuple[str, List[str]]] = []   # (sid, keys) asked before ready

    def subscribe(self, sid: str, key: str) -> None:
        self.by_dir.setdefault(key, set()).add(sid)
        self.by_sid.setdefault(sid, set()).add(key)

    def drop(self, sid: str) -> None:
        for key in self.by_sid.pop(sid, set()):
            subs = self.by_dir.get(key)
            if subs is not None:
                subs.discard(sid)
                if not subs:
                    del self.by_dir[key]


class NamespaceFeed:
    """Listings for the nodes, and the changes to the directories they hold.
    `holders_of(mount, key)` gives the nodes (id -> name) whose exports
    count and the store copies to leave out, per mount (GMountService)."""

    def __init__(self, head: HeadAPI, catalog: ReplicaAPI,
                 exports: Callable[[str], Tuple[Dict[str, str], Set[Tuple[str, str]]]]) -> None:
        self.head = head
        self.catalog = catalog
        self.exports = exports
        self.mounts: Dict[str, MountFeed] = {}
        self.flush_armed = False
        self.directories_listed = 0
        # listings sent and not yet answered: sid -> key -> call, and
        # call -> who waits for it to be taken (a recipe about to start)
        self.listing_calls = 0
        self.listing_out: Dict[str, Dict[str, int]] = {}
        self.listing_done: Dict[int, List[Callable[[], None]]] = {}
        # each mount service's `ns` calls are numbered: a node that sees a
        # number skipped knows its copy missed changes (namespace_copy: gap)
        self.sent: Dict[str, int] = {}
        # the number of each one's last answered call: a node has one call at
        # a time (_may_call), so it has answered every call up to it
        self.acked: Dict[str, int] = {}
        # the number of each one's last change report the catalog took
        # (report_taken): sent with each call, so its mount knows which of
        # its own changes the entries sent may predate (change_feed.py)
        self.taken: Dict[str, int] = {}
        # names changed for a service while its last call is unanswered: they
        # go together in its next call, when that answer comes (a slow node
        # gets fewer, bigger calls instead of a queue of small ones)
        self.held: Dict[str, Dict[str, Dict[str, Set[str]]]] = {}   # sid -> mount -> key -> names
        # (sid, number, done): done() once sid answered every call up to number
        self.node_waiters: List[Tuple[str, int, Callable[[], None]]] = []
        # until _send (None: every mount service)
        self.node_waiting: List[Tuple[Optional[List[str]], Callable[[], None]]] = []
        # a fault for tests: HOST:N, the Nth `ns` call to HOST's mount is not sent
        host, _, nth = (os.environ.get(DROP_ENV) or "").partition(":")
        self.drop = (host, int(nth)) if nth.isdigit() else None

    def add_mount(self, mountpoint: str) -> MountFeed:
        feed = self.mounts[mountpoint] = MountFeed(mountpoint)
        return feed

    def forget_mount(self, mountpoint: str) -> None:
        self.mounts.pop(mountpoint, None)

    def service_gone(self, sid: str) -> None:
        for feed in self.mounts.values():
            feed.drop(sid)
        self.sent.pop(sid, None)
        self.held.pop(sid, None)
        self.listing_out.pop(sid, None)
        self.acked.pop(sid, None)
        self.taken.pop(sid, None)
        self._release_node(sid, None)       # nobody waits for a node that is gone

    # -- listings ------------------------------------------------------------------
    def entries(self, mountpoint: str, key: str, names: Any = None) -> Entries:
        """Directory `key`'s names (or only `names`) with their export holders."""
        nodes, stored = self.exports(mountpoint)
        base = os.path.join(mountpoint, key) if key else mountpoint
        if names is None:
            listed = self.catalog.listing(base)
        else:
            listed = {n: self.catalog.entry(os.path.join(base, n)) for n in names}
        out: Entries = {}
        rel_base = key + "/" if key else ""
        for name, holders in listed.items():
            found = [[nodes[n], s, m, md] for n, s, m, md in holders
                     if n in nodes and (n, rel_base + name) not in stored]
            if found or names is not None:      # a change to no holder: gone
                out[name] = found
        return out

    def asked(self, mountpoint: str, sid: str, keys: List[str]) -> None:
        """A node's mount asks for listings (a `dirs` message)."""
        feed = self.mounts.get(mountpoint)
        if feed is None:
            return
        if not feed.ready:
            feed.waiting.append((sid, keys))
            return
        self._list(mountpoint, feed, sid, keys)

    def prefetch(self, mountpoint: str, sid: str, keys: List[str],
                 done: Callable[[], None]) -> None:
        """Send a node's mount the listings of `keys` it does not hold yet
        (a recipe about to start in them); done() once it took them (at once
        if it holds them all, or before the scans are in: its own looks
        wait for the listings then)."""
        feed = self.mounts.get(mountpoint)
        if feed is None or not feed.ready:
            done()
            return
        held = feed.by_sid.get(sid, set())
        flying = self.listing_out.get(sid, {})
        on_way = {flying[k] for k in keys if k in held and k in flying}
        keys = [k for k in keys if k not in held]
        one = after(len(on_way) + (1 if keys else 0), done)
        for call in on_way:            # listings sent, not yet taken
            self.listing_done.setdefault(call, []).append(one)
        if keys:
            self._list(mountpoint, feed, sid, keys, one)

    def _list(self, mountpoint: str, feed: MountFeed, sid: str, keys: List[str],
              done: Optional[Callable[[], None]] = None) -> None:
        listings = {}
        self.listing_calls += 1
        call = self.listing_calls
        flying = self.listing_out.setdefault(sid, {})
        for key in keys:
            key = key.strip("/")
            feed.subscribe(sid, key)
            listings[key] = self.entries(mountpoint, key)
            flying[key] = call
        self.directories_listed += len(listings)
        self.listing_done[call] = [done] if done is not None else []

        def answered(ok: bool, error: str, result: Dict[str, Any]) -> None:
            if not ok:
                self.head.log("gmount: listing for %s: %s" % (sid, error))
            mine = self.listing_out.get(sid, {})
            for key in listings:
                if mine.get(key) == call:
                    del mine[key]
            for fn in self.listing_done.pop(call, []):
                fn()
        self.head.call_role(sid, "listing", {"dirs": listings}, answered)

    def scanned(self, mountpoint: str) -> None:
        """Every node's export is in the catalog: listings may go out."""
        feed = self.mounts.get(mountpoint)
        if feed is None or feed.ready:
            return
        feed.ready = True
        waiting, feed.waiting = feed.waiting, []
        for sid, keys in waiting:
            self.asked(mountpoint, sid, keys)

    # -- changes -------------------------------------------------------------------
    def report_taken(self, sid: str, seq: Any) -> None:
        """The catalog took change report number `seq` of mount service
        `sid` (a `changes` or `changed` answer's "seq"; ignored unless an
        int). Reports of one mount can come by different ways: the highest."""
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > self.taken.get(sid, 0):
            self.taken[sid] = seq

    def touched(self, mountpoint: str, rels: List[str],
                done: Callable[[], None] | None = None) -> None:
        """The catalog changed under these names (relative to the mountpoint):
        at the end of this loop round their subscribers hear it; done() once
        every mount service has taken it, and every change sent before."""
        feed = self.mounts.get(mountpoint)
        if feed is not None:
            for rel in rels:
                key, name = key_of(rel)
                if name and key in feed.by_dir:
                    feed.changed.setdefault(key, set()).add(name)
        self._arm()
        if done is not None:
            self.node_waiting.append((None, done))

    def _arm(self) -> None:
        if not self.flush_armed:
            self.flush_armed = True
            self.head.at_end(self._send)

    def node_barrier(self, sids: List[str], done: Callable[[], None]) -> None:
        """done() once these mount services have taken every change sent to
        them so far, those held for them, and those this loop round is about
        to send (a recipe about to start on their host: other nodes' answers
        are not waited for)."""
        if self.flush_armed:
            self.node_waiting.append((sids, done))
            return
        waits = []
        for sid in sids:
            self._flush(sid)
            due = self.sent.get(sid, 0) + (1 if self.held.get(sid) else 0)
            if self.acked.get(sid, 0) < due:
                waits.append((sid, due))
        if not waits:
            done()
            return
        one = after(len(waits), done)      # one counter for all of them
        self.node_waiters.extend((sid, n, one) for sid, n in waits)

    def send_now(self, sid: str) -> bool:
        """Every change for mount service `sid` goes out now, this loop
        round's too, even while a call of its own is unanswered (a job on
        its host is about to start, and its node asks the mount to take
        what came before: node_calls.py). True if some call to it (changes
        or listings) is unanswered then."""
        if self.flush_armed:
            self._send()
        held = self.held.pop(sid, None)
        if held:
            self._call(sid, held)
        return self.acked.get(sid, 0) < self.sent.get(sid, 0) or bool(self.listing_out.get(sid))

    def _acked(self, sid: str, seq: int) -> None:
        # answers come in order (the mount answers each after the kernel
        # work of those before it), but never count back
        self.acked[sid] = max(seq, self.acked.get(sid, 0))
        self._flush(sid)
        self._release_node(sid, seq)

    def _release_node(self, sid: str, upto: Optional[int]) -> None:
        """done() of every node barrier waiting for sid's answers up to `upto`
        (None: all of them)."""
        def due(w: Tuple[str, int, Callable[[], None]]) -> bool:
            return w[0] == sid and (upto is None or w[1] <= upto)
        ready = [w for w in self.node_waiters if due(w)]
        if ready:
            self.node_waiters = [w for w in self.node_waiters if not due(w)]
            for _sid, _n, done in ready:
                done()

    def _send(self) -> None:
        """This loop round's changes to each subscriber: now, or with its next
        call if its last one is unanswered."""
        self.flush_armed = False
        for mp, feed in self.mounts.items():
            changed, feed.changed = feed.changed, {}
            for key, names in changed.items():
                for sid in feed.by_dir.get(key, ()):
                    held = self.held.setdefault(sid, {}).setdefault(mp, {})
                    held.setdefault(key, set()).update(names)
        for sid in list(self.held):
            self._flush(sid)
        waiting, self.node_waiting = self.node_waiting, []
        for sids, done in waiting:
            self.node_barrier(list(self.sent) if sids is None else sids, done)

    def _may_call(self, sid: str) -> bool:
        return bool(self.held.get(sid)) and self.acked.get(sid, 0) >= self.sent.get(sid, 0)

    def _flush(self, sid: str) -> None:
        """sid's held changes in one call now, unless its last is unanswered."""
        if self._may_call(sid):
            self._call(sid, self.held.pop(sid))

    def _call(self, sid: str, changed: Dict[str, Dict[str, Set[str]]]) -> None:
        """One `ns` call: the catalog's entries now for the names changed."""
        dirs: Dict[str, Entries] = {}
        for mp, keys in changed.items():
            if mp in self.mounts:
                for key, names in keys.items():
                    dirs[key] = self.entries(mp, key, sorted(names))
        seq = self.sent[sid] = self.sent.get(sid, 0) + 1

        def answered(ok: bool, error: str, result: Dict[str, Any]) -> None:
            self._acked(sid, seq)
        if self.drop is not None and self.drop == (self._host(sid), seq):
            self.head.at_end(lambda: answered(True, "", {}))
            return
        self.head.call_role(sid, "ns", {"dirs": dirs, "seq": seq,
                                        "taken": self.taken.get(sid, 0)}, answered)

    def _host(self, sid: str) -> str:
        node = self.head.node(sid)
        return node.hostname if node is not None else ""
