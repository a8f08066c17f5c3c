"""Work a GMount node does off its loop, in order, on one thread of its own.

The node's loop must never block (FUSE, the disk and the peers may), so work
that can goes to a thread. A thread per call cost a thread start and a storm
of GIL hand-offs per change (one create made about 150 futex calls in the
mount's process); one long-lived thread per kind of work keeps the order the
calls came in and costs a queue put.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import queue
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional


class SerialWork:
    """put(fn) runs fn after every fn put before it, on this queue's thread
    (started at the first put). A failing fn is logged and the next runs.
    close() lets the thread end after what was put; it never waits for it
    (a fn may be stuck on a peer that is gone)."""

    def __init__(self, name: str, log: Callable[[str], None]) -> None:
        self.name = name
        self.log = log
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.closed = False

    def put(self, fn: Callable[[], None]) -> None:
        with self.lock:
            if self.closed:
                return
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self.thread.start()
        self.queue.put(fn)

    def _run(self) -> None:
        while True:
            fn = self.queue.get()
            if fn is None:
                return
            try:
                fn()
            except Exception as e:
                self.log("%s: %s" % (self.name, e))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            started = self.thread is not None
        if started:
            self.queue.put(None)
