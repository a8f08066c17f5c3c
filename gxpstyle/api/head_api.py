"""What a service may do on the head: the interface every service is given.

A service (gxpstyle/api/services.py) gets a HeadAPI of its own at construction:
its jobs go in its own books, its messages to nodes go to its own node sides,
and what it reads of the tree are read-only views. It reaches another service
only through an interface that service declares (gxpstyle/api/interfaces.py),
with `service(Interface)`. Nothing here hands out the head's tree, its
job table or another service's attributes.

Head-only (never shipped to agents).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Optional, Protocol, Sequence, Tuple, Type, TypeVar

T = TypeVar("T")
Env = Dict[str, Optional[str]]


@dataclass
class NodeCall:
    """A call a job's node makes itself to a role node below it (one of its
    own children: a service such as a mount on the job's host), instead of
    the head making it: no round trip of the head's on the job's way."""
    node: str                  # the role node's id
    call: str
    args: Dict[str, Any]
    wait: float                # seconds the job's node waits for the answer at most
                               # (0: a `before` is sent, the job starts at once)
    # of an `after`: a file on the job's host whose bytes the role node
    # changes with each change of its own (a generation): the job's `before`
    # of wait 0 is not sent while the last job that named it saw it
    # unchanged, and then the `after` is not made if it is unchanged at the
    # job's end: its answer is {"unchanged": True} (gxpstyle/node/node_calls.py)
    unless: str = ""


@dataclass
class JobCalls:
    """start_job's calls on one node: `before` is made and answered before
    the job starts there; `after` as it ends, its answer going to the head
    with the end, to after_answered(status, ok, error, result) before
    job_done (status: the share's exit status; a node that could not make
    the call, or not in time, answers ok=False)."""
    before: Optional[NodeCall] = None
    after: Optional[NodeCall] = None
    after_answered: Optional[Callable[[int, bool, str, Dict[str, Any]], None]] = None


class NodeView(Protocol):
    """A node of the explored tree, read-only: what a service may know of it."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def slots(self) -> int: ...
    @property
    def state(self) -> str: ...          # up, leaving, lost, quitting, quit, gone
    @property
    def reason(self) -> str: ...         # why it was lost
    @property
    def role(self) -> str: ...           # "" for an explored host, else a service's role
    @property
    def parent(self) -> Optional[str]: ...
    @property
    def up(self) -> bool: ...

    def names(self) -> List[str]: ...    # its name, hostname and short hostname


