"""Interfaces services declare for other services (HeadAPI.service(Interface)).

A service that others may call subclasses one of these; a caller asks the head
for it by the interface (`head.service(ReplicaAPI)`) and sees nothing else of
that service. The core declares three, for its own services:

- Shell (the parallel shell, shell/service.py): which nodes a pattern or a saved
  mask selects, the session's environment and directory;
- BcastAPI (the transfer engine, bcast/service.py): start a transfer, or join a
  node to one under way;
- ReplicaAPI (the replica service, replicas/service.py): the catalog of which
  node holds which file, and the fan-out to the services that keep copies of
  files on the nodes (ReplicaKeeper: a mount), which register themselves.

Head-only.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple

from gxpstyle.api.head_api import JobCalls

Env = Dict[str, Optional[str]]
Replica = Tuple[int, float, Optional[str]]   # size, mtime, hash
# A job's input smaller than this is read where it is, through the mount (one
# request to one holder, a few ms), not copied to the job's node before it
# starts and pinned there: a planned copy costs a batching delay, a verified
# write and an adoption (make_backend/head/transfer_plan.py: 30 to 200 ms for
# a 31 KB header while seven nodes pulled at once).
STAGE_MIN_BYTES = 64 << 10


class Shell:
    """What the parallel shell tells other services."""

    def select_nodes(self, mask: Optional[str] = None, hosts: Optional[str] = None) -> List[str]:
        """The explored nodes `gxpc e` would run on: saved mask `mask`, else the
        current mask, else all; then those whose names match the pattern
        `hosts`. ValueError naming an unknown mask."""
        raise NotImplementedError

    def saved_masks(self) -> Dict[str, Set[str]]:
        """Saved masks by name (a copy)."""
        raise NotImplementedError

    def env(self) -> Env:
        """The session's environment (`gxpc export`), a copy."""
        raise NotImplementedError

    def cwd(self) -> Optional[str]:
        """The session's directory (`gxpc cd`), or None."""
        raise NotImplementedError


class Transfer(Protocol):
    """A transfer of the engine as its callers see it (read-only)."""

    @property
    def path(self) -> str: ...
    @property
    def primary(self) -> str: ...        # the source the plan started from
    @property
    def error(self) -> str: ...          # the whole transfer failed (no source)
    @property
    def finished(self) -> bool: ...
    @property
    def dests(self) -> Dict[str, str]: ...   # target -> where its copy is

    def failed(self) -> Dict[str, str]: ...  # target -> why its copy failed


class BcastAPI:
    """The transfer engine under `gxpc bcast`."""

    def start(self, sources: List[str], path: str, targets: List[str], dest: str,
              on_done: Callable[[Transfer], None],
              on_progress: Optional[Callable[[Transfer], None]] = None,
              dests: Optional[Dict[str, str]] = None) -> Transfer:
        """Copy `path` (identical on every one of `sources`) to `dest` on every
        target (`dests`: some targets' own); on_done(transfer) once each is
        done or failed. `{sha256}` in a dest becomes the file's SHA-256."""
        raise NotImplementedError

    def join(self, t: Transfer, nid: str, dest: str) -> bool:
        """Add target `nid` to `t` while it runs; False if it cannot join."""
        raise NotImplementedError


class ReplicaKeeper(Protocol):
    """A service that keeps copies of files on the nodes (a mount): it registers
    with ReplicaAPI.add_keeper and feeds the catalog itself."""

    def watched_paths(self) -> List[str]:
        """Absolute paths under which it caches what files look like."""
    def files_changed(self, node: str, paths: List[str], done: Callable[[], None],
                      complete: bool = True, calls: Optional[JobCalls] = None) -> None:
        """Node `node` wrote (or removed) `paths` (not `complete`: a failed
        recipe there, whose files are not to be described as complete):
        act, then done() exactly once. `calls`: what job_calls gave the job,
        made by its node (their answers are in); a keeper acts on them only
        if they are its own."""
    def replica_dir(self, node: str, path: str) -> Optional[str]:
        """Where on `node`'s host a copy of `path` may be written for adopt, or None."""
    def adopt_replica(self, node: str, path: str, file: str, source: str,
                      done: Callable[[bool, str, str], None]) -> bool:
        """`file` (in replica_dir) is a verified copy of `path`: make it the one
        that host uses. False if not this keeper's; else done(ok, error,
        holder) exactly once."""
    def pin_replicas(self, node: str, paths: List[str], pin: bool,
                     done: Callable[[], None]) -> None:
        """Keep (or stop keeping) the copies of `paths` on `node`'s host from
        eviction; done() exactly once."""
    # optional: home_path(path) -> (path, where the head keeps it, path below
    # the keeper's root) when only other hosts hold `path`, else None
    # optional: settle(node, done, cwd, calls): done() once what it keeps on
    # `node`'s host shows every change it has heard of and is ready for a job
    # in `cwd` (a recipe starts then), or will be once the job's node made
    # the `before` of `calls` (if they are its own: job_calls); exactly once
    # optional: job_calls(node, paths, cwd) -> JobCalls or None: calls a job
    # on `node` in `cwd` naming `paths` makes to the keeper's service on its
    # host itself (HeadAPI.start_job), before it starts and as it ends


