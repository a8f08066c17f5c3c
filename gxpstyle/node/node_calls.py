"""A job's calls to a role node below its node: made here, not by the head.

An `exec` may carry `before` and `after` (wire.NODE_CALL): a call this node
makes to a role node of its own (a service on the job's host, such as its
mount) before the job starts, and as it ends. The job starts once `before`
is answered (whatever the answer; with a `wait` of 0, at once: its answer
is not waited for); the job's end (`done` to the head, `exit`
to its client, in that order) waits for `after`'s answer, which goes to the
head with `done`. Without them the head would make each call itself: a round
trip between the head and this node on the job's way, twice per job.

Each wait is bounded by the call's `wait` (the service's bound): a role node
that does not answer in time, or is gone, or is not below this node, is
answered for here (ok=False, in words), and the job goes on.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

from gxpstyle.protocol import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    Answer = Dict[str, Any]          # wire.CALL_ANSWER: ok, error, result


class PendingCall:
    __slots__ = ("role", "done", "timer")

    def __init__(self, role: str, done: Callable[[Answer], None]) -> None:
        self.role, self.done, self.timer = role, done, None


class NodeCalls:
    """The calls of jobs on one node (agent.Node.node_calls())."""

    def __init__(self, node: Any) -> None:
        self.node = node
        # apart from the head's own numbers (it is a node too, and its calls
        # to the same role nodes share their replies' op)
        self.seq = 1 << 62
        # (requester, job) of jobs waiting for `before`: their stdin, kill
        # and output credit, in order, for once they start
        self.held: Dict[Tuple[str, int], List[Tuple[str, Dict[str, Any]]]] = {}
        self.pending: Dict[int, PendingCall] = {}
        # (requester, job) -> its `after` call, made when the job ends (also
        # one that never started: the role node may have work for it still)
        self.after: Dict[Tuple[str, int], Dict[str, Any]] = {}

    def start(self, src: str, msg: Dict[str, Any], run: Callable[[], None]) -> None:
        """An exec with calls: keep `after`; run() once `before` is answered."""
        if msg.get("after") is not None:
            self.after[(src, msg["job"])] = msg["after"]
        before = msg.get("before")
        if before is None:
            run()
            return
        if float(before["wait"]) <= 0:      # a word to the role: not waited for
            if self._below(before["node"]):
                self.seq += 1
                self.node.send(before["node"], {"op": "svc", "req": self.seq,
                                                "call": before["call"], "args": before["args"]})
            run()
            return
        key = (src, msg["job"])
        self.held[key] = []

        def started(_answer: Answer) -> None:
            run()
            for op, held in self.held.pop(key, []):
                getattr(self.node, "op_" + op)(src, held, None)
        self.call(before, started)

    def hold(self, src: str, msg: Dict[str, Any]) -> bool:
        """A frame for a job still waiting for `before`: kept (True)."""
        held = self.held.get((src, msg["job"]))
        if held is None:
            return False
        held.append((msg["op"], msg))
        return True

    def ending(self, dst: str, job: int, send: Callable[[Optional[Answer]], None]) -> bool:
        """Job `job` of requester `dst` ended: True if its `after` call is made
        now, send(answer) once answered; False if it has none."""
        spec = self.after.pop((dst, job), None)
        if spec is None:
            return False
        self.call(spec, send)
        return True

    def call(self, spec: Dict[str, Any], done: Callable[[Answer], None]) -> None:
        role = spec["node"]
        if not self._below(role):
            done(_failed("%s is not below node %s" % (role, self.node.id)))
            return
        self.seq += 1
        req = self.seq
        p = self.pending[req] = PendingCall(role, done)
        p.timer = self.node.loop.call_later(float(spec["wait"]), lambda: self._answer(
            req, _failed("%s did not answer %s within %gs" % (role, spec["call"], spec["wait"]))))
        self.node.send(role, {"op": "svc", "req": req, "call": spec["call"], "args": spec["args"]})

    def replied(self, src: str, msg: Dict[str, Any]) -> None:
        """A role node's svc_reply to one of our calls."""
        p = self.pending.get(msg["req"])
        if p is not None and p.role == src:
            self._answer(msg["req"], {"ok": msg["ok"], "error": msg["error"], "result": msg["result"]})

    def lost(self, child: str) -> None:
        """A child is gone: calls to it or below it get no answer."""
        for req, p in list(self.pending.items()):
            if wire.is_descendant(p.role, child):
                self._answer(req, _failed("%s is gone" % p.role))

    def _below(self, role: str) -> bool:
        return wire.is_descendant(role, self.node.id) and role != self.node.id

    def _answer(self, req: int, answer: Answer) -> None:
        p = self.pending.pop(req, None)
        if p is None:
            return
        self.node.loop.cancel(p.timer)
        p.done(answer)


def _failed(error: str) -> Dict[str, Any]:
    return {"ok": False, "error": error, "result": {}}
