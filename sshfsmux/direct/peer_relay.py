"""A site proxy's serving side: the data channel's `read_peer` call.

    read_peer {node, path, have} -> what read_file on `node`'s export answers

A mount of a site reads a file another site holds through its site's proxy
(sshfsmux/gmount/site_cache.py says which proxy, and why). The proxy's export
answers as `node`'s own export would: the reply carries the holder's version of
the file (size, mtime_ns, ctime_ns, ino; "unchanged" when `have` is that
version) and, unless unchanged, the file follows as fs_data frames, the last
with the size sent, the holder's mtime_ns and ctime_ns and whether they had
settled there. The reader files the copy under the holder's name and version,
as if it had come from the holder.

The proxy reads the file through its own mount's branch to the holder
(`ExportServer.peer_source(node, path, have)`, which the GMount node sets): from its
replica store when the holder says it is unchanged, else one fetch over the
WAN that every reader of the site joins while it runs. That read waits on the
WAN, so each read_peer runs on a thread of its own, never on the connection's
I/O thread; its frames go out through the connection's queue, whose bound holds
the thread while the reader is slower (the reader's pace, not the proxy's
memory). `cancel` and a closed connection end the relay at its next frame.

Standard library only, Python 3.8 syntax (agents run this).
"""
from __future__ import annotations

import errno
import threading

from sshfsmux.direct import protocol as fs_protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

# what a call handler returns when its reply goes out later, from a thread
LATER = object()


class _Relay:
    """One read_peer: the file from the proxy's branch to the reader."""

    def __init__(self, session: Any, req: int) -> None:
        self.session = session
        self.req = req
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    close = cancel

    def send(self, frame: bytes) -> None:
        if self.cancelled:
            # the reader's fetch waits for its stream's end, as after any cancel
            self.session.conn.send_frame(fs_protocol.data_frame(self.req, b"", True,
                                                                errno=errno.ECANCELED))
            raise fs_protocol.ConnectionLost("cancelled")
        self.session.conn.send_frame(frame)      # waits while the queue is full

    def run(self, source: Any, node: str, path: str,
            have: Optional[Tuple[int, int, int, int]]) -> None:
        handle = None
        try:
            try:
                handle, meta, fetch = source(node, path, have)
            except OSError as e:
                self.send(fs_protocol.reply_frame(self.req, e.errno or errno.EIO, None))
                return
            unchanged = have is not None and tuple(have) == tuple(meta)
            self.send(fs_protocol.reply_frame(self.req, 0, {
                "unchanged": unchanged, "size": meta[0], "mtime_ns": meta[1],
                "ctime_ns": meta[2], "ino": meta[3]}))
            if not unchanged:
                self._stream(handle, meta, fetch)
        except fs_protocol.ConnectionLost:
            pass
        except Exception as e:      # a bug ends this relay with a trace, never the export
            self.session.server.log("fs export: read_peer failed: %s: %s"
                                    % (e.__class__.__name__, e))
        finally:
            if handle is not None:
                handle.close()
            self.session.relays.pop(self.req, None)
            self.session.server.give_open()

    def _stream(self, handle: Any, meta: Tuple[int, ...], fetch: Any) -> None:
        size, sent = meta[0], 0
        try:
            while sent < size:
                data = handle.read(min(fs_protocol.CHUNK, size - sent), sent)
                if not data:
                    raise OSError(errno.EIO, "the file ended early")
                self.send(fs_protocol.data_frame(self.req, data, False))
                sent += len(data)
            end: Dict[str, Any] = (fetch.wait_over(handle.timeout) if fetch is not None else
                                   {"mtime_ns": meta[1], "ctime_ns": meta[2], "settled": True})
        except OSError as e:
            self.send(fs_protocol.data_frame(self.req, b"", True, errno=e.errno or errno.EIO,
                                             size=sent))
            return
        self.send(fs_protocol.data_frame(
            self.req, b"", True, errno=0, size=sent, mtime_ns=end.get("mtime_ns"),
            ctime_ns=end.get("ctime_ns"), settled=end.get("settled") is True))


class PeerReads:
    """The read_peer call of an export's connection (a mixin of its _Session)."""

    relays: Dict[int, _Relay]
    streams: Dict[int, Any]

    def c_cancel(self, rid: int, req: int) -> None:
        """Stop stream `req`: a file or listing the export sends, or a relay."""
        stream = self.streams.pop(req, None) or self.relays.get(req)
        if stream is not None:
            stream.cancel()

    def c_read_peer(self, rid: int, node: str, path: str,
                    have: Optional[Tuple[int, int, int, int]]) -> Any:
        session: Any = self
        source = session.server.peer_source
        if source is None:
            raise fs_protocol.oserror(errno.ENOSYS, "not a site proxy")
        session._check_stream_room(rid)
        if rid in self.relays:
            raise fs_protocol.oserror(errno.EBUSY, "request id in use")
        session.server.take_open()
        relay = self.relays[rid] = _Relay(session, rid)
        threading.Thread(target=relay.run, args=(source, node, path, have), daemon=True,
                         name="read_peer").start()
        return LATER
