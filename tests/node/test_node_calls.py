"""A job's calls to a role node below its node (node/node_calls.py) and the
head's side of them (JobTable.start's calls_for, `done` with the answer):
the job starts once `before` is answered and its frames wait meanwhile;
`after` is made as it ends and its answer goes to the head with the end; a
role node that does not answer in time, is gone, or is not below the node
is answered for. Every message is checked against the wire schema. The real
use (a GMount recipe) is tested in tests/gmount/ and tests/make/ (issue 26)."""
from __future__ import annotations

import time

from gxpstyle.api import services
from gxpstyle.api.head_api import JobCalls, NodeCall
from gxpstyle.head.job_table import JobTable
from gxpstyle.node.node_calls import NodeCalls
from gxpstyle.protocol import wire
from gxpstyle.transport.event_loop import EventLoop


class _Node:
    """What NodeCalls uses of agent.Node: id, loop, send, and the ops it replays."""

    def __init__(self) -> None:
        self.id = "0.3"
        self.loop = EventLoop()
        self.sent: list = []
        self.replayed: list = []

    def send(self, dst: str, msg: dict) -> None:
        wire.validate(msg)
        self.sent.append((dst, msg))

    def op_stdin(self, src: str, msg: dict, link) -> None:
        self.replayed.append((src, msg["op"]))

    def op_kill(self, src: str, msg: dict, link) -> None:
        self.replayed.append((src, msg["op"]))


def _exec(job: int, **calls) -> dict:
    msg = {"op": "exec", "job": job, "cmd": "true", "cwd": None, "env": {}, "stdin": False,
           "notify": True}
    msg.update(calls)
    return wire.validate(msg)


def _call(node: str, call: str, wait: float = 5.0) -> dict:
    return {"node": node, "call": call, "args": {"x": 1}, "wait": wait}


def _reply(node: _Node, calls: NodeCalls, ok: bool = True, result=None) -> None:
    dst, msg = node.sent.pop(0)
    assert msg["op"] == "svc"
    calls.replied(dst, {"op": "svc_reply", "req": msg["req"], "ok": ok, "error": "",
                        "result": result or {}})


def test_a_job_starts_once_before_is_answered_and_its_frames_wait_for_it():
    node = _Node()
    calls = NodeCalls(node)
    started = []
    calls.start("c1", _exec(7, before=_call("0.3.1", "ready")), lambda: started.append(7))
    assert started == [] and node.sent[0][0] == "0.3.1" and node.sent[0][1]["call"] == "ready"
    assert calls.hold("c1", {"op": "stdin", "job": 7, "data": b"x", "eof": False})
    assert calls.hold("c1", {"op": "kill", "job": 7, "sig": 15})
    assert not calls.hold("c1", {"op": "stdin", "job": 8, "data": b"", "eof": True})
    _reply(node, calls)
    assert started == [7] and node.replayed == [("c1", "stdin"), ("c1", "kill")]
    assert not calls.hold("c1", {"op": "stdin", "job": 7, "data": b"", "eof": True})


def test_a_before_with_no_wait_is_sent_and_the_job_starts_at_once():
    node = _Node()
    calls = NodeCalls(node)
    started = []
    calls.start("c1", _exec(5, before=_call("0.3.1", "ready", wait=0)), lambda: started.append(5))
    assert started == [5] and node.sent[0][1]["call"] == "ready"
    assert not calls.hold("c1", {"op": "kill", "job": 5, "sig": 15})    # it runs: nothing held
    _reply(node, calls)             # its answer is dropped
    calls.start("c1", _exec(6, before=_call("0.4.1", "ready", wait=0)), lambda: started.append(6))
    assert started == [5, 6] and node.sent == []      # not below this node: not sent


def test_after_is_made_as_the_job_ends_and_its_answer_goes_up():
    node = _Node()
    calls = NodeCalls(node)
    calls.start("c1", _exec(3, after=_call("0.3.1", "changed")), lambda: None)
    assert node.sent == []          # nothing before the job
    got = []
    assert not calls.ending("c1", 4, got.append)        # another job: no call
    assert calls.ending("c1", 3, got.append)
    assert got == []
    _reply(node, calls, result={"files": [["a", 1]]})
    assert got == [{"ok": True, "error": "", "result": {"files": [["a", 1]]}}]
    assert not calls.ending("c1", 3, got.append)        # made once


