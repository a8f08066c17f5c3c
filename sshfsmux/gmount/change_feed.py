"""A GMount node's change feed: names changed through the mount (and in its
export behind it) go to the head's replica catalog. The head keeps one
"changes" call waiting on the node; it is answered once something changed.
A mixin of GMountNode (node.py).

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import threading
import time

from sshfsmux.gmount.change_report import copies_of, export_signature, export_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    Reply = Callable[..., None]

# seconds of changes made through the mount sent as one answer: the first
# change after a quiet spell goes at once, a burst (tar, configure) then
# goes to the head and back to the other nodes in a few rounds instead of a
# round per change, well inside the interactive bound (README: 100 ms); a
# recipe's own changes go with its exit status (the "changed" call)
COALESCE = 0.02
# seconds a change waits while a recipe runs on this node (a `ready` said
# so): its end takes the feed's names with it to the head (the `changed`
# call), so they go out once, with make's order, instead of once at the
# first change and again at the end; a long recipe's changes still go out
RECIPE_HOLD = 1.0
CHANGES_PAGE = 5000     # paths an answer describes; the rest wait for the next call
MAX_PENDING = 100000    # paths kept between answers (more: the catalog misses some)
# reported names kept until the head's word shows it took them (more: the
# oldest go, and the head's word on them is taken as it comes)
MAX_UNSETTLED = 100000
# seconds a reported name stays unsettled at most: a report lost on its way
# (a link that broke) is never taken, and the head's word on the name must
# count again within the feed's bounds
UNSETTLED_MAX_AGE = 5.0


def page(paths: Set[str], room: int) -> Tuple[List[str], List[str]]:
    """Up to `room` of the mount paths ("/a/b"), in order, as rels ("a/b"),
    and the paths left for later."""
    every = sorted(paths, key=lambda p: p.lstrip("/"))
    taken = every[:max(0, room)]
    return [p.lstrip("/") for p in taken], every[len(taken):]


class ChangesWaiting:
    """Changes made through this mount (a write handle closed, an unlink, a
    rename), for the head's replica catalog: the head keeps one "changes"
    call waiting here, answered once something changed (after COALESCE
    seconds, so that a burst is one answer). FUSE threads add paths; the
    loop answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paths: Set[str] = set()
        # changed in this node's export behind the mount (inotify): reported
        # as this export's state alone, never as the merged view's, which
        # may not have heard yet of the change a peer made here
        self.local: Set[str] = set()
        self.reply: Optional[Reply] = None
        self.armed = False
        self.timer: Optional[int] = None
        self.last_flush = 0.0       # time.monotonic() of the last answer
        self.recipes: Set[str] = set()  # keys of recipes running here (ready .. changed), on the loop
        # names this mount changed and reported, by the number of the report
        # ("seq" of an answer), until the head says it took that report
        # ("taken" of its `ns` calls): what the head sends of them before
        # then is older than this mount's own change (_unsettled); oldest
        # first, each newer than the one before in number and time
        self.reported = 0
        self.unsettled: Dict[str, Tuple[int, float]] = {}   # path -> (seq, monotonic)
        # the export's file as this mount's own change left it, by rel: the
        # watch's late report of that same change (inotify) is its echo, not
        # news; reported, it was announced and every node dropped its
        # replicas of the file (a pushed 48 MiB reference streamed again).
        # Oldest first; kept UNSETTLED_MAX_AGE seconds, MAX_UNSETTLED at most
        self.own: Dict[str, Tuple[Tuple[int, ...], float]] = {}


