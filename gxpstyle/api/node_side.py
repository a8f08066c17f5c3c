"""A service's node side: the part of a service that runs on the nodes.

The node hosts it (NodeSide), gives it a NodeHost, and routes to it its
service's messages (`svc_msg`, by service name), each body checked against the
schema declared for its type before a handler sees it. Hosted in every agent
the head asks (`side`), or in a role node (its module's start() returns it).
docs/writing-a-service.md tells the whole story.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import SchemaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from gxpstyle.protocol.schema import Rec


class Message:
    """A type a side accepts: its body's schema and handler(src, body). With
    `peers`, nodes may send it too (else only the head), on the node side."""
    __slots__ = ("body", "handler", "peers")

    def __init__(self, body: Rec, handler: Callable[[str, Dict[str, Any]], None],
                 peers: bool = False) -> None:
        self.body, self.handler, self.peers = body, handler, peers


def checked(svc: str, table: Dict[str, Message], msg: Dict[str, Any]
            ) -> Tuple[Message, Dict[str, Any]]:
    """A `svc_msg`'s declared type and its body, checked; ValueError in words."""
    spec = table.get(msg["type"])
    if spec is None:
        raise ValueError("%s: no message type %r" % (svc, msg["type"]))
    try:
        return spec, spec.body.check(msg["body"], "%s.%s" % (svc, msg["type"]))
    except SchemaError as e:
        raise ValueError(str(e))


def message(svc: str, mtype: str, body: Dict[str, Any]) -> Dict[str, Any]:
    return {"op": "svc_msg", "svc": svc, "type": mtype, "body": body}


class NodeHost:
    """What a node side may use of its node: id, name, secret, opts (read
    them only), loop (for sockets of its own), call_soon_threadsafe and
    call_later (the loop's), send, log, tls_files, session_dir, open_stream."""

    def __init__(self, node: Any, svc: str) -> None:
        self._node, self.svc = node, svc
        self.id, self.name, self.secret, self.opts = node.id, node.name, node.secret, node.opts
        self.loop = node.loop
        self.call_soon_threadsafe, self.call_later = node.loop.call_soon_threadsafe, node.loop.call_later
        self.log, self.tls_files, self.session_dir = node.log, node.tls_files, node.ensure_session_dir

    def send(self, dst: str, mtype: str, body: Dict[str, Any]) -> None:
        """A message of this service to node `dst` (wire.HEAD: its head side)."""
        self._node.send(dst, message(self.svc, mtype, body))

    def open_stream(self, node_id: str, port: int, timeout: float) -> Any:
        """A socket carried along the tree to 127.0.0.1:`port` on node
        `node_id`'s host, for a peer this host cannot connect to itself
        (gxpstyle/node/tree_streams.py); OSError in words if it cannot be had
        within `timeout`. Blocks: call it from a thread of the side's own."""
        streams = self._node.streams()
        if streams is None:
            import errno
            raise OSError(errno.ENOSYS, "%s cannot carry a stream: the head did not push "
                          "gxpstyle.node.tree_streams to it" % self.name)
        return streams.open(node_id, port, timeout)


class NodeSide:
    """Base class: override messages(), start(), stop(); calls() serves a role
    node's calls (name -> handler(args, reply)). spawn() starts a thread this
    side owns; stop() joins them (for at most `seconds`)."""
    seconds = 2.0

    def __init__(self) -> None:
        self.host: Optional[NodeHost] = None
        self.threads: List[Any] = []
        self.table: Optional[Dict[str, Message]] = None

    def start(self, host: NodeHost) -> None:
        self.host = host

    def messages(self) -> Dict[str, Message]:
        return {}

    def calls(self) -> Dict[str, Callable[..., None]]:
        return {}

    def spawn(self, fn: Callable[..., None], *args: Any) -> None:
        import threading
        t = threading.Thread(target=fn, args=args, daemon=True)
        self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def stop(self) -> None:
        import time
        end = time.monotonic() + self.seconds
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))

    def deliver(self, src: str, msg: Dict[str, Any]) -> None:
        """A `svc_msg` for this side: checked, then handled (a bad one is logged)."""
        if self.table is None:
            self.table = self.messages()
        try:
            spec, body = checked(msg["svc"], self.table, msg)
        except ValueError as e:
            if self.host is not None:
                self.host.log("refused a message from %s: %s" % (src, e))
            return
        if src == wire.HEAD or spec.peers:
            spec.handler(src, body)


def describe_error(e: BaseException) -> str:
    """One line in the user's words: the message a ValueError or OSError
    carries, never a class name; anything else is a bug and says so."""
    if isinstance(e, OSError) and e.strerror:
        return "%s: %s" % (e.filename, e.strerror) if e.filename else e.strerror
    text = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, ValueError) and text:
        return text
    return "internal error: %s" % (text or "no detail")
