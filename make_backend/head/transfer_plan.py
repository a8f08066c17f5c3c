"""Planned transfers of a recipe's inputs, before it runs on its node.

Every recipe names its inputs (recipe_files.py), so once placement has picked
node N the head knows which of them N lacks (the replica catalog: holders and
sizes) and copies them there before the recipe starts, instead of letting the
recipe pull them through the mount while it runs (Confuga's push and pull);
inputs under STAGE_MIN_BYTES (64 KiB) are left to the mount:

- at or above the pull threshold, a push: the head starts one transfer of the
  file from its holders to every node that needs it then (requests for one
  file arriving within BATCH_DELAY go together), along the explored tree
  (gxpstyle/bcast/service.py, the engine of `gxpc bcast`);
- below it, a pull: a transfer to N alone, started at once, whose sources are
  the holders in a random order (the first that answers feeds it, the next ones
  take over if it fails); `fixed` order (by node id) is there to measure what
  random buys.

The copy is written, verified (SHA-256 per chunk and whole) and renamed into
the replica store of the mount on N's host (ReplicaAPI.replica_dir), then adopted
as the replica the mount reads that file from (ReplicaAPI.adopt): reading it on
N is local. Then the catalog records N's host as a holder, and only then does
the recipe start. A transfer that fails leaves the recipe to read through the
mount, as it would without planning.

A node takes part as a target in at most `slots` transfers at once (default
1); the others wait in order. A file of one chunk or less costs round trips,
not bandwidth: its transfer takes no slot, and up to SMALL_AT_ONCE of them run
at once on a node, so a merge's many small inputs come together, not one
after another (issue 28: 15 pulls of 36 bytes across a 100 ms WAN took 5 to 9
s one at a time). Options come per make (per client): the
threshold, the slots, the pull order and the trace (transfer_trace.py).

Head-only.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from gxpstyle.api.interfaces import STAGE_MIN_BYTES, BcastAPI, ReplicaAPI, Transfer
from gxpstyle.protocol import wire
from make_backend.head.transfer_trace import TraceFile

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

INF = 1 << 62                      # `inf` on the wire: pull everything
# benchmarks/transfers.py --workflows on 8 hosts at 100 Mbit/s: a push was as
# fast as a pull or faster for every size tried (512 KiB to 48 MiB; it goes
# along the tree once for all the nodes needing a file, from the least busy
# holder); under ~1 MiB a transfer costs its fixed latency (open, plan, adopt)
# either way, and pulls spread over random holders without the head ordering them.
DEFAULT_PULL_THRESHOLD = 1 << 20
BATCH_DELAY = 0.05                 # seconds a push waits for more nodes needing its file
MAX_SOURCES = 2                    # holders a transfer opens (each hashes the whole file)
SMALL = wire.CHUNK                 # a transfer of one chunk: latency, not bandwidth
SMALL_AT_ONCE = 16                 # small transfers one node receives at once

Key = Tuple[str, int]              # (client, job)


@dataclass
class Options:
    pull_threshold: int = DEFAULT_PULL_THRESHOLD
    slots: int = 1
    pull_order: str = "random"     # or "fixed"
    trace: Optional[TraceFile] = None
    wan_before: Dict[str, List[int]] = field(default_factory=dict)   # HeadAPI.wan_bytes at start


@dataclass
class Need:
    """One file one node lacks, for one or more recipes waiting there."""
    node: str
    path: str
    size: int
    mtime: float
    push: bool
    order: str
    waiters: List[Stage] = field(default_factory=list)
    running: bool = False
    started: float = 0.0


@dataclass
class Stage:
    """A recipe held until its inputs are on its node."""
    key: Key
    node: str
    pending: int
    start: Callable[[], None]
    cancelled: bool = False


class TransferPlanner:
    def __init__(self, head: HeadAPI, replicas: ReplicaAPI, bcast: BcastAPI,
                 rng: Optional[random.Random] = None) -> None:
        self.head = head
        self.replicas = replicas
        self.bcast = bcast
        self.rng = rng or random.Random()
        self.options: Dict[str, Options] = {}          # client -> its make's options
        self.needs: Dict[Tuple[str, str], Need] = {}   # (node, path) -> queued or running
        self.queue: List[Need] = []
        self.busy: Dict[str, int] = {}                 # node -> transfers it receives now
        self.busy_small: Dict[str, int] = {}           # node -> small ones of those
        self.feeding: Dict[str, int] = {}              # node -> transfers it is the first source of
        self.pushing: Dict[str, Tuple[Transfer, Dict[str, Need]]] = {}   # path -> its running push
        self.stages: Dict[Key, Stage] = {}
        self.pinned: Dict[Key, Tuple[str, List[str]]] = {}   # recipe -> (node, inputs) pinned there
        self.seq = 0
        self._armed = False
        self.moved = {"push": 0, "pull": 0}            # bytes delivered

    # -- per make ----------------------------------------------------------------
    def configure(self, client: str, args: Dict[str, Any]) -> None:
        old = self.options.pop(client, None)
        if old is not None and old.trace is not None:
            old.trace.close()
        o = Options()
        if args.get("pull_threshold") is not None:
            o.pull_threshold = int(args["pull_threshold"])
        if args.get("transfer_slots"):
            o.slots = int(args["transfer_slots"])
        if args.get("pull_order") in ("random", "fixed"):
            o.pull_order = str(args["pull_order"])
        if args.get("trace"):
            o.trace = TraceFile(str(args["trace"]))    # OSError: the caller says so
            o.wan_before = self.head.wan_bytes()
        self.options[client] = o

    def client_closed(self, client: str) -> List[Key]:
        """Its held recipes will never start; returns them."""
        o = self.options.pop(client, None)
        if o is not None and o.trace is not None:
            now = self.head.wan_bytes()
            if now:
                # what crossed between sites while the make ran
                was = o.wan_before
                o.trace.wan({s: [i - was.get(s, [0, 0])[0], out - was.get(s, [0, 0])[1]]
                             for s, (i, out) in now.items()}, time.time())
            o.trace.close()
        keys = [k for k in self.stages if k[0] == client]
        for key in keys:
            self.stages.pop(key).cancelled = True
        for key in [k for k in self.pinned if k[0] == client]:
            self.release(key)
        return keys

    def trace(self, client: str) -> Optional[TraceFile]:
        o = self.options.get(client)
        return o.trace if o is not None else None

    # -- a recipe ----------------------------------------------------------------
    def stage(self, key: Key, node: str, paths: List[str], start: Callable[[], None],
              pin: bool = True) -> None:
        """Copy to `node` the inputs it lacks, then start(); at once if none.
        Not `pin`: the node pins the inputs itself (ReplicaAPI.job_calls)."""
        o = self.options.get(key[0]) or Options()
        st = Stage(key, node, 1 if pin else 0, start)     # 1: the pin of its inputs, below
        host = self._host(node)
        for p in dict.fromkeys(paths):
            need = self.needs.get((node, p))
            if need is None:
                need = self._need(node, host, p, o)
                if need is None:
                    continue
                self.needs[(node, p)] = need
                self.queue.append(need)
            need.waiters.append(st)
            st.pending += 1
        self.stages[key] = st
        if st.pending > (1 if pin else 0):
            self._arm()
        if not pin:
            if st.pending == 0:
                self._ready(st, 0)
            return
        # Its inputs' replicas on the node stay until it ends (release): the
        # store evicts others first. It starts once the pin holds.
        self.pinned[key] = (node, list(dict.fromkeys(paths)))
        self.replicas.pin(node, self.pinned[key][1], True, lambda: self._ready(st))

    def _ready(self, st: Stage, done: int = 1) -> None:
        st.pending -= done
        if st.pending == 0 and not st.cancelled:
            self.stages.pop(st.key, None)
            st.start()

    def release(self, key: Key) -> None:
        """The recipe ended (or will never start): its inputs' pins go."""
        pinned = self.pinned.pop(key, None)
        if pinned is not None:
            self.replicas.pin(pinned[0], pinned[1], False, lambda: None)

    def _need(self, node: str, host: str, path: str, o: Options) -> Optional[Need]:
        reps = self.replicas.replicas(path)
        up = {n: r for n, r in reps.items() if self.head.is_up(n)}
        if not up or any(self._host(n) == host for n in up):
            return None                 # nobody has it (an output to come), or here already
        if self.replicas.replica_dir(node, path) is None:
            return None                 # not a file of a mount
        size, mtime, _ = max(up.values(), key=lambda r: r[0])
        if size < STAGE_MIN_BYTES:
            return None                 # read through the mount (STAGE_MIN_BYTES)
        return Need(node, path, size, mtime, push=size >= o.pull_threshold, order=o.pull_order)

    # -- the queue ---------------------------------------------------------------
    def _arm(self) -> None:
        if self._armed:
            return
        self._armed = True

        def fire() -> None:
            self._armed = False
            self._pump()
        # only a push gathers the nodes needing its file; a pull goes at once
        # (it waited BATCH_DELAY for nothing: the check's tests of a real
        # project, each pulling the program they run, 50 ms each)
        wait = BATCH_DELAY if any(n.push and not n.running for n in self.queue) else 0.0
        self.head.call_later(wait, fire)

    def _slots(self, need: Need) -> int:
        best = 1
        for st in need.waiters:
            o = self.options.get(st.key[0])
            if o is not None:
                best = max(best, o.slots)
        return best

    def _free(self, need: Need) -> bool:
        if need.size <= SMALL:
            return self.busy_small.get(need.node, 0) < SMALL_AT_ONCE
        return self.busy.get(need.node, 0) < self._slots(need)

    def _busy(self, need: Need, change: int) -> None:
        """need's transfer to its node started (+1) or ended (-1)."""
        books = self.busy_small if need.size <= SMALL else self.busy
        books[need.node] = max(0, books.get(need.node, 0) + change)

    def _pump(self) -> None:
        for need in list(self.queue):
            if need.running or not self._free(need):
                continue
            if not any(not w.cancelled for w in need.waiters):
                self._finish(need)      # every recipe that wanted it is gone
                continue
            if need.push and self._join(need):
                continue
            group = [need]
            if need.push:
                group += [n for n in self.queue if n is not need and not n.running and n.push
                          and n.path == need.path and n.node != need.node and self._free(n)]
            self._start(group)

    def _join(self, need: Need) -> bool:
        """A push of this file is under way: the node joins it (fed along the
        tree from what has already passed), rather than a second copy leaving
        the source."""
        running = self.pushing.get(need.path)
        if running is None:
            return False
        t, by_node = running
        d = self.replicas.replica_dir(need.node, need.path)
        self.seq += 1
        if d is None or not self.bcast.join(t, need.node, os.path.join(
                d, ".tmp-xfer-%d-{sha256}" % self.seq)):
            return False
        need.running, need.started = True, time.time()
        self._busy(need, +1)
        by_node[need.node] = need
        return True

    def _start(self, group: List[Need]) -> None:
        first = group[0]
        holders = [n for n in self.replicas.holders(first.path) if self.head.is_up(n)]
        if first.push:
            # the head plans: the holder feeding the fewest transfers first
            holders.sort(key=lambda n: (self.feeding.get(n, 0), _id_key(n)))
        elif first.order == "fixed":
            holders.sort(key=_id_key)
        else:
            self.rng.shuffle(holders)
        site = self.head.site_of(first.node)
        if site is not None:
            # a holder in the targets' site first: a file that crossed the WAN
            # once spreads inside the site (gxpstyle/head/sites.py)
            holders.sort(key=lambda n: self.head.site_of(n) != site)
        if not holders:
            for n in group:
                self._finish(n, "no holder is up")
            return
        dests: Dict[str, str] = {}
        now = time.time()
        for n in group:
            d = self.replicas.replica_dir(n.node, n.path)
            self.seq += 1
            dests[n.node] = os.path.join(d or "/nonexistent", ".tmp-xfer-%d-{sha256}" % self.seq)
            n.running, n.started = True, now
            self._busy(n, +1)
        by_node = {n.node: n for n in group}
        src = holders[0]
        self.feeding[src] = self.feeding.get(src, 0) + 1
        t = self.bcast.start(holders[:MAX_SOURCES], first.path, list(by_node), "/nonexistent",
                             lambda t: self._done(t, by_node, src), dests=dests)
        if first.push and t is not None and not t.finished:
            self.pushing[first.path] = (t, by_node)

    def _done(self, t: Transfer, by_node: Dict[str, Need], src: str) -> None:
        self.feeding[src] = max(0, self.feeding.get(src, 0) - 1)
        if self.pushing.get(t.path, (None,))[0] is t:
            del self.pushing[t.path]
        failed = t.failed()
        for node, need in by_node.items():
            self._busy(need, -1)
            why = t.error or failed.get(node, "")
            if why:
                self._finish(need, why)
                continue
            dest = t.dests.get(node, "")

            def adopted(ok: bool, error: str, holder: str, need: Need = need,
                        source: str = t.primary) -> None:
                if ok:
                    self.replicas.add(need.path, holder, need.size, need.mtime, None)
                    self.moved["push" if need.push else "pull"] += need.size
                    self._traced(need, source)
                self._finish(need, "" if ok else error)
            self.replicas.adopt(node, need.path, dest, t.primary, adopted)
        self._pump()

    def _traced(self, need: Need, source: str) -> None:
        seen = set()
        for st in need.waiters:
            tr = self.trace(st.key[0])
            if tr is not None and id(tr) not in seen:
                seen.add(id(tr))
                tr.transfer(self.head.name_of(need.node), need.path, need.size, need.started,
                            time.time(), "push" if need.push else "pull", self.head.name_of(source))

    def _finish(self, need: Need, error: str = "") -> None:
        if error:
            self.head.log("transfer of %s to %s: %s (the recipe reads it through the mount)"
                                % (need.path, self.head.name_of(need.node), error))
        self.needs.pop((need.node, need.path), None)
        if need in self.queue:
            self.queue.remove(need)
        for st in need.waiters:
            self._ready(st)
        if self.queue:
            self._arm()

    def node_lost(self, lost: str) -> None:
        """Queued transfers to a lost node are dropped and its recipes go on
        (to be reported lost); running ones end through the engine."""
        for need in [n for n in self.queue if not n.running and wire.is_descendant(n.node, lost)]:
            self._finish(need, "node lost")

    # -- helpers -----------------------------------------------------------------
    def _host(self, nid: str) -> str:
        n = self.head.node(nid)
        return n.hostname if n is not None else nid

    def stat(self) -> Dict[str, Any]:
        return {"transfers_queued": len(self.queue), "bytes_pushed": self.moved["push"],
                "bytes_pulled": self.moved["pull"]}


def _id_key(nid: str) -> List[int]:
    try:
        return [int(x) for x in nid.split(".")]
    except ValueError:
        return [1 << 30]
