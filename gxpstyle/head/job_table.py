"""The head's books of jobs: which service started which job on which nodes.

Head-only, and the head's own: services start and kill jobs through their
HeadAPI, which files each job under the service that started it.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from gxpstyle.api.head_api import JobCalls
from gxpstyle.api.services import Service
from gxpstyle.protocol import wire

if TYPE_CHECKING:
    from gxpstyle.head.daemon import Head


@dataclass
class JobRecord:
    owner: Service
    client: str
    nodes: Dict[str, Optional[int]]      # node id -> exit status, None while running
    output: bytearray = field(default_factory=bytearray)   # the head's own jobs only
    left: int = 0                        # nodes still running
    # node id -> who hears the answer of the call it makes as its share ends
    answers: Dict[str, Callable[[int, bool, str, Dict[str, Any]], None]] = field(default_factory=dict)


MAX_INTERNAL_OUTPUT = 64 << 10
ENV_BASES = 32    # job_runner.ENV_BASES: the bases a node keeps


class JobTable:
    """Jobs the head started, by (client, job id), each owned by a service.

    A node reports a job's end to the head with `done` (the `exec` carries
    notify), so the head never decodes the client's output frames. A lost
    node's jobs are answered for here; a client that goes away has its jobs
    killed. A client of "0" is the head itself: such a job's output and exit
    come back to the owner (`job_output`)."""

    def __init__(self, head: Head) -> None:
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
        # (client, job, node) -> who hears the `after` answer of a job whose
        # client went away (killed, it still ends, and its node still asks)
        self.orphans: Dict[Tuple[str, int, str], Callable[[int, bool, str, Dict[str, Any]], None]] = {}

    def new_id(self) -> int:
        """A job id, taken before start() so the client can hear it first."""
        self.seq += 1
        return self.seq

    def runs_on(self, nid: str) -> bool:
        """Some job still runs on `nid` (asked only as an elastic pool releases
        a node, so a scan of the jobs)."""
        return any(rec.nodes.get(nid, 0) is None for rec in self.jobs.values())

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
              base_for: Optional[Callable[[str], Tuple[Any, Dict[str, Optional[str]]]]] = None,
              calls_for: Optional[Callable[[str], Optional[JobCalls]]] = None) -> None:
        """Start job `job` on `nodes`; its output and exit go to `client`.
        With base_for(node) -> (key, environment), env_for gives only what
        differs from that environment, which goes to each node once per key
        (a make's recipes share one: it is not sent with every recipe).
        calls_for(node): the calls the node makes to a role node of its own
        before and after its share (head_api.JobCalls)."""
        if not nodes:
            return
        rec = self.jobs[(client, job)] = JobRecord(owner, client, {n: None for n in nodes},
                                                   left=len(nodes))
        for idx, nid in enumerate(nodes):
            msg = {"op": "exec", "job": job, "cmd": cmd, "cwd": cwd_for(nid),
                   "env": env_for(nid, idx), "stdin": stdin, "notify": True}
            if base_for is not None:
                self._with_base(msg, nid, *base_for(nid))
            calls = calls_for(nid) if calls_for is not None else None
            if calls is not None:
                for when in ("before", "after"):
                    c = getattr(calls, when)
                    if c is not None:
                        spec: Dict[str, Any] = {"node": c.node, "call": c.call, "args": c.args,
                                                "wait": c.wait}
                        if c.unless:
                            spec["unless"] = c.unless
                        msg[when] = spec
                if calls.after is not None and calls.after_answered is not None:
                    rec.answers[nid] = calls.after_answered
            self.head.route_frame(nid, wire.encode_frame(nid, client, msg), None)
        self._release_held(client, job)

    def _release_held(self, client: str, job: int) -> None:
        for dst, frame in self.announced.pop((client, job), []):
            self.head.route_frame(dst, frame, None)

    def start_tree(self, owner: Service, client: str, job: int, nodes: List[str], cmd: str,
                   env: Dict[str, Optional[str]], env_of: Callable[[str, int], Dict[str, Optional[str]]],
                   cwd: Optional[str], head_cwd: Optional[str], stdin: bool = False,
                   fold: bool = False) -> None:
        """Start job `job` on `nodes` along the tree (node/tree_exec.py): one
        `exec_tree` per child of the head, naming the targets of its subtree
        with what env_of(node, index) adds to `env` for each; the nodes' exit
        statuses come back folded (`exec_report`). The head's own share runs
        as a lone exec (in `head_cwd`); the others in `cwd`."""
        if not nodes:
            return
        self.jobs[(client, job)] = JobRecord(owner, client, {n: None for n in nodes}, left=len(nodes))
        below: Dict[str, Dict[str, Dict[str, Optional[str]]]] = {}
        own = None
        for idx, nid in enumerate(nodes):
            if nid == wire.HEAD:
                own = idx
            else:
                top = wire.HEAD + "." + nid.split(".", 2)[1]
                below.setdefault(top, {})[nid] = env_of(nid, idx)
        for top, targets in below.items():
            if top not in self.head.children:
                self.report(top, {"client": client, "job": job, "groups": [
                    {"status": 255, "error": "node %s is not reachable" % top, "nodes": list(targets)}]})
                continue
            msg = {"op": "exec_tree", "job": job, "cmd": cmd, "cwd": cwd, "env": env, "stdin": stdin,
                   "fold": fold, "targets": targets}
            self.head.route_frame(top, wire.encode_frame(top, client, msg), None)
            # Out before the head's own command starts (its spawn waits for the
            # shell's exec), as an agent sends its share down (tree_exec.py).
            self.head.children[top].push()
        if own is not None:
            mine = dict(env)
            mine.update(env_of(wire.HEAD, own))
            msg = {"op": "exec", "job": job, "cmd": cmd, "cwd": head_cwd, "env": mine,
                   "stdin": stdin, "notify": True}
            self.head.route_frame(wire.HEAD, wire.encode_frame(wire.HEAD, client, msg), None)
        self._release_held(client, job)

    def report(self, src: str, msg: Dict[str, Any]) -> None:
        """Exit statuses of a subtree's nodes (from the child `src` of the
        head), folded: booked here, and passed to the client in one message."""
        client, job = msg["client"], msg["job"]
        rec = self.jobs.get((client, job))
        if rec is None:
            return
        told = []
        for g in msg["groups"]:
            nodes = [n for n in g["nodes"] if wire.is_descendant(n, src) and rec.nodes.get(n, 0) is None]
            if not nodes:
                continue
            for nid in nodes:
                self.done(nid, client, job, g["status"], g["error"])
            told.append(dict(g, nodes=nodes))
        if told and client != wire.HEAD:
            self.head.deliver_to_client(client, wire.HEAD, {"op": "exits", "job": job, "groups": told})

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

    def done(self, node: str, client: str, job: int, status: int, error: str,
             answer: Optional[Dict[str, Any]] = None) -> None:
        """Node `node`'s share ended (`answer`: that of its JobCalls.after call)."""
        rec = self.jobs.get((client, job))
        if rec is None or rec.nodes.get(node, 0) is not None:
            late = self.orphans.pop((client, job, node), None)
            if late is not None and answer is not None:
                late(status, answer["ok"], answer["error"], answer["result"])
            return
        answered = rec.answers.pop(node, None)
        if answered is not None:
            if answer is None:
                answer = {"ok": False, "error": error or "the node sent no answer", "result": {}}
            answered(status, answer["ok"], answer["error"], answer["result"])
        rec.nodes[node] = status
        rec.left -= 1
        if rec.left == 0:
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

    def kill(self, client: str, job: int, sig: int) -> None:
        """Signal a job's running shares (a job not started yet is forgotten)."""
        self.forget(client, job)
        for node in self.running_on(client, job):
            self.head.route_frame(node, wire.encode_frame(
                node, client, {"op": "kill", "job": job, "sig": sig}), None)

    def running_on(self, client: str, job: int) -> List[str]:
        rec = self.jobs.get((client, job))
        return [n for n, s in rec.nodes.items() if s is None] if rec else []

    def nodes_lost(self, lost: str, reason_of: Callable[[str], str]) -> None:
        """Jobs on the lost subtree will never report: answer for them."""
        for nid in [n for n in self.bases if wire.is_descendant(n, lost)]:
            del self.bases[nid]
        for key in [k for k in self.orphans if wire.is_descendant(k[2], lost)]:
            del self.orphans[key]
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
            for node, answered in rec.answers.items():
                self.orphans[(c, job, node)] = answered
            for node, status in rec.nodes.items():
                if status is None:
                    self.head.route_frame(node, wire.encode_frame(
                        node, client, {"op": "kill", "job": job, "sig": int(signal.SIGKILL)}), None)
                    rec.owner.job_done(client, job, node, 255, "client gone")
