"""Where a recipe runs: its inputs' bytes against the nodes' load.

The make service (head/service.py) asks `Placement.decide` for each recipe
with the nodes that may run it, what the replica catalog says each host
already holds of the recipe's inputs, and the recipe's hints:

- no hint (SOFT, the default): the free node whose host holds the most input
  bytes, when the inputs the catalog knows add up to LOCALITY_MIN or more; if
  the best holder is busy, wait for a slot there (delay scheduling), then take
  the free node holding the most; with fewer input bytes known, the least
  busy node (load balance, as before). The wait follows the recipes' run
  times: DELAY_SHARE of the median of the last RUNS_KEPT recipes' (a busy
  node frees a slot about that often), within DELAY_MIN..DELAY_MAX; DELAY
  before any recipe has ended. It never lasts longer than fetching would:
  the input bytes the best free node lacks, at the rate the recipes' copies
  have been going (median of the last RATES_KEPT of FETCH_MIN or more;
  FETCH_RATE before any), bound the wait (waiting is renting, fetching is
  buying: wait at most what buying costs, never more than twice the best
  choice in hindsight). So 3 MB next to a busy node at 100 Mbit/s waits
  0.25 s, not half a minute-long stage. A preference the makefile states
  (GXP_ON with GXP_PLACE=soft, a collocation group) waits at least DELAY.
- GXP_PLACE=hard: only the host holding the most input bytes (Hercules'
  HARD): wait for a slot there, however long.
- GXP_PLACE=load: by load alone, whatever the inputs (a scatter stage; also
  the load-only arm of benchmarks/locality.py).
- GXP_ON=NODES (a node name, a host pattern such as tb[[01-04]], a node id,
  or a mask saved by `gxpc savemask`): only those nodes; with
  GXP_PLACE=soft, they are preferred like a data holder instead (and
  when none of them is up, the recipe runs elsewhere).
- GXP_SLOTS=N: the recipe takes N of a node's slots.
- by load, make's -j may put more recipes on a node than it has slots; not
  while the session grows agents on demand (an elastic pool, `use
  --elastic`): then a recipe waits for a free slot, so the pool sees it
  waiting and adds agents (`bound`).
- the WOSS hints on the output's directory (`setfattr -n user.sshfsmux.dp`):
  `local` makes locality HARD for the recipe; `collocation:GROUP` sends every
  recipe of GROUP after the first to the node the first one took (SOFT).

Head-only; no I/O: the service sends the messages.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Sequence

from gxpstyle.config import hostpattern

DELAY = 3.0        # seconds a SOFT recipe waits for a slot next to its data, at first
# Then a share of a typical run time (Zaharia et al., delay scheduling: with
# recipes of length T and S slots a node frees one about every T/S, so a
# wait of a fraction of T finds the data's node free most of the time; a
# fixed 3 s is too short for minute-long stages and too long for 0.1 s ones).
DELAY_SHARE = 0.5
DELAY_MIN, DELAY_MAX = 0.5, 60.0
RUNS_KEPT = 64     # recent run times the median is taken over
# Inputs smaller than this go by load: fetching 64 KiB costs a few ms even at
# 100 Mbit/s, less than piling small recipes onto one node costs.
LOCALITY_MIN = 64 << 10
# The rate a recipe's missing inputs reach its node at: assumed 100 Mbit/s
# before a copy was measured (a slow cluster link: it errs towards waiting,
# the choice made before rates were weighed), then the median of the last
# RATES_KEPT copies of FETCH_MIN bytes or more (smaller ones measure the
# round trips, not the link).
FETCH_RATE = 12.5e6
FETCH_MIN = 1 << 20
RATES_KEPT = 32


@dataclass
class NodeView:
    id: str
    names: List[str]          # explored name, hostname, short hostname
    host: str
    slots: int
    used: int                 # slots taken by running recipes


@dataclass
class Hints:
    on: str = ""
    place: str = ""           # "", "hard", "soft" or "load"
    slots: int = 1
    dp: str = ""              # "", "local" or "collocation:GROUP"


@dataclass
class Decision:
    node: Optional[str]       # None: wait (retry when a slot frees or at `retry_at`)
    why: str
    local: int = 0            # input bytes already on the chosen node's host
    fetch: int = 0            # input bytes it will read from other hosts
    error: str = ""           # the recipe cannot run at all (a hint no node meets)
    retry_at: Optional[float] = None


@dataclass
class Placement:
    fixed_delay: Optional[float] = None   # a fixed SOFT delay; None: follow run times and rates
    min_bytes: int = LOCALITY_MIN
    groups: Dict[str, str] = field(default_factory=dict)   # collocation group -> node id
    _turn: int = 0
    _runs: Deque[float] = field(default_factory=lambda: deque(maxlen=RUNS_KEPT))
    _rates: Deque[float] = field(default_factory=lambda: deque(maxlen=RATES_KEPT))

    def observe(self, seconds: float) -> None:
        """A recipe ran for `seconds` (successful ones: a failure says little
        about how long the stage takes)."""
        if seconds >= 0:
            self._runs.append(seconds)

    def observe_fetch(self, nbytes: int, seconds: float) -> None:
        """A recipe's missing inputs, `nbytes`, took `seconds` to reach its
        node (queueing for a transfer slot included: it is what a fetch costs)."""
        if nbytes >= FETCH_MIN and seconds > 0:
            self._rates.append(nbytes / seconds)

    @property
    def fetch_rate(self) -> float:
        """Bytes per second a recipe's missing inputs reach its node at now."""
        if not self._rates:
            return FETCH_RATE
        rates = sorted(self._rates)
        return rates[len(rates) // 2]

    @property
    def delay(self) -> float:
        """How long a SOFT recipe waits for its data's node now."""
        if self.fixed_delay is not None:
            return self.fixed_delay
        if not self._runs:
            return DELAY
        runs = sorted(self._runs)
        return min(DELAY_MAX, max(DELAY_MIN, DELAY_SHARE * runs[len(runs) // 2]))

    def matcher(self, on: str, masks: Dict[str, set[str]]) -> Callable[[NodeView], bool]:
        """Which nodes GXP_ON names (PatternError for a bad pattern)."""
        if on in masks:
            chosen = masks[on]
            return lambda n: n.id in chosen
        pat = hostpattern.compile_pattern(on)   # cheap: compiled once per decision
        return lambda n: n.id == on or any(pat.match(x) for x in n.names)

    def decide(self, nodes: Sequence[NodeView], held: Dict[str, int], total: int, hints: Hints,
               waited_since: float, now: float, masks: Dict[str, set[str]],
               bound: bool = False) -> Decision:
        """`held`: input bytes by host (from the catalog); `total`: the inputs'
        size the catalog knows; `waited_since`: when this recipe first asked.
        With `bound` (the session grows agents on demand) a recipe no free
        slot takes waits for one instead of crowding the least busy node."""
        need = max(1, hints.slots)
        pool = list(nodes)
        on_soft = bool(hints.on) and hints.place == "soft"
        preferred: List[NodeView] = []
        if hints.on:
            try:
                match = self.matcher(hints.on, masks)
            except hostpattern.PatternError as e:
                return Decision(None, "", error="GXP_ON=%s: %s" % (hints.on, e))
            named = [n for n in pool if match(n)]
            if on_soft:
                preferred = named        # none up: no preference left
            elif not named:
                return Decision(None, "", error="GXP_ON=%s names no node that is up" % hints.on)
            else:
                pool = named
        if not any(need <= n.slots for n in pool):
            return Decision(None, "", error="GXP_SLOTS=%d: no node has that many slots" % need)
        pool = [n for n in pool if need <= n.slots]

        def free(n: NodeView) -> bool:
            return n.used + need <= n.slots

        def local(n: NodeView) -> int:
            return held.get(n.host, 0)

        group = hints.dp[len("collocation:"):] if hints.dp.startswith("collocation:") else ""
        if group and group in self.groups and not preferred:
            preferred = [n for n in pool if n.id == self.groups[group]]
        hard = hints.place == "hard" or hints.dp == "local"
        if not preferred and hints.place != "load" and total >= self.min_bytes \
                and max((local(n) for n in pool), default=0) > 0:
            best = max(local(n) for n in pool)
            preferred = [n for n in pool if local(n) == best]
        if preferred:
            why_pref = ("GXP_ON=%s" % hints.on if on_soft else
                        "collocation %s" % group if group and group in self.groups else
                        "%d of %d input bytes local" % (local(preferred[0]), total))
            ready = [n for n in preferred if free(n)]
            if ready:
                return self._take(self._least_busy(ready), why_pref, held, total, group)
            if hard:
                return Decision(None, "waiting for %s (%s)" % (
                    preferred[0].names[0], "GXP_PLACE=hard" if hints.place == "hard"
                    else "dp=local"))
            delay = self.delay
            others = [n for n in pool if free(n)]
            best = max((local(n) for n in others), default=0)
            fetching = ""
            if self.fixed_delay is None and (on_soft or why_pref.startswith("collocation")):
                # a preference the makefile states waits at least DELAY: it
                # is not a fetch weighed against a wait
                delay = max(DELAY, delay)
            elif self.fixed_delay is None and others:
                fetch = (total - best) / self.fetch_rate
                if fetch < delay:
                    delay, fetching = fetch, ", fetching %d bytes is quicker" % (total - best)
            if now - waited_since < delay:
                return Decision(None, "waiting up to %.3gs for %s" % (delay, preferred[0].names[0]),
                                retry_at=waited_since + delay)
            if bound and not others:
                return Decision(None, "waiting for a free slot")
            pick = self._fallback(others or pool, local, total)
            return self._take(pick, "%s busy past %.3gs%s; load" % (preferred[0].names[0], delay, fetching),
                              held, total, group)
        if bound and not any(free(n) for n in pool):
            return Decision(None, "waiting for a free slot")
        return self._take(self._least_busy(pool), "load" if not hints.on else
                          "GXP_ON=%s, load" % hints.on, held, total, group)

    def _fallback(self, nodes: Sequence[NodeView], local: Callable[[NodeView], int],
                  total: int) -> NodeView:
        """Where a recipe goes once its data's node was given up: it fetches
        wherever it runs, so by load, unless another node holds most of its
        inputs (a second replica). Among the least busy, the one holding the
        most (LOCALITY_MIN or more). A shared input copied to a few nodes
        (a reference every recipe reads) must not pull every recipe onto
        those few: that packs a CPU-bound stage onto them."""
        best = max(local(n) for n in nodes)
        if best >= self.min_bytes and 2 * best >= total:
            return self._least_busy([n for n in nodes if local(n) == best])
        low = min(_share(n) for n in nodes)
        idle = [n for n in nodes if _share(n) == low]
        top = max(local(n) for n in idle)
        return self._least_busy([n for n in idle if local(n) == top or top < self.min_bytes])

    def _least_busy(self, nodes: Sequence[NodeView]) -> NodeView:
        """Lowest share of slots used; ties go round the nodes in turn."""
        n = len(nodes)
        start = self._turn % n
        self._turn += 1
        return min((nodes[(start + i) % n] for i in range(n)), key=_share)

    def _take(self, n: NodeView, why: str, held: Dict[str, int], total: int,
              group: str) -> Decision:
        if group and group not in self.groups:
            self.groups[group] = n.id
        here = held.get(n.host, 0)
        return Decision(n.id, why, local=here, fetch=max(0, total - here))


def _share(n: NodeView) -> float:
    """How busy a node is: the share of its slots taken."""
    return n.used / float(max(1, n.slots))
