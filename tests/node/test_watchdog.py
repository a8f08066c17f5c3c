"""The job watchdog (job_runner.Watchdog): a shell script that kills the
process groups its agent registered once the agent's pipe closes. It is a
shell, not a Python program, because every node starts one at its first job
(issue 27: a thousand Python watchdogs made the first `gxpc e` after explore
take seconds). Run without a session."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from gxpstyle.node.job_runner import KILL_GRACE, LINES_MAX, WATCHDOG_SOURCE, Watchdog


def _wait_gone(p: subprocess.Popen, seconds: float) -> bool:
    # Popen's own wait: a child of ours is a zombie, still in its group, until reaped.
    try:
        p.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_watchdog_kills_registered_groups_when_its_pipe_closes():
    stubborn = subprocess.Popen(["/bin/sh", "-c", "trap '' TERM; sleep 1000 & sleep 1000; wait"],
                                start_new_session=True)
    polite = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    forgotten = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    dog = Watchdog()
    try:
        for p in (stubborn, polite, forgotten):
            dog.add(p.pid)
        dog.remove(forgotten.pid)      # its group was empty: never signalled again
        # Lines past LINES_MAX: the pipe is rewritten as the groups left, the
        # watchdog (asleep until our end closes) never read them.
        for _ in range(LINES_MAX // 8):
            dog.add(4000001)
            dog.remove(4000001)
        assert 0 < dog.held <= LINES_MAX
        pid = dog.pid
        assert pid is not None
        # Its own session: a kill of the agent's group spares it.
        assert os.getsid(pid) == pid
        t0 = time.monotonic()
        dog.close()
        assert _wait_gone(polite, 5)
        assert _wait_gone(stubborn, KILL_GRACE + 5)
        # SIGTERM at once, SIGKILL for a group that ignores it after the grace.
        assert polite.returncode == -signal.SIGTERM
        assert stubborn.returncode == -signal.SIGKILL
        assert time.monotonic() - t0 >= KILL_GRACE * 0.5
        assert forgotten.poll() is None
    finally:
        dog.close()
        for p in (stubborn, polite, forgotten):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_watchdog_takes_only_group_numbers_over_one(tmp_path):
    # `kill` replaced by a function that logs: "+1" reaching kill would be
    # `kill -TERM -1`, every process of the user.
    log = tmp_path / "kills"
    script = 'kill() { echo "$*" >> %s; }\n%s' % (log, WATCHDOG_SOURCE)
    lines = b"+1\n+0\n+012\n+12x\n+\n*5\n+4000001\n+4000002\n+4000002\n-4000001\n-99\n"
    (tmp_path / "lines").write_bytes(lines)
    # stdin: the agent's end, which says nothing; the lines on its stdout, a read end
    with open(tmp_path / "lines", "rb") as f:
        r = subprocess.run(["/bin/sh", "-c", script, "gxp-watchdog"], input=b"", stdout=f, timeout=30)
    assert r.returncode == 0
    calls = log.read_text().splitlines()
    assert {c.split()[1] for c in calls} == {"-4000002"}
    assert calls[0] == "-TERM -4000002" and calls[1] == "-CONT -4000002"
    assert calls[-1] == "-KILL -4000002"
