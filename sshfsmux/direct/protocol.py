"""The direct data channel between our agents (SSHFSM-Direct): its messages,
calls and argument checks, which both ends share.

Connection: fs_transport (TCP, link_auth's handshake, TLS or per-frame MACs).

Messages are gxpstyle.protocol.wire frames (u32 length, addresses, serialized dict), length
checked against wire.MAX_FRAME before buffering, decoded by the builtin-only
serializer and checked against this module's SCHEMA (wire.validate with schema=SCHEMA):

    {"op": "fs_call",  "req": int, "call": str, "args": dict}
    {"op": "fs_reply", "req": int, "errno": int, "result": value}
    {"op": "fs_data",  "req": int, "data": bytes, "eof": bool, ...}

Every call gets exactly one fs_reply. `read_file` and `readdir` may stream: when
their reply has errno 0 and says so (read_file: "unchanged" false; readdir:
"more" true), fs_data frames with the same req follow back to back, no per-chunk
round trips, each with at most wire.CHUNK bytes of data; the last has eof true.
The last frame of read_file also carries "size" (bytes sent), "mtime_ns",
"ctime_ns" (after reading), "settled" (the file's times are older than
SETTLE_SECONDS on the server clock) and "errno" (nonzero if the stream failed or
was cancelled). readdir's stream data is names joined by NUL bytes, whole names
per frame. TCP is the flow control: the server produces the next chunk only
while its output queue is below a low-water mark.

Wire paths are relative to the export: "" is the root, "a/b" below it. An
absolute path or ".." is refused with EACCES (see confined_paths).

Calls (args -> result; [m] mutating: EROFS on a read-only export):
    getattr    {path}                        -> stat dict (lstat: not following)
    readdir    {path}                        -> {"names": [str], "more": bool}
    readlink   {path}                        -> str
    mkdir      {path, mode}              [m] -> None
    rmdir      {path}                    [m] -> None
    unlink     {path}                    [m] -> None
    rename     {old, new}                [m] -> None
    symlink    {target, path}            [m] -> None
    chmod      {path, mode}              [m] -> None
    truncate   {path, length}            [m] -> None
    utimens    {path, times: None|[atime, mtime]}   [m] -> None (on a symlink itself)
    statfs     {}                            -> statvfs dict
    getxattr   {path, name}                  -> bytes
    setxattr   {path, name, value}       [m] -> None
    listxattr  {path}                        -> [str]
    removexattr {path, name}             [m] -> None
    read_file  {path, have: None|{size, mtime_ns, ctime_ns, ino}}
               -> {"unchanged", "size", "mtime_ns", "ctime_ns", "ino", "st"} + stream
    read_peer  {node, path, have}            -> as read_file, of `node`'s export,
               served by a site proxy (peer_relay.py; ENOSYS where none is)
    read       {path, offset, size}          -> bytes   (a range, size <= MAX_IO)
    version    {path}                        -> {"size", "mtime_ns", "ctime_ns", "ino"}
               (what read_file's "have" compares: a copy made elsewhere is adopted with it)
    open_write {path, flags, mode, create}  [m] -> int handle
    write      {fh, offset, data}        [m] -> int bytes written
    pread      {fh, offset, size}            -> bytes
    ftruncate  {fh, length}              [m] -> None
    fsync      {fh}                      [m] -> None
    close_write {fh}                     [m] -> None
    cancel     {req}                         -> None (stops stream `req`)

Unknown calls get ENOSYS, malformed arguments EINVAL (or EACCES/ENAMETOOLONG for
paths); a frame that is not a valid message drops the connection.

Standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import hashlib
import hmac

from gxpstyle.protocol import schema, wire
from sshfsmux.branches import confined_paths
from sshfsmux.direct.transport import (  # noqa: F401
    LABEL,
    LABEL_PLAIN,
    TAG_BYTES,
    ConnectionLost,
    FrameConn,
    connect,
    plain_client_handshake,
    plain_server_handshake,
    tune_socket,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple

KEY_INFO = b"sshfsmux data channel"
CLIENT_ADDR = "c"
SERVER_ADDR = "fs"

CHUNK = wire.CHUNK              # data per fs_data frame
MAX_IO = 1 << 20                # data per write/read/pread call
MAX_XATTR_NAME = 255
MAX_XATTR_VALUE = 64 << 10
MAX_LINK_TARGET = confined_paths.PATH_MAX
U63 = (1 << 63) - 1
SETTLE_SECONDS = 2.0            # a replica of a file touched this recently may go stale unseen



def data_channel_key(secret: bytes) -> bytes:
    """The data channel's key, derived from the session secret."""
    return hmac.new(secret, KEY_INFO, hashlib.sha256).digest()


