"""The client side of `gxpc e`: run one shell command on the selected nodes and
stream their output back (raw, line-prefixed with -H, or folded with -b), forward
Ctrl-C (SIGINT, then SIGKILL) and stdin, and turn the exit statuses into ours.

Memory stays bounded however much output comes and however slowly our stdout
is read: we take one message at a time and write it out before taking the next,
and the client library acknowledges output only as we take it, so the nodes
stop reading their commands' pipes when we fall behind (job_runner.py). Stdin
goes to every node with a window per node: we read more only when every node
still taking stdin has room, and stop reading once no node wants more. Only -b
holds output (it must see all of it to fold identical ones).
"""
from __future__ import annotations

import _signal as signal  # the signal module's enums cost more than `gxpc e true` itself
import os
import select
import sys

from gxpstyle.gxpc.client import Client
from gxpstyle.protocol import wire

# Types only: `gxpc e` loads this module on every run, and typing alone costs
# about as much CPU as the interpreter's own start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# Stdin bytes a node may have been sent and not yet passed to its command.
STDIN_WINDOW = 1 << 20


def write_stream(stream: int, data: bytes) -> None:
    """Our stdout (1) or stderr (2), unbuffered; blocks while the reader is slow."""
    out = sys.stdout if stream == 1 else sys.stderr
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()


def print_error(text: str) -> None:
    sys.stderr.write("gxpc: %s\n" % text)


def _id_key(nid: str) -> List[int]:
    return [int(x) for x in nid.split(".")]


