"""A frame link to one neighbour over a pair of non-blocking fds.

Reading feeds a bounded FrameReader; writing drains a queue when the fd is
writable. A link that sends garbage or an oversized frame is closed with a
one-line reason; the loop and every other link go on.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import collections
import os
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Callable, Optional
    from gxpstyle.child_bootstrap import ChildStart

from gxpstyle import wire
from gxpstyle.event_loop import EventLoop

READ_SIZE = 256 << 10


class Link:
    """Frames in and out of one neighbour. `on_frame(link, frame)`, `on_close(link, why)`."""

    def __init__(self, loop: EventLoop, rfd: int, wfd: int, peer: str,
                 on_frame: Callable[["Link", bytes], None],
                 on_close: Callable[["Link", str], None]) -> None:
        self.loop = loop
        self.rfd = rfd
        self.wfd = wfd
        self.peer = peer          # the node id (or client id) at the other end
        self.on_frame = on_frame
        self.on_close = on_close
        self.reader = wire.FrameReader()
        self.outq: "collections.deque[memoryview]" = collections.deque()
        self.queued = 0
        self.closed = False
        # The bootstrap bringing up the child at the other end, until it is ready.
        self.starting: "Optional[ChildStart]" = None
        os.set_blocking(rfd, False)
        if wfd != rfd:
            os.set_blocking(wfd, False)
        loop.add_reader(rfd, self._readable)

    def feed_initial(self, data: bytes) -> None:
        """Bytes read before the link existed (after a bootstrap marker)."""
        if data:
            self._consume(data)

    def _readable(self) -> None:
        try:
            data = os.read(self.rfd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close("read error: %s" % e.strerror)
            return
        if not data:
            self.close("link closed")
            return
        self._consume(data)

    def _consume(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except wire.FrameError as e:
            self.close("protocol error: %s" % e)
            return
        for frame in frames:
            if self.closed:
                return
            self.on_frame(self, frame)

    def send_frame(self, frame: bytes) -> None:
        """Queue an encoded frame (with its length prefix)."""
        if self.closed:
            return
        was_empty = not self.outq
        self.outq.append(memoryview(frame))
        self.queued += len(frame)
        if was_empty:
            self._writable()
            if self.outq and not self.closed:
                self.loop.add_writer(self.wfd, self._writable)

    def send(self, dst: str, src: str, msg: dict) -> None:
        self.send_frame(wire.encode_frame(dst, src, msg))

    def _writable(self) -> None:
        while self.outq:
            buf = self.outq[0]
            try:
                n = os.write(self.wfd, buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.close("write error: %s" % e.strerror)
                return
            self.queued -= n
            if n == len(buf):
                self.outq.popleft()
            else:
                self.outq[0] = buf[n:]
                return
        self.loop.remove_writer(self.wfd)

    def flush_blocking(self, timeout: float = 2.0) -> None:
        """Best effort: push out what is queued before the process exits."""
        import select
        import time
        deadline = time.monotonic() + timeout
        while self.outq and not self.closed and time.monotonic() < deadline:
            select.select([], [self.wfd], [], max(0.0, deadline - time.monotonic()))
            self._writable()

    def close(self, why: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.forget(self.rfd)
        self.loop.forget(self.wfd)
        for fd in {self.rfd, self.wfd}:
            try:
                os.close(fd)
            except OSError:
                pass
        self.outq.clear()
        self.queued = 0
        self.on_close(self, why)


def frame_with_prefix(frame_body: bytes) -> bytes:
    """Re-add the length prefix to a frame body taken off a FrameReader."""
    return len(frame_body).to_bytes(4, "big") + frame_body
