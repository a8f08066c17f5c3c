"""The echo service's node side: takes `ping` from the head, answers `pong`.

A worker thread this side owns answers the pings (a node side's blocking work
belongs in a thread, never on the node's event loop); stop() ends it and waits
for it. Pushed by the head to the nodes that host it: standard library only,
Python 3.8 syntax.
"""
from __future__ import annotations

import os
import queue

from gxpstyle.api.node_side import Message, NodeSide
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Int, Rec, Str

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

    from gxpstyle.api.node_side import NodeHost

PING = Rec({"seq": Int(1, 1 << 62), "text": Str(1000)}, {"bad_reply": Bool(), "marker_dir": Str(4096)})


class EchoSide(NodeSide):
    def start(self, host: NodeHost) -> None:
        super().start(host)
        self.work: queue.Queue[Any] = queue.Queue()
        self.marker_dir = ""
        self.spawn(self.worker)

    def messages(self) -> Dict[str, Message]:
        return {"ping": Message(PING, self.on_ping)}

    def on_ping(self, src: str, body: Dict[str, Any]) -> None:
        self.marker_dir = body.get("marker_dir") or self.marker_dir
        self.work.put(body)

    def worker(self) -> None:
        host = self.host
        assert host is not None
        while True:
            body = self.work.get()          # blocks until a ping, or stop()'s None
            if body is None:
                break
            if body.get("bad_reply"):       # a pong the head's schema refuses
                self.answer({"seq": body["seq"], "text": 5, "node": host.id})
            self.answer({"seq": body["seq"], "text": "%s from %s" % (body["text"], host.id),
                         "node": host.id})
        if self.marker_dir:                 # the test's proof that the thread ended at stop()
            with open(os.path.join(self.marker_dir, "stopped-" + host.id), "w") as f:
                f.write("stopped\n")

    def answer(self, pong: Dict[str, Any]) -> None:
        host = self.host
        assert host is not None
        # sending is the node loop's: from this thread, hand it over
        host.call_soon_threadsafe(lambda: host.send(wire.HEAD, "pong", pong))

    def stop(self) -> None:
        self.work.put(None)
        super().stop()                      # joins the worker
