"""GMount on the head: `gxpc mount EXPORT MOUNTPOINT` and `gxpc umount`.

The head decides, the nodes execute. For a mount, the head
1. pushes the mount code (sshfsmux, mfusepy) into every agent's memory,
2. starts a service node (role "gmount") under every explored node, the head
   included, in parallel. Each one opens an export server on EXPORT (the direct data
   channel, keyed from the session secret) and reports its addresses and port,
3. sends every service the list of peers, and each one mounts at MOUNTPOINT the
   merge of its own EXPORT (a local branch, looked up first) with every peer's
   export (direct branches).
A node's mount answers lookups from its own export and a copy of the
directories it looked into, listed by the head from the replica catalog and
kept current by the head (namespace_feed.py): no lookup asks the peers; a
read goes to one holder, directly. `umount` asks every live service to unmount and
exit. A service that died while its node lives is reported lost like a node,
and `umount` removes its dead mount there (lazily: `fusermount -u -z`); a node
that died took its mount with it. The survivors' mounts treat a dead peer as an
unreachable branch.

A service of the core (gxpstyle/api/services.py): it registers the `mount` and
`umount` verbs and hears when nodes are lost.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from gxpstyle.api.interfaces import ReplicaAPI
from gxpstyle.api.node_side import Message
from gxpstyle.api.services import Service, Verb, after
from gxpstyle.config import limits
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Int, ListOf, Opt, Rec, Str
from sshfsmux.fs import mount_nesting
from sshfsmux.gmount import file_records
from sshfsmux.gmount.namespace_feed import NamespaceFeed
from sshfsmux.gmount.node import NODE_MODULES as MODULES  # the mount code's own list
from sshfsmux.gmount.recipe_changes import RecipeChanges

if TYPE_CHECKING:
    from gxpstyle.api.head_api import HeadAPI
SERVICE_TIMEOUT = 30.0
ROLE = "gmount"
ROLE_MODULE = "sshfsmux.gmount.node"

MOUNT_ARGS = Rec({"export": Str(4096, empty=False), "mountpoint": Str(4096, empty=False)},
                 {"ro": Bool(), "cipher": Bool(), "allow_other": Bool(),
                  "cache_size": Int(*limits.RANGES["cache_size"][:2]),
                  "timeout": Int(*limits.RANGES["mount_timeout"][:2]), "site_cache": Bool()})
UMOUNT_ARGS = Rec(None, {"mountpoint": Opt(Str(4096, empty=False))})
# a node's mount asks for the listings of directories it looks into
DIRS_MSG = Rec({"dirs": ListOf(Str(4096), 1024)})


def nested(a: str, b: str) -> bool:
    """Is one of two absolute, normalized paths the other or inside it?"""
    return mount_nesting.inside(a, b) or mount_nesting.inside(b, a)


@dataclass
class Mount:
    export: str
    mountpoint: str
    client: str
    req: int
    services: Dict[str, str] = field(default_factory=dict)       # node id -> service id
    infos: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # service id -> info
    failed: Dict[str, str] = field(default_factory=dict)          # node name -> reason
    pending: Set[str] = field(default_factory=set)
    mounted: List[str] = field(default_factory=list)
    adopted: Set[tuple] = field(default_factory=set)   # (node id, rel): copies in its replica store
    scans: int = 0                                       # exports not yet in the catalog
    site_cache: bool = True                              # -o site_cache=off: False


class GMountService(RecipeChanges, Service):
    """GMount's head side, and a ReplicaKeeper (interfaces.py) of the replica
    service: it feeds the catalog and keeps copies in its replica stores."""
    name = "gmount"

    def __init__(self, head: HeadAPI) -> None:
        super().__init__(head)
        replicas = head.service(ReplicaAPI)
        if replicas is None:
            raise ValueError("gmount needs the replica service")
        self.catalog: ReplicaAPI = replicas
        replicas.add_keeper(self)
        self.mounts: Dict[str, Mount] = {}
        self._detaching: Dict[Any, Callable[[str], None]] = {}
        # files_changed of this loop round: (node, paths, done), sent at its end
        self._changes: List[Any] = []
        self._by_host: Optional[Dict[str, List[Tuple[Mount, str, str]]]] = None   # _on_host
        self._recipes = 0           # recipes given calls (each one's key for its mount)
        self.feed = NamespaceFeed(head, replicas, self._exports)

    def node_messages(self) -> Dict[str, Message]:
        return {"dirs": Message(DIRS_MSG, self._dirs_asked)}

    def _dirs_asked(self, sid: str, body: Dict[str, Any]) -> None:
        for m in self.mounts.values():
            if sid in m.services.values():
                self.feed.asked(m.mountpoint, sid, list(body["dirs"]))
                return

    def _exports(self, mountpoint: str) -> Tuple[Dict[str, str], Set[Tuple[str, str]]]:
        """The nodes whose exports mount `mountpoint` merges (id -> name, as
        the peers know them) and its copies in replica stores (node id, rel)."""
        m = self.mounts.get(mountpoint)
        if m is None:
            return {}, set()
        return {nid: self._name(nid) for nid in m.services}, m.adopted

    def verbs(self) -> Dict[str, Verb]:
        return {"mount": Verb(self.request_mount, MOUNT_ARGS),
                "umount": Verb(self.request_umount, UMOUNT_ARGS)}

    def stat(self) -> Dict[str, Any]:
        return {"mounts": sorted(self.mounts)}

    def _name(self, nid: str) -> str:
        return self.head.name_of(nid)

    # -- mount ---------------------------------------------------------------------
    def request_mount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        export, mountpoint = args["export"], args["mountpoint"]
        if not (export.startswith("/") and mountpoint.startswith("/")):
            raise ValueError("mount: EXPORT and MOUNTPOINT must be absolute paths")
        export, mountpoint = os.path.normpath(export), os.path.normpath(mountpoint)
        # A mount inside its own export would list itself forever: refuse
        # here, before any node starts (each node checks again, through
        # symlinks and cascades, with the same words).
        if mount_nesting.inside(export, mountpoint):
            raise ValueError("mount: export %s is inside the mountpoint %s: the mount would "
                             "contain itself" % (export, mountpoint))
        if mount_nesting.inside(mountpoint, export):
            raise ValueError("mount: mountpoint %s is inside the export %s: the mount would "
                             "contain itself" % (mountpoint, export))
        for other in self.mounts.values():
            if nested(mountpoint, other.mountpoint) or nested(export, other.mountpoint):
                raise ValueError("mount: %s overlaps the session's mount at %s"
                                 % (mountpoint if nested(mountpoint, other.mountpoint) else export,
                                    other.mountpoint))
        # One service per host: agents that share a machine (local agents, two
        # names for one host) share its mount; the shallowest one serves it.
        nodes: List[str] = []
        hosts: Set[str] = set()
        for n in sorted(self.head.nodes(), key=lambda n: (n.id.count("."), n.id)):
            if n.up and not n.role and n.hostname not in hosts:
                hosts.add(n.hostname)
                nodes.append(n.id)
        try:
            self.head.push_modules(MODULES, nodes)
        except ImportError as e:
            raise ValueError("mount: the mount code is not installed: %s" % e)
        m = Mount(export, mountpoint, cid, req, pending=set(nodes),
                  site_cache=args.get("site_cache") is not False)
        self.mounts[mountpoint] = m
        self._hosts_changed()
        self.feed.add_mount(mountpoint)
        config = {"export": export, "mountpoint": mountpoint,
                  "ro": bool(args.get("ro")), "cipher": bool(args.get("cipher", True)),
                  "allow_other": bool(args.get("allow_other")), "cache_size": args.get("cache_size")}
        if args.get("timeout") is not None:
            config["timeout"] = args["timeout"]
        for nid in nodes:
            def up(ok: bool, reason: str, info: Dict[str, Any], child: str, nid: str = nid) -> None:
                self._service_up(m, nid, ok, reason, info, child)
            self.head.spawn_role(
                nid, "gmount@" + self._name(nid), ROLE, ROLE_MODULE, dict(config, node=self._name(nid)),
                SERVICE_TIMEOUT, up)

    def _service_up(self, m: Mount, nid: str, ok: bool, reason: str, info: Dict[str, Any],
                    child: str) -> None:
        service = info.get("service") or {}
        if ok and "error" not in service:
            m.services[nid] = child
            self._hosts_changed()
            m.infos[child] = service
        else:
            why = service.get("error") or reason or "service did not start"
            m.failed[self._name(nid)] = why
            self.head.say(m.client, m.req, "gxpc: mount: %s: %s" % (self._name(nid), why))
            if ok:
                self._stop_service(child)
        m.pending.discard(nid)
        if not m.pending:
            self._mount_all(m)

    def _mount_all(self, m: Mount) -> None:
        # each node's site (gxpstyle/head/sites.py): another site's files are
        # read through the reader's site proxies (site_cache.py)
        site = {nid: (self.head.site_of(nid) if m.site_cache else None) or ""
                for nid in m.services}
        peers = [{"node": self._name(nid), "id": nid, "addrs": m.infos[sid].get("addrs", []),
                  "port": m.infos[sid].get("port", 0), "site": site[nid]}
                 for nid, sid in m.services.items()]
        if not m.services:
            self._finish_mount(m)
            return
        m.pending = set(m.services)
        for nid, sid in m.services.items():
            def mounted(ok: bool, error: str, result: Dict[str, Any], nid: str = nid) -> None:
                self._mounted(m, nid, ok, error)
            self.head.call_role(sid, "mount", {"peers": [p for p in peers if p["id"] != nid],
                                               "site": site[nid]}, mounted)

    def _mounted(self, m: Mount, nid: str, ok: bool, error: str) -> None:
        if ok:
            m.mounted.append(self._name(nid))
        else:
            m.failed[self._name(nid)] = error
            self.head.say(m.client, m.req, "gxpc: mount: %s: %s" % (self._name(nid), error))
        m.pending.discard(nid)
        if not m.pending:
            self._finish_mount(m)

    def _finish_mount(self, m: Mount) -> None:
        if not m.mounted:
            self.mounts.pop(m.mountpoint, None)
            self._hosts_changed()
            self.feed.forget_mount(m.mountpoint)
        self.head.reply(m.client, m.req, 1 if m.failed else 0,
                        {"mounted": sorted(m.mounted), "failed": m.failed})
        m.scans = len(m.services)
        for nid, sid in m.services.items():
            self._scan(m, nid, sid, 0, [])
        if not m.scans:
            self.feed.scanned(m.mountpoint)

    def _scanned(self, m: Mount) -> None:
        m.scans -= 1
        if m.scans <= 0:
            self.feed.scanned(m.mountpoint)

    # -- the replica catalog (gxpstyle/replicas/catalog.py) ---------------------
    def _scan(self, m: Mount, nid: str, sid: str, offset: int, files: List[Any]) -> None:
        """Feed the catalog with what node `nid` exports, a page at a time,
        keyed by the paths users see under the mountpoint."""
        def page(ok: bool, error: str, result: Dict[str, Any]) -> None:
            if not ok:
                self.head.log("gmount: scan of %s: %s" % (self._name(nid), error))
                self._scanned(m)
                return
            got = file_records.parse(file_records.ScannedFile, result.get("files"))
            files.extend(got)
            if result.get("more") and got and self.mounts.get(m.mountpoint) is m:
                self._scan(m, nid, sid, offset + len(got), files)
            elif self.mounts.get(m.mountpoint) is m:
                self.catalog.replace_tree(nid, m.mountpoint, files)
                self._scanned(m)
                self._watch(m, nid, sid)
        self.head.call_role(sid, "scan", {"offset": offset}, page)

    def _watch(self, m: Mount, nid: str, sid: str) -> None:
        """Keep one `changes` call waiting on node `nid`'s mount: it answers
        with the names written, removed or renamed through that mount: every
        complete copy of each (the merged view's, as the location xattr
        names them; a write goes to the branches holding the file, so not
        only to that node's export) and the names no branch holds a file
        under. Ends with the mount or the node."""
        def answered(ok: bool, error: str, result: Dict[str, Any]) -> None:
            if not ok or self.mounts.get(m.mountpoint) is not m:
                return
            # every complete copy of each changed file, as the mount's
            # location xattr names them (Xattrs.copies): the catalog takes
            # that list whole, so the two agree
            changed = self._take_copies(m, result.get("copies"))
            changed += file_records.export_changes(self.catalog, m.mountpoint, nid, result,
                                                   m.adopted)
            self.feed.report_taken(sid, result.get("seq"))
            self.feed.touched(m.mountpoint, changed)
            gone = [str(rel) for rel in result.get("gone") or []]
            if gone:
                # no file under those names in any branch of the merged view
                # (an unlink or a rename through the mount removes it
                # everywhere, make's .DELETE_ON_ERROR too): the catalog
                # forgets them, and the nodes holding their directories
                # hear it (they alone can have them cached: namespace_feed);
                # a name some node's report brought back in the meantime (a
                # rename over it, a new file) is not forgotten
                for rel in gone:
                    path = os.path.join(m.mountpoint, rel)
                    if self.catalog.entry(path) is not None:
                        self.catalog.remove(path)
                self.feed.touched(m.mountpoint, gone)
            self._watch(m, nid, sid)
        self.head.call_role(sid, "changes", {}, answered)

    def _take_copies(self, m: Mount, items: Any) -> List[str]:
        """The catalog takes a mount's merged view of changed names (every
        complete copy of each); returns the names whose entry changed."""
        by_name = {self._name(n): n for n in m.services if self.head.node(n) is not None}
        return file_records.take_copies(self.catalog, m.mountpoint, by_name, items, m.adopted)

    def _mount_of(self, path: str) -> Optional[Mount]:
        for mp, m in self.mounts.items():
            if mount_nesting.inside(path, mp) and path != mp:
                return m
        return None

    def home_path(self, path: str) -> Optional[Tuple[str, str, str]]:
        """Results home (ReplicaKeeper): `path`'s place in the head host's
        export when only other hosts' exports hold it (a copy in the head's
        replica store does not count: it goes with the last export holding
        the file)."""
        p = os.path.normpath(path)
        m = self._mount_of(p)
        info = self.head.node(wire.HEAD)
        if m is None or info is None:
            return None
        rel = os.path.relpath(p, m.mountpoint)
        mine = [nid for _m, nid, _sid in self._on_host(info.hostname, [m])]
        holders = self.catalog.holders(p)
        if not mine or not holders or any(n in holders and (n, rel) not in m.adopted for n in mine):
            return None
        return p, os.path.join(m.export, rel), rel

    def watched_paths(self) -> List[str]:
        """Files under a mountpoint are what a mount caches (ReplicaAPI.watched)."""
        return list(self.mounts)

    # -- planned transfers (make_backend/head/transfer_plan.py) ------------------------
    def _service_on(self, node: str, path: str) -> Optional[tuple]:
        """(mount, node id, service id) of the mount holding `path` served on
        `node`'s host (one service per host), or None."""
        m = self._mount_of(os.path.normpath(path))
        info = self.head.node(node)
        if m is None or info is None:
            return None
        live = [found for found in self._on_host(info.hostname, [m]) if self.head.is_up(found[2])]
        return live[0] if live else None

    def replica_dir(self, node: str, path: str) -> Optional[str]:
        found = self._service_on(node, path)
        if found is None:
            return None
        return str(found[0].infos.get(found[2], {}).get("store") or "") or None

    def adopt_replica(self, node: str, path: str, file: str, source: str,
                      done: Callable[[bool, str, str], None]) -> bool:
        found = self._service_on(node, path)
        if found is None:
            return False
        m, nid, sid = found
        rel = os.path.relpath(os.path.normpath(path), m.mountpoint)

        def answered(ok: bool, error: str, result: Dict[str, Any]) -> None:
            if ok and result.get("kept") == "store":
                m.adopted.add((nid, rel))
            done(ok, error, nid)
        self.head.call_role(sid, "adopt", {"file": file, "path": rel}, answered)
        return True

    def pin_replicas(self, node: str, paths: List[str], pin: bool,
                     done: Callable[[], None]) -> None:
        """Pin (or unpin) in the replica store of `node`'s host the copies of
        `paths` under a mount (a running recipe's inputs): done() once every
        store concerned answered (or none was)."""
        if not self.mounts:
            done()
            return
        by_sid: Dict[str, List[str]] = {}
        for path in paths:
            found = self._service_on(node, path)
            if found is not None:
                rel = os.path.relpath(os.path.normpath(path), found[0].mountpoint)
                by_sid.setdefault(found[2], []).append(rel)
        answered = after(len(by_sid), done)
        for sid, rels in by_sid.items():
            self.head.call_role(sid, "pin", {"paths": rels, "pin": bool(pin)}, answered)

    def _drop_orphans(self, m: Mount, lost: str) -> None:
        """A copy in a replica store is a copy of a file some export holds: once
        no export holding it is left, the file is gone from every mount, and
        the catalog must not name the stores' copies either."""
        by_rel: Dict[str, Set[str]] = {}
        for nid, rel in m.adopted:
            by_rel.setdefault(rel, set()).add(nid)
        for rel, stores in by_rel.items():
            path = os.path.join(m.mountpoint, rel)
            holders = set(self.catalog.holders(path))
            if not (holders - stores) or all(wire.is_descendant(n, lost) for n in holders - stores):
                for nid in stores:
                    self.catalog.remove(path, nid)
                    m.adopted.discard((nid, rel))
            for nid in stores:
                if wire.is_descendant(nid, lost):
                    m.adopted.discard((nid, rel))

    # -- umount --------------------------------------------------------------------
    def request_umount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        which = args.get("mountpoint")
        if which is not None:
            which = os.path.normpath(which)
        targets = [m for mp, m in self.mounts.items() if which in (None, mp)]
        if which is not None and not targets:
            raise ValueError("umount: %s is not mounted in this session" % which)
        pending: Set[str] = set()
        failed: Dict[str, str] = {}
        done_nodes: List[str] = []
        finished: List[bool] = []

        def finish() -> None:
            if not pending and not finished:
                finished.append(True)
                self.head.reply(cid, req, 1 if failed else 0, {"unmounted": sorted(done_nodes),
                                                                "failed": failed})

        def settle(key: str, name: str, error: str) -> None:
            if error:
                failed[name] = error
                self.head.say(cid, req, "gxpc: umount: %s: %s" % (name, error))
            else:
                done_nodes.append(name)
            pending.discard(key)
            finish()

        for m in targets:
            self.mounts.pop(m.mountpoint, None)
            self._hosts_changed()
            self.feed.forget_mount(m.mountpoint)
            self.catalog.forget_tree(m.mountpoint)
            for nid, sid in m.services.items():
                node = self.head.node(sid)
                host = self.head.node(nid)
                name = self._name(nid)
                if node is not None and node.state == "up":
                    pending.add(sid)

                    def done(ok: bool, error: str, result: Dict[str, Any], sid: str = sid,
                             name: str = name) -> None:
                        self._stop_service(sid)
                        settle(sid, name, "" if ok or error.startswith("node lost") else error)
                    self.head.call_role(sid, "umount", {}, done)
                elif host is not None and host.state == "up":
                    # The service died but its node lives: its mount is dead
                    # (ENOTCONN) and still in the way. Detach it there.
                    key = "fix:" + nid
                    pending.add(key)
                    self.head.say(cid, req, "gxpc: umount: %s: the mount service had died (%s); "
                                  "detaching its mount" % (name, node.reason if node else "gone"))
                    def detached(error: str, key: str = key, name: str = name) -> None:
                        settle(key, name, error)
                    self._detach(nid, m.mountpoint, detached)
                    self.head.retire_role(sid)
        finish()

    def _detach(self, nid: str, mountpoint: str, done: Callable[[str], None]) -> None:
        """Lazily unmount a dead FUSE mount on node `nid` (a job of the head's own)."""
        # /proc/self/mounts escapes blanks and backslashes in octal.
        escaped = "".join("\\%03o" % ord(c) if c in " \t\n\\" else c for c in mountpoint)
        q = shlex.quote(mountpoint)
        cmd = ("awk '$2 == ENVIRON[\"GXP_MP\"] {f=1} END {exit !f}' /proc/self/mounts || exit 0; "
               "fusermount3 -u -z %s 2>/dev/null || fusermount -u -z %s" % (q, q))
        env: Dict[str, Optional[str]] = {"GXP_MP": escaped}
        job = self.head.new_job()
        self._detaching[(wire.HEAD, job)] = done
        self.head.start_job(wire.HEAD, job, [nid], cmd, lambda n, i: env, lambda n: "/")

    def job_done(self, client: str, job: int, node: str, status: int, error: str) -> None:
        done = self._detaching.pop((client, job), None)
        if done is not None:
            done("" if status == 0 else "could not detach the dead mount: %s" % error)

    def _stop_service(self, sid: str) -> None:
        self.head.retire_role(sid)

    def node_lost(self, lost: str, reason: str) -> None:
        for m in self.mounts.values():
            gone = []
            for nid, sid in list(m.services.items()):
                if wire.is_descendant(nid, lost) and self.head.node(sid) is not None:
                    # The host itself is gone: so is its mount.
                    self.head.retire_role(sid)
                    self.feed.service_gone(sid)
                    gone.append(self._name(nid))
            if not gone:
                continue
            self._drop_orphans(m, lost)
            # The catalog dropped its replicas (ReplicaService.node_lost); the survivors'
            # mounts drop its branch, so that its files are absent, as the
            # catalog says, rather than an EIO on every access.
            for nid, sid in m.services.items():
                if self.head.is_up(sid) and not wire.is_descendant(nid, lost):
                    self.head.call_role(sid, "drop_peers", {"nodes": gone},
                                           lambda ok, error, result: None)
