"""The elastic pools' decisions (gxpstyle/head/elastic.py, issue 27), on a fake
head and a fake clock: how many jobs go for how many late tasks, what is
cancelled and released and in which order, and the one timer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from gxpstyle.api.services import Service
from gxpstyle.config.use_rules import make_rule
from gxpstyle.head.elastic import ElasticPools


@dataclass
class FakeNode:
    id: str
    name: str
    state: str = "up"


class FakeService(Service):
    name = "fake"

    def __init__(self, events: List[Tuple[str, ...]]) -> None:
        self.held: set = set()
        self.events = events

    def holds_node(self, nid: str) -> bool:
        self.events.append(("asked", nid))
        return nid in self.held

    def pool_changed(self, event: str, pool: str, what: str, up: int) -> None:
        self.events.append(("event", event, what))


class FakeHost:
    def __init__(self) -> None:
        self.now = 100.0
        self.tree: Dict[str, FakeNode] = {"0": FakeNode("0", "head")}
        self.events: List[Tuple[str, ...]] = []     # what happened, in order
        self.svc = FakeService(self.events)
        self.timers: Dict[int, Tuple[float, Callable[[], None]]] = {}
        self.seq = 0
        self.ends: List[Callable[[], None]] = []
        self.jobs_on: set = set()

    # what ElasticPools uses of TreeHost
    def nodes(self) -> List[FakeNode]:
        return list(self.tree.values())

    def call_later(self, delay: float, fn: Callable[[], None]) -> int:
        self.seq += 1
        self.timers[self.seq] = (self.now + delay, fn)
        return self.seq

    def cancel(self, handle: Optional[int]) -> None:
        self.timers.pop(handle or 0, None)

    def at_end(self, fn: Callable[[], None]) -> None:
        self.ends.append(fn)

    def log(self, text: str) -> None:
        pass

    def services(self) -> List[Service]:
        return [self.svc]

    def runs_jobs(self, nid: str) -> bool:
        return nid in self.jobs_on

    def node_up(self, nid: str, name: str, parent: str, channel: str, info: Dict[str, Any]) -> None:
        self.tree[nid] = FakeNode(nid, name)

    def mark_leaving(self, nid: str, reason: str) -> None:
        self.events.append(("mark", nid))
        self.tree[nid].state = "leaving"

    def quit_node(self, nid: str) -> None:
        self.events.append(("quit", nid))

    def unspawn(self, parent: str, child: str) -> None:
        self.events.append(("unspawn", child))

    # the test's side
    def run_ends(self) -> None:
        ends, self.ends = self.ends, []
        for fn in ends:
            fn()

    def advance(self, seconds: float) -> None:
        """The clock moves; the timers due run, in order."""
        self.now += seconds
        for handle, (at, fn) in sorted(self.timers.items(), key=lambda kv: kv[1][0]):
            if at <= self.now and handle in self.timers:
                del self.timers[handle]
                fn()


def _pools(lo_hi: str = "0-4", wait: float = 5, idle: float = 60) -> Tuple[ElasticPools, FakeHost, list]:
    host = FakeHost()
    spawned: list = []

    def spawn(rule: Any, name: str, timeout: float) -> Tuple[int, str, str]:
        child = "0.%d" % (len(spawned) + 1)
        spawned.append((name, child, timeout))
        return len(spawned), child, "0"
    pools = ElasticPools(host, spawn, clock=lambda: host.now)   # type: ignore[arg-type]
    pools.set_rule(make_rule("slurm", "head", "job[[1-4]]", {
        "elastic": lo_hi, "elastic_wait": wait, "elastic_idle": idle}))
    return pools, host, spawned


def _up(pools: ElasticPools, host: FakeHost, req: int, child: str, ncpu: int = 2,
        report: Optional[Tuple[list, list]] = None) -> None:
    """Agent `child` comes up; with `report`, the service's demand at the end
    of that round comes first (its node_up placed tasks there), as make's does."""
    assert pools.spawned("0", {"req": req, "child": child, "ok": True, "reason": "",
                               "info": {"ncpu": ncpu}})
    if report is not None:
        pools.demand("make", *report)
    host.run_ends()


