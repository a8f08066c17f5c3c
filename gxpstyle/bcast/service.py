"""Broadcast on the head: `gxpc bcast SRC DEST`, and the transfer engine under it.

The head decides, the nodes move bytes (gxpstyle/bcast/node.py). A transfer
copies one file from its sources (one node's file, or identical copies on
several) to DEST on a set of targets:

1. Every source opens and hashes its file (`open`); the first that answers
   well in the order given is the primary, and the others whose SHA-256 is the
   same are replicas, kept for failures.
2. The plan follows the explored tree: each target is fed by its neighbour on
   the tree path to the primary, so every agent link carries the file once, and
   nodes on those paths that are not targets (the head, a gateway) relay from a
   store in their session directory. A source that is a target copies from
   itself. Each receiver is told the size, mode and SHA-256 (`plan`), each
   feeder whom to feed (`feed`); chunks flow at once, so a node forwards
   while it still receives and one file reaches every node in about one
   link-time.
3. Nodes report progress (`state`). A receiver whose feeder is lost, failed,
   or sent a chunk that did not match its hash is fed again from another holder
   from where it stands: a replica source first, else the most advanced node
   not fed through it. A node that fails (a full disk) or is lost is named with
   its reason; the others go on.
4. When every target is done or failed, every node is told to stop (relays
   remove their stores) and whoever asked gets the outcome.

Inside a site (the targets one tree parent feeds, which feed nobody else) the
plan is a pipelined chain instead of a star: the parent feeds the first, each
feeds the next over a direct link (bcast/direct_links.py) once it listens; a member that
cannot listen or be reached is fed along the tree, and one that stalls has the
nodes it fed fed by another holder (`_watch`). Between sites data rides the agent
links (framed messages routed through the tree): authenticated, encrypted, and
they cross gateways; except that the gateways of several sites fed from home
feed each other in a chain over direct links, so home's WAN link carries the
file once (bcast/plan.py). `start()` is the engine's entry point for other
services (a push of make's inputs is a transfer with one or more targets, a
pull is one with a single target and the holders, in random order, as sources).

Head-only.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from gxpstyle.api.interfaces import BcastAPI, Shell
from gxpstyle.api.interfaces import Transfer as TransferView
from gxpstyle.api.services import Message, Service, Verb
from gxpstyle.bcast.plan import (
    CHUNK,
    Member,
    Transfer,
    chain_gateways,
    chain_sites,
    depth,
    direct_possible,
    next_hop,
    on_path,
    plan_tree,
)
from gxpstyle.config import hostpattern
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Int, ListOf, Opt, Rec, Str

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

PROGRESS_EVERY = 0.5

_BC = Int(0, (1 << 63) - 1)
_TEXT = Str(1 << 16)
# What the nodes tell the head side (bcast/node.py takes the other types):
# a source opened and hashed its file (chunks_sha256: the SHA-256 of the
# chunks' SHA-256s, which receivers check), a receiver's progress, a chain
# member's listener (or why it has none), a feeder's failed direct link.
OPENED = Rec({"bc": _BC, "ok": Bool(), "error": _TEXT, "size": Int(0, 1 << 62),
              "mode": Int(0, 0o7777), "sha256": Str(64)}, {"chunks_sha256": Str(64)}, open=True)
STATE = Rec({"bc": _BC, "have": Int(0, 1 << 40), "done": Bool(), "error": _TEXT,
             "bad": Str(wire.MAX_ADDR)}, open=True)
LISTENING = Rec({"bc": _BC, "port": Int(0, 65535), "addrs": ListOf(Str(64), 16), "error": _TEXT},
                open=True)
NOLINK = Rec({"bc": _BC, "child": Str(wire.MAX_ADDR, empty=False), "error": _TEXT}, open=True)

BCAST_ARGS = Rec({"src": Str(4096, empty=False), "dest": Str(4096, empty=False)},
                 {"src_nodes": Opt(Str(1 << 16, empty=False)), "mask": Opt(Str(256, empty=False)),
                  "hosts": Opt(Str(1 << 16)), "progress": Bool()})

# Test-only fault, read from the daemon's own environment at start (never from a
# request): "NAME:INDEX" flips one byte of chunk INDEX the first time it is sent
# to the node named NAME, so that a test can see a bad chunk fetched again.
FAULT_ENV = "GXP_TEST_BCAST_CORRUPT"
# Test-only fault, read the same way: the node named NAME is given a port nobody
# listens on for its direct link, so its feeder's connection is refused.
NO_DIRECT_ENV = "GXP_TEST_BCAST_NO_DIRECT"
# The most nodes one chain inside a site holds (a site of N nodes gets
# ceil(N / CHAIN_LEN) interleaved chains); read at start so that a benchmark can
# compare shapes. 0: no chains (every node fed by its tree parent).
CHAIN_ENV = "GXP_BCAST_CHAIN_LEN"
CHAIN_LEN = 64
# A receiver that has not moved for this long while its feeder holds more has
# fallen behind (stopped, swapping, its disk slow): the nodes it feeds are fed
# by another holder, so one slow node in a chain holds up only itself.
STALL_SECONDS = 4.0


class BcastService(Service, BcastAPI):
    name = "bcast"
    # pushed to a node at its first transfer (most agents never take part in one)
    node_side = "gxpstyle.bcast.node:BcastSide"
    node_modules = ["gxpstyle.bcast.direct_links", "gxpstyle.bcast.node"]

    def __init__(self, head: HeadAPI) -> None:
        super().__init__(head)
        self.transfers: Dict[int, Transfer] = {}
        self.seq = 0
        self.fault: Optional[tuple] = None
        spec = os.environ.get(FAULT_ENV, "")
        if ":" in spec:
            name, _, idx = spec.rpartition(":")
            if idx.isdigit():
                self.fault = (name, int(idx))
        self.no_direct = os.environ.get(NO_DIRECT_ENV, "")
        chain = os.environ.get(CHAIN_ENV, "")
        self.chain_len = int(chain) if chain.isdigit() else CHAIN_LEN
        self.watching = False

    def verbs(self) -> Dict[str, Verb]:
        return {"bcast": Verb(self.req_bcast, BCAST_ARGS)}

    def stat(self) -> Dict[str, Any]:
        return {"bcasts": len(self.transfers)}

    def node_messages(self) -> Dict[str, Message]:
        return {"opened": Message(OPENED, self.on_opened), "state": Message(STATE, self.on_state),
                "listening": Message(LISTENING, self.on_listening),
                "nolink": Message(NOLINK, self.on_nolink)}

    # -- the engine ----------------------------------------------------------------
    def start(self, sources: List[str], path: str, targets: List[str], dest: str,
              on_done: Callable[[TransferView], None],
              on_progress: Optional[Callable[[TransferView], None]] = None,
              dests: Optional[Dict[str, str]] = None) -> Transfer:
        """Copy `path` (identical on every one of `sources`, tried in that order)
        to `dest` on every one of `targets`; on_done(transfer) once each target
        is done or failed (transfer.failed() names those, with their reasons).
        `{sha256}` in dest becomes the file's SHA-256 (a content-addressed
        replica: identical content lands on one name per node). `dests` gives
        some targets a dest of their own (another directory on each node)."""
        self.seq += 1
        t = Transfer(self.seq, path, dest, list(sources), list(targets), on_done, on_progress,
                     dests=dict(dests or {}))
        self.transfers[t.id] = t
        self._watch_later()
        for s in t.sources:
            self.head.send_node(s, "open", {"bc": t.id, "path": path, "chunk": CHUNK})
        return t

    def join(self, t: TransferView, nid: str, dest: str) -> bool:
        """Add target `nid` to transfer `t` while it runs: it is fed along the
        tree from the nearest member on its path to the primary (a relay such
        as the head already holds what has passed), from chunk 0, so a node
        that needs the file a moment later costs the source's link nothing.
        False if it cannot join (finished, failed, or `nid` already in it):
        then start a transfer of its own."""
        if not isinstance(t, Transfer) or (t.finished or t.error or nid in t.targets
                                           or nid in t.members or not self.head.is_up(nid)):
            return False
        if not t.members:           # not planned yet: planned with the others
            t.targets.append(nid)
            t.dests[nid] = dest
            return True
        path: List[str] = []
        hop = nid
        while True:                 # the tree path to the first member that is fed
            nxt = next_hop(hop, t.primary)
            hm = t.members.get(nxt)
            if hm is not None and hm.error and not hm.source:
                return False
            path.append(nxt)
            if hm is not None and (hm.source or hm.feeder is not None):
                break
            hop = nxt
        t.targets.append(nid)
        t.dests[nid] = dest.replace("{sha256}", t.sha)
        chain = [Member(nid, target=True)]
        for x in path[:-1]:
            chain.append(t.members.get(x) or Member(x, relay=True))
        for a, b in zip(chain, path):
            a.feeder = b
        for m in chain:
            if m.id not in t.members:
                t.members[m.id] = m
                self._send_plan(t, m)
        for m in reversed(chain):
            self._feed(t, m, m.feeder or "")
        return True

    def on_opened(self, src: str, msg: Dict[str, Any]) -> None:
        t = self.transfers.get(msg["bc"])
        if t is None or t.members or src not in t.sources or src in t.opened:
            return
        t.opened[src] = msg
        self._maybe_plan(t)

    def _maybe_plan(self, t: Transfer) -> None:
        if any(s not in t.opened and self.head.is_up(s) for s in t.sources):
            return
        good = [s for s in t.sources if t.opened.get(s, {}).get("ok")]
        if not good:
            why = [t.opened[s]["error"] for s in t.sources if s in t.opened] or ["source node lost"]
            t.error = why[0]
            self._finish(t)
            return
        first = t.opened[good[0]]
        t.size, t.mode, t.sha = first["size"], first["mode"], first["sha256"]
        t.chunks_sha = str(first.get("chunks_sha256") or "")
        t.n = -(-t.size // CHUNK)
        replicas = [s for s in good if t.opened[s]["sha256"] == t.sha]
        for s in good:
            if s not in replicas:
                self.head.log("bcast %d: %s has a different %s; not used" % (t.id, s, t.path))
        t.primary = replicas[0]
        for s in replicas:
            t.members[s] = Member(s, source=True, have=t.n)
        plan_tree(t)
        chain_sites(t, self.chain_len)
        chain_gateways(t, self.head.site_of)
        t.dest = t.dest.replace("{sha256}", t.sha)
        t.dests = {k: v.replace("{sha256}", t.sha) for k, v in t.dests.items()}
        for m in t.members.values():
            if m.target or m.relay:
                self._send_plan(t, m)
        for m in list(t.members.values()):
            if m.feeder is not None and not m.waiting:
                self._feed(t, m, m.feeder)
        for m in list(t.members.values()):
            if not self.head.is_up(m.id) and not m.error:
                info = self.head.node(m.id)
                self._fail(t, m, "node lost: %s" % info.reason if info is not None else "node lost")
        self._check_done(t)

    def _send_plan(self, t: Transfer, m: Member) -> None:
        """Tell a receiver (target or relay) what it gets: size, mode, hashes,
        its DEST (a relay: none), and whether to listen for a chain feeder."""
        self.head.send_node(m.id, "plan", {
            "bc": t.id, "size": t.size, "mode": t.mode, "sha256": t.sha,
            "chunks_sha256": t.chunks_sha, "chunk": CHUNK,
            "dest": t.dests.get(m.id, t.dest) if m.target else "",
            "name": os.path.basename(t.path.rstrip("/")) or "file", "listen": m.waiting})

    def on_listening(self, src: str, msg: Dict[str, Any]) -> None:
        """A chain member listens: its feeder connects to it (or, if it could not
        listen, it is fed along the tree)."""
        t = self.transfers.get(msg["bc"])
        m = t.members.get(src) if t is not None else None
        if t is None or m is None or m.error or m.done or t.finished:
            return
        if msg["error"] or not msg["port"] or not msg["addrs"]:
            self.head.log("bcast %d: %s cannot take a direct link (%s); fed along the tree"
                                % (t.id, self.head.name_of(src), msg["error"] or "no port"))
            m.no_direct = True
        else:
            m.addr = (msg["port"], list(msg["addrs"]))
        if m.waiting and m.feeder is not None:
            if m.no_direct:
                self._tree_feed(t, m)
            else:
                self._feed(t, m, m.feeder)

    def on_nolink(self, src: str, msg: Dict[str, Any]) -> None:
        """A feeder's direct link to a child failed: the child is fed along the tree."""
        t = self.transfers.get(msg["bc"])
        m = t.members.get(msg["child"]) if t is not None else None
        if t is None or m is None or m.error or m.done or t.finished or m.feeder != src:
            return
        self.head.log("bcast %d: %s: %s; fed along the tree" % (
            t.id, self.head.name_of(m.id), msg["error"]))
        m.no_direct = True
        self._tree_feed(t, m)

    def _tree_feed(self, t: Transfer, m: Member) -> None:
        """Feed m from its neighbour towards the primary if that one holds or
        gets the file, else from whichever holder _refeed finds."""
        hop = next_hop(m.id, t.primary)
        hm = t.members.get(hop)
        if (hm is not None and self.head.is_up(hop)
                and (hm.source or (not hm.error and hm.feeder is not None and not hm.waiting))):
            old = m.feeder
            if old is not None and old != hop and self.head.is_up(old):
                self.head.send_node(old, "drop", {"bc": t.id, "child": m.id})
            self._feed(t, m, hop)
        else:
            self._refeed(t, m, avoid=m.feeder or "")

    def _watch_later(self) -> None:
        if not self.watching:
            self.watching = True
            self.head.call_later(1.0, self._watch)

    def _watch(self) -> None:
        """Every second while transfers run: a receiver that fell behind
        (STALL_SECONDS without progress while its feeder holds more, or
        without answering that it listens) keeps its own feed, but the nodes it
        feeds are fed by another holder."""
        self.watching = False
        now = time.monotonic()
        for t in list(self.transfers.values()):
            for m in list(t.members.values()):
                fm = t.members.get(m.feeder or "")
                if (m.source or m.done or m.error or m.stalled or fm is None
                        or fm is m or now - m.moved < STALL_SECONDS
                        or not (m.waiting or fm.source or fm.have > m.have)):
                    continue
                if m.waiting:       # it never said it listens: fed along the tree
                    m.no_direct = True
                    self._tree_feed(t, m)
                fed = [c for c in t.members.values()
                       if c.feeder == m.id and c is not m and not c.done and not c.error]
                if not fed:
                    continue
                m.stalled = True
                moved = [c for c in fed if self._refeed(t, c, avoid=m.id, around=m.id)]
                if moved:
                    self.head.log("bcast %d: %s has not moved for %.0fs; feeding %d of the nodes "
                                  "it fed from another holder" % (
                                      t.id, self.head.name_of(m.id), now - m.moved, len(moved)))
        if self.transfers:
            self._watch_later()

    def _feed(self, t: Transfer, m: Member, feeder: str) -> None:
        m.feeder = feeder
        m.waiting = False
        m.moved = max(m.moved, time.monotonic())
        msg: Dict[str, Any] = {"bc": t.id, "child": m.id, "start": m.have}
        if self.fault is not None and self.head.name_of(m.id) == self.fault[0]:
            msg["corrupt"] = self.fault[1]
            self.fault = None
        if (m.addr is not None and not m.no_direct and feeder != m.id
                and next_hop(m.id, feeder) != feeder
                and direct_possible(self.head.site_of, feeder, m.id)):
            # not a tree neighbour: over a direct link, not through the tree
            # (none into a site from outside it: its hosts answer their gateway only)
            msg["port"], msg["addrs"] = m.addr
            if self.no_direct and self.head.name_of(m.id) == self.no_direct:
                msg["port"] = 1         # the test-only fault: nobody listens there
        self.head.send_node(feeder, "feed", msg)

    def on_state(self, src: str, msg: Dict[str, Any]) -> None:
        t = self.transfers.get(msg["bc"])
        m = t.members.get(src) if t is not None else None
        if t is None or m is None or m.error or t.finished:
            return
        if msg["have"] > m.have:
            m.have, m.moved, m.stalled = msg["have"], time.monotonic(), False
        if msg["error"]:
            self._fail(t, m, msg["error"])
        elif msg["bad"]:
            self.head.log("bcast %d: %s got a bad chunk %d from %s; fetching it again"
                                % (t.id, src, m.have, msg["bad"]))
            self._refeed(t, m, avoid=msg["bad"])
        elif msg["done"]:
            m.done = True
            m.have = t.n
        if t.on_progress is not None:
            t.on_progress(t)
        self._check_done(t)

    # -- failures ------------------------------------------------------------------
    def _fail(self, t: Transfer, m: Member, reason: str, gone: bool = False) -> None:
        """m's copy failed (a source still feeds from its file unless it is gone)."""
        m.error = reason
        if gone or not self.head.is_up(m.id):
            m.source = False
        if m.feeder is not None and m.feeder != m.id and self.head.is_up(m.feeder):
            self.head.send_node(m.feeder, "drop", {"bc": t.id, "child": m.id})
        m.feeder = None
        if m.source:
            return
        if self.head.is_up(m.id):
            self.head.send_node(m.id, "stop", {"bc": t.id})
        for child in t.members.values():
            if child.feeder == m.id and child is not m and not child.error and not child.done:
                self._refeed(t, child, avoid=m.id)

    def _refeed(self, t: Transfer, m: Member, avoid: str, around: str = "") -> bool:
        """Feed m from another holder: a replica first, else the most advanced
        node not fed through m (which could never get ahead of it). With
        `around` (a node that fell behind), only a holder whose feed would not
        pass through that node: one on the far side of a gateway whose WAN link
        is merely busy would send the same bytes over that link a second time
        (issue 28); with none, m keeps its feeder. Whether m was fed anew."""
        def fed_through(c: Member) -> bool:
            seen = set()
            while c.feeder is not None and c.feeder != c.id and c.id not in seen:
                seen.add(c.id)
                if c.feeder == m.id:
                    return True
                c = t.members[c.feeder]
            return False
        cands = [c for c in t.members.values()
                 if c is not m and self.head.is_up(c.id) and not fed_through(c)
                 and not c.stalled
                 and (c.source or (not c.error and c.feeder is not None))
                 and not (around and self._passes(t, c.id, m, around))]
        cands.sort(key=lambda c: (c.id == avoid, not c.source, -c.have, depth(c.id)))
        if not cands and around:
            return False
        if not cands:
            self._fail(t, m, "no holder of %s is left to fetch it from" % t.path)
            return True
        old = m.feeder
        if old is not None and old != cands[0].id and self.head.is_up(old):
            self.head.send_node(old, "drop", {"bc": t.id, "child": m.id})
        self._feed(t, m, cands[0].id)
        return True

    def _passes(self, t: Transfer, feeder: str, m: Member, node: str) -> bool:
        """Whether `feeder`'s chunks to m would go through `node`: along the
        tree when no direct link can carry them (m does not listen, or the
        feeder is in another site, where a direct link cannot be made)."""
        direct = (m.addr is not None and not m.no_direct
                  and direct_possible(self.head.site_of, feeder, m.id))
        return not direct and on_path(feeder, m.id, node)

    def node_lost(self, lost: str, reason: str) -> None:
        for t in list(self.transfers.values()):
            if not t.members:
                self._maybe_plan(t)
                continue
            for m in list(t.members.values()):
                if wire.is_descendant(m.id, lost) and (not m.error or m.source):
                    why = ("node lost: %s" % reason if m.id == lost else
                           "node lost with %s: %s" % (self.head.name_of(lost), reason))
                    self._fail(t, m, why, gone=True)
            self._check_done(t)

    def side_failed(self, nid: str, error: str) -> None:
        """The node cannot take part in any transfer: its copies fail (a source
        there feeds no one)."""
        for t in list(self.transfers.values()):
            m = t.members.get(nid)
            if m is not None and (not m.error or m.source):
                self._fail(t, m, error, gone=True)
            self._check_done(t)

    def client_closed(self, client: str) -> None:
        for t in list(self.transfers.values()):
            if t.client == client and not t.members:
                t.error = "interrupted"
                self._finish(t)
            elif t.client == client:
                for m in t.members.values():
                    if not m.error and not m.done and m.target:
                        m.error = "interrupted"
                self._check_done(t)

    # -- the end -------------------------------------------------------------------
    def _check_done(self, t: Transfer) -> None:
        if t.finished or not t.members:
            return
        if all(m.done or m.error for m in t.members.values() if m.target):
            self._finish(t)

    def _finish(self, t: Transfer) -> None:
        t.finished = True
        t.ended = time.monotonic()
        self.transfers.pop(t.id, None)
        for nid in set(t.members) | set(t.sources):
            if self.head.is_up(nid):
                self.head.send_node(nid, "stop", {"bc": t.id})
        t.on_done(t)

    # -- the verb ------------------------------------------------------------------
    def req_bcast(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        if not args["dest"].startswith("/"):
            raise ValueError("bcast: give DEST as an absolute path (got %r)" % args["dest"])
        if not args.get("src_nodes") and not args["src"].startswith("/"):
            raise ValueError("bcast: give a source on the head as an absolute path")
        shell = self.head.service(Shell)
        targets = shell.select_nodes(args.get("mask"), args.get("hosts")) if shell else []
        if not targets:
            raise ValueError("bcast: no node selected")
        if args.get("src_nodes"):
            pat = hostpattern.compile_pattern(args["src_nodes"])
            sources = [n.id for n in self.head.nodes()
                       if n.up and not n.role and any(pat.match(x) for x in n.names())]
            if not sources:
                raise ValueError("bcast: no node matches %r" % args["src_nodes"])
        else:
            sources = [wire.HEAD]
        last = [0.0]

        def progress(t: TransferView) -> None:
            assert isinstance(t, Transfer)
            now = time.monotonic()
            if not args.get("progress") or now - last[0] < PROGRESS_EVERY:
                return
            last[0] = now
            done = sum(1 for m in t.members.values() if m.target and m.done)
            mib = t.bytes_done() / len(t.targets) / (1 << 20)
            self.head.say(cid, req, "\rbcast: %.0f of %.0f MiB, %d of %d nodes done " % (
                mib, t.size / (1 << 20), done, len(t.targets)), end="")

        def done(t: TransferView) -> None:
            assert isinstance(t, Transfer)
            names = {nid: self.head.name_of(nid) for nid in t.targets}
            result = {"nodes": names, "failed": t.failed(), "error": t.error, "bytes": t.size,
                      "seconds": t.ended - t.started, "sha256": t.sha,
                      "plan": {m.id: m.feeder or "" for m in t.members.values()}}
            self.head.reply(cid, req, 1 if (t.error or t.failed()) else 0, result)

        t = self.start(sources, args["src"], targets, args["dest"], done, progress)
        t.client = cid

