"""sshfsm with a branch host that goes away: every access to it fails with EIO
within the mount's `-o timeout`, later accesses fail at once, the other branches
keep working, and the mount unmounts cleanly afterwards.

The host is killed with its cable cut first (testbed Host.kill(unplug=True)):
peers see neither FIN nor RST, as when a machine loses power, so only a timeout
can end a request. Runs as an ordinary user on a bed of its own (the killed host
does not come back).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_sshfsm import FUSERMOUNT, mounted, mounts, sshfsm_bed, sshfsm_pids, wait_gone  # noqa: E402

BOUND = 3           # the mounts' -o timeout in these tests
SLACK = 10          # generous: a loaded machine, the kernel's own FUSE round trips


@pytest.fixture(scope="module")
def env():
    with sshfsm_bed(["tt01", "tt02", "tt03"], "sft") as e:
        yield e


def timed(env, argv, limit):
    """(result, seconds) of running argv as the user; not finishing within
    `limit` seconds is a failure, never a result."""
    t0 = time.monotonic()
    try:
        r = env.run(argv, timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail("%s did not finish within %ss (a hang)" % (" ".join(argv), limit))
    return r, time.monotonic() - t0


def assert_eio(r):
    assert r.returncode != 0 and r.stderr.rstrip().endswith("Input/output error"), (
        r.returncode, r.stderr)


def test_timeout_option_has_a_checked_range(env):
    mp = env.mkdir()
    for bad in ("0", "3601", "-1", "x", ""):
        r = env.sshfsm("-o", "timeout=" + bad, "tt01:/", mp)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("sshfsm: bad value for option 'timeout'"), r.stderr
        assert "1 to 3600" in r.stderr
    assert not mounted(mp)


def test_unplugged_host_fails_within_the_bound_and_comes_back(env):
    """reconnect: while the host is unreachable, EIO within the bound, then at
    once; once it is back, the same mount reads it again."""
    _, a = env.remote("tt02", {"f1": "one", "f2": "two"})
    local = env.mkdir()
    with open(os.path.join(local, "here"), "w") as f:
        f.write("local")
    host = env.bed.host("tt02")
    with env.mount("-o", "reconnect,timeout=%d" % BOUND, a, local) as mp:
        assert env.sh("cat %s/f1" % mp) == "one"
        host.unplug()
        try:
            time.sleep(0.5)
            r, took = timed(env, ["cat", mp + "/f2"], BOUND + SLACK)
            assert_eio(r)
            assert took >= BOUND - 0.5, took      # it did wait for the host, then gave up
            r, took = timed(env, ["stat", mp + "/f2"], BOUND + SLACK)
            assert_eio(r)
            assert took < 2, "a second access waited %.1fs instead of failing at once" % took
            r, _ = timed(env, ["cat", mp + "/here"], BOUND + SLACK)
            assert (r.returncode, r.stdout) == (0, "local"), r.stderr
        finally:
            host.plug()
        deadline = time.monotonic() + 30
        while True:
            r, _ = timed(env, ["cat", mp + "/f2"], BOUND + SLACK)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert (r.returncode, r.stdout) == (0, "two"), r.stderr


def test_killed_host_gives_eio_within_the_bound_and_unmount_works(env):
    _, a = env.remote("tt01", {"gone": "x" * 100, "sub/deeper": "y"})
    _, b = env.remote("tt03", {"stays": "here"})
    mp = env.mkdir()
    r = env.sshfsm("-o", "timeout=%d" % BOUND, a, b, mp)
    assert r.returncode == 0, r.stderr
    pids = sshfsm_pids(mp)
    try:
        assert env.sh("cat %s/gone %s/stays" % (mp, mp)).endswith("here")
        env.bed.host("tt01").kill(unplug=True)
        r, took = timed(env, ["stat", mp + "/sub/deeper"], BOUND + SLACK)
        assert_eio(r)
        r, took = timed(env, ["cat", mp + "/gone"], BOUND + SLACK)
        assert_eio(r)
        assert took < 2, "a later access waited %.1fs instead of failing at once" % took
        r, _ = timed(env, ["cat", mp + "/stays"], BOUND + SLACK)
        assert (r.returncode, r.stdout) == (0, "here"), r.stderr
        r, took = timed(env, [FUSERMOUNT, "-u", mp], 30)
        assert r.returncode == 0, r.stderr
        assert wait_gone(pids), "sshfsm survived the unmount"
        assert not mounted(mp)
    finally:
        if mounted(mp):
            subprocess.run(["umount", "-l", mp], capture_output=True)


def test_zz_nothing_left_behind(env):
    ours = [(m, o) for m, t, o in mounts() if t == "fuse.sshfsm"
            and "user_id=%d," % env.uid in o + ","]
    assert ours == []
    assert sshfsm_pids(uid=env.uid) == []
