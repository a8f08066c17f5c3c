"""The core and its services: requests checked by schema, services in their own
books, role nodes that die, slots, and the payload budget after a push.

Run as the tests' ordinary user on local agents (see conftest.py).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from test_explore_local import fuse_for_users, shared_tmp  # noqa: F401  (fixtures)

from gxpstyle.launch import bootstrap
from gxpstyle.protocol import schema, serializer, wire


# -- schemas, without a session ---------------------------------------------------
def test_nested_fields_are_checked_with_words_not_class_names():
    def bad(msg):
        with pytest.raises(wire.FrameError) as e:
            wire.decode_message(serializer.dumps(msg))
        text = str(e.value)
        assert "Error" not in text and "\n" not in text
        return text

    ok = {"op": "exec", "job": 1, "cmd": "true", "cwd": None, "env": {"A": None, "B": "x"},
          "stdin": False}
    assert wire.decode_message(serializer.dumps(ok))["env"] == {"A": None, "B": "x"}
    assert bad(dict(ok, env=[1])) == "exec: env must be a mapping, not a list"
    assert bad(dict(ok, env={"A": 5})) == "exec: env[A] must be text, not a number"
    assert "job must be a whole number" in bad(dict(ok, job=True))
    assert bad({"op": "kill", "job": 1, "sig": 0}) == "kill: sig must be from 1 to 64, got 0"
    assert "channel: port must be from 1 to 65535" in bad(
        {"op": "spawn", "req": 1, "child": "0.1", "target": "x", "timeout": 5,
         "channel": {"name": "ssh", "port": 99999}})
    assert bad({"op": "lost", "ids": [3], "reason": ""}) == "lost: ids[0] must be text, not a number"


def test_request_schemas_are_closed_and_ranged():
    from gxpstyle.head.explorer import EXPLORE_ARGS
    with pytest.raises(schema.SchemaError, match="explore: local must be from 0 to 10000, got -3"):
        EXPLORE_ARGS.check({"local": -3}, "explore")
    with pytest.raises(schema.SchemaError, match="explore: unknown field 'lcoal'"):
        EXPLORE_ARGS.check({"lcoal": 3}, "explore")
    with pytest.raises(schema.SchemaError, match="fanout must be from 1 to 1000, got 0"):
        EXPLORE_ARGS.check({"fanout": 0}, "explore")


def test_only_paths_under_what_a_keeper_watches_need_acting_on():
    from gxpstyle.replicas.service import under_watched

    class Mounts:
        def __init__(self, roots):
            self.roots = roots

        def watched_paths(self):
            return self.roots

    none, mnt = Mounts([]), Mounts(["/tmp/mnt", "/data/"])
    paths = ["/tmp/mnt/a", "/tmp/mnt", "/tmp/mnt2/b", "/data/x/y", "/dev/null"]
    assert under_watched([none], paths) == []
    assert under_watched([none, mnt], paths) == ["/tmp/mnt/a", "/data/x/y"]
    assert under_watched([Mounts(["/"])], ["/a", "/b/c"]) == ["/a", "/b/c"]


def test_explore_payload_keeps_its_budget_after_a_push():
    """After a mount pushed its modules, newly explored agents still get the
    small agent payload; only service children get the mount code."""
    from sshfsmux.gmount import service as gmount_control
    cache = bootstrap.PayloadCache(bootstrap.head_sources())
    tag = sys.implementation.cache_tag
    before = {t: cache.for_tag(t) for t in (None, tag)}
    cache.add(bootstrap.module_sources(gmount_control.MODULES))
    assert {t: cache.for_tag(t) for t in (None, tag)} == before
    service = cache.for_tag(tag, service=True)
    assert len(service[1]) > len(before[tag][1]) + 20000
    from test_wire import PAYLOAD_BUDGET
    assert len(before[None][1]) < PAYLOAD_BUDGET["source"]
    assert len(before[tag][1]) < PAYLOAD_BUDGET["precompiled"]


def test_pushed_modules_never_replace_the_core():
    assert bootstrap.pushable("sshfsmux.gmount.node")
    for name in ("gxpstyle.node.agent", "gxpstyle", "", "a..b", "os.path;x"):
        assert not bootstrap.pushable(name), name
    # bcast's node side is pushed when a node first takes part in a transfer;
    # no module of the agent payload may be pushed over
    assert all(bootstrap.pushable(m) for m in bootstrap.SIDE_MODULES)
    assert not [m for m in bootstrap.AGENT_MODULES if bootstrap.pushable(m)]


# -- node sides, in process -----------------------------------------------------------
class _Node:
    """What NodeHost takes from a node."""

    def __init__(self):
        self.id, self.name, self.secret, self.opts = "0.1", "n1", b"s", {}
        self.loop = type("Loop", (), {"call_soon_threadsafe": None, "call_later": None})()
        self.sent, self.logs = [], []

    def send(self, dst, msg):
        self.sent.append((dst, msg))

    def log(self, text, level="info"):
        self.logs.append(text)

    def tls_files(self):
        return ("c", "k")

    def ensure_session_dir(self):
        return "/nonexistent"


def test_a_node_side_gets_checked_bodies_of_its_own_types_and_peers_only_where_declared():
    from gxpstyle.api.node_side import Message, NodeHost, NodeSide, checked, message
    from gxpstyle.protocol.schema import Int, Rec

    got = []

    class Side(NodeSide):
        def messages(self):
            return {"set": Message(Rec({"n": Int(0, 9)}), lambda src, b: got.append(("set", src, b))),
                    "hop": Message(Rec({"n": Int(0, 9)}), lambda src, b: got.append(("hop", src, b)),
                                   peers=True)}

    node, side = _Node(), Side()
    side.start(NodeHost(node, "demo"))
    side.deliver(wire.HEAD, message("demo", "set", {"n": 3}))
    side.deliver("0.2", message("demo", "set", {"n": 4}))      # only the head may send `set`
    side.deliver("0.2", message("demo", "hop", {"n": 5}))      # a peer may send `hop`
    side.deliver(wire.HEAD, message("demo", "set", {"n": 10}))
    side.deliver(wire.HEAD, message("demo", "nosuch", {}))
    assert got == [("set", "0", {"n": 3}), ("hop", "0.2", {"n": 5})]
    assert node.logs == ["refused a message from 0: demo.set: n must be from 0 to 9, got 10",
                         "refused a message from 0: demo: no message type 'nosuch'"]
    side.host.send(wire.HEAD, "back", {"n": 1})
    assert node.sent == [("0", {"op": "svc_msg", "svc": "demo", "type": "back", "body": {"n": 1}})]
    with pytest.raises(ValueError, match="demo.set: unknown field 'x'"):
        checked("demo", side.messages(), message("demo", "set", {"n": 1, "x": 2}))


def test_a_node_sides_threads_are_joined_at_stop():
    import threading

    from gxpstyle.api.node_side import NodeSide
    side, go = NodeSide(), threading.Event()
    side.spawn(go.wait)
    assert side.threads[0].is_alive()
    go.set()
    side.stop()
    assert not side.threads[0].is_alive()


# -- a session ---------------------------------------------------------------------
def test_malformed_requests_fail_alone_and_the_session_goes_on(gxp):
    """Each of these killed the daemon once; now each fails its own request."""
    gxp.ok("explore", "--local", "1")
    script = r"""
