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

An `after` may name a generation file (`unless`): bytes the role node
changes with every change of its own (a mount: each file system call that
changes something). A job that changed nothing there needs neither word:
the `after` is not made when the file reads the same at the job's end as at
its start (answered here: {"unchanged": True}), and the job's `before` of
wait 0 is not sent while the last job that named the file saw it unchanged
(so a run of quiet jobs costs the role node nothing). The `after` of a job
whose `before` was sent is always made (the role node waits for it).

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os

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
        # one that never started: the role node may have work for it still),
        # with its generation file, what it read at the start, and whether
        # the call may be left out (no `before` went to the role node)
        self.after: Dict[Tuple[str, int], Tuple[Dict[str, Any], str, Optional[bytes], bool]] = {}
        # generation file -> the last job naming it left it unchanged
        self.quiet: Dict[str, bool] = {}

    def start(self, src: str, msg: Dict[str, Any], run: Callable[[], None]) -> None:
        """An exec with calls: keep `after`; run() once `before` is answered."""
        before, after = msg.get("before"), msg.get("after")
        path = (after.get("unless") or "") if after is not None else ""
        skip = before is not None and float(before["wait"]) <= 0 and bool(self.quiet.get(path))
        if after is not None:
            self.after[(src, msg["job"])] = (after, path, _generation(path) if path else None,
                                             before is None or skip)
        if before is None:
            run()
            return
        if float(before["wait"]) <= 0:      # a word to the role: not waited for
            if self._below(before["node"]) and not skip:
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
        kept = self.after.pop((dst, job), None)
        if kept is None:
            return False
        spec, path, at_start, optional = kept
        if path:
            unchanged = at_start is not None and _generation(path) == at_start
            self.quiet[path] = unchanged
            if unchanged and optional:
                send({"ok": True, "error": "", "result": {"unchanged": True}})
                return True
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


def _generation(path: str) -> Optional[bytes]:
    """The generation file's bytes; None if it cannot be read (the call is
    then made). Opened each time: a role node started again writes a new
    file, which a kept descriptor would not see."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 64)
    except OSError:
        return None
    finally:
        os.close(fd)


def _failed(error: str) -> Dict[str, Any]:
    return {"ok": False, "error": error, "result": {}}
