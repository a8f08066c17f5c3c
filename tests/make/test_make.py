"""`gxpc make` on local agents, as an ordinary user: the same files, exit codes
and recipe output as plain GNU make, recipes spread over the nodes, Ctrl-C
reaching every remote recipe, and the fallbacks (no session, no node).
The test-bed case (recipes on other hosts, on the GMount) is in test_gmount.py.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

CASES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "make_cases")
# (case, make arguments)
RUNS = [
    ("patterns", ["-j4"]),
    ("oneshell", ["-j2"]),
    ("genincl", ["-j2"]),
    ("recursive", ["-j4"]),
    ("failing", ["-k", "-j4"]),
    ("failing", ["-j1"]),
    ("patterns", ["-n"]),
]


@pytest.fixture
def workdir(gxp):
    """A directory of the test's user (pytest's tmp_path is root's)."""
    d = tempfile.mkdtemp(prefix="gxpmake-", dir="/var/tmp")
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _copy_case(gxp, case: str, dst: str) -> None:
    shutil.copytree(os.path.join(CASES, case), dst)
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        for root, _dirs, files in os.walk(dst):
            for n in [root] + [os.path.join(root, f) for f in files]:
                os.chown(n, pw.pw_uid, pw.pw_gid)


def _tree(d: str) -> dict:
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def _lines(text: str, d: str) -> list:
    return sorted(text.replace(d, "DIR").splitlines())


def _run(gxp, argv, cwd):
    if gxp.user:
        return gxp.bed.run_as(gxp.user, argv, env=gxp.env(), cwd=cwd, capture_output=True,
                              text=True, timeout=120)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case,args", RUNS, ids=["%s%s" % (c, "".join(a)) for c, a in RUNS])
def test_same_as_plain_make(gxp, workdir, case, args):
    gxp.ok("explore", "--local", "3")
    plain, ours = os.path.join(workdir, "plain"), os.path.join(workdir, "ours")
    _copy_case(gxp, case, plain)
    _copy_case(gxp, case, ours)
    want = _run(gxp, ["make"] + args, plain)
    got = gxp.run("make", *args, cwd=ours)
    assert got.returncode == want.returncode, got.stderr
    assert _tree(ours) == _tree(plain)
    assert _lines(got.stdout, ours) == _lines(want.stdout, plain)
    assert _lines(got.stderr, ours) == _lines(want.stderr, plain)


def test_recipes_spread_over_nodes_and_see_make_environment(gxp, workdir):
    gxp.ok("explore", "--local", "3")
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("export GREETING = hello from make\n"
                "T := $(addprefix t,1 2 3 4 5 6)\n"
                "all: $(T)\n"
                "t%:\n\t@sleep 0.5; echo \"$$GXP_NODE_ID $$GREETING\" > $@\n")
    os.chmod(os.path.join(workdir, "Makefile"), 0o644)
    gxp.ok("make", "-j6", cwd=workdir)
    made = [open(os.path.join(workdir, "t%d" % i)).read().split(" ", 1) for i in range(1, 7)]
    assert {m[1] for m in made} == {"hello from make\n"}
    assert len({m[0] for m in made}) >= 3, made   # 4 nodes (head + 3), 6 recipes at once


def test_ctrl_c_stops_make_and_every_remote_recipe(gxp, workdir):
    gxp.ok("explore", "--local", "2")
    marker = "gxp-make-sleep-%d" % os.getpid()
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("all: a b c\na b c:\n\tsleep 300; : %s; touch $@\n" % marker)
    p = gxp.popen("make", "-j3", cwd=workdir, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = subprocess.run(["pgrep", "-f", "^/bin/sh -c sleep 300; : %s" % marker],
                           capture_output=True, text=True)
        if len(r.stdout.split()) == 3:
            break
        time.sleep(0.05)
    else:
        p.kill()
        pytest.fail("the three recipes did not start")
    os.killpg(p.pid, signal.SIGINT)   # what the terminal does on Ctrl-C
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", marker]).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert subprocess.run(["pgrep", "-f", marker]).returncode == 1
    assert not any(os.path.exists(os.path.join(workdir, t)) for t in "abc")


def test_fallbacks_and_errors_are_one_line(gxp, workdir):
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("all:\n\t@echo ran on $${GXP_NODE_ID:-here}\n")
    # no session: make runs here and says so once
    r = gxp.run("make", cwd=workdir)
    assert r.returncode == 0 and r.stdout == "ran on here\n"
    assert r.stderr.count("gxpc make:") == 1 and "no session" in r.stderr
    assert not gxp.daemon_pids()
    # a session with only the head: same
    gxp.ok("use", "local", "head", "nobody")
    r = gxp.run("make", cwd=workdir)
    assert r.returncode == 0 and "no node explored" in r.stderr
    gxp.ok("explore", "--local", "1")
    r = gxp.run("make", "--local", cwd=workdir)
    assert r.returncode == 0 and r.stdout == "ran on here\n" and r.stderr == ""
    r = gxp.run("make", "-f", "no-such.mk", cwd=workdir)
    assert r.returncode == 2 and "no-such.mk" in r.stderr and "No such file" in r.stderr
    r = gxp.run("make", "--help")
    assert r.returncode == 0 and "usage: gxpc make" in r.stdout
    assert re.search(r"make --help", r.stdout)


def test_a_node_lost_mid_recipe_runs_the_recipe_again_elsewhere(gxp, workdir):
    gxp.ok("explore", "--local", "2")
    gxp.run("e", 'test "$GXP_NODE_ID" != 0')
    gxp.ok("smask")                     # agents only: the head cannot be killed here
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("out:\n\techo $$GXP_NODE_ID >> attempts; sleep 4; echo made > $@\n")
    p = gxp.popen("make", cwd=workdir)
    attempts = os.path.join(workdir, "attempts")
    deadline = time.monotonic() + 20
    while not (os.path.exists(attempts) and open(attempts).read().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    first = open(attempts).read().split()[0]
    pids = {line.split()[0]: int(line.rsplit("pid=", 1)[1].split()[0])
            for line in gxp.ok("stat").stdout.splitlines()[1:] if "pid=" in line}
    os.kill(pids[first], signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "running it again on another node" in err and err.count("gxpc make:") == 1
    tried = open(attempts).read().split()
    assert len(tried) == 2 and tried[0] == first and tried[1] != first
    assert open(os.path.join(workdir, "out")).read() == "made\n"
