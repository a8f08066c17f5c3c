"""Authenticated TLS links (link_auth): the right key gets a link; no key, a
wrong key, a replayed handshake, a slow peer and random bytes get nothing, and
the listener stays up with bounded resources."""
import concurrent.futures
import errno
import os
import random
import socket
import threading
import time

import pytest

from gxpstyle.transport import link_auth

KEY = os.urandom(32)


class Server:
    def __init__(self, cert_files, handshake_seconds=5.0, max_handshakes=32):
        certfile, keyfile, self.pin = cert_files
        self.links = []
        self.refused = []
        self.keys = {"0.1": KEY}
        self.listener = link_auth.Listener(
            self.keys.get, self._on_link, lambda addr, why: self.refused.append(why),
            certfile, keyfile, self.pin, host="127.0.0.1",
            handshake_seconds=handshake_seconds, max_handshakes=max_handshakes)
        self.port = self.listener.port

    def _on_link(self, label, rfd, wfd):
        # Echo server on the plain end of the relay.
        self.links.append(label)

        def echo():
            while True:
                data = os.read(rfd, 65536)
                if not data:
                    break
                os.write(wfd, data)
            os.close(rfd)
        threading.Thread(target=echo, daemon=True).start()

    def close(self):
        self.listener.close()


@pytest.fixture
def server(cert_files):
    s = Server(cert_files)
    yield s
    s.close()


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def send_and_drain(port, data, timeout=15.0):
    """Send data, then read what the server says until it closes; return it.

    A reset (the server closed with our bytes unread) ends the reply like a
    close. A server that cannot be reached, or that neither closes nor resets
    within `timeout` seconds (more than any handshake limit in the suite), fails
    the calling test: a listener that hangs must not pass for one that refuses."""
    got = b""
    deadline = time.monotonic() + timeout
    s = connect(port)
    try:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            # Closed before reading all of it: what it sent is still readable.
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        pytest.fail("port %d neither closed nor reset within %gs after %d bytes (it sent %r)"
                    % (port, timeout, len(data), got[:64]))
    finally:
        s.close()
    return got


def nonce_expected(data, labels):
    """The length of a correct listener's whole reply to `data` sent before a close:
    its 32-byte nonce when `data` holds the magic, a known label and a whole client
    nonce, nothing otherwise (a wrong proof gets no further byte)."""
    n = data[4] if len(data) > 4 else 0
    if data[:4] != link_auth.MAGIC or len(data) < 5 + n + 32:
        return 0
    try:
        return 32 if data[5:5 + n].decode("ascii") in labels else 0
    except UnicodeDecodeError:
        return 0


