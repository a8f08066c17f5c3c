"""The explore service on the head: `use` rules and `explore`.

The head plans the tree (spanning_tree.py) and sends `spawn` to each parent;
parents bootstrap children and answer `spawned`. Targets whose gateway is not up
yet wait for it; a gateway that fails fails the targets behind it. Targets an
elastic rule names (`--elastic MIN-MAX`) belong to its pool (elastic.py): an
explore of them starts the pool's MIN agents, and the pool adds and releases
the others with the demand services report.

Head-only.
"""
from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from gxpstyle.api.services import Service, Verb
from gxpstyle.config import hostpattern, limits, use_rules
from gxpstyle.head import sites, spanning_tree
from gxpstyle.head.elastic import ElasticPools
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Int, ListOf, MapOf, Num, Rec, Str

if TYPE_CHECKING:
    from gxpstyle.head.service_host import TreeHost

_lo_local, _hi_local, _ = limits.RANGES["local"]
_lo_fan, _hi_fan, _ = limits.RANGES["fanout"]
_lo_to, _hi_to, _ = limits.RANGES["timeout"]
_PORT = Int(*limits.RANGES["port"][:2])
_FANOUT = Int(_lo_fan, _hi_fan)
_TIMEOUT = Num(_lo_to, _hi_to)
_STRS = ListOf(Str(4096), 256)
_WAIT = Num(*limits.RANGES["elastic_wait"][:2])
_IDLE = Num(*limits.RANGES["elastic_idle"][:2])

RULE = Rec({"channel": Str(32, empty=False), "from": Str(4096, empty=False),
            "to": Str(4096, empty=False)},
           {"user": Str(256), "port": _PORT, "identity_file": Str(4096), "ssh_options": _STRS,
            "template": Str(4096), "python": Str(4096), "timeout": _TIMEOUT, "fanout": _FANOUT,
            "queue": Str(256), "batch_options": _STRS, "connect_host": Str(256),
            "job_time": Str(64), "elastic": Str(32), "elastic_wait": _WAIT,
            "elastic_idle": _IDLE})
HOST_SETTINGS = Rec(None, {"fanout": _FANOUT, "timeout": _TIMEOUT, "python": Str(4096)}, open=True)

USE_ARGS = Rec(None, {"rules": ListOf(RULE, 4096)})
EXPLORE_ARGS = Rec(None, {
    "targets": ListOf(Str(1 << 16, empty=False), 1 << 16),
    "local": Int(_lo_local, _hi_local),
    "rules": ListOf(RULE, 4096),
    "fanout": _FANOUT,
    "timeout": _TIMEOUT,
    "host_settings": MapOf(HOST_SETTINGS, 1 << 20),
    "verbose": Bool(),
})
# A pattern that expands past this many hosts is almost surely a typo.
MAX_TARGETS = 100000
LOCAL_STARTS_PER_CPU = 2


@dataclass
class Exploration:
    client: str
    req: int
    started: float
    pending: Dict[int, Tuple[spanning_tree.Assignment, str]] = field(default_factory=dict)
    waiting: Dict[str, List[spanning_tree.Assignment]] = field(default_factory=dict)
    up: List[str] = field(default_factory=list)
    failed: Dict[str, str] = field(default_factory=dict)
    timeout: float = 20.0
    fanout: int = 8
    key: int = 0
    # True while dispatching: a spawn on the head itself can fail synchronously,
    # and must not end the exploration before the rest starts.
    planning: bool = True
    queued: int = 0            # local bootstraps waiting for their turn
    pool_pending: int = 0      # elastic pools' agents this explore waits for
    # elastic pools to start once the rest is up (their gateways may be in it)
    pools: List[Any] = field(default_factory=list)
    host_settings: Dict[str, Dict[str, Any]] = field(default_factory=dict)