class HeadAPI(Protocol):
    # -- clients ------------------------------------------------------------
    def reply(self, client: str, req: int, status: int, result: Dict[str, Any]) -> None:
        """Answer request `req` of `client` (status 0 ok, 1 failed, 2 refused)."""
    def say(self, client: str, req: int, text: str, stream: int = 2, end: str = "\n") -> None:
        """A line for the client to print while its request runs."""
    def tell_client(self, client: str, src: str, msg: Dict[str, Any]) -> None:
        """A message to a client as if from node `src` (answers for a lost node's job)."""

    # -- the log and the loop -----------------------------------------------
    def log(self, text: str) -> None: ...
    def call_later(self, delay: float, fn: Callable[[], None]) -> int: ...
    def cancel(self, handle: Optional[int]) -> None: ...
    def at_end(self, fn: Callable[[], None]) -> None:
        """fn() once the events of this loop round are handled (batching)."""

    # -- nodes, read-only ---------------------------------------------------
    def node(self, nid: str) -> Optional[NodeView]: ...
    def nodes(self) -> List[NodeView]:
        """Every node the tree knows, in id order (lost ones too: see .up)."""
    def is_up(self, nid: str) -> bool: ...
    def name_of(self, nid: str) -> str:
        """What users call node `nid`: its name, or its id once it left the tree."""
    def wan_bytes(self) -> Dict[str, List[int]]:
        """Bytes [in, out] so far over each site's gateway link to the head, by
        the gateway's name (`gxpc stat`'s WAN line): what crossed between sites."""
    def site_of(self, nid: str) -> Optional[str]:
        """The id of the gateway whose site (a cluster behind it, derived from
        the `use` rules explore followed: gxpstyle/head/sites.py) holds node
        `nid`, or None: the head, and every node of a flat network."""

    # -- the session --------------------------------------------------------
    def session_env(self) -> Env:
        """The session's environment (`gxpc export`)."""
    def session_cwd(self) -> Optional[str]:
        """The session's directory (`gxpc cd`), or None."""

    # -- jobs, in this service's books ---------------------------------------
    def new_job(self) -> int: ...
    def announce_job(self, client: str, job: int) -> None:
        """The client heard of `job`, which starts later: hold what it sends it."""
    def forget_job(self, client: str, job: int) -> None: ...
    def start_job(self, client: str, job: int, nodes: List[str], cmd: str,
                  env_for: Callable[[str, int], Env], cwd_for: Callable[[str], Optional[str]],
                  stdin: bool = False,
                  base_for: Optional[Callable[[str], Tuple[Any, Env]]] = None,
                  calls_for: Optional[Callable[[str], Optional[JobCalls]]] = None) -> None:
        """Run `cmd` on `nodes`; output goes to `client` ("0": the head, and the
        exit to this service's job_done). calls_for(node): the calls that node
        makes to a role node of its own before and after its share (JobCalls)."""
    def start_tree_job(self, client: str, job: int, nodes: List[str], cmd: str, env: Env,
                       env_of: Callable[[str, int], Env], cwd: Optional[str],
                       head_cwd: Optional[str], stdin: bool = False, fold: bool = False) -> None:
        """Run `cmd` on `nodes` along the tree: the head sends one message per
        child, the agents pass it down and fold the exit statuses (with `fold`,
        identical output too) back up. Each node gets `env` and what
        env_of(node, index) adds; the head runs in `head_cwd`, the others in
        `cwd`. Output that is not folded streams to `client` as start_job's."""
    def kill_job(self, client: str, job: int, sig: int) -> None: ...
    def running_on(self, client: str, job: int) -> List[str]: ...

    # -- role nodes and code for the nodes -------------------------------------
    def push_modules(self, names: List[str], nodes: Optional[List[str]] = None) -> None:
        """Make head modules importable on `nodes` (default: every explored node)."""
    def spawn_role(self, parent: str, target: str, role: str, role_module: str,
                   config: Dict[str, Any], timeout: float,
                   done: Callable[[bool, str, Dict[str, Any], str], None]) -> str:
        """Start a role node under `parent` running `role_module`; done(ok,
        reason, info, child) once it is up. Returns the child's id."""
    def call_role(self, node: str, call: str, args: Dict[str, Any],
                  done: Callable[[bool, str, Dict[str, Any]], None]) -> None:
        """A call to a role node; done(ok, error, result) on its reply or its loss."""
    def retire_role(self, node: str) -> None:
        """This service is done with role node `node`: it leaves the tree's
        listing and, if it still runs, is told to quit."""

    # -- agents on demand (elastic pools: use --elastic MIN-MAX) -------------------
    def demand(self, waiting_since: Sequence[float], busy: Collection[str]) -> None:
        """This service's demand for agents, replacing what it said before:
        when (time.monotonic()) each of its ready tasks began waiting for a
        slot, and the nodes its work occupies now (read during the call only).
        The core submits agents for tasks that waited past a pool's wait
        threshold and releases agents no service keeps busy. Nothing happens
        when no rule is elastic; say it when either changes (once a loop
        round is enough: at_end)."""
    def agents_on_demand(self) -> bool:
        """True while some use rule is elastic: a task that finds no free
        slot should then wait for one (and count in `demand`) rather than
        crowd a busy node."""

    # -- this service's node sides --------------------------------------------
    def send_node(self, node: str, mtype: str, body: Dict[str, Any]) -> None:
        """A message of this service's to its node side on `node` (which the
        node starts hosting at the first one: Service.node_side)."""

    # -- other services --------------------------------------------------------
    def service(self, iface: Type[T]) -> Optional[T]:
        """The service that declares interface `iface`, or None if none does."""