def test_send_and_drain_fails_on_a_listener_that_hangs():
    """The helper itself can fail: a listener that accepts and then neither
    answers nor closes is not taken for one that refuses."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(1)
    try:
        with pytest.raises(pytest.fail.Exception, match="neither closed nor reset"):
            send_and_drain(hung.getsockname()[1], b"GXA1", timeout=0.5)
    finally:
        hung.close()


def test_right_key_gets_an_encrypted_echo(server):
    tls = link_auth.client_handshake(connect(server.port), "0.1", KEY, server.pin)
    tls.sendall(b"hello over tls")
    assert tls.recv(100) == b"hello over tls"
    tls.close()
    assert server.links == ["0.1"]


def test_wrong_key_gets_nothing_but_a_nonce(server):
    s = connect(server.port)
    with pytest.raises(link_auth.AuthError):
        link_auth.client_handshake(s, "0.1", os.urandom(32), server.pin)
    assert server.links == []


def test_unknown_label_and_garbage_get_no_byte(server):
    for payload in (b"", b"GET / HTTP/1.0\r\n\r\n", b"GXA1\x03x.y" + os.urandom(32)):
        assert send_and_drain(server.port, payload) == b""
    assert server.links == []


def test_replayed_handshake_is_refused(server):
    """A recording relay sees a real handshake; replaying its client bytes fails."""
    relay = socket.socket()
    relay.bind(("127.0.0.1", 0))
    relay.listen(1)
    recorded = bytearray()

    def run_relay():
        c, _ = relay.accept()
        up = connect(server.port)

        def pump(a, b, record):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    if record:
                        recorded.extend(data)
                    b.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        t = threading.Thread(target=pump, args=(up, c, False), daemon=True)
        t.start()
        pump(c, up, True)
        t.join(5)
    t = threading.Thread(target=run_relay, daemon=True)
    t.start()
    tls = link_auth.client_handshake(connect(relay.getsockname()[1]), "0.1", KEY, server.pin)
    tls.sendall(b"secret payload")
    assert tls.recv(100) == b"secret payload"
    tls.close()
    t.join(5)
    assert b"secret payload" not in recorded        # the data itself was encrypted
    assert server.links == ["0.1"]
    reply = send_and_drain(server.port, bytes(recorded))
    assert len(reply) == 32                           # a fresh nonce, then nothing
    assert server.links == ["0.1"]
    relay.close()


def test_slow_peer_is_dropped_and_others_are_served(cert_files):
    server = Server(cert_files, handshake_seconds=1.0)
    try:
        slow = connect(server.port)
        t0 = time.monotonic()
        slow.sendall(b"G")
        # Meanwhile a real client is served.
        tls = link_auth.client_handshake(connect(server.port), "0.1", KEY, server.pin)
        tls.sendall(b"x")
        assert tls.recv(10) == b"x"
        slow.settimeout(5)
        for ch in b"XA1":
            try:
                slow.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.4)
        assert slow.recv(10) == b""
        assert time.monotonic() - t0 < 4
        assert any("timed out" in r for r in server.refused)
    finally:
        server.close()


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_fuzz_10000_random_and_malformed_handshakes(server):
    rng = random.Random(20261123)
    good_prefix = b"GXA1\x030.1" + bytes(32)
    rss0 = _rss_kib()

    def attack(n, seed):
        r = random.Random(seed)
        for _ in range(n):
            kind = r.randrange(4)
            if kind == 0:
                data = bytes(r.getrandbits(8) for _ in range(r.randrange(1, 200)))
            elif kind == 1:
                data = bytearray(good_prefix + bytes(r.getrandbits(8) for _ in range(32)))
                data[r.randrange(len(data))] ^= 0xFF
                data = bytes(data)
            elif kind == 2:
                data = b"GXA1" + bytes([r.randrange(256)]) + b"\xff" * r.randrange(300)
            else:
                data = good_prefix + bytes(r.getrandbits(8) for _ in range(r.randrange(0, 64)))
            got = send_and_drain(server.port, data)
            assert len(got) == nonce_expected(data, server.keys), data  # a nonce at most

    # Futures, not bare threads: an assertion that fails in a worker fails the test.
    pool = concurrent.futures.ThreadPoolExecutor(4)
    attacks = [pool.submit(attack, 2500, rng.random()) for _ in range(4)]
    # The right client is served during the attack.
    for _ in range(5):
        tls = link_auth.client_handshake(connect(server.port), "0.1", KEY, server.pin)
        tls.sendall(b"ping")
        assert tls.recv(10) == b"ping"
        tls.close()
        time.sleep(0.2)
    for f in attacks:
        f.result(timeout=300)
    pool.shutdown()
    assert server.links == ["0.1"] * 5
    assert len(server.refused) >= 9000
    assert _rss_kib() - rss0 < 64 * 1024
    assert server.listener.thread.is_alive()


def test_refusal_log_is_bounded_and_counts_everything():
    now = [100.0]
    lines = []
    log = link_auth.RefusalLog(lines.append, burst=3, window=10.0, clock=lambda: now[0])
    for i in range(1000):
        log.refused("10.0.0.%d" % (i % 250), "bad proof")
    assert len(lines) == 3 and all(line.startswith("refused a connection from 10.0.0.") for line in lines)
    now[0] += 10.0
    log.refused("10.0.0.1", "bad proof")
    assert lines[3] == "refused 997 more connections in 10s (not logged one by one)"
    assert lines[4] == "refused a connection from 10.0.0.1: bad proof"
    for _ in range(5):
        log.refused("10.0.0.2", "eof")
    log.flush()
    assert lines[-1] == "refused 3 more connections in 10s (not logged one by one)"
    log.flush()
    assert len(lines) == 8


def test_a_new_certificate_in_the_same_files_is_served(tmp_path):
    """The server's TLS context is made once and kept (loading the key cost
    more than the handshake), yet a session certificate written anew over
    the same files is the one served: a client pinning it gets a link, one
    pinning the old one none."""
    from gxpstyle.head import session as gxsession
    certfile, keyfile = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    pins = []
    for _ in range(2):
        cert, key, pin = gxsession.make_certificate()
        with open(certfile, "w") as f:
            f.write(cert)
        with open(keyfile, "w") as f:
            f.write(key)
        pins.append(pin)
        s = Server((certfile, keyfile, pin))
        try:
            for _ in range(2):      # the second handshake reuses the context
                tls = link_auth.client_handshake(connect(s.port), "0.1", KEY, pin)
                tls.sendall(b"x")
                assert tls.recv(1) == b"x"
                tls.close()
            if len(pins) == 2:
                with pytest.raises(link_auth.AuthError, match="pin"):
                    link_auth.client_handshake(connect(s.port), "0.1", KEY, pins[0])
        finally:
            s.close()
    assert sum(1 for k in link_auth._contexts if k[0] == "server") == 1
