"""The explorer on real sshd hosts in network namespaces, as an ordinary user.

The project's checkout and its venv are hidden on every test-bed host (an empty
tmpfs over them), so these tests prove nothing needs to be preinstalled. The
user's ~/.bashrc prints to stdout and stderr, like many real login scripts.
"""
import os
import signal
import socket
import subprocess
import time
import uuid

import pytest
from conftest import REPO, venv_dir

import testbed

pytestmark = pytest.mark.testbed

HOSTS = ["tb%02d" % i for i in range(1, 21)]
NO_PYTHON = {"tb17", "tb18"}
DOWN = {"tb19", "tb20"}
NOISY_BASHRC = 'echo "Welcome to $(hostname)"\necho "login notice" >&2\n'


@pytest.fixture(scope="module")
def bed():
    if os.getuid() != 0:
        pytest.skip("the test bed needs root")
    missing = testbed.requirements_missing()
    if missing:
        pytest.skip(missing)
    b = testbed.TestBed()
    try:
        b.up(HOSTS, no_python=NO_PYTHON, down=DOWN, hide_paths=[REPO, venv_dir()])
        user = b.add_user("gxpb" + uuid.uuid4().hex[:6])
        bashrc = os.path.join(user.home, ".bashrc")
        with open(bashrc) as f:
            text = f.read()
        with open(bashrc, "w") as f:
            f.write(NOISY_BASHRC + text)
        yield b
    finally:
        b.teardown()


@pytest.fixture
def g(bed, make_gxp):
    return make_gxp(bed=bed, user=next(iter(bed.users)))


def two_level_rules(g):
    g.ok("use", "ssh", "head", "tb[[01-02]]")
    g.ok("use", "ssh", "tb01", "tb[[03-09]]")
    g.ok("use", "ssh", "tb02", "tb[[10-16]]")


def host_is_clean(bed, name, baseline_mounts):
    h = bed.host(name)
    return h.pids() == [] and os.listdir(h.tmp_dir) == [] and h.mounts() == baseline_mounts


def test_nothing_preinstalled_on_hosts(bed):
    h = bed.host("tb01")
    r = h.exec(["ls", "-A", REPO], capture_output=True, text=True)
    assert r.stdout == ""
    r = h.exec(["ls", "-A", venv_dir()], capture_output=True, text=True)
    assert r.stdout == ""


def test_two_level_tree_of_16_and_clean_quit(bed, g):
    baseline = {n: bed.host(n).mounts() for n in HOSTS[:16]}
    two_level_rules(g)
    g.ok("explore", "tb[[01-16]]")
    out = g.ok("stat").stdout.splitlines()
    assert out[0].split(";")[0] == "17 nodes up, 0 lost"   # then the WAN's bytes: the rules make sites
    parent_of = {}
    stack = []
    for line in out[1:]:
        depth = (len(line) - len(line.lstrip())) // 2
        name = line.split()[1]
        stack[depth:] = [name]
        parent_of[name] = stack[depth - 1] if depth else None
    assert parent_of["tb01"] == parent_of["tb02"] == "head"
    assert all(parent_of["tb%02d" % i] == "tb01" for i in range(3, 10))
    assert all(parent_of["tb%02d" % i] == "tb02" for i in range(10, 17))
    r = g.ok("e", "hostname")
    names = r.stdout.split()
    assert len(names) == 17 and len(set(names)) == 17
    assert set(names) == set(HOSTS[:16]) | {socket.gethostname()}
    assert "Welcome" not in r.stdout and r.stderr == ""
    g.ok("quit")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(host_is_clean(bed, n, baseline[n]) for n in HOSTS[:16]):
            break
        time.sleep(0.2)
    for n in HOSTS[:16]:
        h = bed.host(n)
        assert h.pids() == [], "%s still runs %s" % (n, h.pids())
        assert os.listdir(h.tmp_dir) == [], "%s left files in /tmp" % n
        assert h.mounts() == baseline[n]


