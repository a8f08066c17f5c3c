"""`gxpc make` on the head: the `job` verb, one recipe at a time.

The job shell (make_backend/job_shell.py) asks for a node for each recipe; the
scheduler (scheduler.py) picks it and the recipe runs there like one node's
share of `gxpc e`, in this service's own books: make's recipes never change
what `gxpc smask` selects. A service of the core (gxpstyle/services.py).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from gxpstyle.schema import Bool, ListOf, MapOf, Opt, Rec, Str
from gxpstyle.services import Service, Verb
from make_backend.scheduler import MakeScheduler

_PATH = Str(1 << 16)
_ENV = MapOf(Opt(Str(1 << 20)), 1 << 14)
# `env` in a job: what differs from the make's environment (ENV_ARGS), None
# for a variable the recipe does not have.
JOB_ARGS = Rec({"cmd": Str(1 << 20)},
               {"cwd": Opt(Str(4096)), "env": _ENV,
                "target": _PATH, "inputs": ListOf(_PATH, 1 << 16),
                "avoid": ListOf(Str(200), 4096), "stdin": Bool()})
# Once per make (per client): the environment most of its recipes share.
ENV_ARGS = Rec({"env": _ENV})


class MakeService(Service):
    name = "make"

    def __init__(self, head: Any) -> None:
        super().__init__(head)
        self.scheduler = MakeScheduler()
        self.envs: Dict[str, Dict[str, Optional[str]]] = {}   # client -> its make's environment

    def verbs(self) -> Dict[str, Verb]:
        return {"job": Verb(self.req_job, JOB_ARGS), "env": Verb(self.req_env, ENV_ARGS)}

    def req_env(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.envs[cid] = dict(args["env"])
        self.head.reply(cid, req, 0, {})

    def client_closed(self, client: str) -> None:
        self.envs.pop(client, None)

    def req_job(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        """One recipe: pick the node, reply with it, then run it there."""
        head = self.head
        avoid = set(args.get("avoid") or [])
        nodes = [n for n in head.shell.select_nodes({}) if n not in avoid]
        nid = self.scheduler.pick([(n, head.tree[n].slots) for n in nodes])
        if nid is None:
            head.reply(cid, req, 1, {"error": "no node is up to run the recipe"})
            return
        name = head.tree[nid].name
        env: Dict[str, Optional[str]] = head.shell.base_env()
        env.update(self.envs.get(cid, {}))
        env.update(args.get("env") or {})
        env.update({"GXP_NODE_ID": nid, "GXP_HOSTNAME": name})
        job = head.job_table.new_id()
        # The reply goes first: the client learns the job id before its output.
        head.reply(cid, req, 0, {"job": job, "node": nid, "name": name})
        self.scheduler.started((cid, job), nid)
        head.job_table.start(self, cid, job, [nid], args["cmd"], lambda n, i: env,
                             lambda n: args.get("cwd"), stdin=bool(args.get("stdin")))

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        self.scheduler.finished((client, job))
