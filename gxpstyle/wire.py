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

import struct
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional, Tuple

from gxpstyle import serializer

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
# op -> {field: type or tuple of types}. Unlisted fields are allowed (newer peers
# may add some); listed ones must be present with the right type.
_S = str
_I = int
_B = bool
_BY = bytes
_D = dict
_L = list
_O = (type(None), str)

SCHEMA: Dict[str, Dict[str, Any]] = {
    # tree management
    "hello": {"id": _S, "name": _S, "session": _S, "secret": _BY, "opts": _D},
    "ready": {"id": _S, "hostname": _S, "pid": _I, "python": _S, "user": _S},
    "spawn": {"req": _I, "child": _S, "target": _S, "channel": _D, "timeout": (int, float)},
    "spawned": {"req": _I, "child": _S, "ok": _B, "reason": _S, "info": _D},
    "lost": {"ids": _L, "reason": _S},
    "quit": {},
    "bye": {"id": _S},
    "ping": {"req": _I},
    "pong": {"req": _I, "id": _S, "time": float},
    "log": {"level": _S, "text": _S},
    # jobs: a command with its cwd and environment, streamed output, exit, cancel
    "exec": {"job": _I, "cmd": _S, "cwd": _O, "env": _D, "stdin": _B},
    "stdin": {"job": _I, "data": _BY, "eof": _B},
    "out": {"job": _I, "fd": _I, "data": _BY},
    "exit": {"job": _I, "status": _I, "error": _S},
    "kill": {"job": _I, "sig": _I},
    # flow control (job_runner.py): the consumer took `bytes` of a job's output;
    # the command took `bytes` of its stdin (eof: it will take no more)
    "out_ack": {"job": _I, "bytes": _I},
    "stdin_ack": {"job": _I, "bytes": _I, "eof": _B},
    # node-to-node file transfer (head plans; agents move bytes)
    "xfer_open": {"xfer": _I, "path": _S, "mode": _I, "size": _I},
    "xfer_data": {"xfer": _I, "data": _BY},
    "xfer_close": {"xfer": _I, "sha256": _S},
    "xfer_done": {"xfer": _I, "ok": _B, "error": _S},
    # calls to a node's role (service), e.g. GMount's per-node mount
    "svc": {"req": _I, "call": _S, "args": _D},
    "svc_reply": {"req": _I, "ok": _B, "error": _S, "result": _D},
    # more modules for live agents (zlib of a serialized {name: source}); crosses each link once
    "modules": {"blob": _BY},
    # client <-> session daemon
    "request": {"req": _I, "cmd": _S, "args": _D},
    "reply": {"req": _I, "status": _I, "result": _D},
    "print": {"req": _I, "stream": _I, "data": _BY},
    "error": {"text": _S},
    # sshfsmux direct data channel (sshfsmux/fs_protocol.py): calls, one reply
    # each, streamed data for whole-file reads and long listings
    "fs_call": {"req": _I, "call": _S, "args": _D},
    "fs_reply": {"req": _I, "errno": _I,
                 "result": (type(None), bool, int, float, str, bytes, list, dict)},
    "fs_data": {"req": _I, "data": _BY, "eof": _B},
}


def validate(msg: Any) -> Dict[str, Any]:
    """Return msg if it is a known op with well-typed fields, else raise FrameError."""
    if not isinstance(msg, dict):
        raise FrameError("message is not a dict")
    op = msg.get("op")
    if not isinstance(op, str) or op not in SCHEMA:
        raise FrameError("unknown op %r" % (op,))
    for field, typ in SCHEMA[op].items():
        if field not in msg:
            raise FrameError("%s: missing field %s" % (op, field))
        value = msg[field]
        if isinstance(value, bool) and typ in (_I, (int, float)):
            raise FrameError("%s: field %s has wrong type" % (op, field))
        if not isinstance(value, typ):
            raise FrameError("%s: field %s has wrong type" % (op, field))
    return msg


def decode_message(body: bytes) -> Dict[str, Any]:
    try:
        return validate(serializer.loads(body))
    except serializer.DecodeError as e:
        raise FrameError(str(e))


def route(self_id: str, dst: str, children: "Dict[str, Any]") -> Optional[str]:
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
