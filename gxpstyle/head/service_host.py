"""The head's side of HeadAPI: one ServiceHost per service, bound to it.

Each service gets its own, so that what it does is filed under it: its jobs
in its books (the job table), its messages to its own node sides, its role
nodes. Read-only views of the tree are the tree's own NodeInfo records typed
as head_api.NodeView (mypy keeps services from writing them).

Head-only, and the head's own: services import head_api, never this module.
"""
from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Collection,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
)

from gxpstyle.api.head_api import Env, JobCalls, NodeView
from gxpstyle.api.interfaces import Shell
from gxpstyle.api.services import Service

if TYPE_CHECKING:
    from gxpstyle.head.daemon import Head

T = TypeVar("T")


class ServiceHost:
    """HeadAPI for one service (see head_api.py for what each call means)."""

    def __init__(self, head: Head, name: str) -> None:
        self._head = head
        self._name = name
        self._owner: Optional[Service] = None

    def bind(self, owner: Service) -> None:
        self._owner = owner

    @property
    def owner(self) -> Service:
        if self._owner is None:
            raise ValueError("service %s used the head before it was made" % self._name)
        return self._owner

    # -- clients ------------------------------------------------------------------
    def reply(self, client: str, req: int, status: int, result: Dict[str, Any]) -> None:
        self._head.reply(client, req, status, result)

    def say(self, client: str, req: int, text: str, stream: int = 2, end: str = "\n") -> None:
        self._head.say(client, req, text, stream, end)

    def tell_client(self, client: str, src: str, msg: Dict[str, Any]) -> None:
        self._head.deliver_to_client(client, src, msg)

    # -- the log and the loop -----------------------------------------------------
    def log(self, text: str) -> None:
        self._head.write_log(text)

    def call_later(self, delay: float, fn: Callable[[], None]) -> int:
        return self._head.loop.call_later(delay, fn)

    def cancel(self, handle: Optional[int]) -> None:
        self._head.loop.cancel(handle)

    def at_end(self, fn: Callable[[], None]) -> None:
        self._head.loop.at_end(fn)

    # -- nodes ----------------------------------------------------------------------
    def node(self, nid: str) -> Optional[NodeView]:
        return self._head.tree.get(nid)

    def nodes(self) -> List[NodeView]:
        tree = self._head.tree
        return [tree[nid] for nid in sorted(tree, key=id_key)]

    def is_up(self, nid: str) -> bool:
        n = self._head.tree.get(nid)
        return n is not None and n.state == "up"

    def name_of(self, nid: str) -> str:
        n = self._head.tree.get(nid)
        return n.name if n is not None else nid

    def site_of(self, nid: str) -> Optional[str]:
        return self._head.explorer.site_of(nid)

    def wan_bytes(self) -> Dict[str, List[int]]:
        return self._head.wan_bytes()

    # -- the session ----------------------------------------------------------------
    def session_env(self) -> Env:
        shell = self.service(Shell)
        return shell.env() if shell is not None else {}

    def session_cwd(self) -> Optional[str]:
        shell = self.service(Shell)
        return shell.cwd() if shell is not None else None

    # -- jobs -----------------------------------------------------------------------
    def new_job(self) -> int:
        return self._head.job_table.new_id()

    def announce_job(self, client: str, job: int) -> None:
        self._head.job_table.announce(client, job)

    def forget_job(self, client: str, job: int) -> None:
        self._head.job_table.forget(client, job)

    def start_job(self, client: str, job: int, nodes: List[str], cmd: str,
                  env_for: Callable[[str, int], Env], cwd_for: Callable[[str], Optional[str]],
                  stdin: bool = False,
                  base_for: Optional[Callable[[str], Tuple[Any, Env]]] = None,
                  calls_for: Optional[Callable[[str], Optional[JobCalls]]] = None) -> None:
        self._head.job_table.start(self.owner, client, job, nodes, cmd, env_for, cwd_for,
                                   stdin=stdin, base_for=base_for, calls_for=calls_for)

    def start_tree_job(self, client: str, job: int, nodes: List[str], cmd: str, env: Env,
                       env_of: Callable[[str, int], Env], cwd: Optional[str],
                       head_cwd: Optional[str], stdin: bool = False, fold: bool = False) -> None:
        self._head.job_table.start_tree(self.owner, client, job, nodes, cmd, env, env_of, cwd,
                                        head_cwd, stdin=stdin, fold=fold)

    def kill_job(self, client: str, job: int, sig: int) -> None:
        self._head.job_table.kill(client, job, sig)

    def running_on(self, client: str, job: int) -> List[str]:
        return self._head.job_table.running_on(client, job)

    # -- role nodes and code for the nodes -------------------------------------------
    def push_modules(self, names: List[str], nodes: Optional[List[str]] = None) -> None:
        self._head.push_modules(names, nodes)

    def spawn_role(self, parent: str, target: str, role: str, role_module: str,
                   config: Dict[str, Any], timeout: float,
                   done: Callable[[bool, str, Dict[str, Any], str], None]) -> str:
        return self._head.spawn_service(parent, target, role, role_module, config, timeout, done)

    def call_role(self, node: str, call: str, args: Dict[str, Any],
                  done: Callable[[bool, str, Dict[str, Any]], None]) -> None:
        self._head.call_service(node, call, args, done)

    def retire_role(self, node: str) -> None:
        self._head.retire_role(node)

    # -- agents on demand -------------------------------------------------------------
    def demand(self, waiting_since: Sequence[float], busy: Collection[str]) -> None:
        self._head.explorer.pools.demand(self._name, waiting_since, busy)

    def agents_on_demand(self) -> bool:
        return any(p.hi > 0 for p in self._head.explorer.pools.pools.values())

    # -- node sides and other services ------------------------------------------------
    def send_node(self, node: str, mtype: str, body: Dict[str, Any]) -> None:
        self._head.send_node(self.owner, node, mtype, body)

    def service(self, iface: Type[T]) -> Optional[T]:
        for svc in self._head.services:
            if isinstance(svc, iface):
                return svc
        return None


