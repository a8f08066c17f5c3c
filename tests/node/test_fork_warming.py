"""Before its first local fork an agent runs a command on itself a few times
(local_fork.Warming), so that its forks inherit code already specialized
instead of each writing those pages of its own at its first command (issue
27). The forks wait for those runs; their reports never leave the node. Run
in-process, without a session."""
from __future__ import annotations

import socket

import pytest

from gxpstyle.launch import bootstrap
from gxpstyle.node import agent, local_fork
from gxpstyle.transport.links import Link


class _Start:
    """A ChildStart as Warming sees it."""
    finished = False


@pytest.fixture
def node(monkeypatch):
    forked = []
    monkeypatch.setattr(local_fork, "start", forked.append)
    up, peer = socket.socketpair()
    n = agent.Node("0.1", "h", "s", b"x" * 32, {}, bootstrap.PayloadCache({}, None))
    n.parent = Link(n.loop, up.fileno(), up.fileno(), "0", n.on_parent_frame, n.on_parent_close)
    peer.setblocking(False)
    n.forked, n.peer = forked, peer
    try:
        yield n
    finally:
        n.jobs.close()
        n.loop.close()
        up.close()
        peer.close()


def _until_forked(n, cs, rounds=500):
    for _ in range(rounds):
        if cs in n.forked:
            return
        n.loop.run_once(5.0)
    raise AssertionError("the fork never started")


def test_forks_wait_for_the_runs_whose_reports_stay_on_the_node(node):
    first, second = _Start(), _Start()
    node._warming = warming = local_fork.Warming(node, False)
    warming.start(first)
    warming.start(second)
    assert node.forked == [] and len(node.trees.shares) == local_fork.WARM_RUNS
    _until_forked(node, second)
    assert node.forked == [first, second]
    assert not node.trees.shares and not node.jobs.jobs
    with pytest.raises(BlockingIOError):     # nothing of them went up the link
        node.peer.recv(4096)
    third = _Start()
    warming.start(third)        # warm now: at once
    assert node.forked[-1] is third


def test_a_fork_of_a_fork_starts_at_once(node):
    cs = _Start()
    local_fork.Warming(node, True).start(cs)
    assert node.forked == [cs] and not node.trees.shares


def test_a_node_that_cannot_run_the_command_forks_all_the_same(node, monkeypatch):
    def broken(client, msg):
        raise RuntimeError("no shell here")
    monkeypatch.setattr(node.trees, "start", broken)
    cs = _Start()
    node._warming = local_fork.Warming(node, False)
    node._warming.start(cs)
    assert node.forked == [cs]
