"""A job ends when its output has closed and its shell has exited, in either
order (job_runner.py). The exit is watched only when the output closed first
(issue 27: the watch cost every job system calls and a loop event), so both
orders and a kill are checked here, with real shells through a JobRunner."""
from __future__ import annotations

import time

from gxpstyle.node.job_runner import JobRunner
from gxpstyle.transport.event_loop import EventLoop


def _exec(job: int, cmd: str) -> dict:
    return {"op": "exec", "job": job, "cmd": cmd, "cwd": "/", "env": {}, "stdin": False}


def _until_exit(loop: EventLoop, out: list, job: int, bound: float = 10.0) -> dict:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        for _, m in out:
            if m.get("job") == job and m["op"] == "exit":
                return m
        loop.run_once(max_wait=0.2)
    raise AssertionError("job %d never exited" % job)


def _runner():
    loop = EventLoop()
    out: list = []
    return loop, out, JobRunner(loop, "0.1", lambda dst, m: out.append((dst, m)), lambda: 0)


def test_a_shell_that_closes_its_output_first_ends_when_it_exits():
    loop, out, runner = _runner()
    try:
        t0 = time.monotonic()
        runner.start("c1", _exec(1, "exec >&- 2>&-; sleep 0.3; exit 3"))
        got = _until_exit(loop, out, 1)
        assert got["status"] == 3 and time.monotonic() - t0 >= 0.3
        assert not runner.jobs and not loop._pidfds      # its watch went with it
    finally:
        runner.close()
        loop.close()


def test_a_shell_whose_output_outlives_it_ends_when_the_output_closes(tmp_path):
    loop, out, runner = _runner()
    flag = tmp_path / "done"
    try:
        runner.start("c1", _exec(2, "(sleep 0.3; echo late; touch %s) & exit 4" % flag))
        got = _until_exit(loop, out, 2)
        assert got["status"] == 4 and flag.exists()
        assert b"".join(m["data"] for _, m in out if m["op"] == "out") == b"late\n"
    finally:
        runner.close()
        loop.close()


def test_kill_all_ends_as_soon_as_a_job_without_output_exits():
    loop, out, runner = _runner()
    ended = []
    try:
        runner.start("c1", _exec(3, "trap 'exit 5' TERM; exec >&- 2>&-; while :; do sleep 0.05; done"))
        job = runner.jobs[("c1", 3)]
        deadline = time.monotonic() + 5
        while job.open_fds and time.monotonic() < deadline:
            loop.run_once(max_wait=0.05)
        # its output closed after its trap was set: a TERM now ends it with 5
        assert not job.open_fds and job.status is None
        t0 = time.monotonic()
        runner.kill_all(lambda: ended.append(time.monotonic() - t0))
        got = _until_exit(loop, out, 3)
        while not ended:
            loop.run_once(max_wait=0.2)
        assert got["status"] == 5
        assert ended[0] < 0.9      # the shell's exit, not KILL_GRACE (1 s), ended the wait
    finally:
        runner.close()
        loop.close()
