"""Byte streams along the tree: where a node cannot open a TCP connection to a
port on another node's host (sites whose hosts reach nothing outside but
through their gateway), it asks the tree to carry one.

    sock = host.open_stream(node_id, port, timeout)    # NodeHost, off the loop

returns a connected socket (one end of a socketpair) whose bytes reach
127.0.0.1:`port` on `node_id`'s host, carried as frames along the tree links
from the opener up to the nearest common ancestor and down to the node, the
agents on the way routing them like any frame. Whoever uses the stream runs
its own authentication and encryption over it, end to end (GMount's data
channel runs link_auth's proofs and TLS pinned to the session certificate
through it exactly as through TCP): the agents that carry it see ciphertext,
and a node that is not the peer it proved to be gets nothing.

Why a byte stream offered by the core, and not each service relaying its own
messages along the tree: the core knows nothing of mounts or transfers (a
stream is a port and bytes); a service keeps one transport, with its own
end-to-end authentication, whether or not the network lets it connect (found
by trying: a direct connect refused, unreachable or not answering falls back
to the tree, never configured), where relaying its frames would put its
protocol and its trust in every agent on the way and give each service a
relay and a flow control of its own; and what later sits between a site and
the WAN needs no protocol of a service: a site's caching proxy is one more
client of the exports (it reaches them directly or by a stream, as any node,
and serves its site), and the WAN's bytes can be counted where a stream's
frames leave a site.

Messages (core ops, wire.py), `sid` is "<opener id>/<n>", unique in the session:
  stream_open   {sid, port}          opener -> node: connect to 127.0.0.1:port
  stream_opened {sid, ok, error}     node -> opener
  stream_data   {sid, data, eof}     either way
  stream_ack    {sid, bytes}         either way: that many more bytes went into
                                     the receiver's socket
  stream_close  {sid, reason}        either way, or from the agent that could not
                                     route a frame of the stream
A frame of a stream that an agent cannot route (its node was lost) gets its
sender a stream_close at once; a stream whose other end is lost while
nothing flows stays open until its local socket closes (the service's own
bounds) or the session ends: no node is told of another's loss, and no timer
watches an idle stream.

Flow control: a sender keeps at most WINDOW bytes unacknowledged and stops
reading its socket until acks come, so a stream never holds more than WINDOW
in the tree's links or a slow reader's memory. Only loopback ports of the
asked node's own host can be reached: a session's node may already run any
command there, so this gives it nothing new.

Standard library only, Python 3.8 syntax. Not in the agent payload (most
agents never carry a stream): pushed with the node modules of the services
that use streams (bootstrap.SIDE_MODULES makes it pushable); agents on the
way only route the frames, and one that cannot route a stream's frame answers
its sender with stream_close (agent.py).
"""
from __future__ import annotations

import collections
import errno
import itertools
import socket
import threading

from gxpstyle.protocol import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

WINDOW = 4 << 20          # bytes in flight per direction (more than 1 s at 20 Mbit/s)
ACK_EVERY = 256 << 10     # acknowledge after this many bytes went into the socket


class _End:
    """This node's end of one stream: the local socket and the books of both
    directions."""

    def __init__(self, sid: str, peer: str, sock: socket.socket) -> None:
        self.sid, self.peer, self.sock = sid, peer, sock
        sock.setblocking(False)
        self.fd = sock.fileno()
        self.unacked = 0                 # sent to the peer, not yet acknowledged
        self.reading = False
        self.held = False                # until the congested parent link drains
        self.sent_eof = False
        self.out: collections.deque = collections.deque()   # from the peer, for the socket
        self.out_bytes = 0
        self.written = 0                 # went into the socket since the last ack
        self.peer_eof = False
        self.opened: Optional[Callable[[bool, str], None]] = None   # the opener's wait


