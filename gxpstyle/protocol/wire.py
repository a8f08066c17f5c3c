"""The one wire protocol: addressed frames between the head, agents and clients.

Every link (a child's stdin/stdout pipe, a TLS socket from a batch job, the
client's Unix socket) carries the same frames:

    u32 length | u8 dst_len | dst | u8 src_len | src | serialized message

`length` counts everything after itself and is checked against MAX_FRAME before
one byte of the body is buffered, so a 4 GiB length prefix costs nothing.
Addresses are node ids: the head is "0", its children "0.1", "0.2", their
children "0.1.1" and so on. Routing needs no tables: a frame for a descendant
goes down the child whose id is a prefix of the destination, everything else goes
up (mitogen routes by learned tables; hierarchical ids make the tree itself the
table, and a lost link names its whole subtree by prefix).

The message is a dict with a string "op" and fields checked by `validate` against
the schema below before any handler touches them.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional, Tuple

from gxpstyle.protocol import serializer
from gxpstyle.protocol.schema import Any as _Any
from gxpstyle.protocol.schema import Bool, Bytes, Choice, Int, ListOf, MapOf, Num, Opt, Rec, SchemaError, Str

MAX_FRAME = 4 << 20        # a frame body; file data travels in chunks well below this
CHUNK = 256 << 10          # what senders put in one data frame
MAX_ADDR = 200             # a node id of 60 levels is still far below this
HEAD = "0"
CLIENT_PREFIX = "c"        # clients of the session daemon: "c17"

_HDR = struct.Struct("!I")


class FrameError(ValueError):
    """The peer sent something that is not a valid frame; drop the link."""


def encode_frame(dst: str, src: str, msg: Dict[str, Any]) -> bytes:
    d = dst.encode("ascii")
    s = src.encode("ascii")
    if len(d) > MAX_ADDR or len(s) > MAX_ADDR:
        raise ValueError("address too long")
    body = serializer.dumps(msg)
    total = 2 + len(d) + len(s) + len(body)
    if total > MAX_FRAME:
        raise ValueError("message of %d bytes is over the frame limit" % total)
    return b"".join((_HDR.pack(total), bytes((len(d),)), d, bytes((len(s),)), s, body))


def split_frame(frame: bytes) -> Tuple[str, str, bytes]:
    """(dst, src, body) of a frame without its length prefix."""
    if len(frame) < 2:
        raise FrameError("frame too short")
    dl = frame[0]
    if dl > MAX_ADDR or 1 + dl + 1 > len(frame):
        raise FrameError("bad destination length")
    dst = frame[1:1 + dl]
    sl = frame[1 + dl]
    start = 2 + dl + sl
    if sl > MAX_ADDR or start > len(frame):
        raise FrameError("bad source length")
    src = frame[2 + dl:start]
    try:
        return dst.decode("ascii"), src.decode("ascii"), frame[start:]
    except UnicodeDecodeError:
        raise FrameError("non-ASCII address")


class FrameReader:
    """Incremental frame parser. Memory held is bounded by MAX_FRAME + one read."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        self._buf += data
        frames = []
        while True:
            if len(self._buf) < 4:
                break
            (n,) = _HDR.unpack_from(self._buf, 0)
            if n > self.max_frame or n < 2:
                raise FrameError("frame length %d out of bounds" % n)
            if len(self._buf) < 4 + n:
                break
            frames.append(bytes(self._buf[4:4 + n]))
            del self._buf[:4 + n]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buf)


# --- message schema ---------------------------------------------------------
# op -> the shape of its message (gxpstyle/protocol/schema.py), nested fields included.
# Messages are open records: a newer peer may add fields, which are kept but
# never read; every field a handler reads is declared and checked here.

_ID = Str(MAX_ADDR, empty=False)
_REQ = Int(0, (1 << 63) - 1)
_JOB = Int(0, (1 << 63) - 1)
_TEXT = Str(1 << 16)
_MAP = MapOf(_Any())
# a call a job's node makes to a role node below it, and the answer it got
# `unless`: a generation file of the role node's on the job's host (node_calls.py)
NODE_CALL = Rec({"node": _ID, "call": Str(64, empty=False), "args": _MAP, "wait": Num(0, 86400)},
                {"unless": Str(4096, empty=False)})
CALL_ANSWER = Rec({"ok": Bool(), "error": _TEXT, "result": _MAP})
_STRS = ListOf(Str(1 << 16), 1024)
_SID = Str(MAX_ADDR + 24, empty=False)