class ExploreService(Service):
    name = "explore"

    def __init__(self, head: TreeHost) -> None:
        super().__init__(head)
        self.tree_host = head      # the explorer builds the tree: it may add to it
        self.rules: List[use_rules.UseRule] = []
        # every rule an explore followed (`use`, a cluster file's, --local's):
        # what sites are derived from (sites.py)
        self.site_rules: List[use_rules.UseRule] = []
        self._gateways: Tuple[Any, Set[str]] = (None, set())
        self.explorations: Dict[int, Exploration] = {}
        self.spawn_reqs: Dict[int, Tuple[Exploration, spanning_tree.Assignment, str]] = {}
        # Local bootstraps in flight per machine, and those waiting for a turn.
        # The head's own local children are Python starts (~20 ms of CPU), an
        # agent's are forks (~2 ms, local_fork.py); a thousand Python starts at
        # once on two cores starved everything, the daemon included (`stat`
        # took seconds). A few per CPU at a time take as long in total and keep
        # the machine answering.
        self.local_busy: Dict[str, int] = {}
        self.local_queue: Dict[
            str, collections.deque[Tuple[Exploration, spanning_tree.Assignment, str]]] = {}
        self.local_of: Dict[int, str] = {}
        self.pools = ElasticPools(head, self.spawn_agent)

    def verbs(self) -> Dict[str, Verb]:
        return {"use": Verb(self.req_use, USE_ARGS), "explore": Verb(self.req_explore, EXPLORE_ARGS)}

    def req_use(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        for r in args.get("rules", []):
            rule = use_rules.rule_from_dict(r)
            if all(old.to_dict() != rule.to_dict() for old in self.rules):
                self.rules.append(rule)
                self.pools.set_rule(rule)
        self.head.reply(cid, req, 0, {"rules": [r.to_dict() for r in self.rules]})

    def req_explore(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        head = self.tree_host
        fanout = int(args.get("fanout") or 8)
        timeout = float(args.get("timeout") or 20.0)
        rules = list(self.rules)
        for r in args.get("rules", []):
            rules.append(use_rules.rule_from_dict(r))
            self.pools.set_rule(rules[-1])
        targets: List[str] = []
        for pat in args.get("targets", []):
            targets.extend(hostpattern.expand(pat))
            if len(targets) > MAX_TARGETS:
                raise ValueError("explore: more than %d target hosts; check the patterns" % MAX_TARGETS)
        local = int(args.get("local") or 0)
        if local:
            used = {n.name for n in head.nodes()}
            i = 1
            while local > 0:
                name = "local%d" % i
                if name not in used:
                    targets.append(name)
                    local -= 1
                i += 1
            rules.append(use_rules.make_rule("local", "*", "local*"))
        for rule in rules:
            if all(old.to_dict() != rule.to_dict() for old in self.site_rules):
                self.site_rules.append(rule)
        ex = Exploration(cid, req, time.monotonic(), timeout=timeout, fanout=fanout,
                         host_settings=dict(args.get("host_settings") or {}))
        live_names = {n.name for n in head.nodes() if n.up}
        fresh: List[str] = []
        seen = set(live_names)
        pooled = []
        for t in targets:
            pool = self.pools.pool_for(t)
            if pool is not None:
                if pool not in pooled:
                    pooled.append(pool)
            elif t not in seen:
                seen.add(t)
                fresh.append(t)
        live = self._live_plan_nodes(fanout)

        def fanout_for(target: str, rule: use_rules.UseRule) -> int:
            return int(rule.options.get("fanout")
                       or ex.host_settings.get(target, {}).get("fanout") or fanout)

        plan = spanning_tree.plan(live, fresh, rules, fanout_for)
        for target, why in plan.unreachable.items():
            ex.failed[target] = why
            head.say(cid, req, "gxpc: explore: %s: %s" % (target, why))
        ex.key = head.new_req()
        self.explorations[ex.key] = ex
        for a in plan.assignments:
            if not a.parent.startswith("id:"):
                ex.waiting.setdefault(a.parent[2:], []).append(a)
        for a in plan.assignments:
            if a.parent.startswith("id:"):
                self._dispatch(ex, a, a.parent[3:])
        ex.pools = pooled
        ex.planning = False
        self._maybe_done(ex)

    def _pool_started(self, ex: Exploration, name: str, ok: bool, why: str) -> None:
        ex.pool_pending -= 1
        if ok:
            ex.up.append(name)
        else:
            self._fail(ex, name, why or "failed")
        self._maybe_done(ex)

    def _live_plan_nodes(self, fanout: int) -> List[spanning_tree.PlanNode]:
        """The up explored nodes, as the planner sees them."""
        children: Dict[str, int] = {}
        for n in self.head.nodes():
            if n.up and n.parent is not None:
                children[n.parent] = children.get(n.parent, 0) + 1
        return [spanning_tree.PlanNode("id:" + n.id, n.names() + (["head"] if n.id == wire.HEAD else []),
                                       n.id.count("."), children.get(n.id, 0), fanout)
                for n in self.head.nodes() if n.up and not n.role]

    def site_of(self, nid: str) -> Optional[str]:
        """The gateway whose site holds node `nid`, or None (sites.py)."""
        nodes = self.head.nodes()
        # the gateways change only with the explored nodes or the rules
        key = (tuple(n.id for n in nodes if not n.role), len(self.site_rules))
        if self._gateways[0] != key:
            self._gateways = (key, sites.gateways(nodes, self.head.node, self.site_rules))
        return sites.site_of(nid, self.head.node, self._gateways[1])

    def spawn_agent(self, rule: use_rules.UseRule, target: str, timeout: float) -> Tuple[int, str, str]:
        """An elastic pool's agent `target`, by `rule`, under the best explored
        node its source names: (request, child id, parent id)."""
        fanout = int(rule.options.get("fanout") or 8)
        plan = spanning_tree.plan(self._live_plan_nodes(fanout), [target], [rule],
                                  lambda t, r: fanout)
        if not plan.assignments:
            raise ValueError(plan.unreachable.get(target) or "no explored node reaches %s" % target)
        parent = plan.assignments[0].parent[3:]
        head = self.tree_host
        child = head.new_child_id(parent)
        spec = {k: v for k, v in rule.options.items() if not k.startswith("elastic")}
        spec["name"] = rule.channel
        spec["timeout"] = timeout
        req = head.new_req()
        head.spawn(parent, {"op": "spawn", "req": req, "child": child, "target": target,
                            "channel": spec, "timeout": timeout})
        return req, child, parent

    def stat(self) -> Dict[str, Any]:
        return {"elastic": self.pools.stat()} if self.pools.pools else {}

    def _dispatch(self, ex: Exploration, a: spanning_tree.Assignment, parent: str) -> None:
        if a.rule.channel == "local":
            info = self.head.node(parent)
            host = info.hostname if info is not None else parent
            limit = LOCAL_STARTS_PER_CPU * max(1, info.slots if info is not None else 1)
            if self.local_busy.get(host, 0) >= limit:
                self.local_queue.setdefault(host, collections.deque()).append((ex, a, parent))
                ex.queued += 1
                return
            self.local_busy[host] = self.local_busy.get(host, 0) + 1
            self.local_of[self._send_spawn(ex, a, parent)] = host
            return
        self._send_spawn(ex, a, parent)

    def _local_done(self, req: int) -> None:
        """A local bootstrap ended (up, failed or lost): start the next one."""
        host = self.local_of.pop(req, None)
        if host is None:
            return
        self.local_busy[host] -= 1
        queue = self.local_queue.get(host)
        while queue:
            ex, a, parent = queue.popleft()
            ex.queued -= 1
            if self.head.is_up(parent):
                self._dispatch(ex, a, parent)
                return
            self._fail(ex, a.target, "not explored: its parent was lost")
            self._maybe_done(ex)

    def _send_spawn(self, ex: Exploration, a: spanning_tree.Assignment, parent: str) -> int:
        head = self.tree_host
        child = head.new_child_id(parent)
        spec = dict(a.rule.options)
        spec["name"] = a.rule.channel
        cluster = ex.host_settings.get(a.target, {})
        if cluster.get("python") and "python" not in spec:
            spec["python"] = cluster["python"]
        timeout = float(spec.get("timeout") or cluster.get("timeout") or ex.timeout)
        spec.setdefault("timeout", timeout)
        req = head.new_req()
        ex.pending[req] = (a, child)
        self.spawn_reqs[req] = (ex, a, child)
        head.spawn(parent, {"op": "spawn", "req": req, "child": child, "target": a.target,
                            "channel": spec, "timeout": timeout})
        return req

    def spawned(self, src: str, msg: Dict[str, Any]) -> bool:
        """A `spawned` for one of our spawns (True), or not ours (False)."""
        entry = self.spawn_reqs.pop(msg["req"], None)
        if entry is None:
            return self.pools.spawned(src, msg)
        self._local_done(msg["req"])
        ex, a, child = entry
        ex.pending.pop(msg["req"], None)
        if msg["ok"] and msg["child"] == child and src == child.rsplit(".", 1)[0]:
            self.tree_host.node_up(child, a.target, src, a.rule.channel, msg["info"])
            ex.up.append(a.target)
            for waiting in ex.waiting.pop(a.target, []):
                self._dispatch(ex, waiting, child)
        else:
            self._fail(ex, a.target, msg["reason"] or "failed")
        self._maybe_done(ex)
        return True

    def _fail(self, ex: Exploration, target: str, reason: str) -> None:
        ex.failed[target] = reason
        self.head.say(ex.client, ex.req, "gxpc: explore: %s: %s" % (target, reason))
        for waiting in ex.waiting.pop(target, []):
            self._fail(ex, waiting.target, "not explored: its gateway %s failed" % target)

    def _maybe_done(self, ex: Exploration) -> None:
        if ex.planning or ex.pending or ex.waiting or ex.queued or ex.pool_pending:
            return
        pools, ex.pools = ex.pools, []
        ex.planning = bool(pools)    # a start that fails at once answers in here
        for pool in pools:           # now that the gateways this explore brings up are up
            started, error = self.pools.explore(pool, ex.timeout, functools.partial(
                self._pool_started, ex))
            ex.pool_pending += started
            if error:
                self._fail(ex, pool.rule.dst, error)
        ex.planning = False
        if ex.pool_pending:
            return
        if self.explorations.pop(ex.key, None) is None:
            return
        elapsed = time.monotonic() - ex.started
        self.head.reply(ex.client, ex.req, 1 if ex.failed else 0,
                        {"up": ex.up, "failed": ex.failed, "seconds": round(elapsed, 3)})

    def node_lost(self, lost: str, reason: str) -> None:
        self.pools.node_lost(lost)
        # Local bootstraps queued under the lost subtree will never start.
        for queue in self.local_queue.values():
            for item in [q for q in queue if wire.is_descendant(q[2], lost)]:
                queue.remove(item)
                ex, a, _ = item
                ex.queued -= 1
                self._fail(ex, a.target, "not explored: its parent was lost")
                self._maybe_done(ex)
        # Explorations waiting on a spawn from the lost subtree.
        for req, (ex, a, child) in list(self.spawn_reqs.items()):
            if wire.is_descendant(child, lost):
                del self.spawn_reqs[req]
                self._local_done(req)
                ex.pending.pop(req, None)
                self._fail(ex, a.target, "gateway lost during bootstrap")
                self._maybe_done(ex)
