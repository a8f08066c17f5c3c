"""Byte streams along the tree (gxpstyle/node/tree_streams.py), between two
nodes on one event loop whose messages pass through the wire schema, as the
agents' links would carry them: bytes both ways in order past the window,
the window holding, end of stream and closing, a refused port, a node that
cannot be reached."""
from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from gxpstyle.node import tree_streams
from gxpstyle.protocol import wire
from gxpstyle.transport.event_loop import EventLoop


class FakeNode:
    """What TreeStreams uses of a node; send() encodes, checks and delivers
    to the addressed node's streams on the loop, or answers as an agent that
    cannot route (agent.unroutable)."""

    def __init__(self, nodes: dict, node_id: str, loop: EventLoop) -> None:
        self.nodes, self.id, self.name, self.loop = nodes, node_id, "host-" + node_id, loop
        self.streams = tree_streams.TreeStreams(self)
        self.most_unacked = 0
        self.data_sent = 0
        nodes[node_id] = self

    def send(self, dst: str, msg: dict) -> None:
        _, src, body = wire.split_frame(wire.encode_frame(dst, self.id, msg)[4:])
        checked = wire.decode_message(body)
        if checked["op"] == "stream_data":
            self.data_sent += len(checked["data"])
        for end in self.streams.ends.values():
            self.most_unacked = max(self.most_unacked, end.unacked)
        peer = self.nodes.get(dst)
        if peer is None:
            if checked["op"] != "stream_close":
                self.loop.at_end(lambda: self.streams.op_stream_close(dst, {
                    "sid": checked["sid"], "reason": "node %s is not reachable" % dst}, None))
            return
        self.loop.at_end(lambda: getattr(peer.streams, "op_" + checked["op"])(src, checked, None))


@pytest.fixture
def nodes():
    loop = EventLoop()
    nodes: dict = {}
    FakeNode(nodes, "0.1", loop)
    FakeNode(nodes, "0.2.3", loop)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    yield nodes
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)
    loop.close()


@pytest.fixture
def echo_port():
    """A loopback echo server (one connection at a time, until closed)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def wait_until(cond, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_bytes_go_both_ways_in_order_past_the_window_and_the_stream_ends(nodes, echo_port):
    a, b = nodes["0.1"], nodes["0.2.3"]
    sock = a.streams.open("0.2.3", echo_port, 10)
    data = os.urandom(3 * tree_streams.WINDOW + 12345)
    got = bytearray()

    def read_all():
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read_all)
    reader.start()
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    reader.join(60)
    assert bytes(got) == data
    sock.close()
    assert wait_until(lambda: not a.streams.ends and not b.streams.ends)
    # a sender never had more than its window (and one chunk) unacknowledged
    assert 0 < max(a.most_unacked, b.most_unacked) <= tree_streams.WINDOW + wire.CHUNK


def test_a_port_nobody_listens_on_is_refused_in_words(nodes):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(OSError) as e:
        nodes["0.1"].streams.open("0.2.3", port, 10)
    assert e.value.errno == errno.ECONNREFUSED
    assert "through the tree" in str(e.value) and "ECONNREFUSED" in str(e.value)
    assert wait_until(lambda: not nodes["0.1"].streams.ends and not nodes["0.2.3"].streams.ends)


def test_a_node_that_cannot_be_reached_fails_the_open_at_once(nodes, echo_port):
    t = time.monotonic()
    with pytest.raises(OSError) as e:
        nodes["0.1"].streams.open("0.9", echo_port, 10)
    assert time.monotonic() - t < 5 and "not reachable" in str(e.value)
    assert nodes["0.1"].streams.ends == {}


def test_closing_one_end_closes_the_other(nodes, echo_port):
    a, b = nodes["0.1"], nodes["0.2.3"]
    sock = a.streams.open("0.2.3", echo_port, 10)
    sock.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    assert len(b.streams.ends) == 1
    sock.close()
    assert wait_until(lambda: not a.streams.ends and not b.streams.ends)


def test_a_stream_id_not_of_its_sender_is_refused(nodes, echo_port):
    a, b = nodes["0.1"], nodes["0.2.3"]
    answers = []
    a.streams.op_stream_opened = lambda src, msg, link: answers.append(msg)
    a.loop.call_soon_threadsafe(lambda: a.send("0.2.3", {"op": "stream_open", "sid": "0.7/1",
                                                         "port": echo_port}))
    assert wait_until(lambda: answers)
    assert answers[0]["ok"] is False and "bad stream id" in answers[0]["error"]
    assert b.streams.ends == {}


class CongestedParent:
    """A parent link whose queue is over its high-water mark until drain()."""

    def __init__(self) -> None:
        self.congested = True
        self.waiters: list = []

    def when_drained(self, cb) -> None:
        self.waiters.append(cb)

    def drain(self) -> None:
        self.congested = False
        waiters, self.waiters = self.waiters, []
        for cb in waiters:
            cb()


def test_a_stream_going_up_holds_while_its_parent_link_is_congested(nodes, echo_port):
    a = nodes["0.1"]
    a.parent = CongestedParent()
    sock = a.streams.open("0.2.3", echo_port, 10)
    data = os.urandom(4 * wire.CHUNK)
    got = bytearray()

    def read_all():
        while len(got) < len(data):
            chunk = sock.recv(1 << 16)
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read_all)
    reader.start()
    writer = threading.Thread(target=sock.sendall, args=(data,))
    writer.start()
    assert wait_until(lambda: a.parent.waiters)
    time.sleep(0.3)
    assert 0 < a.data_sent <= wire.CHUNK     # one read, then it waits for the drain
    a.loop.call_soon_threadsafe(a.parent.drain)
    writer.join(30)
    reader.join(30)
    assert bytes(got) == data
    sock.close()


def test_a_node_without_the_module_says_so_in_words():
    from gxpstyle.api.node_side import NodeHost

    class Bare:
        id, name, secret, opts = "0.4", "host-0.4", b"", {}
        loop = EventLoop()
        log = tls_files = ensure_session_dir = None

        def streams(self):
            return None

    host = NodeHost(Bare(), "gmount")
    try:
        with pytest.raises(OSError) as e:
            host.open_stream("0.2", 22, 1)
        assert e.value.errno == errno.ENOSYS and "cannot carry a stream" in str(e.value)
    finally:
        Bare.loop.close()