def test_a_job_that_left_the_generation_file_alone_costs_the_role_nothing(tmp_path):
    # issue 26: a recipe that changed nothing in the mount needs neither its
    # notice nor its description (gxpc make of trivial recipes in a GMount)
    gen = tmp_path / "generation"
    gen.write_bytes(b"id-1")
    node = _Node()
    calls = NodeCalls(node)

    def job(n: int) -> tuple:
        before = _call("0.3.1", "ready", wait=0)     # the `after` names the file
        after = dict(_call("0.3.1", "changed"), unless=str(gen))
        calls.start("c1", _exec(n, before=before, after=after), lambda: None)
        return before, after

    job(1)                          # nothing known yet: the notice goes
    assert [m["call"] for _, m in node.sent] == ["ready"]
    node.sent.clear()
    got: list = []
    assert calls.ending("c1", 1, got.append)
    assert [m["call"] for _, m in node.sent] == ["changed"]      # its notice went: made
    _reply(node, calls)
    job(2)                          # the last job left it unchanged: no notice
    assert node.sent == []
    assert calls.ending("c1", 2, got.append) and node.sent == []
    assert got[-1] == {"ok": True, "error": "", "result": {"unchanged": True}}
    job(3)
    gen.write_bytes(b"id-2")        # the role changed something meanwhile
    assert calls.ending("c1", 3, got.append)
    assert [m["call"] for _, m in node.sent] == ["changed"]
    _reply(node, calls)
    job(4)                          # the last one changed it: the notice goes again
    assert [m["call"] for _, m in node.sent] == ["ready"]
    node.sent.clear()
    gen.unlink()                    # unreadable: the call is made
    assert calls.ending("c1", 4, got.append) and [m["call"] for _, m in node.sent] == ["changed"]


def test_a_role_that_does_not_answer_in_time_is_answered_for():
    node = _Node()
    calls = NodeCalls(node)
    calls.start("c1", _exec(1, after=_call("0.3.1", "changed", wait=0.05)), lambda: None)
    got = []
    calls.ending("c1", 1, got.append)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        node.loop.run_once(max_wait=0.05)
    assert got and got[0]["ok"] is False and "did not answer changed within" in got[0]["error"]
    _reply(node, calls)             # a late answer changes nothing
    assert len(got) == 1


def test_a_role_gone_or_not_below_the_node_is_answered_for():
    node = _Node()
    calls = NodeCalls(node)
    got = []
    calls.call(_call("0.4.1", "ready"), got.append)       # another node's child
    assert got[0]["ok"] is False and "not below node 0.3" in got[0]["error"] and node.sent == []
    calls.call(_call("0.3.1", "ready"), got.append)
    calls.lost("0.3.1")
    assert got[1] == {"ok": False, "error": "0.3.1 is gone", "result": {}}


class _Head:
    def __init__(self) -> None:
        self.sent = []

    def route_frame(self, nid, frame, link) -> None:
        _, src, body = wire.split_frame(frame[4:])
        self.sent.append((nid, wire.decode_message(body)))

    def deliver_to_client(self, client, src, msg) -> None:
        pass


class _Owner(services.Service):
    def __init__(self, head, events: list) -> None:
        super().__init__(head)
        self.events = events

    def job_done(self, client, job, node, status, error) -> None:
        self.events.append(("done", job, status))


def _table() -> tuple:
    head = _Head()
    events: list = []
    return head, JobTable(head), events, _Owner(head, events)  # type: ignore[arg-type]


def test_the_head_sends_the_calls_and_hears_the_answer_before_job_done():
    head, table, events, owner = _table()
    calls = JobCalls(before=NodeCall("0.3.1", "ready", {}, 5.0),
                     after=NodeCall("0.3.1", "changed", {"paths": ["a"]}, 5.0),
                     after_answered=lambda *a: events.append(("answer",) + a))
    table.start(owner, "c", 1, ["0.3"], "true", lambda n, i: {}, lambda n: None,
                calls_for=lambda n: calls)
    msg = head.sent[-1][1]
    assert msg["before"]["call"] == "ready" and msg["after"]["args"] == {"paths": ["a"]}
    table.done("0.3", "c", 1, 0, "", {"ok": True, "error": "", "result": {"n": 1}})
    assert events == [("answer", 0, True, "", {"n": 1}), ("done", 1, 0)]
    # a node that sent no answer: ok False, and job_done still comes
    table.start(owner, "c", 2, ["0.3"], "true", lambda n, i: {}, lambda n: None,
                calls_for=lambda n: calls)
    table.done("0.3", "c", 2, 1, "")
    assert events[2][:3] == ("answer", 1, False) and events[3] == ("done", 2, 1)


def test_an_answer_after_the_client_went_away_still_reaches_its_service():
    head, table, events, owner = _table()
    calls = JobCalls(after=NodeCall("0.3.1", "changed", {}, 5.0),
                     after_answered=lambda *a: events.append(("answer",) + a))
    table.start(owner, "c", 1, ["0.3"], "true", lambda n, i: {}, lambda n: None,
                calls_for=lambda n: calls)
    table.client_closed("c")
    assert events == [("done", 1, 255)]
    table.done("0.3", "c", 1, 137, "", {"ok": True, "error": "", "result": {"copies": []}})
    assert events[1] == ("answer", 137, True, "", {"copies": []})
