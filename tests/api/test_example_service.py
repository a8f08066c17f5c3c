"""The example service (tests/example_service, docs/writing-a-service.md) added
without a change to any file of the core: registered by an entry point from a
directory on the daemon's PYTHONPATH, its verb reaches the node side on every
node, each answers with its own message, a body that does not fit its type's
schema is refused before any handler, and the node sides' threads end at quit.

Run as the tests' ordinary user on local agents (see conftest.py)."""
import json
import os
import shutil
import subprocess
import uuid

from gxpstyle.head import session as gxsession

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = "[gxpstyle.services]\necho = echo_service.head:EchoService\n"


def install_example(top: str) -> str:
    """The example service as an installed distribution would leave it: the
    package and a dist-info with its entry point (importlib.metadata finds
    entry points in any dist-info on sys.path)."""
    site = os.path.join(top, "site")
    shutil.copytree(os.path.join(HERE, "example_service", "echo_service"),
                    os.path.join(site, "echo_service"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = os.path.join(site, "echo_service-0.1.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: echo-service\nVersion: 0.1\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(ENTRY_POINTS)
    for d, _, files in os.walk(top):
        os.chmod(d, 0o755)
        for name in files:
            os.chmod(os.path.join(d, name), 0o644)
    return site


def client_calls(gxp, calls):
    """[(status, result)] of `calls` [(verb, args)], made with the client library."""
    script = ("import sys, json\nfrom gxpstyle.gxpc.client import Client\nc = Client(sys.argv[1])\n"
              "assert c.connect(start=False)\n"
              "print(json.dumps([c.call(v, a) for v, a in json.loads(sys.argv[2])]))\n")
    py = os.path.join(os.path.dirname(gxp.gxpc), "python")
    argv = [py, "-c", script, gxp.session_dir, json.dumps(calls)]
    if gxp.user:
        r = gxp.bed.run_as(gxp.user, argv, env=gxp.env(), capture_output=True, text=True, timeout=60)
    else:
        r = subprocess.run(argv, env=dict(os.environ, **gxp.env()), capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_a_service_with_messages_both_ways_plugs_in_from_an_entry_point(gxp):
    top = "/tmp/gxpex-" + uuid.uuid4().hex[:10]
    try:
        site = install_example(top)
        markers = os.path.join(top, "markers")
        os.makedirs(markers)
        os.chmod(markers, 0o777)
        # The first gxpc starts the daemon, with the example on its path.
        gxp.ok("explore", "--local", "2", env={"PYTHONPATH": site})
        (status, result), (bad_status, bad) = client_calls(gxp, [
            ["echo", {"text": "hi", "malformed": True, "bad_reply": True, "marker_dir": markers}],
            ["echo", {"text": 5}]])
        # every node's side answered, each with its own message
        assert status == 0, result
        assert result["replies"] == {"head": "hi from 0", "local1": "hi from 0.1",
                                     "local2": "hi from 0.2"}
        # a request that does not fit the verb's schema is refused in words
        assert bad_status == 2 and bad["error"] == "echo: text must be text, not a number"
        # the malformed bodies never reached a handler: 3 pongs, not 6
        (_, stat), = client_calls(gxp, [["stat", {}]])
        assert stat["echo_pongs"] == 3
        with open(os.path.join(gxp.session_dir, gxsession.LOG_NAME)) as f:
            log = f.read()
        # each node side refused the head's bad ping, the head each bad pong
        assert log.count("echo.ping: seq must be a whole number") == 3, log
        assert log.count("echo.pong: text must be text, not a number") == 3, log
        gxp.ok("quit")
        # every node side's thread ended at quit (it says so as it ends)
        assert sorted(os.listdir(markers)) == ["stopped-0", "stopped-0.1", "stopped-0.2"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_node_side_that_cannot_start_fails_the_request_in_words(gxp):
    """A node side whose module fails on the nodes: each node tells the head,
    the service answers the client with each node's reason (no hang)."""
    top = "/tmp/gxpex-" + uuid.uuid4().hex[:10]
    try:
        site = install_example(top)
        with open(os.path.join(site, "echo_service", "node.py"), "a") as f:
            f.write("\nraise ImportError('this node side does not load here')\n")
        gxp.ok("explore", "--local", "2", env={"PYTHONPATH": site})
        (status, result), = client_calls(gxp, [["echo", {"text": "hi"}]])
        assert status == 1, result
        for name in ("local1", "local2"):
            assert "%s cannot host echo: " % name in result["error"], result
        # each of the three nodes (the head too) said why, in one line
        assert result["error"].count("this node side does not load here") == 3, result
        assert "\n" not in result["error"]
        assert "Traceback" not in result["error"] and "ImportError" not in result["error"]
        gxp.ok("e", "true")      # the session still works
        gxp.ok("quit")
    finally:
        shutil.rmtree(top, ignore_errors=True)
