"""The echo service's head side: the `echo` verb and the `pong` messages.

`echo` sends a `ping` to the node side on every explored node (the head
included) and answers the client once every one of them has sent its `pong`
back, was lost, or could not host the node side. Registered by an entry point
in the `gxpstyle.services` group; it uses only the core's public service interface (services,
head_api, schema).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Set

from gxpstyle.api.services import Message, Service, Verb
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Int, Rec, Str

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

# The verb's arguments. `malformed` also sends every node side a ping its
# schema refuses, `bad_reply` asks every node side for a pong ours refuses
# (the tests' way to see a bad body stopped before any handler). `marker_dir`:
# where each node side's thread says it stopped.
ECHO_ARGS = Rec({"text": Str(1000)},
                {"malformed": Bool(), "bad_reply": Bool(), "marker_dir": Str(4096)})
# What a node side sends back (node.py declares the ping it takes).
PONG = Rec({"seq": Int(1, 1 << 62), "text": Str(2000), "node": Str(wire.MAX_ADDR, empty=False)})


@dataclass
class Echo:
    client: str
    req: int
    waiting: Set[str]
    replies: Dict[str, str] = field(default_factory=dict)
    errors: Dict[str, str] = field(default_factory=dict)


class EchoService(Service):
    name = "echo"
    node_side = "echo_service.node:EchoSide"
    node_modules = ["echo_service.node"]     # pushed to a node before it hosts the side

    def __init__(self, head: HeadAPI) -> None:
        super().__init__(head)
        self.echoes: Dict[int, Echo] = {}
        self.seq = 0
        self.pongs = 0          # pongs the handler saw (a refused one never reaches it)

    def verbs(self) -> Dict[str, Verb]:
        return {"echo": Verb(self.req_echo, ECHO_ARGS)}

    def node_messages(self) -> Dict[str, Message]:
        return {"pong": Message(PONG, self.on_pong)}

    def stat(self) -> Dict[str, Any]:
        return {"echo_pongs": self.pongs}

    def req_echo(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        nodes = [n.id for n in self.head.nodes() if n.up and not n.role]
        self.seq += 1
        self.echoes[self.seq] = Echo(cid, req, set(nodes))
        for nid in nodes:
            if args.get("malformed"):
                self.head.send_node(nid, "ping", {"seq": "one", "text": args["text"]})
            self.head.send_node(nid, "ping", {
                "seq": self.seq, "text": args["text"], "bad_reply": bool(args.get("bad_reply")),
                "marker_dir": args.get("marker_dir", "")})

    def on_pong(self, node: str, body: Dict[str, Any]) -> None:
        self.pongs += 1
        echo = self.echoes.get(body["seq"])
        if echo is None or node not in echo.waiting:
            return
        echo.waiting.discard(node)
        echo.replies[self.head.name_of(node)] = body["text"]
        self._maybe_done(body["seq"])

    def node_lost(self, lost: str, reason: str) -> None:
        for seq, echo in list(self.echoes.items()):
            echo.waiting = {n for n in echo.waiting if not wire.is_descendant(n, lost)}
            self._maybe_done(seq)

    def side_failed(self, nid: str, error: str) -> None:
        """The node could not host EchoSide: no pong will come from it."""
        for seq, echo in list(self.echoes.items()):
            if nid in echo.waiting:
                echo.waiting.discard(nid)
                echo.errors[self.head.name_of(nid)] = error
                self._maybe_done(seq)

    def _maybe_done(self, seq: int) -> None:
        echo = self.echoes[seq]
        if echo.waiting:
            return
        del self.echoes[seq]
        if echo.errors:
            self.head.reply(echo.client, echo.req, 1,
                            {"error": "; ".join(echo.errors[n] for n in sorted(echo.errors))})
        else:
            self.head.reply(echo.client, echo.req, 0, {"replies": echo.replies})
