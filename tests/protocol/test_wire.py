"""The serializer and frame layer: round trips, limits, and hostile bytes."""
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gxpstyle.launch import bootstrap
from gxpstyle.protocol import serializer, wire

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(values)
def test_serializer_round_trip(v):
    assert serializer.loads(serializer.dumps(v)) == v


def test_tuples_become_lists_and_big_ints_survive():
    assert serializer.loads(serializer.dumps((1, 2))) == [1, 2]
    big = 1 << 200
    assert serializer.loads(serializer.dumps([big, -big])) == [big, -big]


def test_serializer_refuses_objects():
    with pytest.raises(TypeError):
        serializer.dumps(object())


@pytest.mark.parametrize("data", [
    b"", b"\x02N", b"\x01", b"\x01X", b"\x01s\x00\x00\x00\x05ab",
    b"\x01l\xff\xff\xff\xff", b"\x01m\x7f\xff\xff\xffN", b"\x01NN",
    b"\x01" + b"l\x00\x00\x00\x01" * 40 + b"N",
])
def test_serializer_rejects_malformed(data):
    with pytest.raises(serializer.DecodeError):
        serializer.loads(data)


def test_frame_round_trip_and_routing_fields():
    frame = wire.encode_frame("0.1.2", "0", {"op": "ping", "req": 7})
    reader = wire.FrameReader()
    # Fed one byte at a time: framing does not depend on read boundaries.
    out = []
    for i in range(len(frame)):
        out += reader.feed(frame[i:i + 1])
    assert len(out) == 1
    dst, src, body = wire.split_frame(out[0])
    assert (dst, src) == ("0.1.2", "0")
    assert wire.decode_message(body) == {"op": "ping", "req": 7}


def test_oversized_length_prefix_is_refused_before_buffering():
    reader = wire.FrameReader()
    with pytest.raises(wire.FrameError):
        reader.feed(struct.pack("!I", 0xFFFFFFFF) + b"x" * 10)
    assert reader.pending <= 14


def test_encode_refuses_over_limit():
    with pytest.raises(ValueError):
        wire.encode_frame("0", "0", {"op": "out", "job": 1, "fd": 1, "data": b"x" * wire.MAX_FRAME})


@pytest.mark.parametrize("msg", [
    {"op": "nosuch"}, {"req": 1}, [], {"op": "ping"}, {"op": "ping", "req": "1"},
    {"op": "exec", "job": 1, "cmd": "true", "cwd": 5, "env": {}, "stdin": False},
    {"op": "kill", "job": True, "sig": 9},
])
def test_validate_rejects_bad_messages(msg):
    with pytest.raises(wire.FrameError):
        wire.validate(msg)


