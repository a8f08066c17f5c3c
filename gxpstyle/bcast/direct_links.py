"""Direct links between nodes for transfers: a sibling feeds a sibling without
routing every chunk through their parent.

Agent links exist only between parent and child, so a chain inside a site (the
children of one parent, each forwarding to the next while it receives) needs a
path of its own between siblings. On the head's request (`plan` with
`listen`) a node opens one TCP listener (port 0, every address) and reports the
port and its addresses; a feeder the head names connects to it and the two
authenticate with link_auth (label "bc", a key derived from the session secret
that no other channel uses, TLS pinned to the session certificate). A peer that
fails any step gets nothing. Then bcast's `chunk`/`ack` messages flow on that socket
exactly as on an agent link: wire frames, each decoded and schema-checked, and
only those two types, addressed to this node, from the one peer the link carries.

Connecting and the handshake run in threads; then the TLS socket, made
non-blocking, belongs to the event loop alone (`TlsLink`): no relay thread and
no socketpair between TLS and the frames, because on a 2-core machine shared by
32 hosts every copy and thread switch per megabyte shows in the time.

Pushed by the head with bcast/node.py (and with the mount code, which uses its
addresses); standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import hashlib
import hmac
import socket
import ssl

from gxpstyle.protocol import wire
from gxpstyle.transport import link_auth
from gxpstyle.transport.links import LOW_WATER, READ_SIZE, Link

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from gxpstyle.api.node_side import NodeHost

LABEL = "bc"
KEY_INFO = b"gxpstyle transfer direct link v1"
CONNECT_SECONDS = 10.0
SVC, TYPES = "bcast", ("chunk", "ack")    # all a direct link carries


def link_key(secret: bytes) -> bytes:
    """The direct links' key: from the session secret, distinct from GMount's."""
    return hmac.new(secret, KEY_INFO, hashlib.sha256).digest()


class TlsLink(Link):
    """A Link over a non-blocking TLS socket, driven by the event loop: reads
    drain what TLS has buffered (the selector sees only the socket), writes go
    through SSL_write (partial writes allowed), close closes the socket once."""

    def __init__(self, loop: Any, tls: ssl.SSLSocket, peer: str,
                 on_frame: Callable[[Link, bytes], None],
                 on_close: Callable[[Link, str], None]) -> None:
        self.tls = tls
        tls.setblocking(False)
        fd = tls.fileno()
        super().__init__(loop, fd, fd, peer, on_frame, on_close)

    def _readable(self) -> None:
        for _ in range(64):     # then let the others run; pending bytes: come back at once
            try:
                data = self.tls.recv(READ_SIZE)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (ssl.SSLError, OSError) as e:
                self.close("read error: %s" % (getattr(e, "reason", None) or e))
                return
            if not data:
                self.close("link closed")
                return
            self._consume(data)
            if self.closed or not self.reading:
                return
        if self.tls.pending():
            self.loop.call_later(0, self._readable)

    def _writable(self) -> None:
        outq = self.outq
        while outq:
            try:
                n = self.tls.send(outq[0])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except (ssl.SSLError, OSError) as e:
                self.close("write error: %s" % (getattr(e, "reason", None) or e))
                return
            self.queued -= n
            if n < len(outq[0]):
                outq[0] = outq[0][n:]
                break           # the socket is full
            outq.popleft()
        if self.congested and self.queued <= LOW_WATER:
            self._drained()
        if not outq and not self.closed:
            self.loop.remove_writer(self.wfd)

    def _close_fds(self) -> None:
        try:
            self.tls.close()        # closes the socket's one descriptor, once
        except OSError:
            pass


class _Listener(link_auth.Listener):
    """link_auth's listener, handing over the TLS socket itself (no relay)."""

    def _accepted(self, peer: Any, addr: Any) -> None:
        label, tls = peer
        self.on_link(label, tls, None)