import sys
from gxpstyle.gxpc.client import Client
c = Client(sys.argv[1]); assert c.connect(start=False)
cases = [("savemask", {}), ("e", {}), ("e", {"cmd": "true", "env": []}),
         ("e", {"cmd": "true", "mask": 5}), ("export", {"env": [1]}), ("job", {}),
         ("job", {"cmd": "true", "avoid": 5}), ("explore", {"local": -3}),
         ("explore", {"local": 10**12}), ("explore", {"fanout": "x"}), ("cd", {"dir": 7}),
         ("use", {"rules": [{"channel": "ssh"}]}), ("mount", {"export": 1}), ("nosuch", {}),
         ("savemask", {"name": ""}), ("export", {"env": {"1A": "b"}}), ("cd", {"dir": "rel"})]
for cmd, args in cases:
    status, result = c.call(cmd, args)
    err = result.get("error", "")
    print("%s %d %s" % (cmd, status, err))
    assert status == 2 and err and "\n" not in err and "Error" not in err, (cmd, status, err)
print("pid", c.call("ping")[1]["pid"])
"""
    env = gxp.env()
    py = os.path.join(os.path.dirname(gxp.gxpc), "python")
    argv = [py, "-c", script, gxp.session_dir]
    if gxp.user:
        r = gxp.bed.run_as(gxp.user, argv, env=env, capture_output=True, text=True, timeout=60)
    else:
        r = subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    pid = int(r.stdout.split("pid ")[1])
    assert gxp.daemon_pids() == [pid]
    assert "explore 2 explore: local must be from 0 to 10000, got -3" in r.stdout
    out = gxp.ok("e", "echo $GXP_NODE_ID").stdout.split()
    assert sorted(out) == ["0", "0.1"]


def test_make_recipes_do_not_change_the_mask(gxp, shared_tmp):  # noqa: F811
    """make's recipes are the make service's jobs: smask still selects the
    nodes of the last `e`."""
    if not shutil.which("make"):
        pytest.skip("no make")
    gxp.ok("explore", "--local", "2")
    gxp.run("e", '[ "$GXP_NODE_ID" = 0.1 ]')
    d = shared_tmp / "mk"
    d.mkdir()
    (d / "Makefile").write_text("all: a b c\na b c:\n\t@true\n")
    os.chmod(d, 0o777)
    gxp.ok("make", "-j3", cwd=str(d))
    assert gxp.ok("smask").returncode == 0
    assert gxp.ok("e", "echo $GXP_NODE_ID").stdout.split() == ["0.1"]


def _client_call(gxp, verb):
    script = ("import sys,json\nfrom gxpstyle.gxpc.client import Client\nc=Client(sys.argv[1])\n"
              "assert c.connect(start=False)\nprint(json.dumps(getattr(c, sys.argv[2])()))\n")
    py = os.path.join(os.path.dirname(gxp.gxpc), "python")
    argv = [py, "-c", script, gxp.session_dir, verb]
    if gxp.user:
        r = gxp.bed.run_as(gxp.user, argv, env=gxp.env(), capture_output=True, text=True, timeout=30)
    else:
        r = subprocess.run(argv, env=dict(os.environ, **gxp.env()), capture_output=True,
                           text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout)


def test_cpus_reach_the_slot_books_and_make_fills_by_slots(gxp, shared_tmp):  # noqa: F811
    """Agents report the CPUs they may use; a -j make fills nodes by slots."""
    if len(os.sched_getaffinity(0)) < 2 or not shutil.which("taskset"):
        pytest.skip("needs 2 CPUs and taskset")
    gxp.ok("use", "sh", "head", "one*", "--template", "taskset -c 0 sh -c {cmd}")
    gxp.ok("use", "sh", "head", "two*", "--template", "sh -c {cmd}")
    gxp.ok("explore", "one1", "two1")
    slots = {n["name"]: n["slots"] for n in _client_call(gxp, "stat")["nodes"]}
    assert slots == {"head": 2, "one1": 1, "two1": 2}
    d = shared_tmp / "mk"
    d.mkdir()
    # Five recipes that overlap: with 2 + 1 + 2 slots, each node gets its share.
    (d / "Makefile").write_text("all: r1 r2 r3 r4 r5\nr%:\n\t@sleep 2; echo $$GXP_HOSTNAME > $@\n")
    os.chmod(d, 0o777)
    gxp.ok("make", "-j5", cwd=str(d))
    where = sorted((d / ("r%d" % i)).read_text().strip() for i in range(1, 6))
    assert where.count("one1") == 1 and where.count("two1") == 2 and where.count("head") == 2, where


def test_mount_inside_its_export_is_refused(gxp, fuse_for_users):  # noqa: F811
    gxp.ok("explore", "--local", "1")
    top = os.path.dirname(gxp.session_dir)
    gxp.ok("e", "--hosts", "head", "mkdir -p %s/exp/inner %s/m" % (top, top))
    for export, mnt in (("exp", "exp/inner"), ("exp/inner", "exp"), ("exp", "exp")):
        r = gxp.run("mount", "%s/%s" % (top, export), "%s/%s" % (top, mnt))
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "the mount would contain itself" in r.stderr
    with open("/proc/mounts") as f:
        assert top not in f.read()


def test_a_dead_mount_service_is_lost_and_umount_detaches_it(gxp, fuse_for_users):  # noqa: F811
    gxp.ok("explore", "--local", "1")
    top = os.path.dirname(gxp.session_dir)
    export, mnt = top + "/export", top + "/mnt"
    gxp.ok("e", "--hosts", "head", "mkdir -p %s %s && echo x > %s/f" % (export, mnt, export))
    gxp.ok("mount", export, mnt)
    services = [n for n in _client_call(gxp, "stat")["nodes"] if n["role"] == "gmount"]
    assert len(services) == 1
    os.kill(services[0]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = {n["id"]: n["state"] for n in _client_call(gxp, "stat")["nodes"]}
        if states.get(services[0]["id"]) == "lost":
            break
        time.sleep(0.2)
    assert states[services[0]["id"]] == "lost", states
    assert "LOST" in gxp.ok("stat").stdout
    r = gxp.run("umount")
    assert r.returncode == 0, r.stderr
    assert "mount service had died" in r.stderr and "detaching" in r.stderr
    with open("/proc/mounts") as f:
        assert mnt not in f.read()
    # The mountpoint is free again.
    gxp.ok("mount", export, mnt)
    assert gxp.ok("e", "--hosts", "local1", "cat %s/f" % mnt).stdout == "x\n"
    gxp.ok("umount")


def _user_pids(gxp, pattern):
    r = subprocess.run(["pgrep", "-f", pattern] + (["-u", gxp.user] if gxp.user else []),
                       capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def test_a_killed_daemon_takes_everything_with_it_and_quit_cleans_up(gxp, fuse_for_users):  # noqa: F811
    """SIGKILL of the session daemon: agents, jobs (the head's own too) and the
    mount go; `gxpc quit` then removes what the daemon left on disk."""
    from gxpstyle.head import session as gxsession
    gxp.ok("explore", "--local", "2")
    top = os.path.dirname(gxp.session_dir)
    export, mnt = top + "/export", top + "/mnt"
    gxp.ok("e", "--hosts", "head", "mkdir -p %s %s" % (export, mnt))
    gxp.ok("mount", export, mnt)
    marker = "sleep 1%d" % os.getpid()
    e = gxp.popen("e", marker)
    deadline = time.monotonic() + 15
    while len(_user_pids(gxp, "^" + marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_user_pids(gxp, "^" + marker)) == 3
    os.kill(gxp.daemon_pids()[0], signal.SIGKILL)
    e.wait(timeout=15)
    assert e.returncode != 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = gxp.agent_pids() + _user_pids(gxp, "^" + marker)
        with open("/proc/mounts") as f:
            mounted = mnt in f.read()
        if not left and not mounted:
            break
        time.sleep(0.2)
    assert left == [] and not mounted
    r = gxp.run("quit")
    assert r.returncode == 0 and "daemon had died" in r.stderr, r.stderr
    assert not os.path.exists(gxp.session_dir)
    tag = "gxp-%s-" % gxsession.session_name(gxp.session_dir)[:12]
    assert [d for d in os.listdir("/tmp") if d.startswith(tag)] == []


def test_after_calls_done_once_after_the_count_and_at_once_for_none():
    from gxpstyle.api.services import after
    calls = []
    one = after(3, lambda: calls.append("done"))
    one()
    one(True, "", {})          # whatever a callback is passed
    assert calls == []
    one()
    assert calls == ["done"]
    after(0, lambda: calls.append("none"))
    assert calls == ["done", "none"]