class TreeStreams:
    """The streams of one node (the agent's `streams`)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.loop = node.loop
        self.ends: Dict[str, _End] = {}
        self._numbers = itertools.count(1)

    # -- the opener (any thread but the loop's) --------------------------------
    def open(self, node_id: str, port: int, timeout: float) -> socket.socket:
        """A socket connected through the tree to 127.0.0.1:port on node_id's
        host; OSError (in words) if the node cannot connect or does not answer
        within `timeout`."""
        mine, theirs = socket.socketpair()
        done = threading.Event()
        result = {"ok": False, "error": "no answer from node %s within %gs" % (node_id, timeout)}
        sid = "%s/%d" % (self.node.id, next(self._numbers))

        def opened(ok: bool, error: str) -> None:
            result.update(ok=ok, error=error)
            done.set()

        def start() -> None:
            end = _End(sid, node_id, theirs)
            end.opened = opened
            self.ends[sid] = end
            self.node.send(node_id, {"op": "stream_open", "sid": sid, "port": port})

        self.loop.call_soon_threadsafe(start)
        if not done.wait(timeout) or not result["ok"]:
            self.loop.call_soon_threadsafe(lambda: self._close(sid, "given up", tell=True))
            mine.close()
            code = errno.ETIMEDOUT if not done.is_set() else errno.ECONNREFUSED
            raise OSError(code, "through the tree: %s" % result["error"])
        return mine

    def op_stream_opened(self, src: str, msg: Dict[str, Any], link: Any) -> None:
        end = self.ends.get(msg["sid"])
        if end is None or end.peer != src or end.opened is None:
            return
        opened, end.opened = end.opened, None
        if msg["ok"]:
            self._read_on(end)
        else:
            self._close(end.sid, msg["error"], tell=False)
        opened(bool(msg["ok"]), msg["error"])

    # -- the asked node -------------------------------------------------------------
    def op_stream_open(self, src: str, msg: Dict[str, Any], link: Any) -> None:
        sid = msg["sid"]
        if not sid.startswith(src + "/") or sid in self.ends:
            self.node.send(src, {"op": "stream_opened", "sid": sid, "ok": False,
                                 "error": "bad stream id %s" % sid})
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        end = self.ends[sid] = _End(sid, src, sock)
        err = sock.connect_ex(("127.0.0.1", msg["port"]))
        if err in (errno.EINPROGRESS, errno.EAGAIN):
            self.loop.add_writer(end.fd, lambda: self._connected(end, msg["port"]))
        else:
            self._answer_open(end, err, msg["port"])

    def _connected(self, end: _End, port: int) -> None:
        self.loop.remove_writer(end.fd)
        self._answer_open(end, end.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), port)

    def _answer_open(self, end: _End, err: int, port: int) -> None:
        error = "" if not err else "%s: port %d on %s: %s" % (
            self.node.name, port, "127.0.0.1", errno.errorcode.get(err, str(err)))
        self.node.send(end.peer, {"op": "stream_opened", "sid": end.sid, "ok": not err,
                                  "error": error})
        if err:
            self._close(end.sid, error, tell=False)
        else:
            try:
                end.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self._read_on(end)

    # -- both ends --------------------------------------------------------------
    def _read_on(self, end: _End) -> None:
        if not end.reading and not end.held and not end.sent_eof and end.unacked < WINDOW:
            end.reading = True
            self.loop.add_reader(end.fd, lambda: self._readable(end))

    def _read_off(self, end: _End) -> None:
        if end.reading:
            end.reading = False
            self.loop.remove_reader(end.fd)

    def _readable(self, end: _End) -> None:
        try:
            data = end.sock.recv(wire.CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close(end.sid, e.strerror or str(e), tell=True)
            return
        end.unacked += len(data)
        if not data:
            end.sent_eof = True
            self._read_off(end)
        elif end.unacked >= WINDOW:
            self._read_off(end)
        self.node.send(end.peer, {"op": "stream_data", "sid": end.sid, "data": data,
                                  "eof": not data})
        self._hold_while_congested(end)
        self._maybe_done(end)

    def _hold_while_congested(self, end: _End) -> None:
        """A stream going up shares its node's link with everything else that
        does: while that link is congested, stop reading (as the agent stops
        its children and jobs), so many streams' windows do not pile up there."""
        parent = getattr(self.node, "parent", None)
        if (parent is None or not parent.congested or end.held
                or wire.is_descendant(end.peer, self.node.id)):
            return
        end.held = True
        self._read_off(end)

        def drained() -> None:
            end.held = False
            if self.ends.get(end.sid) is end:
                self._read_on(end)
        parent.when_drained(drained)

    def _mine(self, src: str, msg: Dict[str, Any]) -> Optional[_End]:
        end = self.ends.get(msg["sid"])
        return end if end is not None and end.peer == src and end.opened is None else None

    def op_stream_data(self, src: str, msg: Dict[str, Any], link: Any) -> None:
        end = self._mine(src, msg)
        if end is None:
            return
        if msg["data"]:
            end.out.append(msg["data"])
            end.out_bytes += len(msg["data"])
        end.peer_eof = end.peer_eof or bool(msg["eof"])
        self._flush(end)

    def op_stream_ack(self, src: str, msg: Dict[str, Any], link: Any) -> None:
        end = self._mine(src, msg)
        if end is not None:
            end.unacked = max(0, end.unacked - msg["bytes"])
            self._read_on(end)

    def op_stream_close(self, src: str, msg: Dict[str, Any], link: Any) -> None:
        # from the peer, or from an agent on the way that could not route the stream
        if msg["sid"] in self.ends:
            self._close(msg["sid"], msg["reason"], tell=False)

    def _flush(self, end: _End) -> None:
        while end.out:
            head = end.out[0]
            try:
                n = end.sock.send(head)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._close(end.sid, e.strerror or str(e), tell=True)
                return
            end.written += n
            end.out_bytes -= n
            if n < len(head):
                end.out[0] = head[n:]
                self.loop.add_writer(end.fd, lambda: self._flush(end))
                break
            end.out.popleft()
        else:
            self.loop.remove_writer(end.fd)
            if end.peer_eof:
                try:
                    end.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if end.written >= ACK_EVERY or (end.written and not end.out):
            self.node.send(end.peer, {"op": "stream_ack", "sid": end.sid, "bytes": end.written})
            end.written = 0
        self._maybe_done(end)

    def _maybe_done(self, end: _End) -> None:
        """Both directions ended and delivered: each end closes on its own."""
        if end.sent_eof and end.peer_eof and not end.out and self.ends.get(end.sid) is end:
            self._close(end.sid, "", tell=False)

    def _close(self, sid: str, reason: str, tell: bool) -> None:
        end = self.ends.pop(sid, None)
        if end is None:
            return
        self.loop.forget(end.fd)
        end.sock.close()
        if tell:
            self.node.send(end.peer, {"op": "stream_close", "sid": sid, "reason": reason})
        if end.opened is not None:
            opened, end.opened = end.opened, None
            opened(False, reason)
