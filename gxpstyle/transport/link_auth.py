"""Authenticated, encrypted TCP links: mutual proof of a shared key with fresh
nonces on both sides, then TLS with the session's own certificate pinned.

    C -> S  "GXA1" | u8 n | label (n bytes) | nonce_c (32)
    S -> C  nonce_s (32)                  (only if the label is known)
    C -> S  HMAC(key, "c1" | label | nonce_c | nonce_s)
    S -> C  HMAC(key, "s1" | label | nonce_c | nonce_s)   (only if C's proof holds)
    TLS handshake; the client checks the server certificate's SHA-256 pin
    C -> S  HMAC(key, "c2" | nonce_c | nonce_s | pin)     inside TLS

A replayed handshake fails at the first proof (nonce_s is new every time). A
relay that passes the clear-text proofs through still cannot answer the proof
inside TLS, because the real client only talks TLS to the pinned certificate.
A peer that fails any step is dropped without one byte of data or any error
detail. `key` is a one-time token (a batch job's connect-back) or a key derived
from the session secret (data channels).

This file is self-contained (standard library only, no package imports, Python
3.8 syntax, no `from __future__`) because a batch job script embeds it verbatim.
"""
import hashlib
import hmac
import os
import select
import socket
import ssl
import struct
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List

MAGIC = b"GXA1"
HANDSHAKE_SECONDS = 10.0
MAX_HANDSHAKES = 32
ACCEPT_BACKOFF = 0.05      # seconds between failed accepts


class AuthError(Exception):
    pass


# One TLS context a process for each side: making one costs more than the
# handshake (the server's loads and parses its key: 0.7 ms against 0.5 ms),
# and a GMount node connects to each holder it reads from. A context is safe
# to share between threads; the server's is made anew if its files change.
_contexts = {}  # type: dict
_contexts_lock = threading.Lock()


def _client_context():
    with _contexts_lock:
        ctx = _contexts.get("client")
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE   # we pin the exact certificate instead
            _contexts["client"] = ctx
        return ctx


def _server_context(certfile, keyfile):
    files = []
    for path in (certfile, keyfile):
        st = os.stat(path)
        files.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
    key = ("server", tuple(files))
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(certfile, keyfile)
            for old in [k for k in _contexts if k[0] == "server"]:
                del _contexts[old]
            _contexts[key] = ctx
        return ctx


