"""Elastic pools of batch agents (issue 27): a `use` rule with `--elastic
MIN-MAX` on the real local Slurm grows while `gxpc make`'s recipes wait for a
slot, shrinks to MIN once its agents idle, cancels what is still queued, and
never places a recipe on an agent it is releasing."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import tempfile
import time

import batch_queue
import pytest

pytestmark = pytest.mark.slurm

PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def slurm():
    if os.getuid() != 0:
        pytest.skip("starting Slurm needs root")
    missing = batch_queue.missing_binaries()
    if missing:
        pytest.skip("missing: %s" % missing)
    s = batch_queue.LocalSlurm()
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def workdir(gxp):
    """A directory of the test's user, on this host (every agent is a job here)."""
    d = tempfile.mkdtemp(prefix="gxpelastic-", dir="/var/tmp")
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _makefile(gxp, d: str, sub: str, count: int, recipe: str) -> str:
    path = os.path.join(d, sub)
    os.mkdir(path)
    with open(os.path.join(path, "Makefile"), "w") as f:
        f.write("all: %s\nt%%:\n\t%s\n" % (" ".join("t%d" % i for i in range(1, count + 1)), recipe))
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        for p in (path, os.path.join(path, "Makefile")):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    return path


def _jobs(slurm, user):
    r = slurm.run(["squeue", "-h", "-u", user, "-o", "%i %T"], check=False)
    return [line for line in r.stdout.splitlines() if line.strip()]


def _pool(gxp):
    """(up, pending, leaving) of the one pool, from `gxpc stat`."""
    out = gxp.ok("stat").stdout
    m = re.search(r"^elastic \S+ \S+ \S+ \d+-\d+: (\d+) up, (\d+) pending, (\d+) leaving", out, re.M)
    assert m, out
    return tuple(int(x) for x in m.groups())


def _until(what, check, seconds):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, "%s: not within %ss" % (what, seconds)
            return value
        time.sleep(0.2)


def test_pool_grows_with_make_and_ends_empty(slurm, gxp, workdir):
    """40 recipes of 2 s at -j40, rule 0-8: the pool grows past one agent and
    never past 8, make's results are plain make's, and after the idle time the
    pool is 0 with nothing of ours in the queue."""
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", "slurm", "head", "el[[1-8]]", "--python", PYTHON, "--connect-host", "127.0.0.1",
           "--elastic", "0-8", "--elastic-wait", "0.5", "--elastic-idle", "2", env=env)
    assert "elastic=0-8" in gxp.ok("use").stdout
    gxp.ok("explore", "el[[1-8]]")           # MIN is 0: nothing starts
    assert _pool(gxp) == (0, 0, 0)
    recipe = "sleep 2; echo $@ > $@"
    plain = _makefile(gxp, workdir, "plain", 40, recipe)
    ours = _makefile(gxp, workdir, "ours", 40, recipe)
    want = gxp.bed.run_as(gxp.user, ["make", "-s", "-j40"], env=gxp.env(), cwd=plain,
                          capture_output=True, text=True, timeout=60)
    trace = os.path.join(ours, "trace.json")
    # --shared: the agents' jobs run on this host and see /var/tmp as we do
    r = gxp.run("make", "--shared", "-s", "-j40", "--trace=%s" % trace, cwd=ours, timeout=120)
    assert (r.returncode, r.stdout) == (want.returncode, want.stdout), r.stderr
    assert sorted(os.listdir(plain)) == sorted(n for n in os.listdir(ours) if n != "trace.json")
    for i in range(1, 41):
        with open(os.path.join(ours, "t%d" % i)) as f:
            assert f.read() == "t%d\n" % i
    with open(trace) as f:
        records = [json.loads(line) for line in f]
    pool = [x for x in records if x["kind"] == "pool"]
    recipes = [x for x in records if x["kind"] == "recipe"]
    assert len(recipes) == 40 and all(x["status"] == 0 for x in recipes)
    peak = max(x["up"] for x in pool)
    assert 1 < peak <= 8, pool
    assert sum(1 for x in pool if x["event"] == "submit") <= 8
    on_agents = {x["node"] for x in recipes} - {"head"}
    assert len(on_agents) > 1 and all(n.startswith("el") for n in on_agents), on_agents
    # the idle threshold after make: every agent released, nothing queued
    _until("pool back to 0", lambda: _pool(gxp) == (0, 0, 0), 30)
    _until("nothing of ours in the queue", lambda: _jobs(slurm, gxp.user) == [], 15)
    out = gxp.ok("stat").stdout
    assert not any(" [slurm] " in line for line in out.splitlines()), out
    gxp.ok("quit")
    assert _jobs(slurm, gxp.user) == []


