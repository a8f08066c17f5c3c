"""A minimal single-threaded event loop over file descriptors, with timers.

Agents run one of these: every link, job pipe and listener is a non-blocking fd,
so forwarding never blocks reading from the other links (execnet's relay writes
from its receive callback and can stall the whole receiver; we queue instead).
Threads (TLS relays, paramiko) talk to the loop only through fds and `call_soon`.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import heapq
import itertools
import os
import selectors
import time
from _thread import allocate_lock   # `threading` costs an agent 4 ms at start

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Callable, Dict, List, Optional, Tuple
    Callback = Callable[[], None]


class EventLoop:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._readers: Dict[int, Callback] = {}
        self._writers: Dict[int, Callback] = {}
        self._timers: List[Tuple[float, int, Callback]] = []
        self._seq = itertools.count()
        self._cancelled: set = set()
        self._stopped = False
        self._pending: List[Callback] = []
        self._pending_lock = allocate_lock()
        # A self-pipe so other threads can wake the loop for call_soon.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.add_reader(self._wake_r, self._drain_wake)

    # -- fds -------------------------------------------------------------
    def _update(self, fd: int) -> None:
        events = 0
        if fd in self._readers:
            events |= selectors.EVENT_READ
        if fd in self._writers:
            events |= selectors.EVENT_WRITE
        try:
            if events:
                try:
                    self._sel.modify(fd, events)
                except KeyError:
                    self._sel.register(fd, events)
            else:
                self._sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def add_reader(self, fd: int, cb: Callback) -> None:
        self._readers[fd] = cb
        self._update(fd)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._update(fd)

    def add_writer(self, fd: int, cb: Callback) -> None:
        self._writers[fd] = cb
        self._update(fd)

    def remove_writer(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None:
            self._update(fd)

    def forget(self, fd: int) -> None:
        self._readers.pop(fd, None)
        self._writers.pop(fd, None)
        self._update(fd)

    # -- timers ----------------------------------------------------------
    def call_later(self, delay: float, cb: Callback) -> int:
        handle = next(self._seq)
        heapq.heappush(self._timers, (time.monotonic() + delay, handle, cb))
        return handle

    def cancel(self, handle: Optional[int]) -> None:
        if handle is not None:
            self._cancelled.add(handle)

    def call_soon_threadsafe(self, cb: Callback) -> None:
        with self._pending_lock:
            self._pending.append(cb)
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # -- running ---------------------------------------------------------
    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        while not self._stopped:
            self.run_once()

    def run_once(self, max_wait: float = 1.0) -> None:
        timeout = max_wait
        now = time.monotonic()
        while self._timers and self._timers[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._timers)[1])
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - now))
        with self._pending_lock:
            if self._pending:
                timeout = 0.0
        for key, events in self._sel.select(timeout):
            fd = key.fd
            if events & selectors.EVENT_READ and fd in self._readers:
                self._readers[fd]()
            if events & selectors.EVENT_WRITE and fd in self._writers:
                self._writers[fd]()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, handle, cb = heapq.heappop(self._timers)
            if handle in self._cancelled:
                self._cancelled.discard(handle)
                continue
            cb()
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for cb in pending:
            cb()

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._sel.close()
