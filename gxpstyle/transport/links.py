"""A frame link to one neighbour over a pair of non-blocking fds.

Reading feeds a bounded FrameReader; writing drains a queue when the fd is
writable. A link that sends garbage or an oversized frame is closed with a
one-line reason; the loop and every other link go on.

Flow control. A link whose outgoing queue passes HIGH_WATER is `congested`
until it drains below LOW_WATER; whoever feeds it can wait for that
(`when_drained`) and stop reading its own sources meanwhile (`pause_reading`).
Which sources to stop is the node's choice (agent.py `route_up`): only traffic
going up is held hop by hop, because everything a node sends up shares the one
link anyway. Output to clients and stdin down to jobs are bounded end to end by
per-job credit windows (job_runner.py), so the head never stops reading its
children for a slow client, and a client that reads nothing stalls only its own
jobs, never another client's or the tree's control traffic.

A client (peer "c...") that does not read what we send it gets no more of its
own frames read past CLIENT_HIGH_WATER: that bounds replies to requests it
keeps sending without reading, and affects that client only.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import itertools
import os

try:  # the C type: `collections` loads keyword, operator and reprlib, 1.6 ms of an agent's start
    from _collections import deque
except ImportError:  # an interpreter without it
    from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Callable, List, Optional

    from gxpstyle.launch.child_bootstrap import ChildStart

from gxpstyle.protocol import wire
from gxpstyle.transport.event_loop import EventLoop

READ_SIZE = 256 << 10
HIGH_WATER = 4 << 20
LOW_WATER = 1 << 20
CLIENT_HIGH_WATER = 16 << 20
WRITEV_MAX = 512            # frames in one writev (Linux takes 1024)


class Link:
    """Frames in and out of one neighbour. `on_frame(link, frame)`, `on_close(link, why)`."""

    def __init__(self, loop: EventLoop, rfd: int, wfd: int, peer: str,
                 on_frame: Callable[[Link, bytes], None],
                 on_close: Callable[[Link, str], None]) -> None:
        self.loop = loop
        self.rfd = rfd
        self.wfd = wfd
        self.peer = peer          # the node id (or client id) at the other end
        self.on_frame = on_frame
        self.on_close = on_close
        self.reader = wire.FrameReader()
        self.outq: deque[memoryview] = deque()
        self.queued = 0
        self.closed = False
        # bytes read from and queued to the neighbour (`gxpc stat`'s WAN bytes)
        self.bytes_in = 0
        self.bytes_out = 0
        # The bootstrap bringing up the child at the other end, until it is ready.
        self.starting: Optional[ChildStart] = None
        self.congested = False
        self._flush_due = False     # a write is queued for the end of the loop's round
        self._drain_waiters: List[Callable[[], None]] = []
        self.reading = True
        self._held = False          # reading paused because our own queue is full
        self.holding = False        # the node holds its sources until we drain (agent.py)
        self._throttle_self = peer.startswith(wire.CLIENT_PREFIX)
        os.set_blocking(rfd, False)
        if wfd != rfd:
            os.set_blocking(wfd, False)
        loop.add_reader(rfd, self._readable)

    def feed_initial(self, data: bytes) -> None:
        """Bytes read before the link existed (after a bootstrap marker)."""
        if data:
            self._consume(data)

    # -- flow control ----------------------------------------------------------
    def pause_reading(self) -> None:
        if self.reading and not self.closed:
            self.reading = False
            self.loop.remove_reader(self.rfd)

    def resume_reading(self) -> None:
        if not self.reading and not self.closed and not self._held:
            self.reading = True
            self.loop.add_reader(self.rfd, self._readable)

    def when_drained(self, cb: Callable[[], None]) -> None:
        """cb() once the queue is below LOW_WATER (now if it is not congested), or closed."""
        if not self.congested or self.closed:
            cb()
        else:
            self._drain_waiters.append(cb)

    def _drained(self) -> None:
        self.congested = False
        if self._held:
            self._held = False
            self.resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for cb in waiters:
            cb()

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
        self.bytes_in += len(data)
        try:
            frames = self.reader.feed(data)
        except wire.FrameError as e:
            self.close("protocol error: %s" % e)
            return
        for frame in frames:
            if self.closed:
                return
            self.on_frame(self, frame)

    # Queue an encoded frame (with its length prefix). It is written at the
    # end of the loop's round, with whatever else the round queued.
    def send_frame(self, frame: bytes) -> None:
        if self.closed:
            return
        was_empty = not self.outq
        self.outq.append(memoryview(frame))
        self.queued += len(frame)
        self.bytes_out += len(frame)
        if was_empty and not self._flush_due:
            self._flush_due = True
            self.loop.at_end(self._flush)
        if self.queued > HIGH_WATER and not self.closed:
            self.congested = True
            if self._throttle_self and self.queued > CLIENT_HIGH_WATER and not self._held:
                self.pause_reading()
                self._held = True

    def _flush(self) -> None:
        self._flush_due = False
        if self.outq and not self.closed:
            self._writable()
            if self.outq and not self.closed:
                self.loop.add_writer(self.wfd, self._writable)

    def send(self, dst: str, src: str, msg: dict) -> None:
        self.send_frame(wire.encode_frame(dst, src, msg))

    # Write what is queued now, not at the end of the round.
    def push(self) -> None:
        self._flush()

    def _writable(self) -> None:
        outq = self.outq
        while outq:
            try:
                if len(outq) == 1:
                    n = os.write(self.wfd, outq[0])
                else:
                    n = os.writev(self.wfd, list(itertools.islice(outq, 0, WRITEV_MAX)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.close("write error: %s" % e.strerror)
                return
            self.queued -= n
            full = False
            while n:
                buf = outq[0]
                if n >= len(buf):
                    n -= len(buf)
                    outq.popleft()
                else:
                    outq[0] = buf[n:]
                    n, full = 0, True
            if full:
                break       # a short write: the pipe or socket is full
        if self.congested and self.queued <= LOW_WATER:
            self._drained()
        if not outq and not self.closed:
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
        self._close_fds()
        self.outq.clear()
        self.queued = 0
        self.on_close(self, why)
        if self.congested:
            self._drained()     # whoever waits on us must not wait forever

    def _close_fds(self) -> None:
        for fd in {self.rfd, self.wfd}:
            try:
                os.close(fd)
            except OSError:
                pass


def frame_with_prefix(frame_body: bytes) -> bytes:
    """Re-add the length prefix to a frame body taken off a FrameReader."""
    return len(frame_body).to_bytes(4, "big") + frame_body
