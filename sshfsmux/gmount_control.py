"""GMount on the head: `gxpc mount EXPORT MOUNTPOINT` and `gxpc umount`.

The head decides, the nodes execute. For a mount, the head
1. pushes the mount code (sshfsmux, mfusepy) into every agent's memory,
2. starts a service node (role "gmount") under every explored node, the head
   included, in parallel. Each one opens an export server on EXPORT (the direct data
   channel, keyed from the session secret) and reports its addresses and port,
3. sends every service the list of peers, and each one mounts at MOUNTPOINT the
   merge of its own EXPORT (a local branch, looked up first) with every peer's
   export (direct branches).
Name lookups go from each node to its peers directly; nothing on the per-lookup
path goes through the head. `umount` asks every live service to unmount and
exit; a service whose node died has nothing left to unmount (its mount died with
it), and the survivors' mounts treat the dead peer as an unreachable branch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Set

from sshfsmux.gmount_node import NODE_MODULES as MODULES   # the mount code's own list
SERVICE_TIMEOUT = 30.0


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


class GMountControl:
    def __init__(self, head: Any) -> None:
        self.head = head
        self.mounts: Dict[str, Mount] = {}

    def _name(self, nid: str) -> str:
        return self.head.tree[nid].name

    # -- mount ---------------------------------------------------------------------
    def request_mount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        export, mountpoint = args.get("export"), args.get("mountpoint")
        if not (isinstance(export, str) and isinstance(mountpoint, str)
                and export.startswith("/") and mountpoint.startswith("/")):
            self.head.reply(cid, req, 2, {"error": "mount: EXPORT and MOUNTPOINT must be absolute paths"})
            return
        if mountpoint in self.mounts:
            self.head.reply(cid, req, 2, {"error": "mount: %s is already mounted in this session" % mountpoint})
            return
        # One service per host: agents that share a machine (local agents, two
        # names for one host) share its mount; the shallowest one serves it.
        nodes: List[str] = []
        hosts: Set[str] = set()
        for nid in sorted(self.head.tree, key=lambda i: (i.count("."), i)):
            n = self.head.tree[nid]
            if n.state == "up" and not n.role and n.hostname not in hosts:
                hosts.add(n.hostname)
                nodes.append(nid)
        try:
            self.head.push_modules(MODULES)
        except ImportError as e:
            self.head.reply(cid, req, 2, {"error": "mount: the mount code is not installed: %s" % e})
            return
        m = Mount(export, mountpoint, cid, req, pending=set(nodes))
        self.mounts[mountpoint] = m
        config = {"export": export, "mountpoint": mountpoint,
                  "ro": bool(args.get("ro")), "cipher": bool(args.get("cipher", True))}
        for nid in nodes:
            self.head.spawn_service(
                nid, "gmount@" + self._name(nid), "gmount", dict(config, node=self._name(nid)),
                SERVICE_TIMEOUT,
                lambda ok, reason, info, child, nid=nid: self._service_up(m, nid, ok, reason, info, child))

    def _service_up(self, m: Mount, nid: str, ok: bool, reason: str, info: Dict[str, Any],
                    child: str) -> None:
        service = info.get("service") or {}
        if ok and "error" not in service:
            m.services[nid] = child
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
        peers = [{"node": self._name(nid), "id": nid, "addrs": m.infos[sid].get("addrs", []),
                  "port": m.infos[sid].get("port", 0)} for nid, sid in m.services.items()]
        if not m.services:
            self._finish_mount(m)
            return
        m.pending = set(m.services)
        for nid, sid in m.services.items():
            self.head.call_service(sid, "mount", {"peers": [p for p in peers if p["id"] != nid]},
                                   lambda ok, error, result, nid=nid: self._mounted(m, nid, ok, error))

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
        self.head.reply(m.client, m.req, 1 if m.failed else 0,
                        {"mounted": sorted(m.mounted), "failed": m.failed})

    # -- umount --------------------------------------------------------------------
    def request_umount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        which = args.get("mountpoint")
        targets = [m for mp, m in self.mounts.items() if which in (None, mp)]
        if which is not None and not targets:
            self.head.reply(cid, req, 2, {"error": "umount: %s is not mounted in this session" % which})
            return
        pending: Set[str] = set()
        failed: Dict[str, str] = {}
        done_nodes: List[str] = []

        def finish() -> None:
            self.head.reply(cid, req, 1 if failed else 0, {"unmounted": sorted(done_nodes),
                                                            "failed": failed})

        for m in targets:
            self.mounts.pop(m.mountpoint, None)
            for nid, sid in m.services.items():
                node = self.head.tree.get(sid)
                if node is None or node.state != "up":
                    continue      # died with its node: nothing left to unmount there
                pending.add(sid)

                def done(ok: bool, error: str, result: Dict[str, Any], sid: str = sid,
                         nid: str = nid) -> None:
                    name = self._name(nid)
                    if ok:
                        done_nodes.append(name)
                    elif not error.startswith("node lost"):
                        failed[name] = error
                        self.head.say(cid, req, "gxpc: umount: %s: %s" % (name, error))
                    self._stop_service(sid)
                    pending.discard(sid)
                    if not pending:
                        finish()
                self.head.call_service(sid, "umount", {}, done)
        if not pending:
            finish()

    def _stop_service(self, sid: str) -> None:
        node = self.head.tree.get(sid)
        if node is not None:
            node.state = "gone"
            self.head.send(sid, {"op": "quit"})

    def nodes_lost(self, lost: str) -> None:
        from gxpstyle import wire
        for m in self.mounts.values():
            for nid, sid in list(m.services.items()):
                if wire.is_descendant(sid, lost) and sid in self.head.tree:
                    self.head.tree[sid].state = "gone"
