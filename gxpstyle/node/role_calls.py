"""A node's part in services: the role it may serve and the node sides it
hosts (gxpstyle/api/node_side.py), the head's calls to them, and the calls
its jobs make to role nodes below it (node_calls.py). A mixin of agent.Node.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

from gxpstyle.api.node_side import describe_error
from gxpstyle.launch import bootstrap
from gxpstyle.protocol import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

    from gxpstyle.transport.links import Link


class RoleCalls:
    if TYPE_CHECKING:       # what agent.Node supplies (for type checkers only)
        id: str
        name: str
        quitting: bool
        sides: Dict[str, Any]
        role: str
        _calls: Any

        def send(self, dst: str, msg: Dict[str, Any]) -> None: ...
        def log(self, text: str, level: str = "info") -> None: ...

    def node_calls(self) -> Any:
        """Calls of jobs to role nodes below this one (node_calls.py), made
        the first time an exec carries one; None on a node the head did not
        push that module to (the service that gives jobs calls pushes it
        with its own: most agents never need it)."""
        if self._calls is None:
            try:
                from gxpstyle.node.node_calls import NodeCalls
            except ImportError:
                return None
            self._calls = NodeCalls(self)
        return self._calls

    def op_svc_reply(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """A role node below answers a call this node made (node_calls.py)."""
        if self._calls is not None:
            self._calls.replied(src, msg)

    def op_svc(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """A call to this node's role (a service such as GMount's per-node mount)."""
        side = self.sides.get(self.role)
        handler = side.calls().get(msg["call"]) if side is not None else None
        if handler is None:
            self.send(src, {"op": "svc_reply", "req": msg["req"], "ok": False,
                            "error": "no such service call %r on %s" % (msg["call"], self.name),
                            "result": {}})
            return

        def reply(ok: bool, error: str = "", result: Optional[Dict[str, Any]] = None) -> None:
            self.send(src, {"op": "svc_reply", "req": msg["req"], "ok": ok, "error": error,
                            "result": result or {}})
        handler(msg["args"], reply)

    def op_svc_msg(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """A service's own message: to the node side of that service here."""
        side = self.sides.get(msg["svc"])
        if side is None:
            self.log("no node side of %s here for a message from %s" % (msg["svc"], src))
            return
        side.deliver(src, msg)

    def op_side(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """The head asks this node to host a service's node side."""
        if src != wire.HEAD or msg["svc"] in self.sides or self.quitting:
            return
        from gxpstyle.api.node_side import NodeSide
        try:
            if self.id == wire.HEAD:        # the head's own installation
                import importlib
                module = importlib.import_module(msg["module"])
            else:
                module = role_module(msg["module"], core=True)
            cls = getattr(module, msg["cls"], None)
            if not (isinstance(cls, type) and issubclass(cls, NodeSide)):
                raise ValueError("%s.%s is not a node side" % (msg["module"], msg["cls"]))
            self.host_side(msg["svc"], cls())
        except Exception as e:     # whatever the side's code raised: the head must hear it
            self.sides.pop(msg["svc"], None)
            text = "%s cannot host %s: %s" % (self.name, msg["svc"], describe_error(e))
            self.log(text)
            self.send(src, {"op": "side_failed", "svc": msg["svc"], "error": text})

    def host_side(self, svc: str, side: Any) -> None:
        from gxpstyle.api.node_side import NodeHost
        self.sides[svc] = side
        side.start(NodeHost(self, svc))



def role_module(name: str, core: bool = False) -> Any:
    """Code the head shipped: a module it pushed (never one of the core's own),
    or with `core` one of the agent payload too (a node side's)."""
    if not (bootstrap.pushable(name) or (core and name in bootstrap.AGENT_MODULES)):
        raise ValueError("module %r is not one the head may name" % name)
    import importlib
    module = importlib.import_module(name)
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    if type(loader).__name__ != "_GxpImporter":
        raise ValueError("module %r was not shipped by the head" % name)
    return module
