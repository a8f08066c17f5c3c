"""How services plug into the head: request verbs, events, stat fields, jobs.

The session daemon (gxpstyle/daemon.py) owns the tree and the client sockets;
everything a user asks for is a request verb of some service. Core services
(explore, the parallel shell) live in gxpstyle; others (GMount in sshfsmux,
`gxpc make` in make_backend) register through the `gxpstyle.services` entry
point group, so the core never imports them. A service:

- declares its verbs, each with the schema of its arguments: the head checks
  every request against it before the handler runs, and a handler that raises
  fails that one request with a one-line error while the session goes on;
- hears events: a subtree lost, a client gone, one of its jobs ended;
- adds fields to `stat`;
- starts jobs on nodes through the head's JobTable, in its own books (so that
  `gxpc make`'s recipes never change what `gxpc smask` selects);
- may start role nodes (a mount service under an agent) and push the modules
  they need (HeadAPI.spawn_role, HeadAPI.push_modules).

Head-only (never shipped to agents).
"""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from gxpstyle import wire
from gxpstyle.schema import Rec

if TYPE_CHECKING:
    from gxpstyle.daemon import Head

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

    def __init__(self, head: "Head") -> None:
        self.head = head

    def verbs(self) -> Dict[str, Verb]:
        return {}

    def node_up(self, nid: str) -> None:
        """A node that runs jobs came up (an explore reached it)."""

    def node_lost(self, lost: str, reason: str) -> None:
        """Every node under `lost` (itself included) is gone."""

    def client_closed(self, client: str) -> None:
        """A client went away (its jobs are already killed by the JobTable)."""

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        """One node's share of a job this service started has ended."""

    def stat(self) -> Dict[str, Any]:
        """Fields added to `gxpc stat`'s reply."""
        return {}

    def files_changed(self, node: str, paths: List[str], done: Callable[[], None]) -> None:
        """Node `node` just wrote (or removed) `paths` (absolute, as users see
        them on the nodes); `node` is "" when nobody wrote them as complete
        files (a failed recipe: caches go, nothing is recorded). A service
        that caches what these files look like (a mount's kernel caches, the
        replica catalog's sizes) acts, then
        calls done() exactly once; Head.files_changed waits for every
        service's done before it answers. The default acts on nothing."""
        done()

    def watched_paths(self) -> List[str]:
        """Absolute paths under which this service caches what files look
        like (a mount's mountpoint): files_changed matters only for paths
        under one of these. The default watches nothing."""
        return []

    def replica_dir(self, node: str, path: str) -> Optional[str]:
        """A directory on `node`'s host where a transfer may write a complete
        copy of `path` (as users see it on the nodes) for adopt_replica, or
        None if this service does not keep such files."""
        return None

    def adopt_replica(self, node: str, path: str, file: str, source: str,
                      done: Callable[[bool, str, str], None]) -> bool:
        """`file` (in replica_dir) is now a complete, verified copy of `path`
        on `node`'s host, copied from node `source`: make it the copy that
        host uses. False if not this service's; else done(ok, error, holder)
        exactly once, `holder` being the node id the catalog records."""
        return False

    def pin_replicas(self, node: str, paths: List[str], pin: bool,
                     done: Callable[[], None]) -> None:
        """A recipe about to run on `node` needs `paths` (pin True) or has
        ended (False): the copies this service keeps of them on that host must
        not be evicted meanwhile. done() exactly once, when the pins hold."""
        done()


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


def node_is_up(tree: Dict[str, Any], nid: str) -> bool:
    """Node `nid` of the head's tree is explored and up."""
    n = tree.get(nid)
    return n is not None and n.state == "up"


def node_name(tree: Dict[str, Any], nid: str) -> str:
    """What users call node `nid`: its name, or its id once it left the tree."""
    n = tree.get(nid)
    return n.name if n is not None else nid

def under_watched(services: List[Service], paths: List[str]) -> List[str]:
    """Those of `paths` (absolute, normalized) that lie under a path some
    service watches (Service.watched_paths): only they need files_changed."""
    roots = [r.rstrip("/") + "/" for svc in services for r in svc.watched_paths()]
    if not roots:
        return []
    return [p for p in paths if any(p.startswith(r) for r in roots)]


def load_plugins(head: "Head") -> List[Service]:
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
        head.write_log("service plugins not loaded: %s" % e)
        return []
    out: List[Service] = []
    seen = set()
    for ep in sorted(found, key=lambda e: e.name):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            cls = ep.load()
            out.append(cls(head))
        except Exception as e:
            head.write_log("service %s not loaded: %s" % (ep.name, e))
    return out


# -- jobs ---------------------------------------------------------------------
@dataclass
class JobRecord:
    owner: Service
    client: str
    nodes: Dict[str, Optional[int]]      # node id -> exit status, None while running
    output: bytearray = field(default_factory=bytearray)   # the head's own jobs only


MAX_INTERNAL_OUTPUT = 64 << 10
ENV_BASES = 32    # job_runner.ENV_BASES: the bases a node keeps


