"""The parallel shell on the head: `e`, `cd`, `export` and GXP's masks.

`e` runs one command on the selected nodes; the nodes stream output and exit
status straight to the client and tell the head when they end, which is what
`smask` and `savemask` select from. Jobs other services start (make's recipes)
are in their own books and never change the masks.

Head-only.
"""
from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from gxpstyle.api.interfaces import Shell
from gxpstyle.api.services import Service, Verb
from gxpstyle.config import hostpattern
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, MapOf, Opt, Rec, Str

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MASK = Str(256, empty=False)
_ENV = MapOf(Opt(Str(1 << 20)), 1 << 14)

E_ARGS = Rec({"cmd": Str(1 << 20, empty=False)},
             {"mask": Opt(_MASK), "hosts": Opt(Str(1 << 16)), "stdin": Bool(),
              "cwd": Opt(Str(4096)), "env": _ENV, "fold": Bool()})
SELECT_ARGS = Rec(None, {"mask": Opt(_MASK), "hosts": Opt(Str(1 << 16))})


def check_env_names(env: Dict[str, Optional[str]], verb: str) -> None:
    for k in env:
        if not _NAME.match(k):
            raise ValueError("%s: %r is not a variable name (letters, digits and _, "
                             "not starting with a digit)" % (verb, k))


class ExecService(Service, Shell):
    name = "exec"

    def __init__(self, head: HeadAPI) -> None:
        super().__init__(head)
        self.last_status: Dict[str, int] = {}
        self.pending_status: Dict[int, Dict[str, int]] = {}
        self.pending_count: Dict[int, int] = {}        # job -> nodes it runs on
        self.mask: Optional[Set[str]] = None
        self.saved: Dict[str, Set[str]] = {}           # saved masks by name
        self.dir: Optional[str] = None                 # `gxpc cd`
        self.exported: Dict[str, Optional[str]] = {}   # `gxpc export`

    def verbs(self) -> Dict[str, Verb]:
        return {
            "e": Verb(self.req_e, E_ARGS),
            "cd": Verb(self.req_cd, Rec({"dir": Str(4096)})),
            "export": Verb(self.req_export, Rec({"env": _ENV})),
            "smask": Verb(self.req_smask),
            "rmask": Verb(self.req_rmask),
            "savemask": Verb(self.req_savemask, Rec({"name": _MASK})),
        }

    # -- what other services read (interfaces.Shell) -----------------------------
    def env(self) -> Dict[str, Optional[str]]:
        return dict(self.exported)

    def cwd(self) -> Optional[str]:
        return self.dir

    def saved_masks(self) -> Dict[str, Set[str]]:
        return {k: set(v) for k, v in self.saved.items()}

    def stat(self) -> Dict[str, Any]:
        key = _id_key
        return {"mask": sorted(self.mask, key=key) if self.mask is not None else None,
                "saved": {k: sorted(v, key=key) for k, v in self.saved.items()}}

    def node_up(self, nid: str) -> None:
        if self.mask is not None:
            self.mask.add(nid)

    def node_lost(self, lost: str, reason: str) -> None:
        if self.mask is not None:
            self.mask = {n for n in self.mask if not wire.is_descendant(n, lost)}

    # -- verbs -----------------------------------------------------------------
    def req_cd(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        d = args["dir"]
        if not d.startswith("/"):
            raise ValueError("cd: give an absolute directory (got %r); the nodes do not share "
                             "your working directory" % d)
        if not os.path.isdir(d):    # the head runs commands too (gxpc checks the same)
            raise ValueError("cd: %s: %s on the head" % (
                d, "not a directory" if os.path.exists(d) else "no such directory"))
        self.dir = os.path.normpath(d)
        self.head.reply(cid, req, 0, {})

    def req_export(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        check_env_names(args["env"], "export")
        self.exported.update(args["env"])
        self.head.reply(cid, req, 0, {})

    def succeeded(self, verb: str) -> Set[str]:
        """The nodes where the last `e` succeeded; none (no `e` yet, or it
        failed everywhere) is an error that leaves every selection as it was."""
        if not self.last_status:
            raise ValueError("%s: no command has run yet (gxpc e CMD first); nothing changed" % verb)
        ok = {n for n, s in self.last_status.items() if s == 0 and self.head.is_up(n)}
        if not ok:
            raise ValueError("%s: the last command succeeded on no node; nothing changed" % verb)
        return ok

    def req_smask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        ok = self.succeeded("smask")
        self.mask = ok
        self.head.reply(cid, req, 0, {"count": len(ok)})

    def req_rmask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.mask = None
        self.head.reply(cid, req, 0, {})

    def req_savemask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        name = args["name"]
        self.saved[name] = self.succeeded("savemask")
        self.head.reply(cid, req, 0, {"count": len(self.saved[name])})

    def select_nodes(self, mask: Optional[str] = None, hosts: Optional[str] = None) -> List[str]:
        """The explored nodes `e` runs on: a saved mask, the current mask, or all;
        then those whose names match `hosts`."""
        views = {n.id: n for n in self.head.nodes() if n.up and not n.role}
        if mask:
            if mask not in self.saved:
                raise ValueError("no saved mask named %r (gxpc savemask NAME saves one)" % mask)
            chosen = self.saved[mask]
        elif self.mask is not None:
            chosen = self.mask
        else:
            chosen = set(views)
        if hosts:
            pat = hostpattern.compile_pattern(hosts)
            chosen = {nid for nid in chosen
                      if nid in views and any(pat.match(x) for x in views[nid].names())}
        return sorted((nid for nid in views if nid in chosen), key=_id_key)

    def req_e(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        check_env_names(args.get("env") or {}, "e")
        nodes = self.select_nodes(args.get("mask"), args.get("hosts"))
        names = {nid: self.head.name_of(nid) for nid in nodes}
        env = dict(self.exported)
        env.update(args.get("env") or {})
        env["GXP_NUM_EXECS"] = str(len(nodes))

        def env_of(nid: str, idx: int) -> Dict[str, Optional[str]]:
            return {"GXP_NODE_ID": nid, "GXP_EXEC_IDX": str(idx), "GXP_HOSTNAME": names[nid]}

        # The reply (with the job id) must reach the client before any output:
        # both travel on the same link, so reply first, then start. Along the
        # tree: the head sends a message per child, not one per node, and
        # hears the exit statuses folded (tree_exec.py). `gxpc cd` wins;
        # otherwise the head runs where the user is, the others in their
        # home directory.
        job = self.head.new_job()
        self.head.reply(cid, req, 0, {"job": job, "nodes": names})
        if nodes:
            self.pending_status[job] = {}
            self.pending_count[job] = len(nodes)
        self.head.start_tree_job(cid, job, nodes, args["cmd"], env, env_of, self.dir,
                                 self.dir or args.get("cwd"), stdin=bool(args.get("stdin")),
                                 fold=bool(args.get("fold")))

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        got = self.pending_status.get(job)
        if got is None:
            return
        got[node] = status
        if len(got) >= self.pending_count[job]:
            del self.pending_count[job]
            self.last_status = self.pending_status.pop(job)


@functools.lru_cache(maxsize=1 << 16)
def _id_key(nid: str) -> Tuple[int, ...]:
    # kept: make's placement sorts every node's id for each recipe
    try:
        return tuple(int(x) for x in nid.split("."))
    except ValueError:
        return (1 << 30,)
