"""How services plug into the head: request verbs, events, stat fields, messages.

The session daemon (gxpstyle/head/daemon.py) owns the tree and the client sockets;
everything a user asks for is a request verb of some service. Core services
(explore, the parallel shell, bcast, the replica catalog) live in gxpstyle;
others (GMount in sshfsmux, `gxpc make` in make_backend) register through the
`gxpstyle.services` entry point group, so the core never imports them. A
service is given a HeadAPI of its own (head_api.py) and:

- declares its verbs, each with the schema of its arguments: the head checks
  every request against it before the handler runs, and a handler that raises
  fails that one request with a one-line error while the session goes on;
- hears events: a node up, a subtree lost, a client gone, one of its jobs ended,
  an elastic pool grown or shrunk (pool_changed);
- when it may want more agents, tells the core its demand (HeadAPI.demand) and
  answers whether it still holds a node the core is about to release (holds_node);
- adds fields to `stat`;
- may have a node side (node_side.py): `node_side` names its class, and
  `node_modules` what the head pushes first; it declares the message types it
  takes from its node sides (node_messages), each with the schema of its
  body, and sends them its own (HeadAPI.send_node);
- declares interfaces other services may call (interfaces.py), by subclassing
  them: HeadAPI.service(Interface) finds it.

Head-only (never shipped to agents).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple, Type

from gxpstyle.api.node_side import Message
from gxpstyle.protocol.schema import Rec

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

__all__ = ["ENTRY_POINT_GROUP", "Message", "Service", "Verb", "after", "describe_error"]

ENTRY_POINT_GROUP = "gxpstyle.services"

Handler = Callable[[str, int, Dict[str, Any]], None]


@dataclass
class Verb:
    """A request verb: `handler(client, req, args)` runs with args checked."""
    handler: Handler
    args: Rec = field(default_factory=Rec)


class Service:
    """Base class: override what the service needs; every hook has a no-op default."""

    name = "service"
    # "module:Class" of this service's node side (node_side.NodeSide), "" if
    # none, and the modules the head pushes before a node hosts it (none for
    # a node side in the agent payload).
    node_side = ""
    node_modules: List[str] = []

    def __init__(self, head: HeadAPI) -> None:
        self.head = head

    def verbs(self) -> Dict[str, Verb]:
        return {}

    def node_messages(self) -> Dict[str, Message]:
        """Message types this service takes from its node sides, each with the
        schema of its body and handler(node, body)."""
        return {}

    def node_up(self, nid: str) -> None:
        """An explored node (not a role node) came up."""

    def node_lost(self, lost: str, reason: str) -> None:
        """Every node under `lost` (itself included) is gone."""

    def side_failed(self, nid: str, error: str) -> None:
        """Node `nid` could not host this service's node side (`error` says
        why, naming the node): what waited on it there must fail."""

    def client_closed(self, client: str) -> None:
        """A client went away (its jobs are already killed by the job table)."""

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        """One node's share of a job this service started has ended."""

    def stat(self) -> Dict[str, Any]:
        """Fields added to `gxpc stat`'s reply."""
        return {}

    def holds_node(self, nid: str) -> bool:
        """Whether this service's work still occupies node `nid` (asked as an
        elastic pool marks the node leaving: a held node is kept)."""
        return False

    def pool_changed(self, event: str, pool: str, what: str, up: int) -> None:
        """An elastic pool (its rule, `pool`) changed: `event` is submit, up,
        release, gone, cancel, lost (`what` names the agent) or failed (`what`
        says why); `up` agents of the pool are up now."""


def after(count: int, done: Callable[[], None]) -> Callable[..., None]:
    """A callback that calls done() once it has itself been called `count`
    times (whatever it is passed); done() at once if count is 0."""
    left = [count]
    if count <= 0:
        done()

    def one(*_: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            done()
    return one


def load_plugins(log: Callable[[str], None]) -> List[Tuple[str, Type[Service]]]:
    """Services registered by installed packages (entry points), by name order.
    One that fails to load is logged and skipped: the core still works."""
    try:
        from importlib import metadata
    except ImportError:   # Python 3.7: no plugins
        return []
    try:
        eps = metadata.entry_points()
        found = list(eps.select(group=ENTRY_POINT_GROUP)) if hasattr(eps, "select") \
            else list(eps.get(ENTRY_POINT_GROUP, []))  # type: ignore[attr-defined]
    except Exception as e:   # a broken installation must not stop the daemon
        log("service plugins not loaded: %s" % e)
        return []
    out: List[Tuple[str, Type[Service]]] = []
    seen = set()
    for ep in sorted(found, key=lambda e: e.name):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Service)):
                raise ValueError("%s is not a service class" % ep.value)
            out.append((ep.name, cls))
        except Exception as e:
            log("service %s not loaded: %s" % (ep.name, e))
    return out


def describe_error(e: BaseException) -> str:
    """A one-line reason for a handler that failed, without class names."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or "internal error (see the session log)"


def log_exception(log: Callable[[str], None], where: str) -> None:
    import traceback
    log("%s failed:\n%s" % (where, "".join(traceback.format_exception(*sys.exc_info()))))
