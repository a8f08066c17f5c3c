# Commands along the tree (`gxpc e` on many nodes). The head sends one
# `exec_tree` to each of its children, naming every target of that subtree;
# a node runs its own share, passes the rest down (one message a child), and
# folds the exit statuses of its subtree (with `fold`, the output too, as
# `gxpc e -b` shows it) into one `exec_report` to its parent once its whole
# subtree has ended. The head so handles a message per child, not two per
# node (issue 27; ClusterShell's gateways fold the same way). Output that is
# not folded streams straight to the client as a lone `exec`'s does; it goes
# up the same links before the report, so a node's output reaches the client
# before the client hears that the node ended.
#
# A report goes up early when the output it folds grows past REPORT_MAX (then
# the last one says `final`). A lost child ends its part: the head answers for
# the nodes of a lost subtree, as for any job.
#
# Shipped to agents: standard library only, Python 3.8 syntax.
from __future__ import annotations

from gxpstyle.protocol import wire

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional, Tuple

FOLD_MAX = 64 << 10      # a node's own output held for folding; past it, it streams
REPORT_MAX = 1 << 20     # bytes a report folds before it goes up early


class _Share:
    # One tree job on this node: what its subtree has reported so far.
    __slots__ = ("client", "job", "fold", "waiting", "own", "groups", "size", "held", "streamed")

    def __init__(self, client: str, job: int, fold: bool) -> None:
        self.client, self.job, self.fold = client, job, fold
        self.waiting: set = set()     # children whose subtree has not reported its end
        self.own = False              # our own share still runs
        self.groups: Dict[Tuple[int, str, Optional[bytes]], List[str]] = {}
        self.size = 0
        self.held = bytearray()       # our own output while it is folded
        self.streamed = False         # our own output went past FOLD_MAX: it streams


class TreeJobs:

    def __init__(self, node: Any) -> None:
        self.node = node
        self.shares: Dict[Tuple[str, int], _Share] = {}

    def start(self, client: str, msg: Dict[str, Any]) -> None:
        node = self.node
        key = (client, msg["job"])
        if key in self.shares:
            return
        share = self.shares[key] = _Share(client, msg["job"], bool(msg.get("fold")))
        below: Dict[str, Dict[str, Any]] = {}
        lost: List[str] = []
        for nid, env in msg["targets"].items():
            where = wire.route(node.id, nid, node.children) or ""
            if where in node.children:
                below.setdefault(where, {})[nid] = env
            elif where == "unroutable":
                lost.append(nid)
        for child, targets in below.items():
            share.waiting.add(child)
            node.children[child].send(child, client, dict(msg, targets=targets))
        # Out before our own spawn, which holds us until the shell has exec'd:
        # long under a thousand spawns, and every level below waited (issue 27).
        for child in below:
            node.children[child].push()
        if lost:
            self._add(share, 255, "not reachable from %s" % node.name, None, lost)
        mine = msg["targets"].get(node.id)
        if mine is not None:
            env = dict(msg["env"])
            env.update(mine)
            share.own = True
            node.jobs.start(client, {"op": "exec", "job": msg["job"], "cmd": msg["cmd"],
                                     "cwd": msg["cwd"], "env": env, "stdin": msg["stdin"]})
        self._maybe_report(share)

    def intercept(self, dst: str, msg: Dict[str, Any]) -> bool:
        # What our own share's job says (True: kept here, not sent to the client).
        share = self.shares.get((dst, msg["job"]))
        if share is None or not share.own:
            return False
        if msg["op"] == "exit":
            share.own = False
            out = bytes(share.held) if share.fold and not share.streamed else None
            share.held = bytearray()
            self._add(share, msg["status"], msg["error"], out, [self.node.id])
            self._maybe_report(share)
            return True
        if msg["op"] != "out" or not share.fold or share.streamed:
            return False
        share.held += msg["data"]
        if len(share.held) > FOLD_MAX:
            # Too much to hold: what we held goes now, the rest streams.
            share.streamed = True
            self.node.send(dst, {"op": "out", "job": msg["job"], "fd": 1, "data": bytes(share.held)})
            share.held = bytearray()
        return True

    def report(self, src: str, msg: Dict[str, Any]) -> None:
        # A child's report: it speaks only for its own subtree.
        share = self.shares.get((msg["client"], msg["job"]))
        if share is None or src not in share.waiting:
            return
        for g in msg["groups"]:
            nodes = [n for n in g["nodes"] if wire.is_descendant(n, src)]
            if nodes:
                self._add(share, g["status"], g["error"], g.get("out"), nodes)
        if msg["final"]:
            share.waiting.discard(src)
        self._maybe_report(share)

    def child_lost(self, child: str) -> None:
        for share in list(self.shares.values()):
            if child in share.waiting:
                share.waiting.discard(child)
                self._maybe_report(share)

    def _add(self, share: _Share, status: int, error: str, out: Optional[bytes],
             nodes: List[str]) -> None:
        key = (status, error, out)
        group = share.groups.get(key)
        if group is None:
            group = share.groups[key] = []
            share.size += len(error) + len(out or b"") + 16
        group.extend(nodes)
        share.size += sum(len(n) + 2 for n in nodes)

    def _maybe_report(self, share: _Share) -> None:
        if self.shares.get((share.client, share.job)) is not share:
            return     # reported its end already (a job that could not start)
        final = not share.own and not share.waiting
        if not final and share.size <= REPORT_MAX:
            return
        groups = []
        for (status, error, out), nodes in share.groups.items():
            g: Dict[str, Any] = {"status": status, "error": error, "nodes": nodes}
            if out is not None:
                g["out"] = out
            groups.append(g)
        share.groups, share.size = {}, 0
        if final:
            del self.shares[(share.client, share.job)]
        # up; a command the node ran on itself (local_fork.Warming) to itself
        node_id = self.node.id
        to = node_id if share.client == node_id else node_id.rsplit(".", 1)[0]
        self.node.send(to, {"op": "exec_report", "job": share.job, "client": share.client,
                                "groups": groups, "final": final})
