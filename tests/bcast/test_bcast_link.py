"""The transfers' direct links on one machine, with a real event loop, TLS and
the session certificate: a feeder's frames reach the listener, a peer without
the key gets nothing, a frame that is not a chunk or an ack closes the link, and
closing leaves no listener or thread behind."""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import tempfile
import threading
import time

import pytest

from gxpstyle.api.node_side import message
from gxpstyle.bcast import direct_links as bcast_link
from gxpstyle.head import session
from gxpstyle.protocol import wire
from gxpstyle.transport import link_auth
from gxpstyle.transport.event_loop import EventLoop

CERT = session.make_certificate()


class FakeNode:
    """What DirectLinks uses of an agent: id, loop, secret, opts, tls_files, log."""

    def __init__(self, nid: str, loop: EventLoop, secret: bytes) -> None:
        self.id, self.loop, self.secret = nid, loop, secret
        self.opts = {"cert": CERT[0], "key": CERT[1], "pin": CERT[2]}
        self.dir = tempfile.mkdtemp(prefix="gxp-test-bclink-")
        self.logs: list = []

    def tls_files(self):
        paths = (os.path.join(self.dir, "cert.pem"), os.path.join(self.dir, "key.pem"))
        for path, text in zip(paths, (CERT[0], CERT[1])):
            with open(path, "w") as f:
                f.write(text)
        return paths

    def log(self, text: str) -> None:
        self.logs.append(text)


def run_until(loop: EventLoop, cond, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        loop.run_once(0.05)


@pytest.fixture
def pair():
    loop = EventLoop()
    secret = os.urandom(32)
    got: list = []
    lost: list = []
    nodes = [FakeNode("0.2", loop, secret), FakeNode("0.1", loop, secret)]
    a = bcast_link.DirectLinks(nodes[0], lambda src, msg, link: got.append((src, msg)),
                               lambda peer, why: lost.append((peer, why)))
    b = bcast_link.DirectLinks(nodes[1], lambda *x: None, lambda *x: None)
    try:
        yield loop, a, b, got, lost
    finally:
        a.close()
        b.close()
        loop.close()
        for n in nodes:
            shutil.rmtree(n.dir, ignore_errors=True)


def test_a_feeders_chunks_reach_the_listener_and_closing_leaves_nothing(pair):
    loop, a, b, got, lost = pair
    threads = threading.active_count()
    port, addrs = a.listen()
    assert "127.0.0.1" in addrs
    up: list = []
    b.connect("0.2", ["127.0.0.1"], port, lambda link, why: up.append((link, why)))
    run_until(loop, lambda: up)
    assert up[0][0] is not None, up
    data = os.urandom(wire.CHUNK)
    for i in range(20):             # 5 MiB through TLS, in order
        assert b.send("0.2", message("bcast", "chunk", {"bc": 1, "index": i, "data": data,
                                                         "sha256": b"h" * 32}))
    run_until(loop, lambda: len(got) == 20)
    assert [m["body"]["index"] for _, m in got] == list(range(20))
    assert {src for src, _ in got} == {"0.1"} and got[7][1]["body"]["data"] == data
    assert set(a.links) == {"0.1"}
    a.close()
    run_until(loop, lambda: "0.2" not in b.links)   # the feeder sees the link go
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).recv(1)
    deadline = time.monotonic() + 5
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads


def test_a_peer_without_the_key_gets_nothing(pair):
    loop, a, b, got, lost = pair
    port, _ = a.listen()
    result: list = []

    def wrong() -> None:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            link_auth.client_handshake(s, bcast_link.LABEL, os.urandom(32), CERT[2])
            result.append("accepted")
        except (link_auth.AuthError, OSError, ssl.SSLError) as e:
            result.append(str(e))
        finally:
            s.close()
    t = threading.Thread(target=wrong)
    t.start()
    run_until(loop, lambda: result)
    t.join(5)
    assert result[0] != "accepted"
    assert got == [] and a.links == {} and a.anonymous == []
    # GMount's label is refused too: the key and the label are the transfers' own
    t2 = threading.Thread(target=lambda: result.append(_try_label(port, "fs")))
    t2.start()
    run_until(loop, lambda: len(result) == 2)
    t2.join(5)
    assert result[1] != "accepted"


def _try_label(port: int, label: str) -> str:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        link_auth.client_handshake(s, label, os.urandom(32), CERT[2])
        return "accepted"
    except (link_auth.AuthError, OSError, ssl.SSLError) as e:
        return str(e)
    finally:
        s.close()


def test_a_frame_other_than_a_chunk_or_an_ack_closes_the_link(pair):
    loop, a, b, got, lost = pair
    port, _ = a.listen()
    up: list = []
    b.connect("0.2", ["127.0.0.1"], port, lambda link, why: up.append(link))
    run_until(loop, lambda: up)
    b.links["0.2"].send("0.2", "0.1", {"op": "exec", "job": 1, "argv": ["sh"]})
    run_until(loop, lambda: "0.2" not in b.links)
    assert got == [] and a.links == {}


def test_a_connection_refused_is_reported_not_raised(pair):
    loop, a, b, got, lost = pair
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                       # nobody listens there now
    up: list = []
    b.connect("0.2", ["127.0.0.1"], port, lambda link, why: up.append((link, why)))
    run_until(loop, lambda: up)
    assert up[0][0] is None and "refused" in up[0][1], up
