"""`gxpc make` on the head: the `job` verb, one recipe at a time.

The job shell (make_backend/hook/job_shell.py) asks for a node for each recipe; the
placement (placement.py: input bytes from the replica catalog against load,
hints) picks it and the recipe runs there like one node's share of `gxpc e`,
in this service's own books: make's recipes never change what `gxpc smask`
selects. A recipe whose best node is busy waits here (delay scheduling), its
reply held. When a recipe ends, the mounts act on its files (ReplicaAPI.files_changed:
caches dropped everywhere, outputs into the catalog) before the `settled`
verb answers, so make hears a success only once every node sees the outputs
complete. A service of the core (gxpstyle/api/services.py).

Elastic pools (`gxpc use ... --elastic MIN-MAX`): at the end of each loop
round in which its books changed, the service tells the core its demand
(HeadAPI.demand: when each waiting recipe first asked, and the nodes its
recipes hold, placed ones still copying their inputs included); the core
grows and shrinks the pools. A node the core releases is marked leaving
first, which takes it out of the nodes a recipe may be placed on
(Shell.select_nodes gives up nodes only; _try checks again); the core asks
holds_node before it marks, so a recipe placed but not started keeps its node.
Pool events go to each running make's --trace.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from gxpstyle.api.head_api import JobCalls
from gxpstyle.api.interfaces import BcastAPI, ReplicaAPI, Shell
from gxpstyle.api.services import Service, Verb
from gxpstyle.protocol.schema import Bool, Int, ListOf, MapOf, Opt, Rec, Str
from gxpstyle.protocol.wire import HEAD
from make_backend.head.placement import Hints, NodeView, Placement
from make_backend.head.slot_books import SlotBooks
from make_backend.head.transfer_plan import INF, TransferPlanner

_PATH = Str(1 << 16)
_ENV = MapOf(Opt(Str(1 << 20)), 1 << 14)
# `env` in a job: what differs from the make's environment (ENV_ARGS), None
# for a variable the recipe does not have. `inputs`: the paths the recipe's
# command names (recipe_files.py); `on`, `place`, `slots`, `dp`: its hints.
JOB_ARGS = Rec({"cmd": Str(1 << 20)},
               {"cwd": Opt(Str(4096)), "env": _ENV,
                "target": _PATH, "inputs": ListOf(_PATH, 1 << 16),
                "avoid": ListOf(Str(200), 4096), "stdin": Bool(),
                "on": Str(4096), "place": Str(8), "slots": Int(1, 4096), "dp": Str(200)})
# Once per make (per client): the environment most of its recipes share, and
# how its inputs are copied to the nodes (transfer_plan.py).
ENV_ARGS = Rec({"env": _ENV}, {"pull_threshold": Int(0, INF), "transfer_slots": Int(1, 64),
                               "pull_order": Str(8), "trace": Str(4096)})
# `gxpc make --home`: "plan" names the files to copy home, "done" once copied;
# `sites`: only when the session has sites (gxpc make without --home)
HOME_ARGS = Rec({"phase": Str(8)}, {"sites": Bool()})
NODE_VARS = ("GXP_NODE_ID", "GXP_HOSTNAME")   # the node's own, never the make's

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI


@dataclass
class Waiting:
    cid: str
    req: int
    args: Dict[str, Any]
    since: float
    why: str = ""
    retry_at: Optional[float] = None   # when placement may decide otherwise


class MakeService(Service):
    name = "make"

    def __init__(self, head: HeadAPI) -> None:
        super().__init__(head)
        shell, replicas, bcast = head.service(Shell), head.service(ReplicaAPI), head.service(BcastAPI)
        if shell is None or replicas is None or bcast is None:
            raise ValueError("make needs the core's shell, replica and bcast services")
        self.shell: Shell = shell
        self.replicas: ReplicaAPI = replicas
        self.slot_books = SlotBooks()
        self.placement = Placement()
        self.envs: Dict[str, Dict[str, Optional[str]]] = {}   # client -> its make's environment
        self.waiting: List[Waiting] = []
        self.paths: Dict[Tuple[str, int], List[str]] = {}     # running recipe -> its paths
        # per make: each path its recipes named, with its newest mtime in the
        # catalog when the first of them started (-1: none); the paths its
        # succeeded recipes named
        self.made: Dict[str, Tuple[Dict[str, float], Set[str]]] = {}
        # recipes whose end the client hears of once the mounts acted (`settled`)
        self.settling: Set[Tuple[str, int]] = set()
        self.calls: Dict[Tuple[str, int], JobCalls] = {}     # running recipe -> its node's calls
        self._timer: Optional[int] = None
        self._timer_at = 0.0
        self.transfers = TransferPlanner(head, replicas, bcast)
        self.started: Dict[Tuple[str, int], Tuple[str, str, float]] = {}   # traced recipes
        # client -> (generation, the session's env it was built on, node -> environment)
        self.bases: Dict[str, Tuple[int, Dict[str, Optional[str]], Dict[str, Dict[str, Optional[str]]]]] = {}
        self.base_gen = 0
        self._demand_due = False

    def verbs(self) -> Dict[str, Verb]:
        return {"job": Verb(self.req_job, JOB_ARGS), "env": Verb(self.req_env, ENV_ARGS),
                "home": Verb(self.req_home, HOME_ARGS)}

    def req_env(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        if args.get("trace") and not str(args["trace"]).startswith("/"):
            raise ValueError("make: give the trace as an absolute path")
        self.envs[cid] = dict(args["env"])
        try:
            self.transfers.configure(cid, args)
        except OSError as e:
            self.head.reply(cid, req, 1, {"error": "cannot write the trace %s: %s"
                                          % (args.get("trace"), e.strerror or e)})
            return
        self.bases.pop(cid, None)
        self.made[cid] = ({}, set())
        # what was done through the mounts before make started, its recipes see
        self.replicas.sync(lambda: self.head.reply(cid, req, 0, {}))

    def client_closed(self, client: str) -> None:
        self.envs.pop(client, None)
        self.made.pop(client, None)
        self.bases.pop(client, None)
        self.waiting = [w for w in self.waiting if w.cid != client]
        self.settling = {k for k in self.settling if k[0] != client}
        self.calls = {k: c for k, c in self.calls.items() if k[0] != client}
        for key in self.transfers.client_closed(client):   # recipes that never started
            self.slot_books.finished(key)
        for key in [k for k in self.started if k[0] == client]:
            del self.started[key]
        self._demand_changed()

    def node_up(self, nid: str) -> None:
        if self.waiting:        # a recipe waiting for any free slot may run there
            self._retry()

    def node_lost(self, lost: str, reason: str) -> None:
        self.transfers.node_lost(lost)
        if self.waiting:        # one waiting for that node now goes elsewhere, or fails
            self._retry()

    def stat(self) -> Dict[str, Any]:
        return dict(self.transfers.stat(), make_waiting=len(self.waiting))

    # -- elastic pools ---------------------------------------------------------------
    def _demand_changed(self) -> None:
        """Tell the core the demand once this loop round's changes are in."""
        if self._demand_due:
            return
        self._demand_due = True

        def tell() -> None:
            self._demand_due = False
            self.head.demand([w.since for w in self.waiting], self.slot_books.running.keys())
        self.head.at_end(tell)

    def holds_node(self, nid: str) -> bool:
        return nid in self.slot_books.running

    def pool_changed(self, event: str, pool: str, what: str, up: int) -> None:
        now = time.time()
        for cid in self.envs:
            trace = self.transfers.trace(cid)
            if trace is not None:
                trace.pool(event, pool, what, up, now)

    # -- placement -----------------------------------------------------------------
    def req_job(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        """One recipe: place it (or hold it until its node has a slot), then run it."""
        w = Waiting(cid, req, args, time.monotonic())
        if not self._try(w):
            self.waiting.append(w)
            self._arm()
        self._demand_changed()

    def _try(self, w: Waiting) -> bool:
        """Place and start `w`; False if it must wait."""
        head = self.head
        args = w.args
        avoid = set(args.get("avoid") or [])
        nodes = [n for n in self.shell.select_nodes() if n not in avoid]
        if not nodes:
            head.reply(w.cid, w.req, 1, {"error": "no node is up to run the recipe"})
            return True
        slots = int(args.get("slots") or 1)
        views = []
        for n in nodes:
            info = head.node(n)
            if info is not None and info.up:      # never a node leaving its pool
                views.append(NodeView(n, info.names(), info.hostname, info.slots,
                                      self.slot_books.running.get(n, 0)))
        held_by_node, total = self.replicas.bytes_by_node(args.get("inputs") or [])
        held: Dict[str, int] = {}
        for holder, nbytes in held_by_node.items():
            info = head.node(holder)
            if info is not None and info.up:
                held[info.hostname] = held.get(info.hostname, 0) + nbytes
        hints = Hints(on=str(args.get("on") or ""), place=str(args.get("place") or ""),
                      slots=slots, dp=str(args.get("dp") or ""))
        d = self.placement.decide(views, held, total, hints, w.since, time.monotonic(),
                                  self.shell.saved_masks(), bound=head.agents_on_demand())
        if d.error:
            head.reply(w.cid, w.req, 1, {"error": d.error})
            return True
        if d.node is None:
            w.why, w.retry_at = d.why, d.retry_at
            return False
        self.replicas.count_moved(d.fetch)
        self._run(w.cid, w.req, args, d.node, slots,
                  {"why": d.why, "local": d.local, "fetch": d.fetch})
        return True

    def _arm(self) -> None:
        """Retry the waiting recipes when the first SOFT wait runs out (a
        wait bounded by a quick fetch can be much shorter than the delay).
        Nothing else is a matter of time: a freed slot (job_done), a node up
        or lost, a fetch that changes the rate a wait is weighed against
        retry them as they happen."""
        soonest = min((w.retry_at for w in self.waiting if w.retry_at is not None), default=None)
        if soonest is None:
            return
        now = time.monotonic()
        wait = max(0.0, soonest - now)
        if self._timer is not None:
            if self._timer_at <= now + wait:
                return
            self.head.cancel(self._timer)

        def fire() -> None:
            self._timer = None
            self._retry()
        self._timer = self.head.call_later(wait, fire)
        self._timer_at = now + wait

    def _retry(self) -> None:
        waiting, self.waiting = self.waiting, []
        for w in waiting:
            if not self._try(w):
                self.waiting.append(w)
        self._arm()
        self._demand_changed()

    def _run(self, cid: str, req: int, args: Dict[str, Any], nid: str, slots: int,
             why: Dict[str, Any]) -> None:
        head = self.head
        name = head.name_of(nid)
        # what this recipe's environment changes from its make's (_base)
        env = {k: v for k, v in (args.get("env") or {}).items() if k not in NODE_VARS}
        job = head.new_job()
        # only files some service caches (a mount) need acting on at the end
        paths = self.replicas.watched(list(args.get("inputs") or []))
        settle = bool(paths)
        # what the node asks its mount itself, before and after (no round
        # trip of the head's on the recipe's way)
        calls = self.replicas.job_calls(nid, paths, args.get("cwd")) if settle else None
        if calls is not None:
            self.calls[(cid, job)] = calls
        # The reply goes first: the client learns the job id before its output
        # (and may send it stdin before it starts: the job table holds that).
        head.announce_job(cid, job)
        head.reply(cid, req, 0, dict(why, job=job, node=nid, name=name, settle=settle))
        if settle:
            self.paths[(cid, job)] = paths
            self.settling.add((cid, job))
            self._versions_before(cid, paths)
        self.slot_books.started((cid, job), nid, slots)

        def start() -> None:      # once the inputs it lacks are on its node
            info = head.node(nid)
            if info is None or not info.up:
                head.forget_job(cid, job)
                error = "node lost: %s" % (info.reason if info is not None else nid)
                self.job_done(cid, job, nid, 255, error)
                head.tell_client(cid, nid, {"op": "exit", "job": job, "status": 255,
                                            "error": error})
                return
            if self.transfers.trace(cid) is not None:
                self.started[(cid, job)] = (name, args["cmd"].strip().split("\n", 1)[0][:200],
                                            time.time())
            head.start_job(cid, job, [nid], args["cmd"], lambda n, i: env,
                           lambda n: args.get("cwd"), stdin=bool(args.get("stdin")),
                           base_for=lambda n: self._base(cid, n), calls_for=lambda n: calls)
        fetch, staged, copying = int(why.get("fetch") or 0), time.monotonic(), [False]

        def measured() -> None:   # the placement weighs SOFT waits against this rate
            if copying[0]:        # not when there was nothing to copy
                self.placement.observe_fetch(fetch, time.monotonic() - staged)
            # the node's mount first takes every change the head has sent out
            self.replicas.settle(nid, start, args.get("cwd"), calls)
            if copying[0] and self.waiting:
                self._retry()     # a wait weighed against the old rate may be over
        self.transfers.stage((cid, job), nid, paths, measured, pin=calls is None)
        copying[0] = True

    def _base(self, cid: str, nid: str) -> Tuple[Any, Dict[str, Optional[str]]]:
        """The environment a make's recipes share on node `nid` (the session's,
        the make's, the node's GXP_ variables): each node gets it once
        (JobTable.start), each recipe only what it changes."""
        shell = self.shell.env()
        b = self.bases.get(cid)
        if b is None or b[1] != shell:
            self.base_gen += 1
            b = self.bases[cid] = (self.base_gen, dict(shell), {})
        env = b[2].get(nid)
        if env is None:
            env = dict(shell)
            env.update(self.envs.get(cid, {}))
            env.update({"GXP_NODE_ID": nid, "GXP_HOSTNAME": self.head.name_of(nid)})
            b[2][nid] = env
        return ("make", b[0]), env

    # -- write-on-exit ---------------------------------------------------------------
    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        key = (client, job)
        self.transfers.release(key)
        ran = self.slot_books.finished(key)
        if ran is not None and status == 0:
            self.placement.observe(ran)      # the SOFT delay follows run times
        traced = self.started.pop(key, None)
        trace = self.transfers.trace(client)
        if traced is not None and trace is not None:
            trace.recipe(traced[0], traced[1], traced[2], time.time(), status)
        paths = self.paths.pop(key, None)
        if paths is not None and status == 0 and client in self.made:
            self.made[client][1].update(paths)
        calls = self.calls.pop(key, None)
        if paths is not None and status == 0:
            # a success counts once every mount shows its files as they are
            self.replicas.files_changed(node, paths, lambda: self._acted(key), calls=calls)
        elif paths is not None:
            # a failed recipe: every mount drops its caches of its files too
            # and its host's change feed goes with it (make's .DELETE_ON_ERROR
            # deletes a target only if it sees a new mtime), but its targets
            # are not described as complete files
            self.replicas.files_changed(node, paths, lambda: self._acted(key), complete=False,
                                        calls=calls)
        if self.waiting:
            self._retry()
        self._demand_changed()

    def _acted(self, key: Tuple[str, int]) -> None:
        """The mounts acted on the recipe's files: its client may count its
        exit now (it waits for this `settled`, which may come before the
        exit itself)."""
        if key in self.settling:
            self.settling.discard(key)
            self.head.tell_client(key[0], HEAD, {"op": "settled", "job": key[1]})

    # -- results home (gxpc make --home) ------------------------------------------------
    def _versions_before(self, cid: str, paths: List[str]) -> None:
        """The version (newest mtime) of each path before the first recipe
        naming it ran: a result is a path whose version changed since, an
        input one whose version did not (however recently it was written)."""
        made = self.made.get(cid)
        if made is None:
            return
        for p in paths:
            if p not in made[0]:
                reps = self.replicas.replicas(p)
                made[0][p] = max((m for _s, m, _h in reps.values()), default=-1.0)

    def req_home(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        """plan: the files this make's recipes named and changed (made or
        remade: _versions_before) that only other hosts hold, each with where
        the head's own export keeps it, once every mount's change feed reached
        the catalog; done: the copies are made, every mount's change
        feed reaches the catalog (so the head counts as a holder) first.
        With `sites`, plan names none unless some node is in a site: results
        come home by default where losing a site is what there is to fear,
        and a flat network's make does as it always did."""
        if args["phase"] == "done":
            self.replicas.sync(lambda: self.head.reply(cid, req, 0, {}))
            return
        if args["phase"] != "plan":
            raise ValueError("home: phase is plan or done, got %r" % args["phase"])
        before, named = self.made.pop(cid, ({}, set()))
        if args.get("sites") and not any(self.head.site_of(n.id) for n in self.head.nodes() if n.up):
            named = set()
        files = []
        for path in sorted(named):
            reps = self.replicas.replicas(path)
            if not reps or max(m for _s, m, _h in reps.values()) == before.get(path, -1.0):
                continue            # unchanged by the make: an input
            home = self.replicas.home_path(path)
            if home is not None:
                files.append(list(home))
        # make returns once what its recipes did through the mounts besides
        # their targets (a file a recipe's shell closed after its exit was
        # seen, a directory it made) is in the catalog and in the copies of
        # the nodes holding those directories: `gxpc make && rm -rf dir` then
        # finds every name (it found a directory not empty)
        self.replicas.sync(lambda: self.head.reply(cid, req, 0, {"files": files}))