def test_agent_being_released_never_gets_a_recipe(slurm, gxp, workdir):
    """A release held between the mark and the quit (GXP_TEST_ELASTIC_HOLD):
    the agents show as leaving, alive and idle, and a make whose recipes wait
    for slots runs every recipe elsewhere; the pool does not grow past MAX
    with them either. Then they quit and the queue is empty."""
    env = {"SLURM_CONF": slurm.conf_path, "GXP_TEST_ELASTIC_HOLD": "12"}
    gxp.ok("use", "slurm", "head", "lv[[1-2]]", "--python", PYTHON, "--connect-host", "127.0.0.1",
           "--elastic", "0-2", "--elastic-wait", "0", "--elastic-idle", "0.5", env=env)
    grow = _makefile(gxp, workdir, "grow", 8, "sleep 3; echo $$GXP_NODE_ID > $@")
    gxp.ok("make", "--shared", "-s", "-j8", cwd=grow, timeout=120)
    ran_on = set()
    for i in range(1, 9):
        with open(os.path.join(grow, "t%d" % i)) as f:
            ran_on.add(f.read().strip())
    assert ran_on - {"0"}, "the pool never grew: %s" % ran_on
    _until("both agents leaving", lambda: _pool(gxp) == (0, 0, 2), 15)
    leaving = [line for line in gxp.ok("stat").stdout.splitlines() if "LEAVING:" in line]
    assert len(leaving) == 2 and all("released by its elastic pool" in x for x in leaving), leaving
    assert len(_jobs(slurm, gxp.user)) == 2          # alive: their jobs still run
    # 6 recipes for the head's slots only: 4 wait, the leaving agents are free
    again = _makefile(gxp, workdir, "again", 6, "sleep 0.5; echo $$GXP_NODE_ID > $@")
    gxp.ok("make", "--shared", "-s", "-j6", cwd=again, timeout=60)
    assert _pool(gxp) == (0, 0, 2), "the hold ended before the make did: the check proves nothing"
    for i in range(1, 7):
        with open(os.path.join(again, "t%d" % i)) as f:
            assert f.read().strip() == "0", "recipe t%d ran on a leaving agent" % i
    assert gxp.ok("e", "echo $GXP_NODE_ID").stdout.split() == ["0"]    # nor a command
    _until("the released agents gone", lambda: _pool(gxp) == (0, 0, 0), 30)
    _until("nothing of ours in the queue", lambda: _jobs(slurm, gxp.user) == [], 15)


