"""Starting children through a batch queue (Slurm, Torque).

The parent writes a 0600 job script holding a one-time token for this one
child, submits it, and waits: the job connects back to a TLS listener of the
parent's (gxpstyle/transport/link_auth.py), proves the token, and becomes the child's
link. Submitting and cancelling run in threads so the node's loop never waits
for the queue.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os

COMMAND_WAIT = 60.0   # seconds sbatch/qsub/scancel/qdel may take
CLOSE_WAIT = 15.0     # seconds a quitting node waits for those in flight, in all

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Callable, Dict, List, Tuple

    from gxpstyle.launch import child_bootstrap
    from gxpstyle.node.agent import Node


class BatchStarts:
    """One node's batch children on their way up, and its connect-back listener."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.listener: Any = None   # link_auth.Listener, made on first use (ssl is slow to import)
        self.waiting: Dict[str, child_bootstrap.ChildStart] = {}
        self.tokens: Dict[str, bytes] = {}
        # Submits and cancels in flight: [thread, argv, result or None, done, ran]
        self.running: List[list] = []
        self.closing = False

    def close(self) -> None:
        """At quit: finish the submits and cancels in flight before the loop
        stops (a job submitted as we quit is cancelled, not left in the
        queue), within CLOSE_WAIT in all; what they call runs here, at once."""
        import time
        self.closing = True
        deadline = time.monotonic() + CLOSE_WAIT
        while self.running:
            item = self.running.pop(0)
            item[0].join(max(0.0, deadline - time.monotonic()))
            if item[2] is not None and not item[4]:
                item[4] = True
                item[3](*item[2])
        if self.listener is not None:
            self.listener.close()

    def ensure_listener(self) -> Any:
        from gxpstyle.transport import link_auth
        if self.listener is None:
            certfile, keyfile = self.node.tls_files()

            def on_link(label: str, rfd: int, wfd: int) -> None:
                self.node.loop.call_soon_threadsafe(lambda: self.connected(label, rfd, wfd))

            refusals = link_auth.RefusalLog(
                lambda line: self.node.loop.call_soon_threadsafe(lambda: self.node.log(line)))

            def on_refused(addr: Any, why: str) -> None:
                refusals.refused(str(addr[0]), why)

            self.listener = link_auth.Listener(self.tokens.get, on_link, on_refused,
                                               certfile, keyfile, self.node.opts["pin"])
        return self.listener

    def start(self, cs: child_bootstrap.ChildStart) -> None:
        import socket

        from gxpstyle.launch import bootstrap, channels, child_bootstrap
        from gxpstyle.transport import link_auth
        listener = self.ensure_listener()
        d = self.node.ensure_session_dir()
        token = os.urandom(32)
        tag = cs.child.replace(".", "-")
        script = os.path.join(d, "job-%s.py" % tag)
        err = "/dev/null"
        host = cs.spec.get("connect_host") or socket.gethostname()
        text = channels.job_script(cs.channel, cs.spec, cs.child, host, listener.port, token,
                                   self.node.opts["pin"], bootstrap.module_source(link_auth), err)
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.tokens[cs.child] = token
        self.waiting[cs.child] = cs
        argv = channels.submit_argv(cs.channel, cs.spec, cs.child, script, err)

        def cleanup() -> None:
            self.tokens.pop(cs.child, None)
            self.waiting.pop(cs.child, None)
            try:
                os.unlink(script)
            except OSError:
                pass
            if cs.batch_job and cs.link is None:
                from gxpstyle.launch import channels
                self.run_async(channels.cancel_argv(cs.channel, cs.batch_job), lambda *a: None)

        cs.kill_hook = cleanup

        def submitted(rc: int, out: str, errtext: str) -> None:
            if cs.finished:
                if rc == 0:
                    # Too late (timed out or quitting): cancel what we just submitted.
                    try:
                        job = channels.parse_job_id(cs.channel, out)
                        self.run_async(channels.cancel_argv(cs.channel, job), lambda *a: None)
                    except channels.ChannelError:
                        pass
                return
            if rc != 0:
                line = child_bootstrap.last_line(errtext.encode()) or "exit status %d" % rc
                cs._finish(False, "%s failed: %s" % (argv[0], line))
                return
            try:
                cs.batch_job = channels.parse_job_id(cs.channel, out)
            except channels.ChannelError as e:
                cs._finish(False, str(e))

        self.run_async(argv, submitted)

    def connected(self, label: str, rfd: int, wfd: int) -> None:
        cs = self.waiting.pop(label, None)
        self.tokens.pop(label, None)
        if cs is None or cs.finished:
            os.close(rfd)
            return
        try:
            os.unlink(os.path.join(self.node.ensure_session_dir(), "job-%s.py" % label.replace(".", "-")))
        except OSError:
            pass
        cs.attach(rfd, wfd, None, need_marker=False)

    def run_async(self, argv: list, done: Callable[[int, str, str], None]) -> None:
        """Run a short command in a thread; `done(rc, stdout, stderr)` on the
        loop. While closing, at once, here."""
        import threading
        if self.closing:
            done(*_run_command(argv))
            return
        item: list = [None, argv, None, done, False]

        def finish() -> None:
            if item in self.running:
                self.running.remove(item)
            if not item[4]:
                item[4] = True
                done(*item[2])

        def work() -> None:
            item[2] = _run_command(argv)
            self.node.loop.call_soon_threadsafe(finish)
        item[0] = threading.Thread(target=work, daemon=True)
        self.running.append(item)
        item[0].start()


def _run_command(argv: list) -> Tuple[int, str, str]:
    import subprocess
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_WAIT)
        return (p.returncode, p.stdout.decode("utf-8", "replace"),
                p.stderr.decode("utf-8", "replace"))
    except (OSError, subprocess.TimeoutExpired) as e:
        return (127, "", "%s: %s" % (argv[0], getattr(e, "strerror", None) or e))