def test_unreachable_and_pythonless_hosts_are_reported(bed, g):
    g.ok("use", "ssh", "head", "tb[[01-20]]")
    r = g.run("explore", "tb[[01-20]]", "--timeout", "10")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 4, r.stderr
    failed = {l.split(":")[2].strip(): l for l in lines}
    assert set(failed) == NO_PYTHON | DOWN
    for n in NO_PYTHON:
        assert "python3" in failed[n] and "not found" in failed[n]
    for n in DOWN:
        assert "Connection refused" in failed[n] or "No route" in failed[n] or "timed out" in failed[n]
    names = g.ok("e", "hostname").stdout.split()
    assert sorted(names) == sorted(HOSTS[:16] + [socket.gethostname()])


def test_killed_gateway_subtree_is_lost_and_rest_works(bed, g):
    two_level_rules(g)
    g.ok("explore", "tb[[01-16]]")
    line = next(l for l in g.ok("stat").stdout.splitlines() if l.split()[1:2] == ["tb01"])
    pid = int(line.split("pid=")[1].split()[0])
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while time.monotonic() - t0 < 5:
        nodes = g.stat_nodes()
        if nodes["tb01"] == "lost" and all(nodes["tb%02d" % i] == "lost" for i in range(3, 10)):
            break
        time.sleep(0.1)
    nodes = g.stat_nodes()
    assert nodes["tb01"] == "lost"
    assert all(nodes["tb%02d" % i] == "lost" for i in range(3, 10))
    assert all(nodes["tb%02d" % i] == "up" for i in [2] + list(range(10, 17)))
    names = g.ok("e", "hostname").stdout.split()
    assert sorted(names) == sorted(["tb02"] + ["tb%02d" % i for i in range(10, 17)]
                                   + [socket.gethostname()])
    # The orphaned leaves noticed their parent went away and exited.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(bed.host("tb%02d" % i).pids() for i in range(3, 10)):
        time.sleep(0.2)
    assert all(bed.host("tb%02d" % i).pids() == [] for i in range(3, 10))


@pytest.fixture
def stub_dir(bed):
    """A directory of channel stubs on PATH: `rsh` that speaks through ssh (a real
    rshd needs inetd and root-owned .rhosts trust, which no test bed user should
    rely on; the stub exercises our rsh command line end to end)."""
    d = "/var/tmp/gxpstub-" + uuid.uuid4().hex[:8]
    os.makedirs(d)
    with open(os.path.join(d, "rsh"), "w") as f:
        f.write('#!/bin/sh\nif [ "$1" = -l ]; then shift 2; fi\nexec ssh -T "$@"\n')
    os.chmod(os.path.join(d, "rsh"), 0o755)
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["rm", "-rf", d])


@pytest.mark.parametrize("channel,extra", [
    ("paramiko", []),
    ("rsh", []),
    ("sh", ["--template", "ssh -T {host} {cmd}"]),
])
def test_channels(bed, g, stub_dir, channel, extra):
    env = {"PATH": stub_dir + ":" + g.env()["PATH"]}
    g.ok("use", channel, "head", "tb[[05-07]]", *extra, env=env)
    g.ok("explore", "tb[[05-07]]", env=env)
    nodes = g.ok("stat").stdout
    assert nodes.count("[%s] up" % channel) == 3
    names = g.ok("e", "--hosts", "tb*", "hostname").stdout.split()
    assert sorted(names) == ["tb05", "tb06", "tb07"]
    g.ok("quit")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(bed.host(n).pids() for n in ("tb05", "tb06", "tb07")):
        time.sleep(0.2)
    assert all(bed.host(n).pids() == [] for n in ("tb05", "tb06", "tb07"))


def test_paramiko_reports_refused_host(bed, g):
    g.ok("use", "paramiko", "head", "tb[[19-20]]")
    r = g.run("explore", "tb19", "--timeout", "5")
    assert r.returncode == 1
    assert r.stderr.startswith("gxpc: explore: tb19: paramiko: ") and r.stderr.count("\n") == 1
