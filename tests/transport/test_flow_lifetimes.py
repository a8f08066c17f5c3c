"""No job outlives the agent or the session daemon that started it, even when
that process is SIGKILLed; after any of it, `quit` leaves no process at all.
Local agents, run as the tests' ordinary user."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest


def _environ(pid: int) -> dict:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, _, v = item.partition(b"=")
        env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _comm(pid: int) -> str:
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def marked_sleeps(mark: str) -> dict:
    """{node id: [pids]} of the `sleep` processes whose environment carries mark."""
    out: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if _comm(pid) != "sleep":
            continue
        env = _environ(pid)
        if env.get("FLOWMARK") == mark:
            out.setdefault(env.get("GXP_NODE_ID", "?"), []).append(pid)
    return out


def wait_for(what, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail("%s: not within %gs" % (what, timeout))
        time.sleep(0.05)


def user_processes(gxp) -> list:
    if gxp.user is None:
        return []
    r = subprocess.run(["pgrep", "-u", gxp.user, "-a"], capture_output=True, text=True)
    return r.stdout.splitlines()


def stat_pids(gxp) -> dict:
    """{node id: pid} from `gxpc stat`."""
    pids = {}
    for line in gxp.ok("stat").stdout.splitlines()[1:]:
        if "pid=" in line:
            pids[line.split()[0]] = int(line.split("pid=")[1].split()[0])
    return pids


@pytest.fixture
def mark(gxp):
    m = uuid.uuid4().hex
    yield m
    # Whatever the test did: nothing of ours is left to the next one.
    for pids in marked_sleeps(m).values():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_jobs_die_with_a_killed_agent_and_a_killed_daemon(gxp, mark):
    if gxp.user is None:
        pytest.skip("needs root to run the session as an ordinary user")
    gxp.ok("explore", "--local", "2")
    gxp.ok("export", "FLOWMARK=" + mark)
    p = gxp.popen("e", "sleep 1000 & sleep 1000")
    try:
        wait_for("two sleeps on each of the 3 nodes",
                 lambda: sorted((k, len(v)) for k, v in marked_sleeps(mark).items())
                 == [("0", 2), ("0.1", 2), ("0.2", 2)], 15)
        pids = stat_pids(gxp)
        os.kill(pids["0.1"], signal.SIGKILL)
        wait_for("the killed agent's jobs gone", lambda: "0.1" not in marked_sleeps(mark), 5)
        assert sorted(marked_sleeps(mark)) == ["0", "0.2"]     # the others still run
        os.kill(pids["0"], signal.SIGKILL)
        wait_for("the daemon's and its agents' jobs gone", lambda: marked_sleeps(mark) == {}, 5)
        assert p.wait(timeout=10) == 3          # gxpc says the daemon went away
        assert "closed the connection" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r = gxp.run("quit")
    assert r.returncode == 0, r.stderr
    wait_for("no process of the user left", lambda: user_processes(gxp) == [], 5)


def test_quit_ends_background_jobs_and_watchdogs(gxp, mark):
    if gxp.user is None:
        pytest.skip("needs root to run the session as an ordinary user")
    gxp.ok("explore", "--local", "2")
    gxp.ok("export", "FLOWMARK=" + mark)
    # Output elsewhere: the job reports its exit at once and its sleep lingers.
    t0 = time.monotonic()
    gxp.ok("e", "sleep 1000 >/dev/null 2>&1 &")
    assert time.monotonic() - t0 < 5
    assert sorted(marked_sleeps(mark)) == ["0", "0.1", "0.2"]
    # Every node that ran a job has its watchdog, in its own session.
    assert len([l for l in user_processes(gxp) if "gxp-watchdog" in l]) == 3
    gxp.ok("quit")
    assert marked_sleeps(mark) == {}
    wait_for("no process of the user left", lambda: user_processes(gxp) == [], 5)


def test_quit_kills_a_job_that_ignores_sigterm_within_the_grace(gxp, mark):
    gxp.ok("explore", "--local", "1")
    gxp.ok("export", "FLOWMARK=" + mark)
    p = gxp.popen("e", "trap '' TERM; sleep 1000")
    try:
        wait_for("the sleeps", lambda: len(marked_sleeps(mark)) == 2, 15)
        t0 = time.monotonic()
        gxp.ok("quit")
        assert time.monotonic() - t0 < 6
        assert marked_sleeps(mark) == {}
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
