"""Sites: the parts of the explored tree that sit behind a gateway.

A cluster reached through its login node is a site: its hosts answer only
their gateway, and everything between them and the rest of the session
crosses one wide-area link (issue 28). Services that care about the WAN (a
mount's site caches, the bytes `gxpc stat` shows) ask the head which site a
node is in.

Derived, never configured: the `use` rules explore followed already say who
may reach whom. A node G is a gateway when it bootstrapped a child that G's
own parent may not reach (no rule lets it): the child was put under G because
only G can get there, not for the fan-out. A node's site is named by the
outermost gateway on its path from the head (the gateway belongs to its
site); the head and the nodes above every gateway are in no site. On a flat
network, where the head may reach every host and a child sits under another
host only for the fan-out, there are no sites, and nothing changes.

A role node (a service's child of an agent) is in its agent's site.

Head-only.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Set

from gxpstyle.api.head_api import NodeView
from gxpstyle.config.use_rules import UseRule
from gxpstyle.protocol import wire


def rule_reaches(rules: List[UseRule], names: List[str], target: str) -> bool:
    """Whether some rule lets a node called `names` start an agent on `target`."""
    return any(rule.reaches(names, target) for rule in rules)


def names_for_rules(n: NodeView) -> List[str]:
    """The names a rule's source pattern may match (the head is also "head")."""
    return n.names() + (["head"] if n.id == wire.HEAD else [])


def gateways(nodes: List[NodeView], node: Callable[[str], Optional[NodeView]],
             rules: List[UseRule]) -> Set[str]:
    """The ids of the nodes that bootstrapped a child their own parent may not reach."""
    found: Set[str] = set()
    for child in nodes:
        parent = node(child.parent) if child.parent is not None and not child.role else None
        above = node(parent.parent) if parent is not None and parent.parent is not None else None
        if above is not None and parent is not None and parent.id not in found \
                and not rule_reaches(rules, names_for_rules(above), child.name):
            found.add(parent.id)
    return found


def site_of(nid: str, node: Callable[[str], Optional[NodeView]], gates: Set[str]) -> Optional[str]:
    """The id of the outermost gateway (of `gates`) at or above node `nid`, or None."""
    n = node(nid)
    if n is not None and n.role and n.parent is not None:
        n = node(n.parent)
    site = None
    while n is not None:
        if n.id in gates:
            site = n.id
        n = node(n.parent) if n.parent is not None else None
    return site
