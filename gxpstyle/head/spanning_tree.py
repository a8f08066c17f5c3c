"""Planning the spanning tree: which node bootstraps which target, by which rule.

Targets are taken in the order given. Each goes under the shallowest node (live
or already planned) that a `use` rule lets reach it and that still has room under
its fan-out; among equals, the one with the fewest children, then the one known
first. A node with no room takes more only when no other candidate exists: the
rules, not the fan-out, say who can reach whom. The last matching rule wins, so a
later `use` refines an earlier one. A target that nothing reaches yet is tried
again after the others, since a later target may be the gateway to it.

Cost: O(P * N * R * log N) for N targets and R rules, where P is the number of
passes. P <= R + 2: a pass after the first places a target only if some rule's
source matched its first node in the pass before, which happens once per rule.
Rules are few, so the candidates are grouped by rule: each rule keeps a heap of
the nodes its source pattern matches, keyed by the placement order above; the
best parent for a target is the best top among the heaps of the rules that reach
the target. A node's entries go stale when it gains a child and are dropped when
they surface (a node's children only grow, so each entry is dropped once).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from gxpstyle.config import hostpattern
from gxpstyle.config.use_rules import UseRule


@dataclass
class PlanNode:
    key: str                 # "id:<node id>" for a live node, "t:<target>" for a planned one
    names: List[str]         # names a rule's source pattern may match
    depth: int
    children: int = 0
    fanout: int = 8


@dataclass
class Assignment:
    target: str
    parent: str              # PlanNode key
    rule: UseRule
    depth: int


@dataclass
class Plan:
    assignments: List[Assignment] = field(default_factory=list)
    unreachable: Dict[str, str] = field(default_factory=dict)


def rule_for(rules: List[UseRule], names: List[str], target: str) -> Optional[UseRule]:
    for rule in reversed(rules):
        if rule.reaches(names, target):
            return rule
    return None


class _Candidates:
    """The nodes each rule's source matches, as heaps of placement keys."""

    def __init__(self, rules: List[UseRule]) -> None:
        self.rules = rules
        self.nodes: List[PlanNode] = []
        self.groups: List[List[int]] = []          # node index -> rules whose source matches it
        self.heaps: List[List[Tuple[int, int, int, int]]] = [[] for _ in rules]

    def add(self, node: PlanNode) -> None:
        order = len(self.nodes)
        self.nodes.append(node)
        groups = [i for i, rule in enumerate(self.rules)
                  if any(hostpattern.matches(rule.src, n) for n in node.names)]
        self.groups.append(groups)
        self._push(order, groups)

    def _push(self, order: int, groups: List[int]) -> None:
        node = self.nodes[order]
        key = (1 if node.children >= node.fanout else 0, node.depth, node.children, order)
        for i in groups:
            heapq.heappush(self.heaps[i], key)

    def best(self, rule_ids: List[int]) -> Optional[int]:
        """The index of the best node any of these rules has, or None."""
        best: Optional[Tuple[int, int, int, int]] = None
        for i in rule_ids:
            heap = self.heaps[i]
            while heap and heap[0][2] != self.nodes[heap[0][3]].children:
                heapq.heappop(heap)                 # stale: the node has gained a child since
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else best[3]

    def took_child(self, order: int) -> None:
        self.nodes[order].children += 1
        self._push(order, self.groups[order])


def plan(live: List[PlanNode], targets: List[str], rules: List[UseRule],
         fanout_for: Callable[[str, UseRule], int]) -> Plan:
    """Plan how to reach `targets` from the `live` nodes.

    fanout_for(target, rule) gives the fan-out a planned node will have."""
    cands = _Candidates(rules)
    for node in live:
        cands.add(node)
    result = Plan()
    pending = list(targets)
    while pending:
        left: List[str] = []
        for target in pending:
            reaching = [i for i, rule in enumerate(rules) if hostpattern.matches(rule.dst, target)]
            order = cands.best(reaching)
            if order is None:
                left.append(target)
                continue
            parent = cands.nodes[order]
            # The last rule that reaches the target from this parent (rules are few).
            rule = next(rules[i] for i in reversed(reaching) if i in cands.groups[order])
            cands.took_child(order)
            result.assignments.append(Assignment(target, parent.key, rule, parent.depth + 1))
            cands.add(PlanNode("t:" + target, [target], parent.depth + 1, 0, fanout_for(target, rule)))
        if len(left) == len(pending):
            for target in left:
                result.unreachable[target] = "no use rule reaches %s from any explored host" % target
            break
        pending = left
    return result
