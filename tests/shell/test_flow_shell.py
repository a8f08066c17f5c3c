"""The client side of `gxpc e` (gxpstyle/shell/parallel_shell.py) against a scripted
daemon on a socketpair: deterministic cases the real session hits by chance."""
from __future__ import annotations

import signal
import socket
import threading

import pytest

from gxpstyle.gxpc.client import Client
from gxpstyle.protocol import wire
from gxpstyle.shell import parallel_shell


def _frames(*msgs) -> bytes:
    return b"".join(wire.encode_frame("c1", src, msg) for src, msg in msgs)


@pytest.fixture
def deadline():
    """Fail, rather than hang, when run() does not return within 5 s."""
    def expired(signum, frame):
        raise TimeoutError("run() did not return")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _scripted_daemon(sock: socket.socket, answer: bytes, seen: list) -> threading.Thread:
    def serve() -> None:
        reader = wire.FrameReader()
        while True:
            try:
                data = sock.recv(65536)
            except OSError:      # the test closed it
                return
            if not data:
                return
            for frame in reader.feed(data):
                _, _, body = wire.split_frame(frame)
                msg = wire.decode_message(body)
                seen.append(msg)
                if msg["op"] == "request":
                    sock.sendall(answer)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_output_and_exits_that_come_with_the_reply_end_the_run(deadline, tmp_path):
    ours, theirs = socket.socketpair()
    c = Client(str(tmp_path))
    c.sock = ours
    # The reply, both nodes' output and both exits arrive in one read.
    answer = _frames(
        ("0", {"op": "reply", "req": 1, "status": 0,
               "result": {"job": 7, "nodes": {"0": "head", "0.1": "n1"}}}),
        ("0", {"op": "out", "job": 7, "fd": 1, "data": b"a\n"}),
        ("0.1", {"op": "out", "job": 7, "fd": 1, "data": b"b\n"}),
        ("0", {"op": "exit", "job": 7, "status": 0, "error": ""}),
        ("0.1", {"op": "exit", "job": 7, "status": 3, "error": ""}))
    seen: list = []
    _scripted_daemon(theirs, answer, seen)
    out, errors = [], []
    try:
        rc = parallel_shell.run(c, "true", host_prefix=True,
                                write=lambda fd, data: out.append(data), error=errors.append)
    finally:
        ours.close()
        theirs.close()
    assert rc == parallel_shell.EXIT_FAILED
    assert sorted(out) == [b"head: a\n", b"n1: b\n"]
    assert errors == ["e: failed on 1 of 2: n1 (exit 3)"]
