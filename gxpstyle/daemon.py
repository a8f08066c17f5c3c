"""The per-user session daemon on the head: node "0" of the tree plus the
controller that owns every decision (planning, masks, bookkeeping of jobs).

`gxpc` is a thin client: it connects to the daemon's Unix socket in the 0700
session directory, the daemon checks the peer's uid with SO_PEERCRED, and both
speak the same frames as the agents. There is no TCP control port.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from gxpstyle import bootstrap, hostpattern, session, spanning_tree, use_rules, wire
from gxpstyle.agent import Node
from gxpstyle.links import Link


@dataclass
class NodeInfo:
    id: str
    name: str
    parent: Optional[str]
    channel: str
    hostname: str = ""
    state: str = "up"          # up, lost, quit
    reason: str = ""
    pid: int = 0
    user: str = ""
    python: str = ""
    bootstrap_seconds: float = 0.0
    next_child: int = 1
    role: str = ""             # "" for an explored host; "gmount" for a mount service
    slots: int = 1             # CPUs the node reported: recipes it can run at once

    @classmethod
    def from_ready(cls, nid: str, name: str, parent: str, channel: str, info: Dict[str, Any],
                   role: str = "") -> "NodeInfo":
        """A node that just came up, from the info its `ready` carried."""
        return cls(nid, name, parent, channel, str(info.get("hostname", "")),
                   pid=int(info.get("pid", 0)), user=str(info.get("user", "")),
                   python=str(info.get("python", "")),
                   bootstrap_seconds=float(info.get("bootstrap_seconds", 0.0)), role=role,
                   slots=max(1, int(info.get("ncpu") or 1)))

    def names(self) -> List[str]:
        out = [self.name]
        if self.hostname and self.hostname not in out:
            out.append(self.hostname)
        short = self.hostname.split(".")[0]
        if short and short not in out:
            out.append(short)
        return out


@dataclass
class Exploration:
    client: str
    req: int
    started: float
    pending: Dict[int, Tuple[spanning_tree.Assignment, str]] = field(default_factory=dict)
    waiting: Dict[str, List[spanning_tree.Assignment]] = field(default_factory=dict)
    up: List[str] = field(default_factory=list)
    failed: Dict[str, str] = field(default_factory=dict)
    timeout: float = 20.0
    fanout: int = 8
    key: int = 0
    # True while req_explore is still dispatching: a spawn on the head itself can
    # fail synchronously, and must not end the exploration before the rest starts.
    planning: bool = True
    host_settings: Dict[str, Dict[str, Any]] = field(default_factory=dict)


class Head(Node):
    def __init__(self, session_dir: str, log_path: str) -> None:
        self.session_dir_head = session_dir
        self.log_file = open(log_path, "a", buffering=1)
        cert, key, pin = session.make_certificate()
        opts = {"cert": cert, "key": key, "pin": pin}
        super().__init__(wire.HEAD, socket.gethostname(), session.session_name(session_dir),
                         session.new_secret(), opts, bootstrap.PayloadCache(bootstrap.head_sources()))
        self.tree: Dict[str, NodeInfo] = {
            wire.HEAD: NodeInfo(wire.HEAD, "head", None, "-", socket.gethostname(),
                                pid=os.getpid(), user=_user(), python=sys.version.split()[0],
                                slots=os.cpu_count() or 1)}
        self.rules: List[use_rules.UseRule] = []
        self.clients: Dict[str, Link] = {}
        self.client_seq = 0
        self.req_seq = 0
        self.job_seq = 0
        self.explorations: Dict[int, Exploration] = {}
        self.spawn_reqs: Dict[int, Tuple[Exploration, spanning_tree.Assignment, str]] = {}
        self.jobs_out: Dict[Tuple[str, int], Dict[str, Optional[int]]] = {}
        self.last_status: Dict[str, int] = {}
        self.mask: Optional[Set[str]] = None
        self.saved_masks: Dict[str, Set[str]] = {}
        self.cwd: Optional[str] = None
        self.env: Dict[str, Optional[str]] = {}
        self.quit_client: Optional[Tuple[str, int]] = None
        self.listen_sock: Optional[socket.socket] = None
        # Other head-side controllers (GMount) wait for spawn and service replies.
        self.spawn_hooks: Dict[int, Any] = {}
        self.svc_hooks: Dict[int, Any] = {}
        self.pushed: Set[str] = set()
        from sshfsmux.gmount_control import GMountControl
        self.gmount = GMountControl(self)
        from make_backend.scheduler import MakeScheduler
        self.make = MakeScheduler()
        try:
            from gxpstyle import paramiko_channel
            self.extra_channels["paramiko"] = lambda cs: paramiko_channel.start(self, cs)
        except ImportError:
            pass

    # -- logging -------------------------------------------------------------
    def write_log(self, text: str) -> None:
        self.log_file.write("%s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), text))

    # -- client socket -------------------------------------------------------
    def listen(self, path: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            s.bind(path)
        finally:
            os.umask(old)
        s.listen(64)
        s.setblocking(False)
        self.listen_sock = s
        self.loop.add_reader(s.fileno(), self._accept)

    def _accept(self) -> None:
        try:
            conn, _ = self.listen_sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        uid = session.peer_uid(conn)
        if uid != os.getuid():
            self.write_log("refused a client with uid %s" % uid)
            conn.close()
            return
        self.client_seq += 1
        cid = "%s%d" % (wire.CLIENT_PREFIX, self.client_seq)
        fd = conn.detach()
        self.clients[cid] = Link(self.loop, fd, fd, cid, self.on_client_frame, self.on_client_close)

    def on_client_frame(self, link: Link, frame: bytes) -> None:
        try:
            dst, _, body = wire.split_frame(frame)
            msg = wire.decode_message(body)
        except wire.FrameError as e:
            link.close("protocol error: %s" % e)
            return
        cid = link.peer
        if msg["op"] == "request":
            try:
                self.handle_request(cid, msg)
            except (use_rules.RuleError, hostpattern.PatternError, ValueError) as e:
                self.reply(cid, msg["req"], 2, {"error": str(e)})
            return
        if msg["op"] in ("kill", "stdin", "out_ack") and dst in self.tree:
            # Clients address jobs on nodes directly; the source is always the client.
            self.route_frame(dst, wire.encode_frame(dst, cid, msg), link)

    def on_client_close(self, link: Link, why: str) -> None:
        cid = link.peer
        if why != "link closed":
            self.write_log("client %s dropped: %s" % (cid, why))
        self.clients.pop(cid, None)
        for key in self.make.jobs_of(cid):
            self.make.finished(key)
        for key in [k for k in self.jobs_out if k[0] == cid]:
            for node, status in self.jobs_out.pop(key).items():
                if status is None:
                    self.route_frame(node, wire.encode_frame(
                        node, cid, {"op": "kill", "job": key[1], "sig": signal.SIGKILL}), None)

    def reply(self, cid: str, req: int, status: int, result: Dict[str, Any]) -> None:
        self.send(cid, {"op": "reply", "req": req, "status": status, "result": result})

    def say(self, cid: str, req: int, text: str, stream: int = 2) -> None:
        self.send(cid, {"op": "print", "req": req, "stream": stream,
                        "data": (text + "\n").encode()})

    # -- routing to clients --------------------------------------------------
    def route_up(self, dst: str, frame: bytes) -> None:
        link = self.clients.get(dst)
        if link is None:
            return
        try:
            _, src, body = wire.split_frame(frame[4:])
            msg = wire.decode_message(body)
        except wire.FrameError:
            return
        if msg["op"] == "exit":
            self._job_exit(dst, msg["job"], src, msg["status"])
        link.send_frame(frame)

    def _job_exit(self, cid: str, job: int, node: str, status: int) -> None:
        out = self.jobs_out.get((cid, job))
        if out is None or node not in out:
            return
        self.make.finished((cid, job))
        out[node] = status
        if all(v is not None for v in out.values()):
            del self.jobs_out[(cid, job)]
            self.last_status = dict(out)  # type: ignore[arg-type]

    # -- requests ------------------------------------------------------------
    def handle_request(self, cid: str, msg: Dict[str, Any]) -> None:
        cmd, args, req = msg["cmd"], msg["args"], msg["req"]
        handler = getattr(self, "req_" + cmd, None)
        if handler is None:
            self.reply(cid, req, 2, {"error": "unknown command %s" % cmd})
            return
        handler(cid, req, args)

    def req_ping(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.reply(cid, req, 0, {"pid": os.getpid()})

    def req_use(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        for r in args.get("rules", []):
            rule = use_rules.rule_from_dict(r)
            if all(old.to_dict() != rule.to_dict() for old in self.rules):
                self.rules.append(rule)
        self.reply(cid, req, 0, {"rules": [r.to_dict() for r in self.rules]})

    def req_stat(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        nodes = []
        for nid in sorted(self.tree, key=_id_key):
            n = self.tree[nid]
            if n.state in ("quit", "gone"):
                continue
            nodes.append({"id": n.id, "name": n.name, "hostname": n.hostname,
                          "channel": n.role or n.channel,
                          "state": n.state, "reason": n.reason, "pid": n.pid, "user": n.user,
                          "python": n.python, "parent": n.parent or ""})
        mask = sorted(self.mask, key=_id_key) if self.mask is not None else None
        self.reply(cid, req, 0, {"nodes": nodes, "mask": mask,
                                 "saved": {k: sorted(v) for k, v in self.saved_masks.items()},
                                 "mounts": sorted(self.gmount.mounts)})

    def req_cd(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.cwd = args.get("dir") or None
        self.reply(cid, req, 0, {})

    def req_export(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        for k, v in args.get("env", {}).items():
            self.env[k] = v
        self.reply(cid, req, 0, {})

    # masks: GXP's smask / rmask / savemask
    def req_smask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        ok = {n for n, s in self.last_status.items() if s == 0}
        self.mask = ok
        self.reply(cid, req, 0, {"count": len(ok)})

    def req_rmask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.mask = None
        self.reply(cid, req, 0, {})

    def req_savemask(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        name = args["name"]
        self.saved_masks[name] = {n for n, s in self.last_status.items() if s == 0}
        self.reply(cid, req, 0, {"count": len(self.saved_masks[name])})

    def select_nodes(self, args: Dict[str, Any]) -> List[str]:
        up = [nid for nid, n in self.tree.items() if n.state == "up" and not n.role]
        if args.get("mask"):
            if args["mask"] not in self.saved_masks:
                raise ValueError("no saved mask named %r" % args["mask"])
            chosen = self.saved_masks[args["mask"]]
        elif self.mask is not None:
            chosen = self.mask
        else:
            chosen = set(up)
        if args.get("hosts"):
            pat = hostpattern.compile_pattern(args["hosts"])
            chosen = {nid for nid in chosen
                      if nid in self.tree and any(pat.match(x) for x in self.tree[nid].names())}
        return sorted((nid for nid in up if nid in chosen), key=_id_key)

    def req_e(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        nodes = self.select_nodes(args)
        self.job_seq += 1
        job = self.job_seq
        self.jobs_out[(cid, job)] = {n: None for n in nodes}
        names = {n: self.tree[n].name for n in nodes}
        self.reply(cid, req, 0, {"job": job, "nodes": names})
        if not nodes:
            del self.jobs_out[(cid, job)]
            return
        env = dict(self.env)
        env.update(args.get("env") or {})
        for idx, nid in enumerate(nodes):
            e = dict(env)
            e.update({"GXP_NODE_ID": nid, "GXP_EXEC_IDX": str(idx), "GXP_NUM_EXECS": str(len(nodes)),
                      "GXP_HOSTNAME": self.tree[nid].name})
            # `gxpc cd` wins; otherwise the head runs where the user is, and
            # the other nodes in their home directory.
            cwd = self.cwd or (args.get("cwd") if nid == wire.HEAD else None)
            msg = {"op": "exec", "job": job, "cmd": args["cmd"], "cwd": cwd, "env": e,
                   "stdin": bool(args.get("stdin"))}
            self.route_frame(nid, wire.encode_frame(nid, cid, msg), None)

    def req_job(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        """One `gxpc make` recipe: the head picks the node (make_backend/scheduler.py),
        then it runs like one node's share of `e`; output and exit go to the client."""
        avoid = set(args.get("avoid") or [])
        nodes = [n for n in self.select_nodes({}) if n not in avoid]
        nid = self.make.pick([(n, self.tree[n].slots) for n in nodes])
        if nid is None:
            self.reply(cid, req, 1, {"error": "no node is up to run the recipe"})
            return
        self.job_seq += 1
        job = self.job_seq
        self.jobs_out[(cid, job)] = {nid: None}
        self.make.started((cid, job), nid)
        self.reply(cid, req, 0, {"job": job, "node": nid, "name": self.tree[nid].name})
        env = dict(self.env)
        env.update(args.get("env") or {})
        env.update({"GXP_NODE_ID": nid, "GXP_HOSTNAME": self.tree[nid].name})
        msg = {"op": "exec", "job": job, "cmd": args["cmd"], "cwd": args.get("cwd"), "env": env,
               "stdin": False}
        self.route_frame(nid, wire.encode_frame(nid, cid, msg), None)

    # -- GMount (sshfsmux/gmount_control.py decides; services execute) ----------
    def req_mount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.gmount.request_mount(cid, req, args)

    def req_umount(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.gmount.request_umount(cid, req, args)

    # -- explore ---------------------------------------------------------------
    def req_explore(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        fanout = int(args.get("fanout") or 8)
        timeout = float(args.get("timeout") or 20.0)
        rules = list(self.rules)
        targets: List[str] = []
        for r in args.get("rules", []):
            rules.append(use_rules.rule_from_dict(r))
        for pat in args.get("targets", []):
            targets.extend(hostpattern.expand(pat))
        local = int(args.get("local") or 0)
        if local:
            used = {n.name for n in self.tree.values()}
            i = 1
            while local:
                name = "local%d" % i
                if name not in used:
                    targets.append(name)
                    local -= 1
                i += 1
            rules.append(use_rules.make_rule("local", "*", "local*"))
        ex = Exploration(cid, req, time.monotonic(), timeout=timeout, fanout=fanout,
                         host_settings=dict(args.get("host_settings") or {}))
        live_names = {n.name: nid for nid, n in self.tree.items() if n.state == "up"}
        fresh = []
        for t in targets:
            if t in live_names or t in fresh:
                continue
            fresh.append(t)
        live = [spanning_tree.PlanNode("id:" + nid, n.names() + (["head"] if nid == wire.HEAD else []),
                                       nid.count("."), self._live_children(nid), fanout)
                for nid, n in self.tree.items() if n.state == "up"]

        def fanout_for(target: str, rule: use_rules.UseRule) -> int:
            return int(rule.options.get("fanout")
                       or ex.host_settings.get(target, {}).get("fanout") or fanout)

        plan = spanning_tree.plan(live, fresh, rules, fanout_for)
        for target, why in plan.unreachable.items():
            ex.failed[target] = why
            self.say(cid, req, "gxpc: explore: %s: %s" % (target, why))
        ex.key = self.new_req()
        self.explorations[ex.key] = ex
        for a in plan.assignments:
            if not a.parent.startswith("id:"):
                ex.waiting.setdefault(a.parent[2:], []).append(a)
        for a in plan.assignments:
            if a.parent.startswith("id:"):
                self._dispatch(ex, a, a.parent[3:])
        ex.planning = False
        self._maybe_done(ex)

    def _live_children(self, nid: str) -> int:
        return sum(1 for n in self.tree.values() if n.parent == nid and n.state == "up")

    def _new_child_id(self, parent: str) -> str:
        info = self.tree[parent]
        info.next_child += 1
        return "%s.%d" % (parent, info.next_child - 1)

    def _dispatch(self, ex: Exploration, a: spanning_tree.Assignment, parent: str) -> None:
        child = self._new_child_id(parent)
        spec = dict(a.rule.options)
        spec["name"] = a.rule.channel
        cluster = ex.host_settings.get(a.target, {})
        if cluster.get("python") and "python" not in spec:
            spec["python"] = cluster["python"]
        timeout = float(spec.get("timeout") or cluster.get("timeout") or ex.timeout)
        spec.setdefault("timeout", timeout)
        req = self.new_req()
        ex.pending[req] = (a, child)
        self.spawn_reqs[req] = (ex, a, child)
        self.send(parent, {"op": "spawn", "req": req, "child": child, "target": a.target,
                           "channel": spec, "timeout": timeout})

    def new_req(self) -> int:
        self.req_seq += 1
        return self.req_seq

    def spawn_service(self, parent: str, target: str, role: str, config: Dict[str, Any],
                      timeout: float, done: Any) -> str:
        """Start a role node under `parent`; done(ok, reason, info) when it is up."""
        child = self._new_child_id(parent)
        req = self.new_req()

        def spawned(msg: Dict[str, Any], src: str) -> None:
            if msg["ok"]:
                self.tree[child] = NodeInfo.from_ready(child, target, parent, "local", msg["info"], role)
            done(msg["ok"], msg["reason"], msg["info"], child)
        self.spawn_hooks[req] = (child, spawned)
        self.send(parent, {"op": "spawn", "req": req, "child": child, "target": target,
                           "channel": {"name": "local", "role": role, "role_config": config},
                           "timeout": timeout})
        return child

    def call_service(self, node: str, call: str, args: Dict[str, Any], done: Any) -> None:
        """Send a service call; done(ok, error, result) on the reply (or loss)."""
        req = self.new_req()
        self.svc_hooks[req] = (node, done)
        self.send(node, {"op": "svc", "req": req, "call": call, "args": args})

    def op_svc_reply(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        entry = self.svc_hooks.pop(msg["req"], None)
        if entry is not None and entry[0] == src:
            entry[1](msg["ok"], msg["error"], msg["result"])

    def push_modules(self, names: List[str]) -> None:
        """Make head modules importable on every agent (each link carries them once)."""
        sources = bootstrap.module_sources(names)
        fresh = {k: v for k, v in sources.items() if k not in self.pushed}
        if not fresh:
            return
        self.pushed.update(fresh)
        blob = bootstrap.pack_modules(sources)
        self.payloads.add(sources)
        # Agents start service children with these modules: compile and compress
        # the children's payload once here, not once per agent (32 agents on a
        # few shared cores made that most of a first mount's time).
        tag = sys.implementation.cache_tag
        payload = list(self.payloads.for_tag(tag, service=True))
        for child, link in list(self.children.items()):
            link.send(child, self.id, {"op": "modules", "blob": blob, "tag": tag, "payload": payload})

    def op_spawned(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        hook = self.spawn_hooks.pop(msg["req"], None)
        if hook is not None:
            hook[1](msg, src)
            return
        entry = self.spawn_reqs.pop(msg["req"], None)
        if entry is None:
            return
        ex, a, child = entry
        ex.pending.pop(msg["req"], None)
        if msg["ok"] and msg["child"] == child:
            self.tree[child] = NodeInfo.from_ready(child, a.target, src, a.rule.channel, msg["info"])
            ex.up.append(a.target)
            if self.mask is not None:
                self.mask.add(child)
            for waiting in ex.waiting.pop(a.target, []):
                self._dispatch(ex, waiting, child)
        else:
            self._fail(ex, a.target, msg["reason"] or "failed")
        self._maybe_done(ex)

    def _fail(self, ex: Exploration, target: str, reason: str) -> None:
        ex.failed[target] = reason
        self.say(ex.client, ex.req, "gxpc: explore: %s: %s" % (target, reason))
        for waiting in ex.waiting.pop(target, []):
            self._fail(ex, waiting.target, "not explored: its gateway %s failed" % target)

    def _maybe_done(self, ex: Exploration) -> None:
        if ex.planning or ex.pending or ex.waiting:
            return
        if self.explorations.pop(ex.key, None) is None:
            return
        elapsed = time.monotonic() - ex.started
        self.reply(ex.client, ex.req, 1 if ex.failed else 0,
                   {"up": ex.up, "failed": ex.failed, "seconds": round(elapsed, 3)})

    # -- lost nodes ------------------------------------------------------------
    def op_lost(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        for lost in msg["ids"]:
            if not isinstance(lost, str) or not wire.is_descendant(lost, src) or lost == src:
                continue
            for nid, n in self.tree.items():
                if wire.is_descendant(nid, lost) and n.state == "up":
                    n.state = "lost"
                    n.reason = msg["reason"] if nid == lost else "parent %s lost" % lost
                    if self.mask is not None:
                        self.mask.discard(nid)
            self.write_log("lost %s: %s" % (lost, msg["reason"]))
            # Controllers waiting on the lost subtree get their answer now.
            for req, (node, done) in list(self.svc_hooks.items()):
                if wire.is_descendant(node, lost):
                    del self.svc_hooks[req]
                    done(False, "node lost: %s" % msg["reason"], {})
            for req, (child, spawned) in list(self.spawn_hooks.items()):
                if wire.is_descendant(child, lost):
                    del self.spawn_hooks[req]
                    spawned({"ok": False, "reason": "parent lost", "info": {}, "child": child}, "")
            self.gmount.nodes_lost(lost)
            # Jobs on the lost subtree will never report: answer for them.
            for (cid, job), out in list(self.jobs_out.items()):
                for nid, status in out.items():
                    if status is None and wire.is_descendant(nid, lost):
                        frame = wire.encode_frame(cid, nid, {
                            "op": "exit", "job": job, "status": 255,
                            "error": "node lost: %s" % self.tree[nid].reason})
                        self.route_up(cid, frame)
            # Explorations waiting on a spawn from the lost subtree.
            for req, (ex, a, child) in list(self.spawn_reqs.items()):
                if wire.is_descendant(child, lost):
                    del self.spawn_reqs[req]
                    ex.pending.pop(req, None)
                    self._fail(ex, a.target, "gateway lost during bootstrap")
                    self._maybe_done(ex)

    def op_bye(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if src in self.tree:
            self.tree[src].state = "quit"

    # -- quit --------------------------------------------------------------------
    def req_quit(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.quit_client = (cid, req)
        for nid, n in self.tree.items():
            if n.state == "up" and nid != wire.HEAD:
                n.state = "quitting"
        self.shutdown(send_bye=False)

    def finish_shutdown(self, send_bye: bool) -> None:
        left = [n.name for nid, n in self.tree.items() if n.state == "quitting"
                and nid.count(".") == 1 and nid in self.children]
        super().finish_shutdown(send_bye)
        if self.quit_client is not None:
            cid, req = self.quit_client
            link = self.clients.get(cid)
            if link is not None:
                status = 1 if left else 0
                result = {"unclean": left}
                link.send(cid, self.id, {"op": "reply", "req": req, "status": status, "result": result})
                link.flush_blocking(2.0)


def _id_key(nid: str) -> List[int]:
    try:
        return [int(x) for x in nid.split(".")]
    except ValueError:
        return [1 << 30]


def _user() -> str:
    import getpass
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid())


def serve(session_dir: str, ready_fd: Optional[int]) -> int:
    session.ensure_session_dir(session_dir)
    sock_path = session.socket_path(session_dir)
    log_path = os.path.join(session_dir, session.LOG_NAME)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    # Handlers rather than SIG_IGN, so that jobs on the head get default signals.
    signal.signal(signal.SIGINT, lambda *a: None)
    signal.signal(signal.SIGHUP, lambda *a: None)
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    head = Head(session_dir, log_path)
    head.listen(sock_path)
    signal.signal(signal.SIGTERM, lambda *a: head.loop.call_soon_threadsafe(
        lambda: head.shutdown(send_bye=False)))
    head.write_log("session daemon started, pid %d" % os.getpid())
    if ready_fd is not None:
        os.write(ready_fd, b"ok\n")
        os.close(ready_fd)
    head.loop.run()
    head.write_log("session daemon stopped")
    try:
        os.unlink(sock_path)
    except OSError:
        pass
    if head.quit_client is not None:
        import shutil
        shutil.rmtree(session_dir, ignore_errors=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="gxpd", description="gxpstyle session daemon (started by gxpc)")
    p.add_argument("--session", required=True)
    p.add_argument("--ready-fd", type=int)
    a = p.parse_args(argv)
    return serve(a.session, a.ready_fd)


if __name__ == "__main__":
    sys.exit(main())