class JobTable:
    """Jobs the head started, by (client, job id), each owned by a service.

    A node reports a job's end to the head with `done` (the `exec` carries
    notify), so the head never decodes the client's output frames. A lost
    node's jobs are answered for here; a client that goes away has its jobs
    killed. A client of "0" is the head itself: such a job's output and exit
    come back to the owner (`job_output`)."""

    def __init__(self, head: "Head") -> None:
        self.head = head
        self.seq = 0
        self.jobs: Dict[Tuple[str, int], JobRecord] = {}
        # Environment bases each node keeps (job_runner.ENV_BASES, oldest
        # first, forgotten in the same order): node id -> {caller's key: id}
        self.bases: Dict[str, Dict[Any, int]] = {}
        self.base_seq = 0
        # Jobs their client has heard of but that have not started (their
        # inputs are still being copied): the frames the client sent them
        # (stdin, kill, output credit), in order, go out after the exec. Held
        # stdin is bounded by the client's window (it waits for stdin_ack).
        self.announced: Dict[Tuple[str, int], List[Tuple[str, bytes]]] = {}

    def new_id(self) -> int:
        """A job id, taken before start() so the client can hear it first."""
        self.seq += 1
        return self.seq

    def announce(self, client: str, job: int) -> None:
        """The client heard of `job`, which starts later: hold what it sends the job."""
        self.announced[(client, job)] = []

    def hold(self, client: str, job: Any, dst: str, frame: bytes) -> bool:
        """Keep a client's frame for a job not started yet (True), else False."""
        held = self.announced.get((client, job))
        if held is None:
            return False
        held.append((dst, frame))
        return True

    def forget(self, client: str, job: int) -> None:
        """A job announced to its client will never start: drop what it sent."""
        self.announced.pop((client, job), None)

    def start(self, owner: Service, client: str, job: int, nodes: List[str], cmd: str,
              env_for: Callable[[str, int], Dict[str, Optional[str]]],
              cwd_for: Callable[[str], Optional[str]], stdin: bool = False,
              base_for: Optional[Callable[[str], Tuple[Any, Dict[str, Optional[str]]]]] = None) -> None:
        """Start job `job` on `nodes`; its output and exit go to `client`.
        With base_for(node) -> (key, environment), env_for gives only what
        differs from that environment, which goes to each node once per key
        (a make's recipes share one: it is not sent with every recipe)."""
        if not nodes:
            return
        self.jobs[(client, job)] = JobRecord(owner, client, {n: None for n in nodes})
        for idx, nid in enumerate(nodes):
            msg = {"op": "exec", "job": job, "cmd": cmd, "cwd": cwd_for(nid),
                   "env": env_for(nid, idx), "stdin": stdin, "notify": True}
            if base_for is not None:
                self._with_base(msg, nid, *base_for(nid))
            self.head.route_frame(nid, wire.encode_frame(nid, client, msg), None)
        for dst, frame in self.announced.pop((client, job), []):
            self.head.route_frame(dst, frame, None)

    def _with_base(self, msg: Dict[str, Any], nid: str, key: Any,
                   env: Dict[str, Optional[str]]) -> None:
        kept = self.bases.setdefault(nid, {})
        base = kept.get(key)
        if base is None:
            self.base_seq += 1
            base = self.base_seq
            if len(kept) >= ENV_BASES:
                del kept[next(iter(kept))]
            kept[key] = base
            msg["base_env"] = env
        msg["base"] = base

    def done(self, node: str, client: str, job: int, status: int, error: str) -> None:
        rec = self.jobs.get((client, job))
        if rec is None or rec.nodes.get(node, 0) is not None:
            return
        rec.nodes[node] = status
        if all(v is not None for v in rec.nodes.values()):
            del self.jobs[(client, job)]
        if client == wire.HEAD and status != 0 and not error:
            lines = bytes(rec.output).decode("utf-8", "replace").strip().splitlines()
            error = lines[-1] if lines else "exit status %d" % status
        rec.owner.job_done(client, job, node, status, error)

    def output(self, node: str, job: int, data: bytes) -> None:
        """Output of a job the head itself started (client "0"), kept bounded."""
        rec = self.jobs.get((wire.HEAD, job))
        if rec is not None and node in rec.nodes:
            room = MAX_INTERNAL_OUTPUT - len(rec.output)
            if room > 0:
                rec.output += data[:room]

    def running_on(self, client: str, job: int) -> List[str]:
        rec = self.jobs.get((client, job))
        return [n for n, s in rec.nodes.items() if s is None] if rec else []

    def nodes_lost(self, lost: str, reason_of: Callable[[str], str]) -> None:
        """Jobs on the lost subtree will never report: answer for them."""
        for nid in [n for n in self.bases if wire.is_descendant(n, lost)]:
            del self.bases[nid]
        for (client, job), rec in list(self.jobs.items()):
            for nid, status in list(rec.nodes.items()):
                if status is None and wire.is_descendant(nid, lost):
                    error = "node lost: %s" % reason_of(nid)
                    self.done(nid, client, job, 255, error)
                    self.head.deliver_to_client(client, nid, {"op": "exit", "job": job,
                                                              "status": 255, "error": error})

    def client_closed(self, client: str) -> None:
        for key in [k for k in self.announced if k[0] == client]:
            del self.announced[key]
        for (c, job), rec in list(self.jobs.items()):
            if c != client:
                continue
            del self.jobs[(c, job)]
            for node, status in rec.nodes.items():
                if status is None:
                    self.head.route_frame(node, wire.encode_frame(
                        node, client, {"op": "kill", "job": job, "sig": int(signal.SIGKILL)}), None)
                    rec.owner.job_done(client, job, node, 255, "client gone")


def describe_error(e: BaseException) -> str:
    """A one-line reason for a handler that failed, without class names."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or "internal error (see the session log)"


def log_exception(head: "Head", where: str) -> None:
    import traceback
    head.write_log("%s failed:\n%s" % (where, "".join(traceback.format_exception(*sys.exc_info()))))