def oserror(code: int, detail: str = "") -> OSError:
    return confined_paths.error(code, detail)


# --- argument checks ----------------------------------------------------------

def _path(v: Any) -> str:
    confined_paths.split_path(v)        # raises EACCES / EINVAL / ENAMETOOLONG
    return v


def _uint(limit: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limit:
            raise oserror(errno.EINVAL, "integer out of range")
        return v
    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise oserror(errno.EINVAL, "not a bool")
    return v


def _data(limit: int) -> Callable[[Any], bytes]:
    def check(v: Any) -> bytes:
        if not isinstance(v, bytes) or len(v) > limit:
            raise oserror(errno.EINVAL, "bad data")
        return v
    return check


def _text(what: str, limit: int, too_long: int) -> Callable[[Any], str]:
    """A checker for a non-empty string without NUL of at most `limit` UTF-8
    bytes; longer ones fail with errno `too_long`."""
    def check(v: Any) -> str:
        if not isinstance(v, str) or not v or "\x00" in v:
            raise oserror(errno.EINVAL, "bad " + what)
        try:
            n = len(v.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            raise oserror(errno.EINVAL, "bad " + what)
        if n > limit:
            raise oserror(too_long)
        return v
    return check


_xname = _text("attribute name", MAX_XATTR_NAME, errno.ERANGE)
_target = _text("symlink target", MAX_LINK_TARGET, errno.ENAMETOOLONG)


def _times(v: Any) -> Optional[Tuple[float, float]]:
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 2
            or any(isinstance(t, bool) or not isinstance(t, (int, float)) for t in v)):
        raise oserror(errno.EINVAL, "bad times")
    return (v[0], v[1])


_HAVE_KEYS = ("size", "mtime_ns", "ctime_ns", "ino")


def _node_name(v: Any) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= 255 or "\0" in v:
        raise oserror(errno.EINVAL, "bad node name")
    return v


def _have(v: Any) -> Optional[Tuple[int, int, int, int]]:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise oserror(errno.EINVAL, "bad have")
    out = []
    for k in _HAVE_KEYS:
        x = v.get(k)
        if isinstance(x, bool) or not isinstance(x, int) or not -U63 <= x <= U63:
            raise oserror(errno.EINVAL, "bad have")
        out.append(x)
    return tuple(out)  # type: ignore


_MODE = _uint(0o7777)
_SIZE = _uint(U63)
_FH = _uint(U63)
_FLAGS = _uint(0x7FFFFFFF)

# call -> ((arg, check), ...)
CALLS = {
    "getattr": (("path", _path),),
    "readdir": (("path", _path),),
    "readlink": (("path", _path),),
    "mkdir": (("path", _path), ("mode", _MODE)),
    "rmdir": (("path", _path),),
    "unlink": (("path", _path),),
    "rename": (("old", _path), ("new", _path)),
    "symlink": (("target", _target), ("path", _path)),
    "chmod": (("path", _path), ("mode", _MODE)),
    "truncate": (("path", _path), ("length", _SIZE)),
    "utimens": (("path", _path), ("times", _times)),
    "statfs": (),
    "getxattr": (("path", _path), ("name", _xname)),
    "setxattr": (("path", _path), ("name", _xname), ("value", _data(MAX_XATTR_VALUE))),
    "listxattr": (("path", _path),),
    "removexattr": (("path", _path), ("name", _xname)),
    "read_file": (("path", _path), ("have", _have)),
    "read_peer": (("node", _node_name), ("path", _path), ("have", _have)),
    "read": (("path", _path), ("offset", _SIZE), ("size", _uint(MAX_IO))),
    "version": (("path", _path),),
    "open_write": (("path", _path), ("flags", _FLAGS), ("mode", _MODE), ("create", _bool)),
    "write": (("fh", _FH), ("offset", _SIZE), ("data", _data(MAX_IO))),
    "pread": (("fh", _FH), ("offset", _SIZE), ("size", _uint(MAX_IO))),
    "ftruncate": (("fh", _FH), ("length", _SIZE)),
    "fsync": (("fh", _FH),),
    "close_write": (("fh", _FH),),
    "cancel": (("req", _uint(U63)),),
}

MUTATING = frozenset(("mkdir", "rmdir", "unlink", "rename", "symlink", "chmod", "truncate",
                      "utimens", "setxattr", "removexattr", "open_write", "write",
                      "ftruncate", "fsync", "close_write"))
# Safe to send again on a new connection when the old one died after sending.
IDEMPOTENT = frozenset(("getattr", "readdir", "readlink", "statfs", "getxattr", "listxattr",
                        "read_file", "read_peer", "read", "version", "chmod", "utimens",
                        "truncate", "setxattr"))


def check_args(call: Any, args: Any) -> Dict[str, Any]:
    """Validated arguments of a call, or OSError (ENOSYS, EINVAL, EACCES...)."""
    spec = CALLS.get(call) if isinstance(call, str) else None
    if spec is None:
        raise oserror(errno.ENOSYS, "unknown call")
    if not isinstance(args, dict):
        raise oserror(errno.EINVAL, "arguments are not a dict")
    out = {}
    for name, check in spec:
        if name not in args and check is not _have and check is not _times:
            raise oserror(errno.EINVAL, "missing argument %s" % name)
        out[name] = check(args.get(name))
    return out


# --- frames -------------------------------------------------------------------

def call_frame(req: int, call: str, args: Dict[str, Any]) -> bytes:
    return wire.encode_frame(SERVER_ADDR, CLIENT_ADDR,
                             {"op": "fs_call", "req": req, "call": call, "args": args})


def reply_frame(req: int, err: int, result: Any) -> bytes:
    return wire.encode_frame(CLIENT_ADDR, SERVER_ADDR,
                             {"op": "fs_reply", "req": req, "errno": err, "result": result})


def data_frame(req: int, data: bytes, eof: bool, **extra: Any) -> bytes:
    msg = {"op": "fs_data", "req": req, "data": data, "eof": eof}
    msg.update(extra)
    return wire.encode_frame(CLIENT_ADDR, SERVER_ADDR, msg)


# The channel's own messages, checked like the core's (wire.validate with this
# schema): calls, one reply each, streamed data for whole-file reads and listings.
_REQ = schema.Int(0, U63)
SCHEMA = {
    "fs_call": schema.Rec({"req": _REQ, "call": schema.Str(4096), "args": schema.MapOf(schema.Any())},
                          open=True),
    "fs_reply": schema.Rec({"req": _REQ, "errno": schema.Int(-(1 << 31), 1 << 31),
                            "result": schema.Any()}, open=True),
    "fs_data": schema.Rec({"req": _REQ, "data": schema.Bytes(wire.MAX_FRAME), "eof": schema.Bool()},
                          open=True),
}
_HEAD_MAX = 2 + 2 * wire.MAX_ADDR       # the longest address part of a frame


def decode(body: Any, ops: Tuple[str, ...]) -> Dict[str, Any]:
    """A validated message of one of `ops` from a frame body (bytes or memoryview,
    no length prefix); wire.FrameError for anything else. Addresses are checked
    by wire.split_frame, then ignored: a data channel has two ends."""
    mv = memoryview(body)
    head = bytes(mv[:_HEAD_MAX])        # the addresses only: the data is not copied
    _dst, _src, rest = wire.split_frame(head)
    msg = wire.decode_message(mv[len(head) - len(rest):], SCHEMA)  # type: ignore[arg-type]  # a memoryview: no copy of the data
    if msg["op"] not in ops:
        raise wire.FrameError("unexpected op %s" % msg["op"])
    if not 0 <= msg["req"] <= U63:
        raise wire.FrameError("request id out of range")
    return msg
