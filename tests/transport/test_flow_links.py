"""Hop-by-hop flow control on links, in process: a link over its high-water mark
is congested until it drains; a node whose link up is congested stops reading
its children until it drains; a client that reads nothing is held alone."""
from __future__ import annotations

import socket

from gxpstyle.launch import bootstrap
from gxpstyle.node.agent import Node
from gxpstyle.protocol import wire
from gxpstyle.transport import links
from gxpstyle.transport.event_loop import EventLoop
from gxpstyle.transport.links import Link

DATA = b"x" * (200 << 10)


def _pair():
    a, b = socket.socketpair()
    return a.detach(), b


def _drain(sock: socket.socket, loop: EventLoop, until) -> int:
    """Read the far end (and run the loop) until until() holds; bytes read."""
    sock.setblocking(False)
    got = 0
    for _ in range(100000):
        try:
            chunk = sock.recv(1 << 20)
            got += len(chunk)
        except BlockingIOError:
            pass
        loop.run_once(max_wait=0.001)
        if until():
            return got
    raise AssertionError("condition never held")


def _noop(*a):
    pass


def test_a_congested_link_drains_and_says_so():
    loop = EventLoop()
    fd, far = _pair()
    link = Link(loop, fd, fd, "0.1", _noop, _noop)
    drained = []
    try:
        while not link.congested:
            link.send("0.1", "0", {"op": "out", "job": 1, "fd": 1, "data": DATA})
        assert link.queued > links.HIGH_WATER
        link.when_drained(lambda: drained.append(link.queued))
        assert drained == []
        _drain(far, loop, lambda: drained)
        assert not link.congested and drained[0] <= links.LOW_WATER
    finally:
        link.close()
        far.close()
        loop.close()


def test_a_node_stops_reading_its_children_while_its_link_up_is_congested():
    node = Node("0.1", "gw", "s", b"k" * 32, {}, bootstrap.PayloadCache({}))
    up_fd, up_far = _pair()
    child_fd, child_far = _pair()
    node.parent = Link(node.loop, up_fd, up_fd, "0", node.on_parent_frame, _noop)
    child = Link(node.loop, child_fd, child_fd, "0.1.1", node.on_child_frame, _noop)
    node.children["0.1.1"] = child
    try:
        frame = wire.encode_frame("c1", "0.1.1", {"op": "out", "job": 1, "fd": 1, "data": DATA})
        child_far.setblocking(False)
        sent = 0
        # The child writes until the node stops reading it (its socket fills).
        for _ in range(2000):
            try:
                sent += child_far.send(frame[sent % len(frame):])
            except BlockingIOError:
                node.loop.run_once(max_wait=0.01)
                if not child.reading:
                    break
                continue
            node.loop.run_once(max_wait=0)
        assert node.parent.congested and not child.reading
        assert node.jobs.paused
        queued = node.parent.queued
        # Nothing more is read while the link up stays full.
        for _ in range(20):
            node.loop.run_once(max_wait=0.01)
        assert node.parent.queued == queued
        # The parent reads: the node reads its child again.
        _drain(up_far, node.loop, lambda: child.reading)
        assert not node.jobs.paused
    finally:
        for link in (node.parent, child):
            link.close()
        up_far.close()
        child_far.close()
        node.jobs.close()
        node.loop.close()


def test_a_client_that_reads_nothing_is_no_longer_read():
    loop = EventLoop()
    fd, far = _pair()
    frames = []
    link = Link(loop, fd, fd, "c7", lambda l, f: frames.append(f), _noop)
    try:
        while link.queued <= links.CLIENT_HIGH_WATER:
            link.send("c7", "0", {"op": "print", "req": 1, "stream": 1, "data": DATA})
        assert not link.reading
        far.sendall(wire.encode_frame("0", "c", {"op": "quit"}))
        for _ in range(20):
            loop.run_once(max_wait=0.01)
        assert frames == []                       # held
        _drain(far, loop, lambda: frames)         # it reads: we read it again
        assert link.reading
    finally:
        link.close()
        far.close()
        loop.close()
    # A tree link is never held for its own queue (both ends would wait).
    loop = EventLoop()
    fd, far = _pair()
    link = Link(loop, fd, fd, "0.3", _noop, _noop)
    try:
        while link.queued <= links.CLIENT_HIGH_WATER:
            link.send("0.3", "0", {"op": "print", "req": 1, "stream": 1, "data": DATA})
        assert link.reading
    finally:
        link.close()
        far.close()
        loop.close()
