"""A job's environment by base: the head sends a make's environment to each
node once (JobTable.start with base_for) and each recipe only what it changes;
the node keeps the bases in the order the head forgets them (job_runner.py).
Runs real shells through a JobRunner, without a session."""
from __future__ import annotations

import time

from gxpstyle.api import services
from gxpstyle.head.job_table import JobTable
from gxpstyle.node.job_runner import ENV_BASES, JobRunner
from gxpstyle.protocol import wire
from gxpstyle.transport.event_loop import EventLoop


class _Head:
    """What JobTable.start needs of the head: the frames it routes."""

    def __init__(self) -> None:
        self.sent = []

    def route_frame(self, nid, frame, link) -> None:
        _, src, body = wire.split_frame(frame[4:])    # after its length prefix
        self.sent.append((src, wire.decode_message(body)))


def _run(runner: JobRunner, loop: EventLoop, out: list, src: str, msg: dict) -> dict:
    """Start one exec on the runner; (status, error, stdout) once it exits."""
    runner.start(src, msg)
    got = {"out": b""}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        while out:
            _, m = out.pop(0)
            if m.get("job") == msg["job"] and m["op"] == "out":
                got["out"] += m["data"]
            if m.get("job") == msg["job"] and m["op"] == "exit":
                got.update(status=m["status"], error=m["error"])
                return got
        loop.run_once(max_wait=0.2)
    raise AssertionError("job %d never exited" % msg["job"])


def test_a_make_environment_goes_to_each_node_once_and_recipes_send_what_differs():
    head = _Head()
    table = JobTable(head)  # type: ignore[arg-type]
    owner = services.Service(head)   # type: ignore[arg-type]
    base = {"A": "base-a", "B": "base-b", "HOME": None}

    def start(job: int, node: str, env: dict, key="k1") -> dict:
        table.start(owner, "1", job, [node], "echo $A $B ${HOME-unset}", lambda n, i: env,
                    lambda n: "/", base_for=lambda n: (key, dict(base, NODE=n)))
        return head.sent[-1][1]

    first = start(1, "0.1", {})
    assert first["base_env"] == dict(base, NODE="0.1") and first["env"] == {}
    again = start(2, "0.1", {"B": "mine"})
    assert "base_env" not in again and again["base"] == first["base"] and again["env"] == {"B": "mine"}
    other = start(3, "0.2", {})
    assert other["base_env"] == dict(base, NODE="0.2")     # each node gets its own once

    loop = EventLoop()
    out: list = []
    runner = JobRunner(loop, "0.1", lambda dst, m: out.append((dst, m)), lambda: 0)
    try:
        assert _run(runner, loop, out, "1", first)["out"] == b"base-a base-b unset\n"
        assert _run(runner, loop, out, "1", again)["out"] == b"base-a mine unset\n"
        # the head forgets bases in the node's order: after ENV_BASES others,
        # the first is sent again, and the node has room for every one
        for k in range(ENV_BASES):
            msg = start(10 + k, "0.1", {}, key=("other", k))
            assert "base_env" in msg
            assert _run(runner, loop, out, "1", msg)["status"] == 0
        back = start(100, "0.1", {})
        assert "base_env" in back and back["base"] != first["base"]
        assert _run(runner, loop, out, "1", back)["out"] == b"base-a base-b unset\n"
        # a base the node never got fails the job in one line, never runs it bare
        lost = dict(again, job=101, base=10 ** 9)
        got = _run(runner, loop, out, "1", lost)
        assert got["status"] == 127 and "environment was not sent" in got["error"]
    finally:
        runner.close()
        loop.close()


def test_a_service_kills_its_job_where_it_still_runs_and_held_input_is_dropped():
    head = _Head()
    head.dests = []
    route = head.route_frame

    def route_frame(nid, frame, link):
        head.dests.append(nid)
        route(nid, frame, link)
    head.route_frame = route_frame
    table = JobTable(head)  # type: ignore[arg-type]
    owner = services.Service(head)   # type: ignore[arg-type]
    table.start(owner, "c1", 1, ["0.1", "0.2"], "sleep 9", lambda n, i: {}, lambda n: None)
    table.done("0.1", "c1", 1, 0, "")
    table.kill("c1", 1, 15)
    assert head.dests[-1] == "0.2" and head.sent[-1][1] == {"op": "kill", "job": 1, "sig": 15}
    table.announce("c1", 2)                     # heard of, not started: nothing to signal
    assert table.hold("c1", 2, "0.1", b"frame")
    table.kill("c1", 2, 15)
    assert not table.hold("c1", 2, "0.1", b"frame") and head.dests[-1] == "0.2"