def _recv_exact(sock, n, deadline):
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AuthError("handshake timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:
            raise AuthError("handshake timed out")
        if not chunk:
            raise AuthError("peer closed during handshake")
        buf += chunk
    return buf


def _mac(key, *parts):
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def cert_pin(der):
    return hashlib.sha256(der).hexdigest()


def client_handshake(sock, label, key, pin, timeout=HANDSHAKE_SECONDS):
    """Authenticate to a listener and return the TLS socket. Raises AuthError."""
    deadline = time.monotonic() + timeout
    lab = label.encode("ascii")
    nc = os.urandom(32)
    sock.sendall(MAGIC + bytes((len(lab),)) + lab + nc)
    ns = _recv_exact(sock, 32, deadline)
    sock.sendall(_mac(key, b"c1", lab, nc, ns))
    proof = _recv_exact(sock, 32, deadline)
    if not hmac.compare_digest(proof, _mac(key, b"s1", lab, nc, ns)):
        raise AuthError("server failed to prove the key")
    ctx = _client_context()
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    tls = ctx.wrap_socket(sock, server_hostname=None)
    der = tls.getpeercert(binary_form=True)
    if not der or not hmac.compare_digest(cert_pin(der), pin):
        tls.close()
        raise AuthError("server certificate does not match the session's pin")
    tls.sendall(_mac(key, b"c2", nc, ns, pin.encode("ascii")))
    return tls


def server_handshake(sock, lookup_key, certfile, keyfile, pin, timeout=HANDSHAKE_SECONDS):
    """Authenticate a connecting peer; return (label, tls socket) or raise AuthError.

    lookup_key(label) gives the expected key, or None for an unknown label."""
    deadline = time.monotonic() + timeout
    head = _recv_exact(sock, 5, deadline)
    if head[:4] != MAGIC:
        raise AuthError("bad magic")
    lab = _recv_exact(sock, head[4], deadline) if head[4] else b""
    nc = _recv_exact(sock, 32, deadline)
    try:
        label = lab.decode("ascii")
    except UnicodeDecodeError:
        raise AuthError("bad label")
    key = lookup_key(label)
    if not key:
        raise AuthError("unknown label")
    ns = os.urandom(32)
    sock.sendall(ns)
    proof = _recv_exact(sock, 32, deadline)
    if not hmac.compare_digest(proof, _mac(key, b"c1", lab, nc, ns)):
        raise AuthError("client failed to prove the key")
    sock.sendall(_mac(key, b"s1", lab, nc, ns))
    try:
        ctx = _server_context(certfile, keyfile)
    except (ssl.SSLError, OSError) as e:
        raise AuthError("cannot load the session certificate: %s" % (getattr(e, "reason", None)
                                                                     or e.strerror or e))
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        tls = ctx.wrap_socket(sock, server_side=True)
    except (ssl.SSLError, OSError) as e:
        raise AuthError("TLS handshake failed: %s" % (getattr(e, "reason", None) or e.strerror
                                                      or "the peer broke it off"))
    tls.settimeout(max(0.1, deadline - time.monotonic()))
    proof2 = _recv_exact(tls, 32, deadline)
    if not hmac.compare_digest(proof2, _mac(key, b"c2", nc, ns, pin.encode("ascii"))):
        raise AuthError("client failed the in-TLS proof")
    return label, tls


def start_relay(tls):
    """Bridge a blocking TLS socket to a plain socketpair; return (rfd, wfd) of
    our end. One thread does both directions with non-blocking I/O, because an
    SSL object must never be used from two threads at once."""
    ours, theirs = socket.socketpair()
    t = threading.Thread(target=_relay, args=(tls, theirs), daemon=True)
    t.start()
    fd = ours.detach()
    return fd, fd


def _relay(tls, plain):
    tls.setblocking(False)
    plain.setblocking(False)
    to_tls = bytearray()
    to_plain = bytearray()
    tls_eof = plain_eof = False
    # TLS may need a read to write, or a write to read
    recv_wants_write = send_wants_read = False
    limit = 1 << 20
    try:
        while True:
            rlist, wlist = [], []
            if (not tls_eof and len(to_plain) < limit) or send_wants_read:
                rlist.append(tls)
            if not plain_eof and len(to_tls) < limit:
                rlist.append(plain)
            if to_tls or recv_wants_write:
                wlist.append(tls)
            if to_plain:
                wlist.append(plain)
            if not rlist and not wlist:
                break
            if tls.pending():
                r, w = [tls], []
            else:
                r, w, _ = select.select(rlist, wlist, [])
            if (tls in r or (recv_wants_write and tls in w)) and not tls_eof:
                recv_wants_write = False
                try:
                    data = tls.recv(65536)
                    to_plain += data
                    tls_eof = not data
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLWantWriteError:
                    recv_wants_write = True
                except (ssl.SSLError, OSError):
                    tls_eof = True
            if plain in r and not plain_eof:
                try:
                    data = plain.recv(65536)
                    to_tls += data
                    plain_eof = not data
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    plain_eof = True
            if to_tls:
                send_wants_read = False
                try:
                    n = tls.send(to_tls[:65536])
                    del to_tls[:n]
                except ssl.SSLWantReadError:
                    send_wants_read = True
                except ssl.SSLWantWriteError:
                    pass
                except (ssl.SSLError, OSError):
                    break
            if to_plain:
                try:
                    n = plain.send(to_plain)
                    del to_plain[:n]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    break
            if (tls_eof and not to_plain) or (plain_eof and not to_tls):
                break
    finally:
        for s in (tls, plain):
            try:
                s.close()
            except OSError:
                pass


class RefusalLog:
    """One log line per refused connection, but at most `burst` lines per
    `window` seconds: a flood of bad peers must not fill the user's disk. The
    lines held back are counted and summed up in one line when the next window
    begins (or at flush)."""

    def __init__(self, write, burst=5, window=10.0, clock=time.monotonic):
        self.write = write
        self.burst, self.window, self.clock = burst, window, clock
        self.lock = threading.Lock()
        self.started = None
        self.count = 0
        self.held = 0

    def refused(self, peer, why):
        # type: (str, str) -> None
        lines = []
        with self.lock:
            now = self.clock()
            if self.started is None or now - self.started >= self.window:
                lines += self._summary()
                self.started, self.count = now, 0
            self.count += 1
            if self.count <= self.burst:
                lines.append("refused a connection from %s: %s" % (peer, why))
            else:
                self.held += 1
        for line in lines:
            self.write(line)

    def flush(self):
        with self.lock:
            lines = self._summary()
        for line in lines:
            self.write(line)

    def _summary(self):
        if not self.held:
            return []
        n, self.held = self.held, 0
        return ["refused %d more connection%s in %gs (not logged one by one)"
                % (n, "" if n == 1 else "s", self.window)]


class Listener:
    """Accepts authenticated TLS links on a TCP port, in its own threads.

    on_link(label, rfd, wfd) runs in a handshake thread after success; failures
    call on_refused(peer_address, reason) for a one-line log, nothing more."""

    def __init__(self, lookup_key, on_link, on_refused, certfile, keyfile, pin,
                 host="0.0.0.0", port=0, max_handshakes=MAX_HANDSHAKES,
                 handshake_seconds=HANDSHAKE_SECONDS):
        self.handshake_seconds = handshake_seconds
        self.lookup_key = lookup_key
        self.on_link = on_link
        self.on_refused = on_refused
        self.certfile, self.keyfile, self.pin = certfile, keyfile, pin
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.slots = threading.BoundedSemaphore(max_handshakes)
        self.closed = False
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def _accept_loop(self):
        while not self.closed:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                if self.closed:
                    return
                # out of descriptors or memory: no event says one is free
                # again; a pause instead of a spinning thread
                time.sleep(ACCEPT_BACKOFF)
                continue
            if not self.slots.acquire(blocking=False):
                conn.close()
                self.on_refused(addr, "too many handshakes in progress")
                continue
            threading.Thread(target=self._handshake, args=(conn, addr), daemon=True).start()

    def _authenticate(self, conn):
        """What _accepted gets for a peer that proved the key: (label, TLS
        socket, blocking). Raises AuthError, OSError or ValueError."""
        label, tls = server_handshake(conn, self.lookup_key, self.certfile,
                                      self.keyfile, self.pin, self.handshake_seconds)
        tls.settimeout(None)
        return label, tls

    def _accepted(self, peer, addr):
        """A peer that passed: its TLS relayed to a plain descriptor pair."""
        label, tls = peer
        rfd, wfd = start_relay(tls)
        self.on_link(label, rfd, wfd)

    def _handshake(self, conn, addr):
        # one slot per handshake in progress (MAX_HANDSHAKES), not per link
        try:
            try:
                peer = self._authenticate(conn)
            except (AuthError, OSError, ValueError) as e:
                try:
                    conn.close()
                except OSError:
                    pass
                self.on_refused(addr, str(e) or e.__class__.__name__)
                return
        finally:
            self.slots.release()
        self._accepted(peer, addr)

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# -- addresses (direct links and GMount's data channels pick a peer's) ---------
def local_addresses() -> "List[str]":
    """This host's IPv4 addresses (loopback last), from /proc: no ifconfig needed."""
    found: List[str] = []
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for i, line in enumerate(lines):
        if "/32 host LOCAL" in line and i > 0:
            addr = lines[i - 1].strip().lstrip("|-+` ").strip()
            if addr and addr not in found and not addr.startswith("127."):
                found.append(addr)
    found.append("127.0.0.1")
    return found


def _as_int(addr: str) -> int:
    try:
        return struct.unpack("!I", socket.inet_aton(addr))[0]
    except OSError:
        return 0


def pick_address(peer_addrs: "List[str]", own: "List[str]") -> str:
    """The peer address sharing the longest prefix with one of ours: on the same
    subnet first, loopback only for a peer on this very host."""
    best, best_len = peer_addrs[0] if peer_addrs else "127.0.0.1", -1
    for a in peer_addrs:
        if a.startswith("127."):
            if a in own and best_len < 0:
                best = a
            continue
        ai = _as_int(a)
        for o in own:
            if o.startswith("127."):
                continue
            common = 32 - (ai ^ _as_int(o)).bit_length()
            if common > best_len:
                best, best_len = a, common
    return best
