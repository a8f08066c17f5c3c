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
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type

from gxpstyle.api import node_side, services
from gxpstyle.api.services import Message, Service, Verb
from gxpstyle.bcast.service import BcastService
from gxpstyle.config import hostpattern, use_rules
from gxpstyle.head import session
from gxpstyle.head.client_links import ClientBudget, ClientLink
from gxpstyle.head.explorer import ExploreService
from gxpstyle.head.job_table import JobTable
from gxpstyle.head.service_host import ServiceHost, TreeHost, id_key
from gxpstyle.launch import bootstrap
from gxpstyle.node.agent import Node, usable_cpus
from gxpstyle.node.node_dirs import remove_node_dirs
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import SchemaError
from gxpstyle.replicas.service import ReplicaService
from gxpstyle.shell.service import ExecService
from gxpstyle.transport.links import Link

CORE_SERVICES: List[Tuple[str, Type[Service]]] = [
    ("explore", ExploreService), ("exec", ExecService), ("bcast", BcastService),
    ("replicas", ReplicaService)]


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
    role: str = ""             # "" for an explored host; a service's role (e.g. "gmount")
    slots: int = 1             # CPUs the node reported: recipes it can run at once

    @classmethod
    def from_ready(cls, nid: str, name: str, parent: str, channel: str, info: Dict[str, Any],
                   role: str = "") -> NodeInfo:
        """A node that just came up, from the info its `ready` carried."""
        return cls(nid, name, parent, channel, str(info.get("hostname", "")),
                   pid=int(info.get("pid", 0)), user=str(info.get("user", "")),
                   python=str(info.get("python", "")),
                   bootstrap_seconds=float(info.get("bootstrap_seconds", 0.0)), role=role,
                   slots=max(1, int(info.get("ncpu") or 1)))

    @property
    def up(self) -> bool:
        return self.state == "up"

    def names(self) -> List[str]:
        out = [self.name]
        if self.hostname and self.hostname not in out:
            out.append(self.hostname)
        short = self.hostname.split(".")[0]
        if short and short not in out:
            out.append(short)
        return out