class ChangeFeed:
    if TYPE_CHECKING:       # what GMountNode supplies (for type checkers only)
        node: Any
        fs: Any
        cfg: Any
        peer_work: Any
        changes_waiting: ChangesWaiting

        def in_loop(self, fn: Callable[..., None], *args: Any) -> None: ...

    def _take_pending(self) -> Tuple[List[str], int]:
        """The change feed's names not sent yet, taken out of it, and the
        number of the report that carries them."""
        w = self.changes_waiting
        with w.lock:
            paths, w.paths = w.paths, set()
        rels, rest = page(paths, CHANGES_PAGE)   # an answer's worth; the rest as before
        self._requeue([r.lstrip("/") for r in rest])
        return rels, self._numbered(rels)

    def _numbered(self, rels: List[str]) -> int:
        """The number of a new report of `rels`; they stay unsettled until
        the head says it took it."""
        w = self.changes_waiting
        with w.lock:
            now = time.monotonic()      # under the lock: numbers and times agree
            w.reported += 1
            for rel in rels:
                path = "/" + rel
                w.unsettled.pop(path, None)     # newest last: the oldest go first
                w.unsettled[path] = (w.reported, now)
            while len(w.unsettled) > MAX_UNSETTLED:
                del w.unsettled[next(iter(w.unsettled))]
            return w.reported

    def _unsettled(self, taken: Any) -> Set[str]:
        """The names whose catalog entry the head's word may not show yet:
        changed here and not reported, or in a report after `taken` (the
        last the head took before it wrote its word)."""
        w = self.changes_waiting
        upto = taken if isinstance(taken, int) and not isinstance(taken, bool) else 0
        with w.lock:
            old = time.monotonic() - UNSETTLED_MAX_AGE
            # settled ones are at the front (_numbered keeps the order)
            while w.unsettled:
                path = next(iter(w.unsettled))
                seq, when = w.unsettled[path]
                if seq > upto and when >= old:
                    break
                del w.unsettled[path]
            return set(w.unsettled) | w.paths

    def _requeue(self, rels: List[str]) -> None:      # any thread
        if not rels:
            return
        w = self.changes_waiting
        with w.lock:
            w.paths.update("/" + r for r in rels)
        self.node.loop.call_soon_threadsafe(self._arm)

    def changes(self, args: Dict[str, Any], reply: Reply) -> None:
        w = self.changes_waiting
        with w.lock:
            old, w.reply = w.reply, reply
        if old is not None:
            old(False, "superseded", {})
        self._arm()

    def _on_change(self, path: str) -> None:      # a FUSE thread
        self._note_own(path)
        self._note_changes(self.changes_waiting.paths, (path,))

    def _note_own(self, path: str) -> None:
        """Keep the export's state of `path` as this mount's change left it
        (nothing there: nothing kept), so that the watch's report of that
        change is known for its echo (_own_echoes)."""
        rel = path.lstrip("/")
        sig = export_signature(self.cfg.export, rel)
        w = self.changes_waiting
        with w.lock:
            w.own.pop(rel, None)
            if sig is not None:
                w.own[rel] = (sig, time.monotonic())
            old = time.monotonic() - UNSETTLED_MAX_AGE
            while w.own and (len(w.own) > MAX_UNSETTLED or next(iter(w.own.values()))[1] < old):
                del w.own[next(iter(w.own))]

    def _own_echoes(self, rels: List[str]) -> Dict[str, Tuple[int, ...]]:
        """rel -> the export's state this mount's own recent change left, of
        those of `rels` it changed."""
        w = self.changes_waiting
        with w.lock:
            return {rel: w.own[rel][0] for rel in rels if rel in w.own}

    def _on_export_changes(self, paths: List[str]) -> None:      # the watch's thread
        self._note_changes(self.changes_waiting.local, paths)

    def _note_changes(self, into: Set[str], paths: Any) -> None:
        w = self.changes_waiting
        with w.lock:
            for path in paths:
                if len(into) < MAX_PENDING:
                    into.add(path)
            # the loop arms the answer; once armed (or with no call of the
            # head's waiting) there is nothing to wake it for
            wake = not w.armed and w.reply is not None
        if wake:
            self.node.loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        w = self.changes_waiting
        with w.lock:
            if w.armed or w.reply is None or not (w.paths or w.local):
                return
            w.armed = True
        # the first change after a quiet spell goes at once; a burst waits
        # out COALESCE from the answer before it; while recipes run here,
        # their ends take the changes (RECIPE_HOLD)
        wait = COALESCE - (time.monotonic() - w.last_flush)
        if w.recipes:
            wait = max(wait, RECIPE_HOLD)
        w.timer = self.node.loop.call_later(max(0.0, wait), self._flush_changes)

    def recipe_started(self, key: str) -> None:       # the loop
        self.changes_waiting.recipes.add(key)

    def recipe_ended(self, key: str) -> None:         # the loop
        """A recipe here ended (its `changed` took the feed's names): once
        none runs, what waits goes out as it would have. A recipe whose
        `ready` never came (its node left it out: node_calls.py) held
        nothing."""
        w = self.changes_waiting
        w.recipes.discard(key)
        if w.recipes or not w.armed:
            return
        self.node.loop.cancel(w.timer)
        with w.lock:
            w.armed = False
        self._arm()

    def _flush_changes(self) -> None:
        w = self.changes_waiting
        with w.lock:
            w.armed = False
            w.timer = None
            w.last_flush = time.monotonic()
            reply, paths, local = w.reply, w.paths, w.local - w.paths
            if reply is None or not (paths or local):
                return
            w.reply, w.paths, w.local = None, set(), set()
        # an answer's worth of names; the rest go with the next answer
        rels, rest = page(paths, CHANGES_PAGE)
        own, rest_own = page(local, CHANGES_PAGE - len(rels))
        with w.lock:
            w.paths.update(rest)
            w.local.update(rest_own)
        seq = self._numbered(rels)
        echoes = self._own_echoes(own)

        def work() -> None:
            # a name in a directory this mount holds no copy of is answered
            # by asking every branch (the merged view does): waiting for a
            # listing nobody asked for kept such a change from the head for
            # good (a recipe's .deps/x.Po renamed into place on a host)
            copies, gone = copies_of(self.fs, rels)
            here, not_here = export_state(self.cfg.export, own, echoes)
            self.in_loop(reply, True, "", {"copies": copies, "gone": gone, "seq": seq,
                                           "here": here, "not_here": not_here})
        # the merged view may ask the holders: not on the node's loop
        self.peer_work.put(work)

