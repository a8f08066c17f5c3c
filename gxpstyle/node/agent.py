"""The agent: one node of the tree. It routes frames between its parent and
children, starts children when the head asks (`spawn`), runs jobs (`exec`), and
cleans up after itself on `quit` or when its parent goes away.

The head's session daemon is a Node too (id "0"), so routing, jobs and child
bootstrap are written once. The head decides; agents execute and report.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os

try:  # the C module itself: `signal` loads enum and functools, 2.5 ms of every agent's start
    import _signal as signal
except ImportError:  # an interpreter without it
    import signal  # type: ignore[no-redef]
import sys
import time

from gxpstyle.launch import bootstrap
from gxpstyle.protocol import wire

# channels, child_bootstrap, subprocess, socket, shutil and threading are imported
# where used: most agents are leaves, and every import here delays `ready`.
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Callable, Dict, Optional, Tuple

    from gxpstyle.launch import child_bootstrap
from gxpstyle.api.node_side import describe_error
from gxpstyle.launch.batch_start import BatchStarts
from gxpstyle.node.job_runner import JobRunner
from gxpstyle.node.node_dirs import node_dir_prefix, remove_node_dirs
from gxpstyle.node.role_calls import RoleCalls, role_module
from gxpstyle.node.tree_exec import TreeJobs
from gxpstyle.transport.event_loop import EventLoop
from gxpstyle.transport.links import Link, frame_with_prefix

QUIT_GRACE = 3.0


class Node(RoleCalls):
    def __init__(self, node_id: str, name: str, session: str, secret: bytes,
                 opts: Dict[str, Any], payloads: bootstrap.PayloadCache,
                 loop: Optional[EventLoop] = None, environ: Optional[Dict[str, str]] = None,
                 forked: bool = False) -> None:
        self.loop = loop or EventLoop()
        self.id = node_id
        self.name = name
        self.session = session
        self.secret = secret
        self.opts = opts
        self.payloads = payloads
        self.parent: Optional[Link] = None
        self.children: Dict[str, Link] = {}
        self.starting: Dict[str, child_bootstrap.ChildStart] = {}
        self.started: Dict[str, child_bootstrap.ChildStart] = {}
        self.jobs = JobRunner(self.loop, self.id, self._job_send, self.backlog, environ)
        self.trees = TreeJobs(self)     # shares of commands sent along the tree (tree_exec.py)
        self.notify_jobs: set = set()   # (requester, job) whose end the head wants to hear
        self.session_dir: Optional[str] = None
        self.batch = BatchStarts(self)
        self.extra_channels: Dict[str, Callable[[child_bootstrap.ChildStart], None]] = {}
        self.quitting = False
        self.exit_code = 0
        # Node sides of services this node hosts (node_side.py), by service
        # name: the role's own (a role node), and those the head asked for.
        self.sides: Dict[str, Any] = {}
        self.role = str(opts.get("role") or "")
        self._streams: Any = None       # tree_streams.py
        self._calls: Any = None         # node_calls.py
        self._forked = forked           # a fork of its parent (local_fork.Warming)
        self._warming: Any = None

    # -- sending and routing ---------------------------------------------
    def backlog(self) -> int:
        return self.parent.queued if self.parent is not None else 0

    def _job_send(self, dst: str, msg: Dict[str, Any]) -> None:
        """What the job runner says goes to the job's requester; a job's end
        goes to the head too when the exec asked (`notify`): the head keeps its
        books from that, without decoding the client's output frames."""
        if self.trees.intercept(dst, msg):
            return
        # `done` first: both go up the same links, so the head has booked the
        # end before the client can see `exit` and ask (`gxpc smask`) about it.
        if msg["op"] == "exit" and (dst, msg["job"]) in self.notify_jobs:
            calls = self._calls
            if calls is not None and calls.ending(dst, msg["job"], lambda answer: self._job_end(
                    dst, msg, answer)):
                return
            self._job_end(dst, msg, None)
            return
        self.send(dst, msg)

    def _job_end(self, dst: str, msg: Dict[str, Any], answer: Optional[Dict[str, Any]]) -> None:
        self.notify_jobs.discard((dst, msg["job"]))
        done = dict(msg, op="done", client=dst)
        if answer is not None:
            done["answer"] = answer
        self.send(wire.HEAD, done)
        self.send(dst, msg)

    def send(self, dst: str, msg: Dict[str, Any]) -> None:
        self.route_frame(dst, wire.encode_frame(dst, self.id, msg), None)

    def route_frame(self, dst: str, frame: bytes, from_link: Optional[Link]) -> None:
        where = wire.route(self.id, dst, self.children)
        if where == "self":
            _, src, body = wire.split_frame(frame[4:])
            self.deliver(src, body, from_link)
        elif where is None:
            self.route_up(dst, frame)
        elif where == "unroutable":
            self.unroutable(dst, frame)
        else:
            self.children[where].send_frame(frame)

    def route_up(self, dst: str, frame: bytes) -> None:
        parent = self.parent
        if parent is None:
            return
        parent.send_frame(frame)
        if parent.congested and not parent.holding:
            # Everything going up shares this link: while it is congested, stop
            # reading our children and our jobs' output, and start again when
            # it drains (links.py says why this cannot stall the tree).
            parent.holding = True
            held = list(self.children.values())
            for link in held:
                link.pause_reading()
            self.jobs.pause_output()

            def drained() -> None:
                parent.holding = False
                for link in held:
                    link.resume_reading()
                self.jobs.resume_output()
            parent.when_drained(drained)

    def unroutable(self, dst: str, frame: bytes) -> None:
        """A frame for a descendant we have no link to (lost or never was)."""
        try:
            _, src, body = wire.split_frame(frame[4:])
            msg = wire.decode_message(body)
        except wire.FrameError:
            return
        if msg["op"] in ("stream_open", "stream_data", "stream_ack"):    # tree_streams.py
            self.send(src, {"op": "stream_close", "sid": msg["sid"],
                            "reason": "node %s is not reachable" % dst})
        elif msg["op"] == "exec":
            exit_msg = {"op": "exit", "job": msg["job"], "status": 255,
                        "error": "node %s is not reachable" % dst}
            if msg.get("notify"):
                self.send(wire.HEAD, dict(exit_msg, op="done", client=src))
            self.send(src, exit_msg)

    def deliver(self, src: str, body: bytes, from_link: Optional[Link]) -> None:
        try:
            msg = wire.decode_message(body)
        except wire.FrameError as e:
            self.log("dropped a bad message from %s: %s" % (src, e))
            return
        handler = getattr(self, "op_" + msg["op"], None) or getattr(self.streams(), "op_" + msg["op"], None)
        if handler is None:
            self.log("no handler for %s from %s" % (msg["op"], src))
            return
        try:
            handler(src, msg, from_link)
        except Exception as e:
            # A message that trips a handler is dropped and logged; the node,
            # its links and its jobs go on.
            self.log_failure("%s from %s" % (msg["op"], src), e)

    def streams(self) -> Any:
        """The node's byte streams along the tree (tree_streams.py), None on a
        node the head did not push that module to (most never carry a stream)."""
        if self._streams is None:
            try:
                from gxpstyle.node.tree_streams import TreeStreams
            except ImportError:
                return None
            self._streams = TreeStreams(self)
        return self._streams

    def log(self, text: str, level: str = "info") -> None:
        if self.id == wire.HEAD:
            self.write_log(text)
        elif self.parent is not None:
            self.send(wire.HEAD, {"op": "log", "level": level, "text": "%s: %s" % (self.id, text)})

    def write_log(self, text: str) -> None:
        sys.stderr.write(text + "\n")

    def log_failure(self, what: str, e: BaseException) -> None:
        self.log("%s failed: %s" % (what, describe_error(e)), "error")

    # -- links -------------------------------------------------------------
    def on_parent_frame(self, link: Link, frame: bytes) -> None:
        try:
            dst, _, _ = wire.split_frame(frame)
        except wire.FrameError as e:
            link.close("protocol error: %s" % e)
            return
        self.route_frame(dst, frame_with_prefix(frame), link)

    def on_parent_close(self, link: Link, why: str) -> None:
        # Our parent is gone: nobody can ever talk to us again. Clean up and go.
        self.parent = None
        self.shutdown(send_bye=False)

    def on_child_frame(self, link: Link, frame: bytes) -> None:
        try:
            dst, src, _ = wire.split_frame(frame)
        except wire.FrameError as e:
            link.close("protocol error: %s" % e)
            return
        # A child speaks only for its own subtree.
        if not wire.is_descendant(src, link.peer):
            link.close("frame with a foreign source %r" % src)
            return
        self.route_frame(dst, frame_with_prefix(frame), link)

    def on_child_close(self, link: Link, why: str) -> None:
        starting = getattr(link, "starting", None)
        if starting is not None and not starting.finished:
            starting.link_closed(why)
            return
        if self.children.get(link.peer) is link:
            del self.children[link.peer]
            if not self.quitting:
                self.child_lost(link.peer, why)
        cs = self.started.pop(link.peer, None)
        if cs is not None:
            cs.reap(0.5)
            if cs.channel == "local":
                # A child on this host that died without cleaning up (SIGKILL)
                # leaves its per-session directory here: ours to remove.
                remove_node_dirs(self.session, link.peer)

    def child_lost(self, child: str, why: str) -> None:
        self.send(wire.HEAD, {"op": "lost", "ids": [child], "reason": why})
        self.trees.child_lost(child)     # after `lost`: the head answers for its subtree
        if self._calls is not None:
            self._calls.lost(child)

    def child_stderr(self, child: str, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").splitlines()[:20]:
            if line.strip():
                self.log("[%s stderr] %s" % (child, line[:500]))

    def hello_for(self, child: str, target: str, role: Optional[str] = None,
                  role_config: Optional[Dict[str, Any]] = None,
                  role_module: Optional[str] = None) -> Dict[str, Any]:
        opts = dict(self.opts)
        for k in ("role", "role_config", "role_module"):
            opts.pop(k, None)
        if role:
            opts["role"] = role
            opts["role_module"] = role_module or ""
            opts["role_config"] = role_config or {}
        return {"op": "hello", "id": child, "name": target, "session": self.session,
                "secret": self.secret, "opts": opts}

    # -- ops -----------------------------------------------------------------
    def op_ready(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if link is None:
            return
        starting = getattr(link, "starting", None)
        if starting is not None and link.peer == src:
            info: Dict[str, Any] = {k: msg[k] for k in ("hostname", "pid", "python", "user", "ncpu")
                                    if k in msg}
            if isinstance(msg.get("service"), dict):
                info["service"] = msg["service"]
            starting.ready(info)

    def op_spawn(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        from gxpstyle.launch import channels, child_bootstrap
        from gxpstyle.node import local_fork
        child = msg["child"]
        spec = dict(msg["channel"])
        spec["tag"] = "%s:%s" % (bootstrap.PROCESS_TAG, self.session)
        channel: str = spec["name"]      # wire.CHANNEL requires it
        timeout = float(msg["timeout"])

        def reply(ok: bool, reason: str, info: Optional[Dict[str, Any]] = None) -> None:
            self.send(src, {"op": "spawned", "req": msg["req"], "child": child, "ok": ok,
                            "reason": reason, "info": info or {}})

        if not child.startswith(self.id + ".") or "." in child[len(self.id) + 1:]:
            reply(False, "bad child id %s" % child)
            return
        if child in self.children or child in self.starting:
            reply(False, "child id %s is in use" % child)
            return
        if self.quitting:
            reply(False, "parent is quitting")
            return

        def done(cs: child_bootstrap.ChildStart, ok: bool, reason: str,
                 new_link: Optional[Link], info: Dict[str, Any]) -> None:
            self.starting.pop(child, None)
            if ok and new_link is not None:
                new_link.starting = None
                self.children[child] = new_link
                self.started[child] = cs
            reply(ok, reason, info)

        cs = child_bootstrap.ChildStart(self, child, msg["target"], channel, spec, timeout, done)
        self.starting[child] = cs
        try:
            if channel == "local" and local_fork.can_fork(self, spec):
                if self._warming is None:
                    self._warming = local_fork.Warming(self, self._forked)
                self._warming.start(cs)
            elif channel in channels.PROCESS_CHANNELS:
                cs.start_process(channels.process_argv(channel, msg["target"], spec))
            elif channel in channels.BATCH_CHANNELS:
                self.batch.start(cs)
            elif channel in self.extra_channels:
                self.extra_channels[channel](cs)
            else:
                cs._finish(False, "channel %s is not available on %s" % (channel, self.name))
        except (channels.ChannelError, OSError) as e:
            cs._finish(False, str(e))
        except Exception as e:      # a bug answers at once, not at the spawn's timeout
            self.log_failure("spawn of %s" % child, e)
            cs._finish(False, "internal error: %s" % describe_error(e))

    def op_unspawn(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """The head gave up a child still starting: a batch job still in the
        queue is cancelled (its kill hook), and `spawned` says so."""
        cs = self.starting.get(msg["child"]) if src == wire.HEAD else None
        if cs is not None:
            cs._finish(False, "cancelled: no longer needed")

    def op_exec(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if msg.get("notify"):
            self.notify_jobs.add((src, msg["job"]))
        calls = self.node_calls() if msg.get("before") or msg.get("after") else None
        if calls is None:       # none asked, or the module is not here: the head asks
            self.jobs.start(src, msg)
            return
        calls.start(src, msg, lambda: self.jobs.start(src, msg))

    def op_exec_tree(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        self.trees.start(src, msg)

    def op_exec_report(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if src == self.id:       # local_fork.Warming's
            if self._warming is not None and self._warming.left:
                self._warming.ended()
            return
        self.trees.report(src, msg)

    def _held(self, src: str, msg: Dict[str, Any]) -> bool:
        """A frame for a job that waits for its `before` call (node_calls.py)."""
        return self._calls is not None and bool(self._calls.held) and self._calls.hold(src, msg)

    def op_stdin(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if not self._held(src, msg):
            self.jobs.write_stdin(src, msg)

    def op_out_ack(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """Output credit: the consumer took `bytes` of a job's output."""
        if not self._held(src, msg):
            self.jobs.ack_output(src, msg["job"], msg["bytes"])

    def op_kill(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if not self._held(src, msg):
            self.jobs.kill(src, msg["job"], msg["sig"])

    def op_ping(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        self.send(src, {"op": "pong", "req": msg["req"], "id": self.id, "time": time.time()})

    def op_quit(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        self.shutdown(send_bye=True)

    def op_modules(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        """Modules pushed from the head: install them, pass them down once per link."""
        if src != wire.HEAD:
            return
        try:
            sources = bootstrap.unpack_modules(msg["blob"])
        except Exception as e:   # ValueError, zlib.error, DecodeError: a bad blob is dropped
            self.log("refused pushed modules: %s" % e)
            return
        bootstrap.install_sources(sources)
        self.payloads.add(sources)
        if isinstance(msg.get("tag"), str):
            self.payloads.preset(msg["tag"], msg.get("payload"))
        if msg.get("forward", True):
            for child, link in list(self.children.items()):
                link.send(child, wire.HEAD, msg)

    def op_log(self, src: str, msg: Dict[str, Any], link: Optional[Link]) -> None:
        if self.id == wire.HEAD:
            self.write_log(msg["text"])

    # -- files on this host ----------------------------------------------------
    def ensure_session_dir(self) -> str:
        if self.session_dir is None:
            base = os.environ.get("TMPDIR") or "/tmp"
            if not os.path.isdir(base):
                base = "/tmp"
            import tempfile
            # Named by session and node, so that whoever outlives this node on
            # this host (its parent, the head at quit) can remove it after a
            # SIGKILL: see remove_node_dirs.
            self.session_dir = tempfile.mkdtemp(prefix=node_dir_prefix(self.session, self.id),
                                                dir=base)
        return self.session_dir

    def tls_files(self) -> Tuple[str, str]:
        """The session certificate and key as files (ssl loads only files), 0600
        inside the 0700 per-session directory; written once, removed at quit."""
        d = self.ensure_session_dir()
        certfile = os.path.join(d, "cert.pem")
        keyfile = os.path.join(d, "key.pem")
        if not os.path.exists(keyfile):
            for path, text in ((certfile, self.opts["cert"]), (keyfile, self.opts["key"])):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
        return certfile, keyfile

    # -- shutdown --------------------------------------------------------------
    def shutdown(self, send_bye: bool) -> None:
        if self.quitting:
            return
        self.quitting = True
        for child, link in list(self.children.items()):
            link.send(child, self.id, {"op": "quit"})
            link.resume_reading()    # their goodbyes must get through
        for cs in list(self.starting.values()):
            cs._finish(False, "quitting")
        for svc, side in list(self.sides.items()):
            try:
                side.stop()
            except Exception as e:   # a failing node side must not stop the shutdown
                self.log("%s: stopping its node side failed: %s" % (svc, describe_error(e)))
        # Finish when every child link has closed and every job has died (both
        # are events), or after QUIT_GRACE, whichever comes first.
        state = {"jobs": False, "done": False}

        def check() -> None:
            if not state["done"] and state["jobs"] and not self.children:
                finish()

        def finish() -> None:
            if state["done"]:
                return
            state["done"] = True
            self.loop.cancel(timer)
            self.finish_shutdown(send_bye)

        def jobs_dead() -> None:
            state["jobs"] = True
            check()

        for link in list(self.children.values()):
            def closed(link: Link, why: str, inner: Callable[[Link, str], None] = link.on_close) -> None:
                inner(link, why)
                check()
            link.on_close = closed
        timer = self.loop.call_later(QUIT_GRACE, finish)
        self.jobs.kill_all(jobs_dead)

    def finish_shutdown(self, send_bye: bool) -> None:
        for link in list(self.children.values()):
            link.close("quit")
        for cs in list(self.started.values()):
            cs.terminate()
        for cs in list(self.started.values()):
            cs.reap(1.0)
        self.jobs.close()
        self.batch.close()
        if self.session_dir is not None:
            import shutil
            shutil.rmtree(self.session_dir, ignore_errors=True)
        if send_bye and self.parent is not None:
            self.send(wire.HEAD, {"op": "bye", "id": self.id})
            self.parent.flush_blocking(2.0)
        self.loop.stop()


def main(fds: Tuple[int, int]) -> None:
    """Entry point of a shipped agent (called by the bootstrap loader)."""
    rfd, wfd = os.dup(fds[0]), os.dup(fds[1])
    # Move the protocol off fds 0/1 so that a stray print, or a library writing
    # to stdout, can never corrupt the stream (execnet does the same).
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    if fds[0] not in (0, 1):
        os.close(fds[0])
    run(rfd, wfd, bootstrap.PayloadCache(bootstrap.agent_sources(), bootstrap.agent_payload()))


def run(rfd: int, wfd: int, payloads: bootstrap.PayloadCache,
        environ: Optional[Dict[str, str]] = None, forked: bool = False) -> None:
    """Be the node the hello on `rfd` names until it quits (from main(), or
    straight after a fork: local_fork.py, with the parent's `environ`, see
    JobRunner); never returns."""
    # A handler, not SIG_IGN: an ignored signal stays ignored in every job we
    # exec, and a job must die of the SIGINT that `gxpc e` forwards on Ctrl-C.
    signal.signal(signal.SIGINT, lambda *a: None)
    os.set_blocking(rfd, True)
    frame = wire.read_frame_blocking(rfd, wire.MAX_FRAME)
    _, _, body = wire.split_frame(frame)
    hello = wire.decode_message(body)
    if hello["op"] != "hello":
        raise SystemExit(96)
    node = Node(hello["id"], hello["name"], hello["session"], hello["secret"],
                hello["opts"], payloads, environ=environ, forked=forked)
    parent_id = hello["id"].rsplit(".", 1)[0]
    node.parent = Link(node.loop, rfd, wfd, parent_id, node.on_parent_frame, node.on_parent_close)
    signal.signal(signal.SIGTERM, lambda *a: node.loop.call_soon_threadsafe(
        lambda: node.shutdown(send_bye=False)))
    ready = {"op": "ready", "id": node.id, "hostname": os.uname().nodename,
             "pid": os.getpid(), "python": sys.version.split()[0], "user": _user_name(),
             "ncpu": usable_cpus()}
    role = hello["opts"].get("role")
    runner = None
    if role:
        # A service node: its module (pushed by the head) sets it up and may
        # take over the main thread (FUSE wants it); the loop then runs beside.
        try:
            module = role_module(str(hello["opts"].get("role_module") or ""))
            service, runner, side = module.start(node, dict(hello["opts"].get("role_config") or {}))
            node.host_side(role, side)
            ready["service"] = service
        except Exception as e:
            ready["service"] = {"error": describe_error(e)}
    node.send(parent_id, ready)
    if not role:
        node.loop.at_end(node.jobs.start_watchdog)     # after `ready` has gone
    if runner is not None:
        import threading
        loop_thread = threading.Thread(target=node.loop.run, daemon=True)
        loop_thread.start()
        runner()
        node.loop.call_soon_threadsafe(lambda: node.shutdown(send_bye=False))
        # until the loop has stopped: the shutdown's own waits are bounded
        # (QUIT_GRACE), this bounds a stuck one
        loop_thread.join(QUIT_GRACE + 3)
    else:
        node.loop.run()
    os._exit(node.exit_code)


def _user_name() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def usable_cpus() -> int:
    """CPUs this process may run on: a batch allocation or `taskset` limits
    them below what the machine has, and the head fills nodes by this."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
