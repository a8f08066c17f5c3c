"""Elastic agent pools: batch agents the head submits while work waits for a
slot, and releases once they idle (`gxpc use slurm head 'job[[1-16]]'
--elastic 0-16 [--elastic-wait S] [--elastic-idle S]`).

The core owns agents, so the pools live here and know nothing of make. A
service says what it needs through one call, HeadAPI.demand(waiting_since,
busy): when each of its ready tasks began waiting for a slot, and the nodes
its work occupies. From that, per pool (one per elastic rule):

- grow: the tasks that have waited longer than the pool's wait threshold,
  less the slots its agents still in the queue will bring, ask for agents
  (one batch job each, the slots each brings guessed from the last one that
  came up), up to MAX agents in the queue, up or leaving. Pools are asked in
  the order of their rules. A submission that fails (sbatch refused, the job
  never connected back) holds that pool back for a while (doubling, from the
  wait threshold up to BACKOFF_MAX), so a broken rule does not flood the queue;
- cancel: once no task waits, the jobs still in the queue are cancelled (the
  parent that submitted them runs scancel/qdel: `unspawn`), but for those
  MIN still needs;
- release: an agent that no service has reported busy, and that runs no job
  of the job table, for the idle threshold is released down to MIN. It is
  marked `leaving` first (NodeView.state, `gxpc stat`): it is no longer up,
  so nothing places work on it (Shell.select_nodes and the planner take up
  nodes only), and every service is asked at that moment whether it still
  holds the node (Service.holds_node: the make service between placing a
  recipe and starting it); only then is it told to quit, and its batch job
  ends with it.

Every change is an event: a demand report, an agent up, failed or lost, and
the one timer armed for the soonest thing that waits (a task reaching the
wait threshold, an agent reaching the idle one, a backoff ending). Nothing
runs while nothing waits. Services hear each grow and release
(Service.pool_changed: make writes them to its --trace).

`GXP_TEST_ELASTIC_HOLD=SECONDS`, read when the daemon starts, holds each
release that long between the mark and the quit: a test-only window in
which a leaving agent is alive, idle and must get nothing.

Head-only.
"""
from __future__ import annotations

import bisect
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Sequence, Set, Tuple

from gxpstyle.api.services import Service
from gxpstyle.config import hostpattern, use_rules

if TYPE_CHECKING:
    from gxpstyle.head.service_host import TreeHost

# A job may wait in a batch queue for long: without the rule's own
# --timeout, a pool's job is given this long to connect back (the pool
# cancels it earlier once no task waits for it).
PENDING_TIMEOUT = 3600.0
BACKOFF_MAX = 300.0          # seconds a pool whose submissions fail waits at most


@dataclass
class Member:
    child: str               # node id
    name: str
    parent: str
    state: str = "pending"   # pending (in the queue), up, leaving
    since: float = 0.0       # pending: submitted; up: up or last seen busy
    busy: bool = False       # some service's last report says it works there
    cancelled: bool = False


@dataclass
class Pool:
    rule: use_rules.UseRule
    lo: int
    hi: int
    wait: float
    idle: float
    members: Dict[str, Member] = field(default_factory=dict)   # child id -> member
    slots: int = 1           # slots the last agent that came up offered
    failures: int = 0
    retry_at: float = 0.0
    error: str = ""
    keep_min: bool = False   # explored: MIN agents are kept up from then on
    names: Optional[List[str]] = None

    @property
    def label(self) -> str:
        return "%s %s %s" % (self.rule.channel, self.rule.src, self.rule.dst)

    def count(self, state: str) -> int:
        """Members in `state`; a queued job being cancelled counts for nothing."""
        return sum(1 for m in self.members.values() if m.state == state and not m.cancelled)

    def stat(self) -> Dict[str, Any]:
        return {"rule": self.label, "min": self.lo, "max": self.hi, "up": self.count("up"),
                "pending": self.count("pending"), "leaving": self.count("leaving"),
                "error": self.error}