class _Output:
    """Where each node's output goes: straight through, by line with -H, or kept for -b."""

    def __init__(self, names: Dict[str, str], host_prefix: bool, fold: bool,
                 write: Callable[[int, bytes], None]) -> None:
        self.names = names
        self.host_prefix = host_prefix
        self.fold = fold
        self.write = write
        self.folded: Dict[str, bytearray] = {n: bytearray() for n in names}
        self.partial: Dict[Tuple[str, int], bytes] = {}

    def add(self, src: str, fd: int, data: bytes) -> None:
        if self.fold:
            self.folded[src] += data
        elif self.host_prefix:
            key = (src, fd)
            data = self.partial.pop(key, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self.partial[key] = lines[-1]
            prefix = self.names[src].encode() + b": "
            if len(lines) > 1:
                self.write(fd, b"".join(prefix + line + b"\n" for line in lines[:-1]))
        else:
            self.write(fd, data)

    def finish(self) -> None:
        for (src, fd), rest in self.partial.items():
            self.write(fd, self.names[src].encode() + b": " + rest + b"\n")
        if self.fold:
            groups: Dict[bytes, List[str]] = {}
            for nid in sorted(self.names, key=_id_key):
                groups.setdefault(bytes(self.folded[nid]), []).append(self.names[nid])
            for out, members in groups.items():
                from gxpstyle.config import hostpattern  # only -b folds names
                header = hostpattern.fold(members)
                self.write(1, ("-" * 15 + "\n" + header + " (%d)\n" % len(members)
                               + "-" * 15 + "\n").encode())
                self.write(1, out)


def run(c: Client, cmd: str, mask: Optional[str] = None, hosts: Optional[str] = None,
        stdin: bool = False, host_prefix: bool = False, fold: bool = False,
        stdin_fd: int = 0, write: Callable[[int, bytes], None] = write_stream,
        error: Callable[[str], None] = print_error) -> int:
    """Run `cmd` on the selected nodes of the session `c` is connected to; returns
    the exit status of `gxpc e` (0 all succeeded, 1 some failed, 2 refused, 130 Ctrl-C)."""
    cwd = os.getcwd() if os.path.isdir(os.getcwd()) else None
    args: Dict[str, Any] = {"cmd": cmd, "mask": mask, "hosts": hosts, "stdin": stdin, "cwd": cwd,
                            "env": {}, "fold": fold}
    status, result = c.call("e", args)
    if status:
        error(result.get("error", "e failed"))
        return EXIT_USAGE
    job, names = result["job"], result["nodes"]
    if not names:
        error("e: no node selected")
        return EXIT_FAILED
    shell = _Shell(c, job, names, _Output(names, host_prefix, fold, write),
                   stdin_fd if stdin else None)
    shell.loop()
    if shell.interrupts:
        return EXIT_INTERRUPTED
    failed = sorted((n for n, s in shell.statuses.items() if s != 0), key=_id_key)
    if failed:
        parts = []
        for nid in failed:
            why = shell.errors.get(nid) or "exit %d" % shell.statuses[nid]
            parts.append("%s (%s)" % (names[nid], why))
        error("e: failed on %d of %d: %s" % (len(failed), len(names), ", ".join(parts)))
        return EXIT_FAILED
    return EXIT_OK


class _Shell:
    def __init__(self, c: Client, job: int, names: Dict[str, str], output: _Output,
                 stdin_fd: Optional[int]) -> None:
        self.c = c
        self.job = job
        self.names = names
        self.output = output
        self.running: Set[str] = set(names)
        self.statuses: Dict[str, int] = {}
        self.errors: Dict[str, str] = {}
        self.interrupts = 0
        if stdin_fd == 0 and sys.stdin is None:
            # Started with fd 0 closed (the number may now be our socket's):
            # the commands get an empty stdin.
            stdin_fd = os.open(os.devnull, os.O_RDONLY)
        self.stdin_fd = stdin_fd
        self.feeding: Set[str] = set(names) if stdin_fd is not None else set()
        self.in_flight: Dict[str, int] = {n: 0 for n in names}

    def on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupts += 1
        sig = signal.SIGINT if self.interrupts == 1 else signal.SIGKILL
        for nid in self.running:
            try:
                self.c.send_urgent(nid, {"op": "kill", "job": self.job, "sig": int(sig)})
            except OSError:
                pass

    def loop(self) -> None:
        old = signal.signal(signal.SIGINT, self.on_sigint)
        try:
            while self.running:
                self._step()
        finally:
            signal.signal(signal.SIGINT, old)
        self.output.finish()

    def _wants_stdin(self) -> bool:
        if self.stdin_fd is None or not self.feeding or self.c.out_buf:
            return False
        return all(self.in_flight[n] + wire.CHUNK <= STDIN_WINDOW for n in self.feeding)

    def _step(self) -> None:
        c = self.c
        # Messages may already wait: the reply to our request can arrive in the
        # same read as the first output and exits.
        self._take_all()
        if not self.running:
            return
        readers: List[Any] = [c.fileno()]
        if self._wants_stdin():
            readers.append(self.stdin_fd)
        # No timeout: every change is an event here. A Ctrl-C's kill goes out
        # from the handler itself, or is queued behind a frame already half
        # sent, and then the socket is among the writers already.
        writers = [c.fileno()] if c.out_buf else []
        try:
            readable, writable, _ = select.select(readers, writers, [])
        except InterruptedError:
            return
        if writable:
            c.flush()
        if self.stdin_fd is not None and self.stdin_fd in readable:
            self._read_stdin()
        if c.fileno() in readable:
            c.receive()
            self._take_all()
        if c.out_buf:
            c.flush()

    def _take_all(self) -> None:
        while True:
            item = self.c.take()
            if item is None:
                return
            self._handle(*item)

    def _read_stdin(self) -> None:
        assert self.stdin_fd is not None
        try:
            data = os.read(self.stdin_fd, wire.CHUNK)
        except InterruptedError:
            return
        except OSError:
            data = b""
        for nid in sorted(self.feeding, key=_id_key):
            self.c.queue(nid, {"op": "stdin", "job": self.job, "data": data, "eof": not data})
            self.in_flight[nid] += len(data)
        if not data:
            self.stdin_fd = None
        self.c.flush()

    def _handle(self, src: str, msg: Dict[str, Any]) -> None:
        if msg.get("job") != self.job:
            return
        op = msg["op"]
        if op == "exits" and src == wire.HEAD:
            self._exits(msg["groups"])
            return
        if src not in self.names:
            return
        if op == "out":
            self.output.add(src, msg["fd"], msg["data"])
        elif op == "stdin_ack":
            self.in_flight[src] -= msg["bytes"]
            if msg["eof"]:
                self.feeding.discard(src)
        elif op == "exit":
            self._ended(src, msg["status"], msg["error"])

    def _ended(self, nid: str, status: int, error: str) -> None:
        self.running.discard(nid)
        self.feeding.discard(nid)
        self.statuses[nid] = status
        if error:
            self.errors[nid] = error

    def _exits(self, groups: List[Dict[str, Any]]) -> None:
        """Exit statuses the tree folded (node/tree_exec.py): (status, error,
        nodes) groups, with the nodes' output when it was folded too (-b).
        A node the head already answered for (lost) keeps that answer."""
        for g in groups:
            out = g.get("out")
            for nid in g["nodes"]:
                if nid in self.running:
                    self._ended(nid, g["status"], g["error"])
                    if out is not None and nid in self.output.folded:
                        self.output.folded[nid] += out