class Head(Node):
    """Node "0": the tree's bookkeeping, the client socket, and the services."""

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
                                slots=usable_cpus())}
        self.clients: Dict[str, Link] = {}
        self.client_budget = ClientBudget()
        self.client_seq = 0
        self.req_seq = 0
        self.quit_client: Optional[Tuple[str, int]] = None
        self.listen_sock: Optional[socket.socket] = None
        # Replies from role nodes (spawned, svc_reply) go to whoever asked.
        self.spawn_hooks: Dict[int, Tuple[str, Callable[[Dict[str, Any], str], None]]] = {}
        self.svc_hooks: Dict[int, Tuple[str, Callable[[bool, str, Dict[str, Any]], None]]] = {}
        # Pushed modules, and the nodes that hold the current set.
        self.pushed: Dict[str, str] = {}
        self.pushed_to: Set[str] = set()
        self.side_code: Dict[str, bytes] = {}    # service -> its node side's modules, packed
        self.job_table = JobTable(self)
        # Services, each with its own HeadAPI; a plugin's may find the core's
        # (HeadAPI.service) as it is made, so these come first.
        self.services: List[Service] = []
        for name, cls in CORE_SERVICES + services.load_plugins(self.write_log):
            host = (TreeHost if cls is ExploreService else ServiceHost)(self, name)
            try:
                svc = cls(host)
            except Exception:
                services.log_exception(self.write_log, "service %s" % name)
                continue
            host.bind(svc)
            self.services.append(svc)
        self.explorer = next(s for s in self.services if isinstance(s, ExploreService))
        self.shell = next(s for s in self.services if isinstance(s, ExecService))
        # Service messages from nodes (node_side.py): by service, then type.
        self.by_name: Dict[str, Service] = {svc.name: svc for svc in self.services}
        self.node_tables: Dict[str, Dict[str, Message]] = {}
        self.hosting: Dict[str, Set[str]] = {}     # service -> nodes hosting its node side
        self.verbs: Dict[str, Tuple[Service, Verb]] = {
            "ping": (self.shell, Verb(self.req_ping)),
            "stat": (self.shell, Verb(self.req_stat)),
            "quit": (self.shell, Verb(self.req_quit)),
        }
        for svc in self.services:
            for name, verb in svc.verbs().items():
                if name in self.verbs:
                    self.write_log("service %s: verb %s is taken; ignored" % (svc.name, name))
                    continue
                self.verbs[name] = (svc, verb)
        try:
            from gxpstyle.launch import paramiko_channel
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
        assert self.listen_sock is not None
        try:
            conn, _ = self.listen_sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:   # EMFILE and friends: refuse this one, keep serving
            self.write_log("accept failed: %s" % e.strerror)
            return
        uid = session.peer_uid(conn)
        if uid != os.getuid():
            self.write_log("refused a client with uid %s" % uid)
            conn.close()
            return
        refused = self.client_budget.admit_problem(len(self.clients))
        if refused:
            line = self.client_budget.log_line(refused)
            if line:
                self.write_log(line)
            conn.close()
            return
        self.client_seq += 1
        cid = "%s%d" % (wire.CLIENT_PREFIX, self.client_seq)
        fd = conn.detach()
        self.clients[cid] = ClientLink(self.client_budget, self.loop, fd, fd, cid, self.on_client_frame,
                                       self.on_client_close)

    def on_client_frame(self, link: Link, frame: bytes) -> None:
        try:
            dst, _, body = wire.split_frame(frame)
            msg = wire.decode_message(body)
        except wire.FrameError as e:
            link.close("protocol error: %s" % e)
            return
        cid = link.peer
        if msg["op"] == "request":
            self.handle_request(cid, msg)
        elif msg["op"] in ("kill", "stdin", "out_ack") and dst in self.tree:
            # Clients address jobs on nodes directly; the source is always the
            # client, so a client reaches only its own jobs. A job still
            # waiting for its inputs gets them once it starts.
            frame = wire.encode_frame(dst, cid, msg)
            if not self.job_table.hold(cid, msg.get("job"), dst, frame):
                self.route_frame(dst, frame, link)

    def on_client_close(self, link: Link, why: str) -> None:
        cid = link.peer
        if why != "link closed":
            self.write_log("client %s dropped: %s" % (cid, why))
        self.clients.pop(cid, None)
        self.job_table.client_closed(cid)
        for svc in self.services:
            self._guarded(svc.client_closed, "%s.client_closed" % svc.name, cid)

    def reply(self, cid: str, req: int, status: int, result: Dict[str, Any]) -> None:
        self.send(cid, {"op": "reply", "req": req, "status": status, "result": result})

    def say(self, cid: str, req: int, text: str, stream: int = 2, end: str = "\n") -> None:
        self.send(cid, {"op": "print", "req": req, "stream": stream,
                        "data": (text + end).encode()})

    def deliver_to_client(self, cid: str, src: str, msg: Dict[str, Any]) -> None:
        """A message to a client as if from node `src` (answers for lost nodes)."""
        self.route_frame(cid, wire.encode_frame(cid, src, msg), None)

    # -- routing to clients --------------------------------------------------
    def route_up(self, dst: str, frame: bytes) -> None:
        # Frames for clients pass through undecoded: the head learns of job
        # ends from `done`, not by reading every output frame.
        link = self.clients.get(dst)
        if link is not None:
            link.send_frame(frame)

    # -- requests ------------------------------------------------------------
    def handle_request(self, cid: str, msg: Dict[str, Any]) -> None:
        cmd, req = msg["cmd"], msg["req"]
        entry = self.verbs.get(cmd)
        if entry is None:
            self.reply(cid, req, 2, {"error": "unknown command %r" % cmd})
            return
        svc, verb = entry
        try:
            args = verb.args.check(msg["args"], cmd)
            verb.handler(cid, req, args)
        except (SchemaError, use_rules.RuleError, hostpattern.PatternError, ValueError) as e:
            self.reply(cid, req, 2, {"error": services.describe_error(e)})
        except Exception as e:
            # A bug in one handler fails that request; the session goes on.
            services.log_exception(self.write_log, "request %s" % cmd)
            self.reply(cid, req, 1, {"error": "%s: internal error: %s (details in %s)" % (
                cmd, services.describe_error(e), self.log_file.name)})

    def _guarded(self, fn: Callable[..., None], what: str, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            services.log_exception(self.write_log, what)

    def log_failure(self, what: str, e: BaseException) -> None:
        services.log_exception(self.write_log, what)

    def req_ping(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        self.reply(cid, req, 0, {"pid": os.getpid()})

    # `stat` sends the nodes as a table: field names once, then a row per
    # node. With a thousand nodes that is half the values to encode and
    # decode (13,000 instead of 26,000); Client.stat() gives dicts back.
    STAT_FIELDS = ("id", "name", "hostname", "channel", "role", "state", "reason", "pid", "user",
                   "python", "parent", "slots")

    def req_stat(self, cid: str, req: int, args: Dict[str, Any]) -> None:
        rows = []
        for nid in sorted(self.tree, key=id_key):
            n = self.tree[nid]
            if n.state in ("quit", "gone"):
                continue
            rows.append([n.id, n.name, n.hostname, n.role or n.channel, n.role, n.state, n.reason,
                         n.pid, n.user, n.python, n.parent or "", n.slots])
        result: Dict[str, Any] = {"node_fields": list(self.STAT_FIELDS), "node_rows": rows,
                                  "wan": self.wan_bytes()}
        for svc in self.services:
            result.update(svc.stat())
        self.reply(cid, req, 0, result)

    def wan_bytes(self) -> Dict[str, List[int]]:
        """Bytes in and out of each site (gxpstyle/head/sites.py) whose gateway
        is the head's child, over the gateway's link: what crossed between the
        sites and home along the tree (a frame routed from one site to another
        counts on both). Direct connections between sites (a mount's data
        channel to a gateway another site reaches) and sites deeper in the
        tree are not counted here."""
        out: Dict[str, List[int]] = {}
        for child, link in self.children.items():
            n = self.tree.get(child)
            if n is not None and self.explorer.site_of(child) == child:
                out[n.name] = [link.bytes_in, link.bytes_out]
        return out

    # -- the tree --------------------------------------------------------------
    def new_req(self) -> int:
        self.req_seq += 1
        return self.req_seq

    def new_child_id(self, parent: str) -> str:
        info = self.tree[parent]
        info.next_child += 1
        return "%s.%d" % (parent, info.next_child - 1)

    def node_up(self, nid: str, name: str, parent: str, channel: str, info: Dict[str, Any],
                role: str = "") -> None:
        self.tree[nid] = NodeInfo.from_ready(nid, name, parent, channel, info, role)
        if not role:
            for svc in self.services:
                self._guarded(svc.node_up, "%s.node_up" % svc.name, nid)

    def op_spawned(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        hook = self.spawn_hooks.get(msg["req"])
        if hook is not None:
            if hook[0].rsplit(".", 1)[0] != src:
                return   # only the parent we asked answers for its child
            del self.spawn_hooks[msg["req"]]
            hook[1](msg, src)
            return
        self.explorer.spawned(src, msg)

    # -- services' own messages (node_side.py) ------------------------------------
    def op_svc_msg(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """A service's message: to its head side if that declares the type,
        else to its node side here (the head is a node too: a service's two
        sides name their types apart)."""
        svc = self.by_name.get(msg["svc"])
        table = self.node_tables.get(msg["svc"])
        if svc is not None and table is None:
            table = self.node_tables[svc.name] = svc.node_messages()
        if table is None or msg["type"] not in table:
            super().op_svc_msg(src, msg, link)
            return
        try:
            spec, body = node_side.checked(msg["svc"], table, msg)
        except ValueError as e:
            self.write_log("refused a message from %s: %s" % (src, e))
            return
        self._guarded(spec.handler, "%s.%s from %s" % (msg["svc"], msg["type"], src), src, body)

    def op_side_failed(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """A node could not host a service's node side: that service hears it."""
        svc = self.by_name.get(msg["svc"])
        self.hosting.get(msg["svc"], set()).discard(src)
        self.write_log(msg["error"])
        if svc is not None:
            self._guarded(svc.side_failed, "%s.side_failed" % svc.name, src, msg["error"])

    def send_node(self, svc: Service, node: str, mtype: str, body: Dict[str, Any]) -> None:
        """Service `svc`'s message to its node side on `node`; the first one
        asks the node to host that side (pushing its modules first)."""
        hosting = self.hosting.setdefault(svc.name, set())
        if node not in hosting:
            module, _, cls = svc.node_side.partition(":")
            if not (module and cls):
                raise ValueError("service %s has no node side" % svc.name)
            if svc.node_modules and node != wire.HEAD:
                self._push_side(svc, node)
            self.send(node, {"op": "side", "svc": svc.name, "module": module, "cls": cls})
            hosting.add(node)
        self.send(node, node_side.message(svc.name, mtype, body))

    def retire_role(self, nid: str) -> None:
        """A service is done with its role node `nid`: it leaves `stat`, and
        quits if it still runs."""
        n = self.tree.get(nid)
        if n is None or not n.role:
            return
        was_up = n.state == "up"
        n.state = "gone"
        if was_up:
            self.send(nid, {"op": "quit"})

    def op_done(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        self.job_table.done(src, msg["client"], msg["job"], msg["status"], msg["error"],
                            msg.get("answer"))

    def op_exec_report(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if src in self.children:       # a child speaks for its own subtree only
            self.job_table.report(src, msg)

    def op_out(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        self.job_table.output(src, msg["job"], msg["data"])

    def op_exit(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        pass   # the head's own jobs end through `done`

    def spawn_service(self, parent: str, target: str, role: str, role_module: str,
                      config: Dict[str, Any], timeout: float,
                      done: Callable[[bool, str, Dict[str, Any], str], None]) -> str:
        """Start a role node under `parent`, running `role_module` (pushed
        first with push_modules); done(ok, reason, info, child) when it is up."""
        self.push_modules([], [parent])
        child = self.new_child_id(parent)
        req = self.new_req()

        def spawned(msg: Dict[str, Any], src: str) -> None:
            if msg["ok"]:
                self.node_up(child, target, parent, "local", msg["info"], role)
            done(msg["ok"], msg["reason"], msg["info"], child)
        self.spawn_hooks[req] = (child, spawned)
        self.send(parent, {"op": "spawn", "req": req, "child": child, "target": target,
                           "channel": {"name": "local", "role": role, "role_module": role_module,
                                       "role_config": config},
                           "timeout": timeout})
        return child

    def call_service(self, node: str, call: str, args: Dict[str, Any],
                     done: Callable[[bool, str, Dict[str, Any]], None]) -> None:
        """Send a call to a role node; done(ok, error, result) on the reply (or loss)."""
        req = self.new_req()
        self.svc_hooks[req] = (node, done)
        self.send(node, {"op": "svc", "req": req, "call": call, "args": args})

    def op_svc_reply(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        entry = self.svc_hooks.get(msg["req"])
        if entry is not None and entry[0] == src:
            del self.svc_hooks[msg["req"]]
            entry[1](msg["ok"], msg["error"], msg["result"])
        else:       # a call one of the head's own jobs made (node_calls.py)
            super().op_svc_reply(src, msg, link)

    def _push_side(self, svc: Service, node: str) -> None:
        """A node side's modules, to the node about to host it: only those (a
        node side needs no role payload, and role nodes host no one's side)."""
        blob = self.side_code.get(svc.name)
        if blob is None:
            blob = self.side_code[svc.name] = bootstrap.pack_modules(
                bootstrap.module_sources(svc.node_modules))
        self.send(node, {"op": "modules", "blob": blob, "forward": False})

    def push_modules(self, names: List[str], nodes: Optional[List[str]] = None) -> None:
        """Make head modules importable on `nodes` (default: every explored node).

        They are kept apart from the agent payload, so agents explored later
        still get the small payload; a node explored after the push gets the
        modules when a service needs it. A push to every node crosses each link
        once; a late node gets its own copy."""
        if names:
            sources = bootstrap.module_sources(names)
            if any(self.pushed.get(k) != v for k, v in sources.items()):
                self.pushed.update(sources)
                self.pushed_to = set()
                self.payloads.add(sources)
        if not self.pushed:
            return
        up = [nid for nid, n in self.tree.items() if n.state == "up" and not n.role
              and nid != wire.HEAD]
        want = [n for n in (nodes if nodes is not None else up)
                if n != wire.HEAD and n not in self.pushed_to]
        if not want:
            return
        blob = bootstrap.pack_modules(self.pushed)
        # Agents start service children with these modules: compile and compress
        # the children's payload once here, not once per agent (32 agents on a
        # few shared cores made that most of a first mount's time).
        tag = sys.implementation.cache_tag
        payload = list(self.payloads.for_tag(tag, service=True))
        msg = {"op": "modules", "blob": blob, "tag": tag, "payload": payload}
        if nodes is None and not self.pushed_to:
            for child in list(self.children):
                self.send(child, dict(msg, forward=True))
            self.pushed_to.update(up)
        else:
            for nid in want:
                self.send(nid, dict(msg, forward=False))
                self.pushed_to.add(nid)

    # -- lost nodes ------------------------------------------------------------
    def op_lost(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        for lost in msg["ids"]:
            if not wire.is_descendant(lost, src) or lost == src:
                continue
            for nid, n in self.tree.items():
                if wire.is_descendant(nid, lost) and n.state == "up":
                    n.state = "lost"
                    n.reason = msg["reason"] if nid == lost else "parent %s lost" % lost
                elif wire.is_descendant(nid, lost) and n.state == "leaving":
                    n.state = "quit"       # released (elastic.py): it left as asked
            self.pushed_to = {n for n in self.pushed_to if not wire.is_descendant(n, lost)}
            for hosting in self.hosting.values():
                hosting.difference_update([n for n in hosting if wire.is_descendant(n, lost)])
            self.write_log("lost %s: %s" % (lost, msg["reason"]))
            # Whoever waits on the lost subtree gets its answer now.
            for req, (node, done) in list(self.svc_hooks.items()):
                if wire.is_descendant(node, lost):
                    del self.svc_hooks[req]
                    self._guarded(done, "svc loss", False, "node lost: %s" % msg["reason"], {})
            for req, (child, spawned) in list(self.spawn_hooks.items()):
                if wire.is_descendant(child, lost):
                    del self.spawn_hooks[req]
                    self._guarded(spawned, "spawn loss", {"ok": False, "reason": "parent lost",
                                                          "info": {}, "child": child}, "")
            self.job_table.nodes_lost(lost, lambda nid: self.tree[nid].reason if nid in self.tree else "")
            for svc in self.services:
                self._guarded(svc.node_lost, "%s.node_lost" % svc.name, lost, msg["reason"])

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
            # Every agent of the session on this host is gone by now; one that
            # was killed along the way left its directory behind.
            remove_node_dirs(self.session)
            cid, req = self.quit_client
            link = self.clients.get(cid)
            if link is not None:
                status = 1 if left else 0
                result = {"unclean": left}
                link.send(cid, self.id, {"op": "reply", "req": req, "status": status, "result": result})
                link.flush_blocking(2.0)


def _user() -> str:
    import getpass
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid())


def serve(session_dir: str, ready_fd: Optional[int]) -> int:
    try:
        session.check_path_length(session_dir)
    except session.SessionPathError as e:
        sys.stderr.write("gxpd: %s\n" % e)
        return 2
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