# What a channel spec may carry (use-rule options, plus what the head and the
# parent add): every field a channel or the bootstrap reads.
CHANNEL = Rec({"name": Str(32, empty=False)}, {
    "user": Str(256), "port": Int(1, 65535), "python": Str(4096), "template": Str(4096),
    "queue": Str(256), "connect_host": Str(256), "job_time": Str(64),
    "identity_file": Str(4096), "fanout": Int(1, 100000), "timeout": Num(0, 1e9),
    "ssh_options": _STRS, "batch_options": _STRS, "tag": Str(512),
    "role": Str(64), "role_module": Str(256), "role_config": _MAP,
}, open=True)
_ENV = MapOf(Opt(Str(1 << 20, nul=True)), 1 << 14)
_GROUPS = ListOf(Rec({"status": Int(-(1 << 31), 1 << 31), "error": _TEXT,
                      "nodes": ListOf(_ID, 1 << 20)}, {"out": Bytes(MAX_FRAME)}, open=True), 1 << 16)
NODE_INFO = Rec(None, {"hostname": Str(1024), "pid": Int(0, 1 << 31), "python": Str(64),
                       "user": Str(256), "ncpu": Int(1, 1 << 20), "service": _MAP}, open=True)

SCHEMA: Dict[str, Rec] = {
    # tree management
    "hello": Rec({"id": _ID, "name": Str(4096), "session": Str(256), "secret": Bytes(1024),
                  "opts": Rec(None, {"cert": Str(1 << 16), "key": Str(1 << 16), "pin": Str(256),
                                     "role": Str(64), "role_module": Str(256),
                                     "role_config": _MAP}, open=True)}, open=True),
    "ready": Rec({"id": _ID, "hostname": Str(1024), "pid": Int(0, 1 << 31), "python": Str(64),
                  "user": Str(256)}, {"ncpu": Int(1, 1 << 20), "service": _MAP}, open=True),
    "spawn": Rec({"req": _REQ, "child": _ID, "target": Str(4096, empty=False), "channel": CHANNEL,
                  "timeout": Num(0, 1e9)}, open=True),
    "spawned": Rec({"req": _REQ, "child": _ID, "ok": Bool(), "reason": _TEXT, "info": NODE_INFO},
                   open=True),
    # the head no longer wants `child` (an elastic pool's job still queued)
    "unspawn": Rec({"child": _ID}, open=True),
    "lost": Rec({"ids": ListOf(_ID, 1 << 16), "reason": _TEXT}, open=True),
    "quit": Rec(open=True),
    "bye": Rec({"id": _ID}, open=True),
    "ping": Rec({"req": _REQ}, open=True),
    "pong": Rec({"req": _REQ, "id": _ID, "time": Num()}, open=True),
    "log": Rec({"level": Str(16), "text": _TEXT}, open=True),
    # jobs: a command with its cwd and environment, streamed output, exit, cancel.
    # `notify`: the node also tells the head the job ended (`done`), so the head
    # keeps its books without decoding the client's output frames.
    # `base`: env is what differs from an environment the node keeps under
    # that id (job_runner.py), given once in `base_env` (JobTable.start)
    # `before`, `after`: a call the node makes to a role node of its own
    # (node_calls.py) before the job starts, and as it ends (its answer goes
    # with `done`)
    "exec": Rec({"job": _JOB, "cmd": Str(1 << 20), "cwd": Opt(Str(4096)), "env": _ENV,
                 "stdin": Bool()}, {"notify": Bool(), "base": _JOB, "base_env": _ENV,
                                    "before": NODE_CALL, "after": NODE_CALL}, open=True),
    # a job along the tree (tree_exec.py): one message a child, naming every
    # target of its subtree with what each adds to `env`; the subtree's exit
    # statuses come back folded, as (status, error, nodes) groups (with
    # `fold`, the output as well), up the tree to the head (`exec_report`),
    # which tells the client (`exits`)
    "exec_tree": Rec({"job": _JOB, "cmd": Str(1 << 20), "cwd": Opt(Str(4096)), "env": _ENV,
                      "stdin": Bool(), "targets": MapOf(_ENV, 1 << 20, key=_ID)},
                     {"fold": Bool()}, open=True),
    "exec_report": Rec({"job": _JOB, "client": _ID, "groups": _GROUPS, "final": Bool()}, open=True),
    "exits": Rec({"job": _JOB, "groups": _GROUPS}, open=True),
    # the head acted on a job's files (gxpc make's write-on-exit): its client
    # may count the job's exit now
    "settled": Rec({"job": _JOB}, open=True),
    "stdin": Rec({"job": _JOB, "data": Bytes(MAX_FRAME), "eof": Bool()}, open=True),
    "out": Rec({"job": _JOB, "fd": Choice(1, 2), "data": Bytes(MAX_FRAME)}, open=True),
    "exit": Rec({"job": _JOB, "status": Int(-(1 << 31), 1 << 31), "error": _TEXT}, open=True),
    "done": Rec({"job": _JOB, "client": _ID, "status": Int(-(1 << 31), 1 << 31), "error": _TEXT},
                {"answer": CALL_ANSWER}, open=True),
    "kill": Rec({"job": _JOB, "sig": Int(1, 64)}, open=True),
    # flow control (job_runner.py): the consumer took `bytes` of a job's output;
    # the command took `bytes` of its stdin (eof: it will take no more)
    "out_ack": Rec({"job": _JOB, "bytes": Int(0, 1 << 62)}, open=True),
    "stdin_ack": Rec({"job": _JOB, "bytes": Int(0, 1 << 62), "eof": Bool()}, open=True),
    # byte streams along the tree (gxpstyle/node/tree_streams.py): `sid` is
    # "<opener id>/<n>"; the asked node connects to its own 127.0.0.1:port
    "stream_open": Rec({"sid": _SID, "port": Int(1, 65535)}, open=True),
    "stream_opened": Rec({"sid": _SID, "ok": Bool(), "error": _TEXT}, open=True),
    "stream_data": Rec({"sid": _SID, "data": Bytes(CHUNK), "eof": Bool()}, open=True),
    "stream_ack": Rec({"sid": _SID, "bytes": Int(0, 1 << 62)}, open=True),
    "stream_close": Rec({"sid": _SID, "reason": _TEXT}, open=True),
    # a service's own messages between its head side and its node sides
    # (node_side.py), routed by service name; `body` is checked against the
    # schema the receiving side declares for `type` before a handler sees it
    "svc_msg": Rec({"svc": Str(64, empty=False), "type": Str(64, empty=False), "body": _MAP},
                   open=True),
    # the head asks a node to host a service's node side (node_side.py): a
    # class of a module in the agent payload or pushed by the head
    "side": Rec({"svc": Str(64, empty=False), "module": Str(256, empty=False),
                 "cls": Str(128, empty=False)}, open=True),
    # a node could not host it (its modules failed to load or start): the
    # head's side of that service hears it and fails what waited on the node
    "side_failed": Rec({"svc": Str(64, empty=False), "error": _TEXT}, open=True),
    # calls to a node's role (a service such as GMount's per-node mount)
    "svc": Rec({"req": _REQ, "call": Str(64), "args": _MAP}, open=True),
    "svc_reply": Rec({"req": _REQ, "ok": Bool(), "error": _TEXT, "result": _MAP}, open=True),
    # more modules for live agents (zlib of a serialized {name: source}); with
    # forward, each link carries them once down the whole subtree
    "modules": Rec({"blob": Bytes(MAX_FRAME)},
                   {"tag": Str(64), "payload": Opt(ListOf(Bytes(MAX_FRAME), 2)),
                    "forward": Bool()}, open=True),
    # client <-> session daemon; a request's args are checked by its verb's schema
    "request": Rec({"req": _REQ, "cmd": Str(64, empty=False), "args": _MAP}, open=True),
    "reply": Rec({"req": _REQ, "status": Int(0, 255), "result": _MAP}, open=True),
    "print": Rec({"req": _REQ, "stream": Choice(1, 2), "data": Bytes(MAX_FRAME)}, open=True),
    "error": Rec({"text": _TEXT}, open=True),
}