def test_queued_jobs_are_cancelled_at_quit(slurm, gxp, workdir):
    """Jobs the scheduler holds never start: a make's demand leaves them in
    the queue while it runs, its end cancels them, and so does quit."""
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", "slurm", "head", "hq[[1-3]]", "--python", PYTHON, "--connect-host", "127.0.0.1",
           "--batch-option=--hold", "--elastic", "0-3", "--elastic-wait", "0", env=env)
    slow = _makefile(gxp, workdir, "slow", 5, "sleep 4; echo $@ > $@")
    p = gxp.popen("make", "--shared", "-s", "-j5", cwd=slow)
    try:
        _until("three jobs queued", lambda: len(_jobs(slurm, gxp.user)) == 3, 15)
        assert _pool(gxp) == (0, 3, 0)
    finally:
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    _until("make's end cancelled them", lambda: _jobs(slurm, gxp.user) == [], 15)
    assert _pool(gxp) == (0, 0, 0)
    # and at quit, with a make still waiting
    p = gxp.popen("make", "--shared", "-s", "-j5", "-B", cwd=slow)
    try:
        _until("queued again", lambda: len(_jobs(slurm, gxp.user)) == 3, 15)
        r = gxp.run("quit")
        assert r.returncode == 0, r.stderr
    finally:
        p.communicate(timeout=60)
    assert _jobs(slurm, gxp.user) == []


@pytest.mark.parametrize("channel", ["slurm", "torque"])
def test_explore_starts_min_and_the_pool_keeps_it(slurm, gxp, workdir, channel):
    """`gxpc explore` of a pool's names starts MIN agents; the pool grows past
    them for a make and shrinks back to MIN, never below; quit ends them
    (torque: qsub and qdel, Debian's wrappers over this Slurm)."""
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", channel, "head", "mn[[1-3]]", "--python", PYTHON, "--connect-host", "127.0.0.1",
           "--elastic", "1-3", "--elastic-wait", "0", "--elastic-idle", "0.5", env=env)
    r = gxp.ok("explore", "mn[[1-3]]", "--timeout", "40", "-v")
    assert _pool(gxp) == (1, 0, 0), r.stderr
    assert gxp.stat_nodes().get("mn1") == "up"
    work = _makefile(gxp, workdir, "work", 8, "sleep 2; echo $$GXP_NODE_ID > $@")
    gxp.ok("make", "--shared", "-s", "-j8", cwd=work, timeout=120)
    ran_on = set()
    for i in range(1, 9):
        with open(os.path.join(work, "t%d" % i)) as f:
            ran_on.add(f.read().strip())
    assert len(ran_on - {"0"}) >= 2, ran_on         # mn1 and at least one grown agent
    _until("back to MIN", lambda: _pool(gxp) == (1, 0, 0), 30)
    _until("one job left", lambda: len(_jobs(slurm, gxp.user)) == 1, 15)
    # the queue ends the last agent (a wall time, scancel): MIN brings another
    first = _jobs(slurm, gxp.user)[0].split()[0]
    slurm.cancel(first)
    _until("MIN again", lambda: _pool(gxp) == (1, 0, 0) and
           [j.split()[0] for j in _jobs(slurm, gxp.user)] not in ([], [first]), 30)
    gxp.ok("quit")
    _until("quit ended it", lambda: _jobs(slurm, gxp.user) == [], 10)


def test_explore_starts_min_behind_a_gateway_it_brings_up(slurm, gxp):
    """A pool whose jobs a gateway submits, explored in the same command as
    the gateway: its MIN agents start once the gateway is up, under it (an
    agent writes the connect-back code it was shipped into the job script)."""
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", "local", "head", "gw1", env=env)
    gxp.ok("use", "slurm", "gw1", "bq[[1-2]]", "--python", PYTHON, "--connect-host", "127.0.0.1",
           "--elastic", "2-2")
    r = gxp.ok("explore", "gw1", "bq[[1-2]]", "--timeout", "40")
    assert _pool(gxp) == (2, 0, 0), r.stderr
    rows = [line.split() for line in gxp.ok("stat").stdout.splitlines()[2:]]
    ids = {row[1]: row[0] for row in rows if len(row) > 1}
    assert ids["bq1"].rsplit(".", 1)[0] == ids["gw1"] == ids["bq2"].rsplit(".", 1)[0], rows
    gxp.ok("quit")
    _until("quit ended them", lambda: _jobs(slurm, gxp.user) == [], 10)