SpawnDone = Callable[[str, bool, str], None]    # (name, ok, reason)
# (rule, name, timeout) -> (spawn request, child id, parent id); ValueError
# when no explored node may reach the name by the rule
SpawnAgent = Callable[[use_rules.UseRule, str, float], Tuple[int, str, str]]


class ElasticPools:
    """Every elastic rule's pool, and the demand services reported."""

    def __init__(self, host: TreeHost, spawn_agent: SpawnAgent,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.clock = clock         # time.monotonic, the clock of waiting_since
        self.spawn_agent = spawn_agent
        self.soon = False          # an evaluation is due at the end of this loop round
        self.pools: Dict[str, Pool] = {}       # label -> pool, in the order rules came
        self.waiting: Dict[str, List[float]] = {}     # service -> when its tasks began waiting
        self.busy: Dict[str, Set[str]] = {}           # service -> pool agents it works on
        self.spawns: Dict[int, Member] = {}           # spawn request -> member
        self.explore_done: Dict[str, SpawnDone] = {}  # child -> an explore waiting for it
        self.timer: Optional[int] = None
        self.hold = float(os.environ.get("GXP_TEST_ELASTIC_HOLD") or 0)

    # -- rules and explore --------------------------------------------------------
    def set_rule(self, rule: use_rules.UseRule) -> None:
        """An elastic rule (a newer one for the same SRC and DST replaces its settings)."""
        limits = use_rules.elastic_of(rule)
        if limits is None:
            return
        lo, hi, wait, idle = limits
        pool = Pool(rule, lo, hi, wait, idle)
        old = self.pools.get(pool.label)
        if old is not None:
            pool.members, pool.slots, pool.keep_min = old.members, old.slots, old.keep_min
        self.pools[pool.label] = pool
        self.evaluate()

    def pool_for(self, target: str) -> Optional[Pool]:
        """The pool whose rule names `target` (the last such rule wins, as for use rules)."""
        for pool in reversed(list(self.pools.values())):
            if hostpattern.matches(pool.rule.dst, target):
                return pool
        return None

    def explore(self, pool: Pool, timeout: float, done: SpawnDone) -> Tuple[int, str]:
        """`gxpc explore` of a pool's names: from now on it keeps MIN agents;
        starts those missing, done(name, ok, reason) for each. Returns how
        many, and why the others could not start ("" if none is missing)."""
        pool.keep_min = True
        started = 0
        while pool.count("up") + pool.count("pending") < pool.lo:
            m = self._submit(pool, float(pool.rule.options.get("timeout") or timeout))
            if m is None:
                return started, pool.error or "%s names no free agent" % pool.rule.dst
            self.explore_done[m.child] = done
            started += 1
        return started, ""

    def stat(self) -> List[Dict[str, Any]]:
        return [p.stat() for p in self.pools.values()]

    # -- demand -------------------------------------------------------------------
    def demand(self, service: str, waiting_since: Sequence[float], busy: Collection[str]) -> None:
        """What `service` needs now (HeadAPI.demand); replaces what it said before."""
        if not self.pools:
            return
        self.waiting[service] = sorted(waiting_since)
        now = self.clock()
        mine: Set[str] = set()
        for pool in self.pools.values():
            mine.update(c for c in pool.members if c in busy)
        self.busy[service] = mine
        for pool in self.pools.values():
            for m in pool.members.values():
                was, m.busy = m.busy, any(m.child in b for b in self.busy.values())
                if was and not m.busy:
                    m.since = now       # its idle time starts now
        self.evaluate()

    # -- the decisions --------------------------------------------------------------
    def evaluate(self) -> None:
        """Grow, cancel and release as the demand says now; arm the one timer
        for the soonest thing that waits."""
        now = self.clock()
        waiting = sorted(t for ts in self.waiting.values() for t in ts)
        covered = sum(p.slots * p.count("pending") for p in self.pools.values())
        soonest: List[float] = []
        for pool in list(self.pools.values()):
            covered += self._grow(pool, waiting, covered, now, soonest)
            if not waiting:
                self._cancel_unneeded(pool)
            self._release_idle(pool, now, soonest)
        self._arm(min(soonest) if soonest else None, now)

    def _grow(self, pool: Pool, waiting: List[float], covered: int, now: float,
              soonest: List[float]) -> int:
        """Submit what the late tasks need; the slots the new jobs will bring."""
        late = bisect.bisect_right(waiting, now - pool.wait)
        need = late - covered
        want = math.ceil(need / max(1, pool.slots)) if need > 0 else 0
        if pool.keep_min:
            want = max(want, pool.lo - pool.count("up") - pool.count("pending"))
        room = pool.hi - sum(1 for m in pool.members.values() if not m.cancelled)
        if late < len(waiting) and room > want:
            soonest.append(waiting[late] + pool.wait)   # the next task to become late
        if want <= 0 or room <= 0:
            return 0
        if now < pool.retry_at:
            soonest.append(pool.retry_at)
            return 0
        added = 0
        for _ in range(min(want, room)):
            if self._submit(pool, float(pool.rule.options.get("timeout") or PENDING_TIMEOUT)) is None:
                break
            added += pool.slots
        return added

    def _cancel_unneeded(self, pool: Pool) -> None:
        """No task waits: the jobs still in the queue go, but for those MIN needs."""
        keep = max(0, pool.lo - pool.count("up")) if pool.keep_min else 0
        pending = [m for m in pool.members.values() if m.state == "pending" and not m.cancelled]
        for m in sorted(pending, key=lambda m: m.since)[keep:]:
            m.cancelled = True
            self.host.unspawn(m.parent, m.child)
            self._event("cancel", pool, m.name)

    def _release_idle(self, pool: Pool, now: float, soonest: List[float]) -> None:
        """Release agents idle for the idle threshold, down to MIN; oldest idle first."""
        ups = [m for m in pool.members.values() if m.state == "up"]
        spare = len(ups) - pool.lo
        for m in sorted((m for m in ups if not m.busy), key=lambda m: m.since):
            if spare <= 0:
                return
            if now - m.since < pool.idle:
                soonest.append(m.since + pool.idle)
                return
            if self._held(m.child):
                m.since = now          # still used after all: idle from now at the earliest
                soonest.append(now + pool.idle)
                continue
            self._release(pool, m, now - m.since)
            spare -= 1

    def _held(self, nid: str) -> bool:
        """Some service still holds the node, or a job of the job table runs there."""
        for svc in self.host.services():
            try:
                if svc.holds_node(nid):
                    return True
            except Exception as e:   # a broken service must not lose the node its work is on
                self.host.log("%s.holds_node failed: %s" % (svc.name, e))
                return True
        return self.host.runs_jobs(nid)

    def _release(self, pool: Pool, m: Member, idle: float) -> None:
        m.state = "leaving"
        self.host.mark_leaving(m.child, "idle %.3gs, released by its elastic pool" % idle)
        self.host.log("elastic %s: releasing %s (%s), idle %.3gs" % (pool.label, m.name, m.child, idle))
        self._event("release", pool, m.name)
        if self.hold > 0:
            self.host.call_later(self.hold, lambda: self.host.quit_node(m.child))
        else:
            self.host.quit_node(m.child)

    def _arm(self, at: Optional[float], now: float) -> None:
        if self.timer is not None:
            self.host.cancel(self.timer)
            self.timer = None
        if at is None:
            return

        def fire() -> None:
            self.timer = None
            self.evaluate()
        # a hair past the moment: a task exactly at the threshold counts as late
        self.timer = self.host.call_later(max(0.0, at - now) + 0.001, fire)

    # -- spawns -----------------------------------------------------------------------
    def _submit(self, pool: Pool, timeout: float) -> Optional[Member]:
        """One more agent for `pool` (a batch job); None if none can go now."""
        name = self._free_name(pool)
        if name is None:
            return None
        try:
            req, child, parent = self.spawn_agent(pool.rule, name, timeout)
        except ValueError as e:
            self._failed(pool, str(e))
            return None
        m = Member(child, name, parent, since=self.clock())
        pool.members[child] = m
        self.spawns[req] = m
        self._event("submit", pool, name)
        return m

    def _free_name(self, pool: Pool) -> Optional[str]:
        if pool.names is None:
            pool.names = hostpattern.expand(pool.rule.dst)
        taken = {n.name for n in self.host.nodes() if n.state in ("up", "leaving", "quitting")}
        for p in self.pools.values():
            taken.update(m.name for m in p.members.values())
        return next((n for n in pool.names if n not in taken), None)

    def spawned(self, src: str, msg: Dict[str, Any]) -> bool:
        """A `spawned` for a pool's agent (True), or not one of ours (False)."""
        m = self.spawns.get(msg["req"])
        if m is None or src != m.parent or msg["child"] != m.child:
            return False
        del self.spawns[msg["req"]]
        pool = self._pool_of(m)
        done = self.explore_done.pop(m.child, None)
        if pool is None:
            return True
        if msg["ok"]:
            self.host.node_up(m.child, m.name, src, pool.rule.channel, msg["info"])
            m.state, m.since, m.busy = "up", self.clock(), False
            pool.slots = max(1, int(msg["info"].get("ncpu") or 1))
            pool.failures, pool.error = 0, ""
            self._event("up", pool, m.name)
        else:
            del pool.members[m.child]
            if not m.cancelled:
                self._failed(pool, "%s: %s" % (m.name, msg["reason"] or "failed"))
        if done is not None:
            done(m.name, bool(msg["ok"]), msg["reason"] or "")
        self.evaluate_soon()
        return True

    def evaluate_soon(self) -> None:
        """Evaluate once this loop round's events are handled: an agent that
        came up has just had tasks placed on it by the services (node_up),
        whose new demand comes at the end of the round; evaluated now, the
        tasks it took would still count as waiting, and more jobs would go."""
        if self.soon:
            return
        self.soon = True

        def run() -> None:
            self.soon = False
            self.evaluate()
        self.host.at_end(run)

    def _failed(self, pool: Pool, reason: str) -> None:
        pool.failures += 1
        pool.error = reason
        pool.retry_at = self.clock() + min(BACKOFF_MAX, max(1.0, pool.wait) * 2 ** (pool.failures - 1))
        self.host.log("elastic %s: %s" % (pool.label, reason))
        self._event("failed", pool, reason)

    def node_lost(self, lost: str) -> None:
        """Agents under `lost` are gone (a released one says goodbye this way too)."""
        from gxpstyle.protocol import wire
        for req, m in list(self.spawns.items()):     # jobs whose parent went
            if wire.is_descendant(m.child, lost):
                self.spawned(m.parent, {"req": req, "child": m.child, "ok": False,
                                        "reason": "its parent was lost", "info": {}})
        for pool in self.pools.values():
            for child in [c for c in pool.members if wire.is_descendant(c, lost)]:
                m = pool.members.pop(child)
                self._event("gone" if m.state == "leaving" else "lost", pool, m.name)
                self.evaluate_soon()

    def _pool_of(self, m: Member) -> Optional[Pool]:
        return next((p for p in self.pools.values() if p.members.get(m.child) is m), None)

    def _event(self, kind: str, pool: Pool, what: str) -> None:
        up = pool.count("up")
        for svc in self.host.services():
            self._guarded(svc, kind, pool, what, up)

    def _guarded(self, svc: Service, kind: str, pool: Pool, what: str, up: int) -> None:
        try:
            svc.pool_changed(kind, pool.label, what, up)
        except Exception as e:     # a service's trace must not stop the pool
            self.host.log("%s.pool_changed failed: %s" % (svc.name, e))