class DirectLinks:
    """This node's listener and direct links, by peer id.

    on_message(src, msg, link) gets every bcast chunk and ack (a svc_msg); on_lost(peer,
    why) when a link to a known peer closes."""

    def __init__(self, node: NodeHost, on_message: Callable[[str, Dict[str, Any], Link], None],
                 on_lost: Callable[[str, str], None]) -> None:
        self.node = node
        self.on_message = on_message
        self.on_lost = on_lost
        self.listener: Any = None
        self.links: Dict[str, Link] = {}       # peer id -> link (once the peer is known)
        self.anonymous: List[Link] = []         # accepted, no frame seen yet
        self.connecting: Dict[str, List[Callable[[Optional[Link], str], None]]] = {}
        self.closed = False

    # -- the listening side --------------------------------------------------------
    def listen(self) -> Tuple[int, List[str]]:
        """Open the listener if it is not open; (port, addresses). Raises OSError."""
        if self.listener is None:
            certfile, keyfile = self.node.tls_files()
            key = link_key(self.node.secret)
            loop = self.node.loop

            def on_link(label: str, tls: Any, unused: Any) -> None:
                loop.call_soon_threadsafe(lambda: self._accepted(tls))

            refusals = link_auth.RefusalLog(
                lambda line: loop.call_soon_threadsafe(lambda: self.node.log(line)))
            self.listener = _Listener(
                lambda label: key if label == LABEL else None, on_link,
                lambda addr, why: refusals.refused(str(addr[0]), why),
                certfile, keyfile, self.node.opts["pin"])
        return self.listener.port, link_auth.local_addresses()

    def _accepted(self, tls: Any) -> None:
        if self.closed:
            tls.close()
            return
        link = TlsLink(self.node.loop, tls, "", self._frame, self._closed)
        self.anonymous.append(link)

    # -- the connecting side -------------------------------------------------------
    def connect(self, peer: str, addrs: List[str], port: int,
                done: Callable[[Optional[Link], str], None]) -> None:
        """done(link, "") once a link to `peer` is up (at once if it is), or
        done(None, reason). The connect and handshake run in a thread."""
        link = self.links.get(peer)
        if link is not None and not link.closed:
            done(link, "")
            return
        waiting = self.connecting.get(peer)
        if waiting is not None:
            waiting.append(done)
            return
        self.connecting[peer] = [done]
        import threading
        key, pin = link_key(self.node.secret), self.node.opts["pin"]
        addr = link_auth.pick_address(addrs, link_auth.local_addresses())
        loop = self.node.loop

        def work() -> None:
            tls, why = None, ""
            sock = None
            try:
                sock = socket.create_connection((addr, port), timeout=CONNECT_SECONDS)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tls = link_auth.client_handshake(sock, LABEL, key, pin)
                tls.settimeout(None)
            except (OSError, link_auth.AuthError, ValueError) as e:
                why = "direct link to %s:%d: %s" % (addr, port, getattr(e, "strerror", None) or e)
                if sock is not None:
                    sock.close()
            loop.call_soon_threadsafe(lambda: self._connected(peer, tls, why))
        threading.Thread(target=work, daemon=True).start()

    def _connected(self, peer: str, tls: Any, why: str) -> None:
        waiting = self.connecting.pop(peer, [])
        link = None
        if tls is not None and self.closed:
            tls.close()
            why = "closed"
        elif tls is not None:
            link = TlsLink(self.node.loop, tls, peer, self._frame, self._closed)
            old = self.links.get(peer)
            self.links[peer] = link
            if old is not None:
                old.close("replaced")
        for done in waiting:
            done(link, why)

    # -- both sides ----------------------------------------------------------------
    def send(self, peer: str, msg: Dict[str, Any]) -> bool:
        """Send on the link to `peer`; False if there is none."""
        link = self.links.get(peer)
        if link is None or link.closed:
            return False
        link.send(peer, self.node.id, msg)
        return True

    def _frame(self, link: Link, frame: bytes) -> None:
        try:
            dst, src, body = wire.split_frame(frame)
            msg = wire.decode_message(body)
        except wire.FrameError as e:
            link.close("protocol error: %s" % e)
            return
        if dst != self.node.id or msg["op"] != "svc_msg" or msg["svc"] != SVC \
                or msg["type"] not in TYPES or not src or src == self.node.id \
                or (link.peer and src != link.peer):
            link.close("unexpected frame %s from %s" % (msg["op"], src))
            return
        if not link.peer:            # the first frame names the peer; it may not change
            link.peer = src
            if link in self.anonymous:
                self.anonymous.remove(link)
            old = self.links.get(src)
            self.links[src] = link
            if old is not None and old is not link:
                old.close("replaced")
        self.on_message(src, msg, link)

    def _closed(self, link: Link, why: str) -> None:
        if link in self.anonymous:
            self.anonymous.remove(link)
        if link.peer and self.links.get(link.peer) is link:
            del self.links[link.peer]
            if not self.closed:
                self.on_lost(link.peer, why)

    def drop(self, peer: str) -> None:
        link = self.links.pop(peer, None)
        if link is not None:
            link.close("dropped")

    def close(self) -> None:
        """Close the listener and every link (the transfers ended, or the agent)."""
        self.closed = True
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for link in list(self.links.values()) + self.anonymous:
            link.close("closed")
        self.links.clear()
        self.anonymous = []
