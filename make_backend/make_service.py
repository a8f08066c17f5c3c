"""`gxpc make` on the head: the `job` verb, one recipe at a time.

The job shell (make_backend/job_shell.py) asks for a node for each recipe; the
scheduler (scheduler.py) picks it and the recipe runs there like one node's
share of `gxpc e`, in this service's own books: make's recipes never change
what `gxpc smask` selects. A service of the core (gxpstyle/services.py).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from gxpstyle.schema import ListOf, MapOf, Opt, Rec, Str
from gxpstyle.services import Service, Verb
from make_backend.scheduler import MakeScheduler

_PATH = Str(1 << 16)
JOB_ARGS = Rec({"cmd": Str(1 << 20)},
               {"cwd": Opt(Str(4096)), "env": MapOf(Opt(Str(1 << 20)), 1 << 14),
                "target": _PATH, "inputs": ListOf(_PATH, 1 << 16),
                "avoid": ListOf(Str(200), 4096)})


class MakeService(Service):
    name = "make"

    def __init__(self, head: Any) -> None:
        super().__init__(head)
        self.scheduler = MakeScheduler()

    def verbs(self) -> Dict[str, Verb]:
        return {"job": Verb(self.req_job, JOB_ARGS)}

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
        env.update(args.get("env") or {})
        env.update({"GXP_NODE_ID": nid, "GXP_HOSTNAME": name})
        job = head.job_table.new_id()
        # The reply goes first: the client learns the job id before its output.
        head.reply(cid, req, 0, {"job": job, "node": nid, "name": name})
        self.scheduler.started((cid, job), nid)
        head.job_table.start(self, cid, job, [nid], args["cmd"], lambda n, i: env,
                        lambda n: args.get("cwd"))

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        self.scheduler.finished((client, job))