def test_late_tasks_ask_for_agents_up_to_max_and_not_twice():
    pools, host, spawned = _pools("0-4", wait=5)
    now = host.now
    pools.demand("make", [now - 6, now - 6, now - 1], [])
    assert [s[0] for s in spawned] == ["job1", "job2"]        # 2 late tasks, 1 slot assumed each
    assert [t[0] for t in host.timers.values()] == [now + 4.001]  # the third becomes late then
    pools.demand("make", [now - 6, now - 6, now - 1], [])
    assert len(spawned) == 2                                  # the queued jobs cover them
    host.advance(4.5)
    assert [s[0] for s in spawned] == ["job1", "job2", "job3"]
    pools.demand("make", [now - 9] * 20, [])
    assert len(spawned) == 4                                  # MAX, whatever the demand
    assert pools.stat()[0]["pending"] == 4


def test_slots_of_the_agent_that_came_up_count():
    pools, host, spawned = _pools("0-4", wait=0)
    pools.demand("make", [host.now - 1] * 2, [])
    assert len(spawned) == 2
    _up(pools, host, 1, "0.1", ncpu=4)
    # job2 still queued brings 4 slots now: 4 waiting tasks are covered
    pools.demand("make", [host.now - 1] * 4, [])
    assert len(spawned) == 2
    pools.demand("make", [host.now - 1] * 9, [])
    assert len(spawned) == 4                                  # 5 more: 2 agents of 4


def test_nothing_waits_cancels_the_queued_jobs_but_min():
    pools, host, spawned = _pools("1-4", wait=0)
    pool = pools.pool_for("job1")
    assert pool is not None
    assert pools.explore(pool, 20, lambda *a: None) == (1, "")   # keeps MIN from now on
    assert len(spawned) == 1
    pools.demand("make", [host.now - 1] * 3, [])
    assert len(spawned) == 3
    pools.demand("make", [], [])
    assert [e for e in host.events if e[0] == "unspawn"] == [("unspawn", "0.2"), ("unspawn", "0.3")]
    for req, child in ((2, "0.2"), (3, "0.3")):
        pools.spawned("0", {"req": req, "child": child, "ok": False, "reason": "cancelled",
                            "info": {}})
    host.run_ends()
    assert pools.stat()[0]["pending"] == 1 and pools.stat()[0]["error"] == ""


def test_release_marks_first_and_never_takes_a_held_node():
    pools, host, spawned = _pools("0-4", wait=0, idle=10)
    pools.demand("make", [host.now - 1] * 2, [])
    _up(pools, host, 1, "0.1", report=([host.now - 1], ["0.1"]))
    _up(pools, host, 2, "0.2", report=([], ["0.1", "0.2"]))   # both busy: no timer for them
    assert host.timers == {} and len(spawned) == 2
    host.advance(1)
    pools.demand("make", [], ["0.2"])                         # 0.1 idle from now
    host.svc.held.add("0.1")                                  # ... yet held when the time comes
    host.advance(10.01)
    assert ("mark", "0.1") not in host.events and ("asked", "0.1") in host.events
    host.svc.held.clear()
    host.advance(10.01)
    log = [e for e in host.events if e[0] in ("asked", "mark", "quit") and e[1] == "0.1"]
    assert log[-3:] == [("asked", "0.1"), ("mark", "0.1"), ("quit", "0.1")]
    assert ("event", "release", "job1") in host.events
    assert host.tree["0.1"].state == "leaving"
    assert ("mark", "0.2") not in host.events                    # busy all along
    pools.node_lost("0.1")
    host.run_ends()
    assert pools.stat()[0] == {"rule": "slurm head job[[1-4]]", "min": 0, "max": 4, "up": 1,
                               "pending": 0, "leaving": 0, "error": ""}


def test_a_job_of_the_job_table_keeps_the_node():
    pools, host, spawned = _pools("0-4", wait=0, idle=1)
    pools.demand("make", [host.now - 1], [])
    _up(pools, host, 1, "0.1", report=([], []))
    host.jobs_on.add("0.1")                                  # a gxpc e job runs there
    host.advance(2)
    assert ("mark", "0.1") not in host.events
    host.jobs_on.clear()
    host.advance(2)
    assert ("mark", "0.1") in host.events


def test_failed_submissions_back_off():
    pools, host, spawned = _pools("0-4", wait=2)
    pools.demand("make", [host.now - 3], [])
    assert len(spawned) == 1
    pools.spawned("0", {"req": 1, "child": "0.1", "ok": False, "reason": "sbatch failed: no",
                        "info": {}})
    host.run_ends()
    assert len(spawned) == 1 and "sbatch failed" in pools.stat()[0]["error"]
    assert ("event", "failed", "job1: sbatch failed: no") in host.events
    host.advance(1.9)
    assert len(spawned) == 1
    host.advance(0.2)                                         # 2 s: the wait, doubled next time
    assert len(spawned) == 2