def test_fuzz_random_frames_never_crash_the_parser():
    """10,000 random and mutated frames: every one parses or raises FrameError."""
    rng = random.Random(1234)
    good = wire.encode_frame("0.1", "0", {"op": "exec", "job": 1, "cmd": "echo", "cwd": None,
                                          "env": {"A": "b"}, "stdin": False})
    for i in range(10000):
        if i % 2:
            data = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            data = bytearray(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        reader = wire.FrameReader()
        try:
            for frame in reader.feed(bytes(data)):
                _, _, body = wire.split_frame(frame)
                wire.decode_message(body)
        except wire.FrameError:
            pass
        assert reader.pending <= wire.MAX_FRAME + 4


def test_route_by_hierarchical_ids():
    children = {"0.1": 1, "0.2": 2}
    assert wire.route("0", "0", children) == "self"
    assert wire.route("0", "0.1.4.2", children) == "0.1"
    assert wire.route("0", "0.3", children) == "unroutable"
    assert wire.route("0.1", "0", {}) is None
    assert wire.route("0.1", "c5", {}) is None
    # "0.10" is not under "0.1"
    assert wire.route("0.1", "0.10", {}) is None
    assert wire.is_descendant("0.1.2", "0.1") and not wire.is_descendant("0.10", "0.1")


def test_payload_built_by_the_head_is_taken_only_for_our_interpreter():
    """After a module push the head ships the service children's payload
    prebuilt (code only); an agent keeps it for its own cache tag only, and
    only if well-formed; explored children still get sources."""
    import sys
    tag = sys.implementation.cache_tag
    head = bootstrap.PayloadCache(bootstrap.head_sources())
    agent = bootstrap.PayloadCache(bootstrap.head_sources())
    built = head.for_tag(tag, service=True)
    assert len(built[1]) < len(head.for_tag(tag)[1])    # no sources in it
    assert agent.preset(tag, list(built))
    assert agent.for_tag(tag, service=True) == built
    assert agent.for_tag(tag) == head.for_tag(tag)      # not the service payload
    assert not agent.preset("cpython-27", list(built))
    assert not agent.preset(tag, [b"x"]) and not agent.preset(tag, "xy") and not agent.preset(tag, [1, 2])
    # a later push clears what was built, preset or not
    agent.add({"sshfsmux": "# new\n"})
    assert (tag, True) not in agent.built


# What every new agent receives, in bytes (mitogen keeps a check like this on its
# preamble). Measured: first stage 562 characters, payload 35 KB as source and
# 119 KB precompiled (with nested schemas, the job watchdog and flow control);
# the budgets leave room to grow a little, not to double, and the mount code
# (three times the agent's own) can never fold into them. Since then the node
# side of `gxpc bcast` and posix_spawn for jobs joined: 42.3 KB as source,
# 133 KB precompiled (docstrings left out). Then the transfers' direct links
# between siblings (bcast/direct_links.py, a chain inside a site): 47.3 KB as source,
# 148 KB precompiled. Then bcast's node side left the payload (the head pushes it
# at a node's first transfer; most agents never host it): 43.5 KB as source,
# 134.7 KB precompiled. Then `e` along the tree (tree_exec.py: each agent runs its
# share, passes the rest down and folds the statuses): 46.2 KB as source, 142.0 KB
# precompiled. Then local children by fork (local_fork.py: a thousand local agents
# cost one Python start per first-level agent, not one each): 48.7 KB as source,
# 146.6 KB precompiled. Then the event loop on epoll itself (not selectors), a
# job's environment made once and handed to forks, and no collections or importlib
# at start: 49.5 KB as source, 149.0 KB precompiled. Then byte streams along the
# tree for sites with no direct route (the stream ops' schemas and the agent's
# hook; tree_streams.py itself is pushed with the services that use it): 50.2 KB
# as source, 150.9 KB precompiled. Then a job's calls to the mount on its host
# made by its node (the exec's before/after fields, the agent's hook, the
# service ops in a module of their own; node_calls.py is pushed with the mount):
# 51.2 KB as source, 153.8 KB precompiled. Then the commands an agent runs on
# itself before its first fork, so that its forks inherit warm code
# (local_fork.Warming): 52.5 KB as source, 156.9 KB precompiled. Then one TLS
# context a process (the server's cost 0.7 ms a link): 52.9 KB as source, 158.1 KB
# precompiled.
STAGE1_BUDGET = 1024
PAYLOAD_BUDGET = {"source": 53 << 10, "precompiled": 159 << 10}


def test_bootstrap_stays_within_its_byte_budget():
    import sys
    assert len(bootstrap.stage1_argument()) <= STAGE1_BUDGET
    cache = bootstrap.PayloadCache(bootstrap.head_sources())
    sizes = {"source": len(bootstrap.payload_wire(cache.for_tag("cpython-38"))),
             "precompiled": len(bootstrap.payload_wire(cache.for_tag(sys.implementation.cache_tag)))}
    over = {k: v for k, v in sizes.items() if v > PAYLOAD_BUDGET[k]}
    assert not over, "agent payload over budget: %s (budget %s)" % (over, PAYLOAD_BUDGET)


# A shipped program laid out in sub-packages: the entry module imports a module
# of another sub-package, a package whose __init__ was shipped (and runs) and one
# whose __init__ was not (and runs as empty), by absolute and relative imports.
NESTED_SOURCES = {
    "gxpstyle.probe": "",
    "gxpstyle.probe.entry": (
        "import os\n"
        "from gxpstyle.probe.inner import leaf\n"
        "from gxpstyle import probe_implicit\n"
        "from gxpstyle.probe_implicit.deep import VALUE\n"
        "def main(fds):\n"
        "    line = '%s %s %s %s\\n' % (leaf.WORD, leaf.PARENT_WORD, VALUE,\n"
        "                              probe_implicit.__path__ is not None)\n"
        "    os.write(fds[1], line.encode())\n"),
    "gxpstyle.probe.inner": "PARENT_WORD = 'init-ran'\n",
    "gxpstyle.probe.inner.leaf": "WORD = 'leaf'\nfrom . import PARENT_WORD\n",
    "gxpstyle.probe_implicit.deep": "VALUE = 'deep'\n",
}


@pytest.mark.parametrize("precompiled", [False, True])
def test_shipped_sub_packages_load_from_memory(precompiled):
    """Sub-packages of the shipped program import on the agent from the
    payload, never from a disk (the interpreter runs with -I, from /)."""
    import marshal
    import subprocess
    import sys
    codes = (marshal.dumps({n: bootstrap.compile_shipped(n, s) for n, s in NESTED_SOURCES.items()})
             if precompiled else None)
    sources = {} if precompiled else dict(NESTED_SOURCES)
    payload = bootstrap.build_payload(sources, codes, entry="gxpstyle.probe.entry")
    argv = bootstrap.stage1_argv(sys.executable)
    argv.insert(1, "-I")
    proc = subprocess.run(argv, input=bootstrap.payload_wire(payload), capture_output=True,
                          cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.splitlines()[-1] == b"leaf init-ran deep True"


# What an agent's start must not load: each costs every agent milliseconds of
# CPU (base64 and signal load re and enum, hashlib loads OpenSSL, site the
# site-packages), paid a thousand times by explore --local 1000 (issue 27).
HEAVY_AT_START = ("site", "re", "enum", "hashlib", "_hashlib", "base64", "typing", "threading",
                  "subprocess", "socket", "ssl", "signal")


def test_agent_start_loads_no_heavy_module():
    """The first stage and the agent's modules, as shipped, load none of
    HEAVY_AT_START before the agent runs."""
    import subprocess
    import sys
    probe = ("import os, sys\n"
             "import gxpstyle.node.agent\n"
             "def main(fds):\n"
             "    os.write(fds[1], (' '.join(sorted(sys.modules)) + '\\n').encode())\n")
    sources = dict(bootstrap.head_sources(), **{"gxpstyle.probe_start": probe})
    payload = bootstrap.build_payload(sources, entry="gxpstyle.probe_start")
    proc = subprocess.run(bootstrap.stage1_argv(sys.executable), input=bootstrap.payload_wire(payload),
                          capture_output=True, cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    loaded = set(proc.stdout.splitlines()[-1].decode().split())
    assert "gxpstyle.node.agent" in loaded
    assert not loaded & set(HEAVY_AT_START), sorted(loaded & set(HEAVY_AT_START))


def test_head_sources_are_the_agent_modules_and_packages_with_code():
    """A package whose __init__ is empty or only a docstring is not shipped
    (the loader makes it a package); one with code is."""
    assert set(bootstrap.head_sources()) == set(bootstrap.AGENT_MODULES)
    assert not bootstrap._has_code("") and not bootstrap._has_code('"""The wire."""\n')
    assert bootstrap._has_code('"""The wire."""\nfrom x import y\n')