class TreeHost(ServiceHost):
    """The explorer's: it builds the tree, so it may add to it."""

    def new_req(self) -> int:
        return self._head.new_req()

    def new_child_id(self, parent: str) -> str:
        return self._head.new_child_id(parent)

    def node_up(self, nid: str, name: str, parent: str, channel: str, info: Dict[str, Any]) -> None:
        self._head.node_up(nid, name, parent, channel, info)

    def spawn(self, parent: str, msg: Dict[str, Any]) -> None:
        """A `spawn` to `parent` (the explorer hears its `spawned`)."""
        self._head.send(parent, msg)

    # -- what elastic pools do to their agents (elastic.py) ------------------------
    def unspawn(self, parent: str, child: str) -> None:
        """`parent` stops bringing `child` up (a batch job still queued is cancelled)."""
        self._head.send(parent, {"op": "unspawn", "child": child})

    def mark_leaving(self, nid: str, reason: str) -> None:
        """Node `nid` is being released: no longer up, so nothing is placed on it."""
        n = self._head.tree.get(nid)
        if n is not None and n.state == "up":
            n.state, n.reason = "leaving", reason

    def quit_node(self, nid: str) -> None:
        """Tell a leaving node to quit (its batch job ends with it)."""
        n = self._head.tree.get(nid)
        if n is not None and n.state == "leaving":
            self._head.send(nid, {"op": "quit"})

    def services(self) -> List[Service]:
        return list(self._head.services)

    def runs_jobs(self, nid: str) -> bool:
        """A job of the job table (any service's) still runs on `nid`."""
        return self._head.job_table.runs_on(nid)


def id_key(nid: str) -> List[int]:
    try:
        return [int(x) for x in nid.split(".")]
    except ValueError:
        return [1 << 30]
