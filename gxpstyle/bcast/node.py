"""Broadcast on a node: a source's file read and hashed, a receiver's chunks
checked, written and renamed, and both fed on to the children the head names.

The head (bcast/service.py) decides who feeds whom; a node keeps a store and
feeds from it. A source's store is its file; a receiver's is a temporary file
beside DEST (a relay's: in the session directory) that becomes DEST, by one
rename, once every chunk is in and the SHA-256 of the chunks' SHA-256s is the
source's (each chunk checked on arrival; the file is hashed once, not twice).
Each child is fed from the store at its own pace with at most WINDOW chunks
unacknowledged: a slow child holds up only itself, and no process holds more
than WINDOW chunks per child. Chunks come in order, each with the source's
SHA-256 of it, checked before it is written; a bad one is reported to the head,
which has it fetched again from another holder.

Pushed by the head to a node at its first transfer (bootstrap.SIDE_MODULES);
standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import time

from gxpstyle.api.node_side import Message, NodeSide, checked, message
from gxpstyle.protocol import wire
from gxpstyle.protocol.schema import Bool, Bytes, Int, ListOf, Rec, Str

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    from gxpstyle.api.node_side import NodeHost

SVC = "bcast"
_BC = Int(0, (1 << 63) - 1)
_N = Int(0, 1 << 40)
_CHUNK = Int(1 << 12, 1 << 21)
_ID = Str(wire.MAX_ADDR, empty=False)
# What this node side takes (bcast/service.py declares what nodes answer).
# From the head: open (a source hashes its file), plan (a receiver's size,
# mode, hashes and DEST; chunks_sha256: the SHA-256 of the chunks' SHA-256s,
# which a receiver checks instead of hashing the file again; listen: open a
# direct-link listener and answer `listening`), feed (whom to feed, from
# which chunk; with a port, over a direct link), drop, stop. From a feeder or
# a child: chunk, ack.
TYPES = {
    "open": Rec({"bc": _BC, "path": Str(4096, empty=False), "chunk": _CHUNK}, open=True),
    "plan": Rec({"bc": _BC, "size": Int(0, 1 << 62), "mode": Int(0, 0o7777), "sha256": Str(64),
                 "chunk": _CHUNK, "dest": Str(4096), "name": Str(4096)},
                {"chunks_sha256": Str(64), "listen": Bool()}, open=True),
    "feed": Rec({"bc": _BC, "child": _ID, "start": _N},
                {"corrupt": Int(-1, 1 << 40), "port": Int(0, 65535), "addrs": ListOf(Str(64), 16)},
                open=True),
    "drop": Rec({"bc": _BC, "child": _ID}, open=True),
    "stop": Rec({"bc": _BC}, open=True),
    "chunk": Rec({"bc": _BC, "index": _N, "data": Bytes(wire.MAX_FRAME), "sha256": Bytes(32)},
                 open=True),
    "ack": Rec({"bc": _BC, "index": _N}, open=True),
}
PEER_TYPES = ("chunk", "ack")     # from other nodes; the rest only from the head

WINDOW = 8
KEEP = 2 * WINDOW           # chunks kept in memory to feed several children from one read
REPORT_EVERY = 0.25


def os_reason(e: OSError, where: str = "") -> str:
    """`/scratch: No space left on device (ENOSPC)`."""
    code = errno.errorcode.get(e.errno or 0)
    text = e.strerror or str(e)
    where = where or e.filename or ""
    return ("%s: " % where if where else "") + text + (" (%s)" % code if code else "")


def dest_problem(dest: str) -> str:
    """`DEST: not a regular file` when the rename would replace anything but a
    regular file (a device such as /dev/null, a FIFO, a socket), else ""."""
    try:
        st = os.stat(dest)
    except OSError:
        return ""           # missing (or unreachable: the open of the temporary says why)
    return "" if stat.S_ISREG(st.st_mode) else "%s: not a regular file" % dest


def pread_full(fd: int, n: int, off: int) -> bytes:
    parts = []
    while n > 0:
        data = os.pread(fd, n, off)
        if not data:
            break
        parts.append(data)
        n -= len(data)
        off += len(data)
    return b"".join(parts)


class Transfer:
    """One broadcast on this node: a source, a receiver, or both."""

    def __init__(self, host: NodeHost, bc: int, owner: BcastSide) -> None:
        self.host = host
        self.owner = owner          # the node side that holds the direct links
        self.bc = bc
        self.chunk = 1
        self.size = 0
        self.n = 0
        self.src_fd: Optional[int] = None
        self.src_path = ""
        self.src_hashes: List[bytes] = []
        self.fd: Optional[int] = None
        self.tmp = ""
        self.dest = ""
        self.where = ""
        self.have = 0
        self.hashes: List[bytes] = []
        self.hasher = hashlib.sha256()
        self.sha = ""
        self.chunks_sha = ""
        self.mode = 0o644
        self.done = False
        self.error = ""
        self.closed = False
        # child -> [next, unacked, chunk to corrupt, direct link or None, fed directly]
        self.feeds: Dict[str, List[Any]] = {}
        self.reported = 0.0
        self.bad_from: Any = set()
        self.self_pending = False
        self.recent: Dict[int, bytes] = {}      # chunk -> data, for feeding several children

    def chunk_len(self, i: int) -> int:
        return min(self.chunk, self.size - i * self.chunk)

    # -- a source ----------------------------------------------------------------
    def bc_open(self, msg: Dict[str, Any]) -> None:
        """Open and hash the source in a thread (a big file must not stop the loop)."""
        path, chunk = msg["path"], msg["chunk"]

        def work() -> None:
            fd = None
            res: Any = None
            try:
                fd = os.open(path, os.O_RDONLY)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", path)
                whole, hashes, size = hashlib.sha256(), [], 0
                while True:
                    data = pread_full(fd, chunk, size)
                    if not data:
                        break
                    whole.update(data)
                    hashes.append(hashlib.sha256(data).digest())
                    size += len(data)
                mode = os.fstat(fd).st_mode & 0o7777
                res = (fd, size, mode, whole.hexdigest(), hashes, "",
                       hashlib.sha256(b"".join(hashes)).hexdigest())
            except OSError as e:
                if fd is not None:
                    os.close(fd)
                res = (None, 0, 0, "", [], os_reason(e, path), "")
            self.host.call_soon_threadsafe(lambda: self.opened(path, chunk, *res))
        self.owner.spawn(work)

    def opened(self, path: str, chunk: int, fd: Optional[int], size: int, mode: int, sha: str,
               hashes: List[bytes], error: str, chunks_sha: str) -> None:
        if self.closed:
            if fd is not None:
                os.close(fd)
            return
        if fd is not None:
            self.src_fd, self.src_path, self.src_hashes = fd, path, hashes
            self.chunk, self.size, self.n = chunk, size, len(hashes)
        self.host.send(wire.HEAD, "opened", {"bc": self.bc, "ok": fd is not None, "error": error,
                                       "size": size, "mode": mode, "sha256": sha,
                                       "chunks_sha256": chunks_sha})

    # -- a receiver --------------------------------------------------------------
    def bc_plan(self, msg: Dict[str, Any]) -> None:
        self.size, self.mode, self.sha, self.chunk = msg["size"], msg["mode"], msg["sha256"], msg["chunk"]
        self.chunks_sha = msg.get("chunks_sha256") or ""
        self.n = -(-self.size // self.chunk)
        dest = msg["dest"]
        try:
            if dest and (dest.endswith("/") or os.path.isdir(dest)):
                dest = os.path.join(dest, msg["name"])
            if dest and self.src_fd is not None and os.path.exists(dest) \
                    and os.path.samefile(dest, self.src_path):
                self.have, self.done = self.n, True      # the source itself
                self.report(force=True)
                return
            if dest:
                refused = dest_problem(dest)
                if refused:     # /dev/null, a FIFO, a socket: never replaced
                    self.fail(refused)
                    return
                d, base = os.path.split(dest)
                self.where = d or "/"
                self.tmp = os.path.join(d, ".%s.gxp-bcast-%d-%d" % (base, os.getpid(), self.bc))
            else:          # a relay: a store for its children only
                self.where = self.host.session_dir()
                self.tmp = os.path.join(self.where, "bcast-%d" % self.bc)
            self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            if self.size:
                # Claims the space now: a full disk fails here, by name, at once.
                try:
                    os.posix_fallocate(self.fd, 0, self.size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                        raise
        except OSError as e:
            self.fail(os_reason(e, self.where if e.filename in (None, self.tmp) else ""))
            return
        self.dest = dest
        if msg.get("listen"):
            self.listen()
        if self.n == 0:
            self.finish()

    def listen(self) -> None:
        """Open this node's direct-link listener and tell the head where it is:
        a sibling will feed us over it (a failure here: our parent feeds us)."""
        port, error = 0, ""
        addrs: List[str] = []
        try:
            port, addrs = self.owner.direct_links().listen()
        except OSError as e:
            error = os_reason(e, "listener")
        self.host.send(wire.HEAD, "listening", {"bc": self.bc, "port": port, "addrs": addrs[:16],
                                          "error": error})

    def bc_chunk(self, src: str, msg: Dict[str, Any], via: Any = None) -> None:
        i = msg["index"]
        ack = {"bc": self.bc, "index": i}
        if via is not None:         # acked on the direct link it came on
            via.send(src, self.host.id, message(SVC, "ack", ack))
        else:
            self.host.send(src, "ack", ack)
        if self.fd is None or self.done or i != self.have:
            return
        data = msg["data"]
        if len(data) != self.chunk_len(i) or hashlib.sha256(data).digest() != msg["sha256"]:
            if src not in self.bad_from:
                self.bad_from.add(src)
                self.report(bad=src)
            return
        try:
            off, view = i * self.chunk, memoryview(data)
            while view:
                k = os.pwrite(self.fd, view, off)
                view, off = view[k:], off + k
        except OSError as e:
            self.fail(os_reason(e, self.where))
            return
        self.have += 1
        if not self.chunks_sha:         # a head that sends no hash of the hashes
            self.hasher.update(data)
        self.hashes.append(msg["sha256"])
        if len(self.feeds) > 1:         # its children read it from here, not the file
            self.keep(i, data)
        if self.have == self.n:
            self.finish()
        else:
            self.report()
        for child in list(self.feeds):
            self.pump(child)

    def finish(self) -> None:
        # Every chunk matched the SHA-256 sent with it; these, in order, must
        # be the source's (hashing the hashes, not the file a second time).
        if self.chunks_sha:
            good = hashlib.sha256(b"".join(self.hashes)).hexdigest() == self.chunks_sha
        else:
            good = self.hasher.hexdigest() == self.sha
        if not good:
            self.fail("the copy's SHA-256 differs from the source's")
            return
        if self.dest:
            try:
                os.fchmod(self.fd, self.mode)   # type: ignore[arg-type]
                refused = dest_problem(self.dest)   # one made while we received
                if refused:
                    self.fail(refused)
                    return
                os.rename(self.tmp, self.dest)
            except OSError as e:
                self.fail(os_reason(e))
                return
            self.tmp = ""
        self.done = True
        self.report(force=True)

    def fail(self, reason: str) -> None:
        """This node's copy failed; a source still feeds from its own file."""
        self.error = reason
        if self.src_fd is None:
            self.feeds.clear()
        self.close_files(keep_source=True)
        self.report(force=True)

    def report(self, bad: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not (force or bad) and now - self.reported < REPORT_EVERY:
            return
        self.reported = now
        self.host.send(wire.HEAD, "state", {"bc": self.bc, "have": self.have, "done": self.done,
                                      "error": self.error, "bad": bad})

    # -- feeding children ----------------------------------------------------------
    def bc_feed(self, msg: Dict[str, Any]) -> None:
        child = msg["child"]
        port = msg.get("port", 0)
        f = self.feeds[child] = [msg["start"], 0, msg.get("corrupt", -1), None, bool(port)]
        if not port:
            self.pump(child)
            return

        def up(link: Any, why: str) -> None:
            if self.feeds.get(child) is not f:
                return                      # dropped or replaced meanwhile
            if link is None:
                self.direct_lost(child, why)
                return
            f[3] = link
            self.pump(child)
        self.owner.direct_links().connect(child, msg.get("addrs") or [], port, up)

    def direct_lost(self, child: str, why: str) -> None:
        """The direct link to `child` failed or closed: stop feeding it that
        way and tell the head, which feeds it from another holder."""
        f = self.feeds.get(child)
        if f is None or not f[4]:
            return
        del self.feeds[child]
        self.host.send(wire.HEAD, "nolink", {"bc": self.bc, "child": child, "error": why[:1000]})

    def bc_drop(self, msg: Dict[str, Any]) -> None:
        self.feeds.pop(msg["child"], None)

    def bc_ack(self, src: str, msg: Dict[str, Any], via: Any = None) -> None:
        f = self.feeds.get(src)
        if f is not None:
            f[1] = max(0, f[1] - 1)
            self.pump(src)

    def keep(self, i: int, data: bytes) -> None:
        """Children fed at about the same pace ask for the same chunks: the
        last few are kept, so N children cost one read (at most KEEP chunks)."""
        self.recent[i] = data
        while len(self.recent) > KEEP:
            del self.recent[min(self.recent)]

    def pump(self, child: str, now: bool = False) -> None:
        f = self.feeds.get(child)
        if f is None or self.closed:
            return
        link = f[3]
        if f[4] and (link is None or link.closed):
            return                          # its direct link is not up yet
        if child == self.host.id and not now:
            # A source that is a target feeds itself; messages to ourselves are
            # delivered at once, so a window sent from here would recurse.
            if not self.self_pending:
                self.self_pending = True
                self.host.call_later(0, self.pump_self)
            return
        if self.src_fd is not None:
            fd, hashes, limit = self.src_fd, self.src_hashes, self.n
        elif self.fd is not None:
            fd, hashes, limit = self.fd, self.hashes, self.have
        else:
            return
        while f[1] < WINDOW and f[0] < limit:
            i = f[0]
            try:
                data = self.recent.get(i)
                if data is None:
                    data = pread_full(fd, self.chunk_len(i), i * self.chunk)
                    if len(self.feeds) > 1:
                        self.keep(i, data)
            except OSError as e:
                self.host.log("bcast %d: feeding %s stopped: %s" % (self.bc, child, os_reason(e)))
                self.feeds.pop(child, None)
                return
            if f[2] == i and data:      # the head's test-only fault: one flipped byte
                f[2] = -1
                data = bytes((data[0] ^ 0xFF,)) + data[1:]
            f[0] += 1
            f[1] += 1
            out = {"bc": self.bc, "index": i, "data": data, "sha256": hashes[i]}
            if link is not None:
                link.send(child, self.host.id, message(SVC, "chunk", out))
            else:
                self.host.send(child, "chunk", out)

    def pump_self(self) -> None:
        self.self_pending = False
        self.pump(self.host.id, now=True)

    # -- the end -------------------------------------------------------------------
    def close_files(self, keep_source: bool = False) -> None:
        for fd in (self.fd, None if keep_source else self.src_fd):
            if fd is not None:
                os.close(fd)
        self.fd = None
        if not keep_source:
            self.src_fd = None
        if self.tmp:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = ""

    def close(self) -> None:
        self.closed = True
        self.feeds.clear()
        self.close_files()


class BcastSide(NodeSide):
    """This node's broadcasts, by the head's id: bcast's node side."""

    def __init__(self) -> None:
        super().__init__()
        self.transfers: Dict[int, Transfer] = {}
        self.direct: Any = None     # bcast_link.DirectLinks, while a transfer needs it

    def messages(self) -> Dict[str, Message]:
        return {t: Message(rec, getattr(self, "on_" + t), peers=t in PEER_TYPES)
                for t, rec in TYPES.items()}

    def on_open(self, src: str, body: Dict[str, Any]) -> None:
        self.planned(body, "bc_open")

    def on_plan(self, src: str, body: Dict[str, Any]) -> None:
        self.planned(body, "bc_plan")

    def on_feed(self, src: str, body: Dict[str, Any]) -> None:
        self.planned(body, "bc_feed")

    def on_drop(self, src: str, body: Dict[str, Any]) -> None:
        self.planned(body, "bc_drop")

    def on_chunk(self, src: str, body: Dict[str, Any], via: Any = None) -> None:
        self.peer(src, body, "bc_chunk", via)

    def on_ack(self, src: str, body: Dict[str, Any], via: Any = None) -> None:
        self.peer(src, body, "bc_ack", via)

    def direct_links(self) -> Any:
        if self.direct is None:
            from gxpstyle.bcast import direct_links as bcast_link
            assert self.host is not None
            self.direct = bcast_link.DirectLinks(self.host, self.on_direct, self.direct_lost)
        return self.direct

    def direct_lost(self, peer: str, why: str) -> None:
        for t in list(self.transfers.values()):
            t.direct_lost(peer, why)

    def on_direct(self, src: str, msg: Dict[str, Any], via: Any) -> None:
        """A chunk or an ack on a direct link (bcast/direct_links.py let only those through)."""
        try:
            _, body = checked(SVC, self.table or self.messages(), msg)
        except ValueError as e:
            via.close("bad message: %s" % e)
            return
        getattr(self, "on_" + msg["type"])(src, body, via)

    def peer(self, src: str, body: Dict[str, Any], op: str, via: Any = None) -> None:
        t = self.transfers.get(body["bc"])
        if t is not None and not src.startswith(wire.CLIENT_PREFIX):
            try:
                getattr(t, op)(src, body, via)
            except Exception as e:
                t.fail("internal error in %s: %s" % (op, e))

    def planned(self, body: Dict[str, Any], op: str) -> None:
        bc = body["bc"]
        t = self.transfers.get(bc)
        if t is None:
            assert self.host is not None
            t = self.transfers[bc] = Transfer(self.host, bc, self)
        try:
            getattr(t, op)(body)
        except Exception as e:      # a bug fails this node's share, by name, not the agent
            t.fail("internal error in %s: %s" % (op, e))

    def on_stop(self, src: str, body: Dict[str, Any]) -> None:
        t = self.transfers.pop(body["bc"], None)
        if t is not None:
            t.close()
        if not self.transfers and self.direct is not None:
            self.direct.close()     # no listener or link outlives the transfers
            self.direct = None

    seconds = 0.2       # a source's hash thread cannot be interrupted: it ends with the process

    def stop(self) -> None:
        """The node quits: no temporary file outlives it."""
        for t in self.transfers.values():
            t.close()
        self.transfers.clear()
        if self.direct is not None:
            self.direct.close()
            self.direct = None
        super().stop()
