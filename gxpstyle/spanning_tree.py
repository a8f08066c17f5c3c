"""Planning the spanning tree: which node bootstraps which target, by which rule.

Targets are taken in the order given. Each goes under the shallowest node (live
or already planned) that a `use` rule lets reach it and that still has room under
its fan-out; among equals, the one with the fewest children. A node with no room
takes more only when no other candidate exists: the rules, not the fan-out, say
who can reach whom. The last matching rule wins, so a later `use` refines an
earlier one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from gxpstyle.use_rules import UseRule


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


def plan(live: List[PlanNode], targets: List[str], rules: List[UseRule],
         fanout_for: Callable[[str, UseRule], int]) -> Plan:
    """Plan how to reach `targets` from the `live` nodes.

    fanout_for(target, rule) gives the fan-out a planned node will have."""
    nodes: List[PlanNode] = list(live)
    result = Plan()
    pending = list(targets)
    # Repeat until no progress: a target may be reachable only from another target
    # that appears later in the list.
    while pending:
        left: List[str] = []
        for target in pending:
            best: Optional[Tuple[Tuple[int, int, int, int], PlanNode, UseRule]] = None
            for order, node in enumerate(nodes):
                rule = rule_for(rules, node.names, target)
                if rule is None:
                    continue
                score = (1 if node.children >= node.fanout else 0, node.depth, node.children, order)
                if best is None or score < best[0]:
                    best = (score, node, rule)
            if best is None:
                left.append(target)
                continue
            _, parent, rule = best
            parent.children += 1
            result.assignments.append(Assignment(target, parent.key, rule, parent.depth + 1))
            nodes.append(PlanNode("t:" + target, [target], parent.depth + 1, 0,
                                  fanout_for(target, rule)))
        if len(left) == len(pending):
            for target in left:
                result.unreachable[target] = "no use rule reaches %s from any explored host" % target
            break
        pending = left
    return result
