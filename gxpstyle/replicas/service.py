"""The replica service on the head: which node holds which file, and the
services that keep copies of files on the nodes.

It owns the replica catalog (replicas/catalog.py) and the `where` verb, adds the
catalog's fields to `stat`, and drops a lost subtree's replicas. A service that
keeps copies of files on the nodes (a mount) registers as a ReplicaKeeper
(interfaces.py) and feeds the catalog through ReplicaAPI; make and its transfer
planner read the catalog and reach the keepers through ReplicaAPI too:
files_changed, replica_dir, adopt and pin go to every keeper.

Head-only.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from gxpstyle.api.head_api import JobCalls
from gxpstyle.api.interfaces import Replica, ReplicaAPI, ReplicaKeeper
from gxpstyle.api.services import Service, Verb, after, log_exception
from gxpstyle.protocol.schema import ListOf, Rec, Str
from gxpstyle.replicas.catalog import ReplicaCatalog

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI

WHERE_ARGS = Rec({"paths": ListOf(Str(4096, empty=False), 4096)})
FILES_CHANGED_WAIT = 30.0   # seconds; a keeper that never answers must not stall make


def under_watched(keepers: List[ReplicaKeeper], paths: List[str]) -> List[str]:
    """Those of `paths` (absolute, normalized) that lie under a path some
    keeper watches: only they need files_changed."""
    roots = [r.rstrip("/") + "/" for k in keepers for r in k.watched_paths()]
    if not roots:
        return []
    return [p for p in paths if any(p.startswith(r) for r in roots)]


class ReplicaService(Service, ReplicaAPI):
    name = "replicas"

    def __init__(self, head: HeadAPI, catalog: Optional[ReplicaCatalog] = None) -> None:
        super().__init__(head)
        self.catalog = catalog if catalog is not None else ReplicaCatalog()
        self.keepers: List[ReplicaKeeper] = []

    def verbs(self) -> Dict[str, Verb]:
        return {"where": Verb(self.req_where, WHERE_ARGS)}

    def stat(self) -> Dict[str, Any]:
        return dict(self.catalog.stat())

    def node_lost(self, lost: str, reason: str) -> None:
        dropped = self.catalog.drop_node(lost)
        if dropped:
            self.head.log("lost %s: %d replicas dropped from the catalog" % (lost, dropped))

    def req_where(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        """The catalog's holders of each path: [node name, size, mtime, hash]."""
        out: Dict[str, List[List[Any]]] = {}
        for p in args["paths"]:
            p = os.path.normpath(p)
            out[p] = [[self.head.name_of(n), s, m, h or ""]
                      for n, (s, m, h) in sorted(self.catalog.replicas(p).items())]
        self.head.reply(cid, req, 0, {"replicas": out})

    # -- the catalog ---------------------------------------------------------------
    def replicas(self, path: str) -> Dict[str, Replica]:
        return self.catalog.replicas(path)

    def holders(self, path: str) -> List[str]:
        return self.catalog.holders(path)

    def bytes_by_node(self, paths: Iterable[str]) -> Tuple[Dict[str, int], int]:
        return self.catalog.bytes_by_node(paths)

    def listing(self, directory: str) -> Dict[str, List[Tuple[str, int, float, int]]]:
        return self.catalog.listing(directory)

    def entry(self, path: str) -> List[Tuple[str, int, float, int]]:
        return self.catalog.entry(path)

    def add(self, path: str, node: str, size: int, mtime: float,
            digest: Optional[str] = None, mode: int = 0) -> bool:
        return self.catalog.add(path, node, size, mtime, digest, mode)

    def set_replicas(self, path: str, copies: Dict[str, Tuple[Any, ...]]) -> bool:
        return self.catalog.set_replicas(path, copies)

    def remove(self, path: str, node: Optional[str] = None) -> None:
        self.catalog.remove(path, node)

    def replace_tree(self, node: str, root: str, files: Iterable[Tuple[Any, ...]]) -> int:
        return self.catalog.replace_tree(node, root, files)

    def forget_tree(self, root: str) -> None:
        self.catalog.forget_tree(root)

    def count_moved(self, nbytes: int) -> None:
        self.catalog.bytes_moved += nbytes

    # -- the keepers -----------------------------------------------------------------
    def add_keeper(self, keeper: ReplicaKeeper) -> None:
        if keeper not in self.keepers:
            self.keepers.append(keeper)

    def watched(self, paths: List[str]) -> List[str]:
        return under_watched(self.keepers, paths)

    def files_changed(self, node: str, paths: List[str], done: Callable[[], None],
                      complete: bool = True, calls: Optional[JobCalls] = None) -> None:
        """Every keeper acts (mounts drop their kernel caches, describe what the
        writer's export holds for the catalog); done() once all have, or
        after FILES_CHANGED_WAIT seconds. `calls` go to every keeper: the one
        that gave them (job_calls) knows them as its own."""
        keepers = list(self.keepers)
        waiting = set(range(len(keepers)))
        state: Dict[str, Any] = {"done": False, "timer": None}

        def finish() -> None:
            if not state["done"]:
                state["done"] = True
                self.head.cancel(state["timer"])
                done()

        def acted(i: int) -> None:
            waiting.discard(i)
            if not waiting:
                finish()

        def late() -> None:
            if not state["done"]:
                self.head.log("files_changed on %s: %d keepers did not answer in %gs" % (
                    node, len(waiting), FILES_CHANGED_WAIT))
                finish()
        if not keepers:
            done()
            return
        state["timer"] = self.head.call_later(FILES_CHANGED_WAIT, late)
        for i, k in enumerate(keepers):
            try:
                k.files_changed(node, paths, lambda i=i: acted(i), complete,  # type: ignore[misc]
                                calls=calls)
            except Exception:
                log_exception(self.head.log, "files_changed")
                acted(i)

    def replica_dir(self, node: str, path: str) -> Optional[str]:
        """Where on `node`'s host a copy of `path` is written for adopt (the
        first keeper that keeps such copies), or None."""
        for k in self.keepers:
            d = k.replica_dir(node, path)
            if d:
                return d
        return None

    def adopt(self, node: str, path: str, file: str, source: str,
              done: Callable[[bool, str, str], None]) -> None:
        """A transfer put a verified copy of `path` at `file` on `node`'s host:
        the keeper that named that place takes it."""
        for k in self.keepers:
            if k.adopt_replica(node, path, file, source, done):
                return
        done(False, "no service keeps copies of %s" % path, "")

    def settle(self, node: str, done: Callable[[], None], cwd: Optional[str] = None,
               calls: Optional[JobCalls] = None) -> None:
        """Every keeper that can (ReplicaKeeper.settle) settles `node` for a
        job in `cwd` (the one that gave `calls`, knowing the job's node makes
        them); done() then."""
        self._each_keeper("settle", done, lambda k, one: k.settle(node, one, cwd, calls))

    def job_calls(self, node: str, paths: List[str], cwd: Optional[str]) -> Optional[JobCalls]:
        """The first keeper's calls for a job on `node` (ReplicaKeeper.job_calls)."""
        for k in self.keepers:
            fn = getattr(k, "job_calls", None)
            calls = fn(node, paths, cwd) if callable(fn) else None
            if calls is not None:
                return calls
        return None

    def _each_keeper(self, method: str, done: Callable[[], None],
                     call: Callable[[Any, Callable[[], None]], None]) -> None:
        """call(keeper, one) for every keeper that has the optional `method`,
        one being its share of done(): done() once all have called theirs (a
        keeper that raises counts as done)."""
        keepers = [k for k in self.keepers if callable(getattr(k, method, None))]
        one = after(len(keepers), done)
        for k in keepers:
            try:
                call(k, one)
            except Exception:
                log_exception(self.head.log, method)
                one()

    def home_path(self, path: str) -> Optional[Tuple[str, str, str]]:
        for k in self.keepers:
            fn = getattr(k, "home_path", None)
            if callable(fn):
                got = fn(path)
                if got is not None:
                    return tuple(got)    # type: ignore[return-value]
        return None

    def sync(self, done: Callable[[], None]) -> None:
        """Every keeper that can (ReplicaKeeper.sync) syncs; done() then."""
        self._each_keeper("sync", done, lambda k, one: k.sync(one))

    def pin(self, node: str, paths: List[str], pin: bool, done: Callable[[], None]) -> None:
        """Every keeper pins (unpins) `paths` on `node`'s host; done() once all did."""
        if not paths or not self.keepers:
            done()
            return
        one = after(len(self.keepers), done)
        for k in list(self.keepers):
            try:
                k.pin_replicas(node, paths, pin, one)
            except Exception:
                log_exception(self.head.log, "pin_replicas")
                one()
