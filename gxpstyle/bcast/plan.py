"""Who feeds whom in one transfer: the members, the tree plan, and its chains.

The head (bcast/service.py) plans, messages and repairs; this module holds a
transfer's state and shapes its plan:

- the tree: each target is fed by its neighbour on the explored tree's path to
  the primary source, and the nodes on that path that are not targets relay;
- chains inside a site (`chain_sites`): the targets one tree parent feeds,
  which feed nobody else, feed each other in a pipeline over direct links, so
  the parent's uplink carries the file once, not once per child;
- a chain of gateways (`chain_gateways`): when the targets span several sites
  of a WAN (gxpstyle/head/sites.py) and the tree would feed each site's
  gateway from the same node (the head), the first gateway is fed that way and
  each next one by the one before over a direct link between gateways, so the
  feeding node's WAN link carries the file once, not once per site (issue 28).
  Whether two gateways reach each other is found by trying: a gateway that
  cannot listen or be reached is fed along the tree, as before.

A chained member waits (`waiting`) until it says where it listens; then its
feeder connects to it. Head-only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from gxpstyle.protocol import wire

CHUNK = wire.CHUNK


@dataclass
class Member:
    """A node of one transfer: a source, a receiver (target or relay), or both."""
    id: str
    target: bool = False
    relay: bool = False
    source: bool = False       # holds the whole file (a usable source)
    have: int = 0              # chunks it holds in order
    feeder: Optional[str] = None
    done: bool = False
    error: str = ""
    waiting: bool = False      # a chain member: its feeder is told once it listens
    addr: Optional[tuple] = None    # (port, addresses) of its direct-link listener
    no_direct: bool = False    # its direct link failed: fed along the tree from now on
    moved: float = 0.0         # when it was last fed or last reported progress
    stalled: bool = False      # fell behind: feeds nobody new until it moves again


@dataclass
class Transfer:
    id: int
    path: str
    dest: str
    sources: List[str]
    targets: List[str]
    on_done: Callable[[Transfer], None]
    on_progress: Optional[Callable[[Transfer], None]] = None
    client: str = ""           # the client that asked, if any (its leaving stops the transfer)
    chunks_sha: str = ""       # SHA-256 of the chunks' SHA-256s (receivers check it)
    dests: Dict[str, str] = field(default_factory=dict)   # target -> its own dest, if not `dest`
    members: Dict[str, Member] = field(default_factory=dict)
    opened: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    size: int = 0
    mode: int = 0o644
    sha: str = ""
    primary: str = ""          # the source the plan starts from
    n: int = 0
    error: str = ""            # the whole transfer failed (no source)
    started: float = field(default_factory=time.monotonic)
    ended: float = 0.0
    finished: bool = False

    def failed(self) -> Dict[str, str]:
        return {m.id: m.error for m in self.members.values() if m.target and m.error}

    def bytes_done(self) -> int:
        """Bytes the targets hold, summed."""
        return sum(min(m.have * CHUNK, self.size) for m in self.members.values() if m.target)


def plan_tree(t: Transfer) -> None:
    """Each target fed by its neighbour towards t.primary; the nodes on the
    way that are not members become relays."""
    for nid in t.targets:
        m = t.members.setdefault(nid, Member(nid))
        m.target = True
        m.have = 0
        m.feeder = nid if m.source else None
        hop = nid
        while m.feeder is None:     # walk the tree path towards the primary
            nxt = next_hop(hop, t.primary)
            hm = t.members.get(nxt)
            if hm is None:
                hm = t.members[nxt] = Member(nxt, relay=True)
            m.feeder = nxt
            if hm.source or hm.feeder is not None:
                break
            m, hop = hm, nxt


def chain_sites(t: Transfer, chain_len: int) -> None:
    """Inside a site (the targets fed by their common tree parent, which
    feed nobody else), a pipelined chain instead of a star: the parent feeds
    the first, each feeds the next over a direct link while it receives. A
    site larger than chain_len gets several chains, interleaved."""
    if chain_len < 2:
        return
    feeding = {m.feeder for m in t.members.values() if m.feeder != m.id}
    sites: Dict[str, List[Member]] = {}
    for m in t.members.values():
        if (m.target and not m.source and m.feeder is not None and m.id not in feeding
                and m.feeder == m.id.rsplit(".", 1)[0]):
            sites.setdefault(m.feeder, []).append(m)
    for site in sites.values():
        if len(site) < 2:
            continue
        site.sort(key=lambda m: id_key(m.id))
        k = -(-len(site) // chain_len)
        now = time.monotonic()
        for j in range(k):
            chain = site[j::k]
            for prev, m in zip(chain, chain[1:]):
                m.feeder, m.waiting, m.moved = prev.id, True, now


def chain_gateways(t: Transfer, site_of: Callable[[str], Optional[str]]) -> None:
    """The gateways of several sites, each fed from one node outside every
    site (the head), fed in a pipeline instead: the first as planned, each
    next by the one before (a direct link between gateways, tried)."""
    by_feeder: Dict[str, List[Member]] = {}
    for m in t.members.values():
        if (not m.source and m.feeder is not None and not m.waiting
                and site_of(m.id) == m.id and site_of(m.feeder) is None):
            by_feeder.setdefault(m.feeder, []).append(m)
    now = time.monotonic()
    for gates in by_feeder.values():
        gates.sort(key=lambda m: id_key(m.id))
        for prev, m in zip(gates, gates[1:]):
            m.feeder, m.waiting, m.moved = prev.id, True, now


def direct_possible(site_of: Callable[[str], Optional[str]], a: str, b: str) -> bool:
    """Whether a direct link between nodes a and b may be tried: both in one
    site (or in none: a flat network), or both outside every site's inside (a
    gateway, a node in no site: they share the WAN). A site's other hosts
    answer only their gateway."""
    sa, sb = site_of(a), site_of(b)
    return sa == sb or ((sa is None or sa == a) and (sb is None or sb == b))


def next_hop(node: str, toward: str) -> str:
    """The neighbour of `node` on the explored tree's path to `toward`."""
    if toward.startswith(node + "."):
        return node + "." + toward[len(node) + 1:].split(".", 1)[0]
    return node.rsplit(".", 1)[0]


def on_path(a: str, b: str, x: str) -> bool:
    """Whether node x is on the explored tree's path between nodes a and b
    (not an end): above one and not the other, or the two's lowest common
    ancestor, through which the path turns."""
    if x in (a, b):
        return False
    above_a, above_b = wire.is_descendant(a, x), wire.is_descendant(b, x)
    if above_a != above_b:
        return True
    if not above_a:
        return False
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    return ".".join(pa[:k]) == x


def depth(nid: str) -> int:
    return nid.count(".")


def id_key(nid: str) -> List[int]:
    try:
        return [int(x) for x in nid.split(".")]
    except ValueError:
        return [1 << 30]