def validate(msg: Any, schema: Optional[Dict[str, Rec]] = None) -> Dict[str, Any]:
    """The message, checked against its op's declared shape (nested fields
    included), else FrameError with the reason."""
    if not isinstance(msg, dict):
        raise FrameError("message is not a dict")
    op = msg.get("op")
    table = SCHEMA if schema is None else schema
    if not isinstance(op, str) or op not in table:
        raise FrameError("unknown op %r" % (op,))
    try:
        return table[op].check(msg, op)
    except SchemaError as e:
        raise FrameError(str(e))


def decode_message(body: bytes, schema: Optional[Dict[str, Rec]] = None) -> Dict[str, Any]:
    try:
        return validate(serializer.loads(body), schema)
    except serializer.DecodeError as e:
        raise FrameError(str(e))


def route(self_id: str, dst: str, children: Dict[str, Any]) -> Optional[str]:
    """Where a frame for dst goes from node self_id: "self", a child id, or None (up)."""
    if dst == self_id:
        return "self"
    prefix = self_id + "."
    if dst.startswith(prefix):
        rest = dst[len(prefix):]
        child = prefix + rest.split(".", 1)[0]
        return child if child in children else "unroutable"
    return None


def is_descendant(node: str, ancestor: str) -> bool:
    return node == ancestor or node.startswith(ancestor + ".")


def read_frame_blocking(fd: int, limit: int) -> bytes:
    """One frame's body from a blocking fd (an agent's hello, before its loop runs)."""
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError("parent closed before hello")
            buf += chunk
        return buf
    n = int.from_bytes(exact(4), "big")
    if n > limit:
        raise FrameError("hello too large")
    return exact(n)