class ReplicaAPI:
    """The replica catalog and the keepers of copies, as a service."""

    # -- the catalog's reads (replicas/catalog.py) ----------------------------------
    def replicas(self, path: str) -> Dict[str, Replica]:
        raise NotImplementedError

    def holders(self, path: str) -> List[str]:
        raise NotImplementedError

    def bytes_by_node(self, paths: Iterable[str]) -> Tuple[Dict[str, int], int]:
        raise NotImplementedError

    def listing(self, directory: str) -> Dict[str, List[Tuple[str, int, float, int]]]:
        """Every name in `directory`: name -> [(node, size, mtime, mode)]."""
        raise NotImplementedError

    def entry(self, path: str) -> List[Tuple[str, int, float, int]]:
        """The holders of one name, as `listing` gives them."""
        raise NotImplementedError

    # -- the catalog's writes (keepers, transfers) ----------------------------------
    def add(self, path: str, node: str, size: int, mtime: float,
            digest: Optional[str] = None, mode: int = 0) -> bool:
        raise NotImplementedError

    def set_replicas(self, path: str, copies: Dict[str, Tuple[Any, ...]]) -> bool:
        """node -> (size, mtime) or (size, mtime, mode)."""
        raise NotImplementedError

    def remove(self, path: str, node: Optional[str] = None) -> None:
        raise NotImplementedError

    def replace_tree(self, node: str, root: str, files: Iterable[Tuple[Any, ...]]) -> int:
        """files: (rel, size, mtime) or (rel, size, mtime, mode)."""
        raise NotImplementedError

    def forget_tree(self, root: str) -> None:
        raise NotImplementedError

    def count_moved(self, nbytes: int) -> None:
        """Placement expected a node to fetch `nbytes` (the `bytes_moved` stat)."""
        raise NotImplementedError

    # -- the keepers ---------------------------------------------------------------
    def add_keeper(self, keeper: ReplicaKeeper) -> None:
        raise NotImplementedError

    def watched(self, paths: List[str]) -> List[str]:
        """Those of `paths` some keeper caches: only they need files_changed."""
        raise NotImplementedError

    def files_changed(self, node: str, paths: List[str], done: Callable[[], None],
                      complete: bool = True, calls: Optional[JobCalls] = None) -> None:
        """Every keeper acts on `paths` written by `node` (not `complete`: by a
        recipe that failed there); done() once all have (or after a bound).
        `calls`: what job_calls gave the recipe's job (made, answered)."""
        raise NotImplementedError

    def replica_dir(self, node: str, path: str) -> Optional[str]:
        raise NotImplementedError

    def adopt(self, node: str, path: str, file: str, source: str,
              done: Callable[[bool, str, str], None]) -> None:
        raise NotImplementedError

    def pin(self, node: str, paths: List[str], pin: bool, done: Callable[[], None]) -> None:
        raise NotImplementedError

    def settle(self, node: str, done: Callable[[], None], cwd: Optional[str] = None,
               calls: Optional[JobCalls] = None) -> None:
        """done() once every keeper's copies on `node`'s host show every change
        the keepers have heard of and are ready for a job in `cwd` (before a
        recipe starts there), or will be once the job's node has made the
        `before` call of `calls` (job_calls: the job starts with them)."""
        raise NotImplementedError

    def job_calls(self, node: str, paths: List[str], cwd: Optional[str]) -> Optional[JobCalls]:
        """The calls a recipe's job on `node` (in `cwd`, naming `paths`) makes
        itself to a keeper's service on its host (HeadAPI.start_job's
        calls_for), saving the head's round trips to it; None: none. Give
        them to settle and files_changed too."""
        raise NotImplementedError

    def home_path(self, path: str) -> Optional[Tuple[str, str, str]]:
        """Where the head's own disk keeps `path` if only other hosts hold it
        (results home): (path, that place, path below the keeper's root);
        None if the head holds it or no keeper keeps it."""
        raise NotImplementedError

    def sync(self, done: Callable[[], None]) -> None:
        """done() once every change made so far on any node (through a mount)
        has reached the keepers and the copies that hold its directory (as a
        make starts: what the user did before it, its recipes see)."""
        raise NotImplementedError
