"""A minimal single-threaded event loop over file descriptors, with timers.

Agents run one of these: every link, job pipe and listener is a non-blocking fd,
so forwarding never blocks reading from the other links (execnet's relay writes
from its receive callback and can stall the whole receiver; we queue instead).
Threads (TLS relays, paramiko) talk to the loop only through fds and `call_soon`.

Child exit is an event too (`watch_child`): a pidfd where the kernel and Python
have one (Linux 5.3, Python 3.9), else SIGCHLD written into the loop's wake-up
pipe by `signal.set_wakeup_fd` (the signal is delivered to the main thread, but
the byte wakes the loop in whatever thread runs it). Only when neither is
possible (no pidfd, and the loop was made outside the main thread) does a watched
child fall back to a 50 ms poll.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

import heapq
import itertools
import os
import select

try:  # the C module itself: `signal` loads enum and functools, 2.5 ms of every agent's start
    import _signal as signal
except ImportError:  # an interpreter without it
    import signal  # type: ignore[no-redef]
import time
from _thread import allocate_lock  # `threading` costs an agent 4 ms at start

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Callable, Dict, List, Optional, Tuple
    Callback = Callable[[], None]


_READ, _WRITE = 1, 4     # POLLIN, POLLOUT (EPOLLIN, EPOLLOUT)


# epoll itself (else poll): selectors' layers cost a node more than the rest of
# an exec's bookkeeping, paid by every node of a `gxpc e` (issue 27).
class _Poller:

    def __init__(self) -> None:
        self.registered: Dict[int, int] = {}
        self.epoll = select.epoll() if hasattr(select, "epoll") else None
        self.poll = self.epoll or select.poll()

    def set(self, fd: int, events: int) -> None:
        old = self.registered.pop(fd, 0)
        if events:
            self.registered[fd] = events
        if events == old:
            return
        poll = self.poll
        if not events:
            _quietly(poll.unregister, fd)
        elif not _quietly(poll.modify if old else poll.register, fd, events):
            # the number was closed and opened again unseen
            _quietly(poll.register if old else poll.modify, fd, events)

    def wait(self, timeout: Optional[float]) -> List[Tuple[int, int]]:
        if self.epoll is not None:
            return self.epoll.poll(-1 if timeout is None else timeout)
        return self.poll.poll(None if timeout is None else int(timeout * 1000 + 0.999))

    def close(self) -> None:
        if self.epoll is not None:
            self.epoll.close()


class EventLoop:
    def __init__(self) -> None:
        self._sel = _Poller()
        self._readers: Dict[int, Callback] = {}
        self._writers: Dict[int, Callback] = {}
        self._timers: List[Tuple[float, int, Callback]] = []
        self._seq = itertools.count()
        self._cancelled: set = set()
        self._stopped = False
        self._pending: List[Callback] = []
        self._at_end: List[Callback] = []      # run once this round's events are handled
        self._pending_lock = allocate_lock()
        # A self-pipe so other threads can wake the loop for call_soon.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.add_reader(self._wake_r, self._drain_wake)
        self._children: Dict[int, Callback] = {}     # pid -> cb, for every watched child
        self._pidfds: Dict[int, int] = {}            # pid -> its pidfd
        self._sigchld = False                         # SIGCHLD wakes us (fallback)
        self._child_poll: Optional[int] = None        # last-resort poll timer

    # -- fds -------------------------------------------------------------
    def _update(self, fd: int) -> None:
        self._sel.set(fd, (_READ if fd in self._readers else 0) | (_WRITE if fd in self._writers else 0))

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

    # cb() once the events of this round are handled, before the loop waits
    # again (from the loop's thread). Links write here: every frame a round
    # produces for one neighbour leaves in one system call, and the neighbour
    # wakes once for them, not once a frame.
    def at_end(self, cb: Callback) -> None:
        self._at_end.append(cb)

    def _run_at_end(self) -> None:
        while self._at_end:
            todo, self._at_end = self._at_end, []
            for cb in todo:
                cb()

    def call_soon_threadsafe(self, cb: Callback) -> None:
        with self._pending_lock:
            self._pending.append(cb)
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _drain_wake(self) -> None:
        got = b""
        try:
            while True:
                chunk = os.read(self._wake_r, 4096)
                if not chunk:
                    break
                got += chunk
        except (BlockingIOError, OSError):
            pass
        if self._sigchld and bytes((signal.SIGCHLD,)) in got:
            self._check_children()

    # -- child processes -----------------------------------------------------
    def watch_child(self, pid: int, cb: Callback, how: str = "auto") -> None:
        """Call cb() when child `pid` may have exited (it checks, e.g. Popen.poll(),
        and calls unwatch_child once it has). `how` forces "sigchld" or "poll" (tests)."""
        self._children[pid] = cb
        if how == "auto" and hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(pid)
            except OSError:      # ENOSYS on old kernels, EPERM in some sandboxes
                pass
            else:
                self._pidfds[pid] = fd
                self.add_reader(fd, cb)
                return
        if how in ("auto", "sigchld") and self._install_sigchld():
            # The child may have exited before the handler was there.
            self.call_later(0, lambda: self._children.get(pid, _noop)())
            return
        if self._child_poll is None:
            self._child_poll = self.call_later(0.05, self._poll_children)

    def unwatch_child(self, pid: int) -> None:
        self._children.pop(pid, None)
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            self.forget(fd)
            os.close(fd)

    def _install_sigchld(self) -> bool:
        if self._sigchld:
            return True
        try:
            # A Python handler must exist for the C handler to write the byte;
            # it does nothing itself. Jobs get SIGCHLD back to default at exec.
            signal.signal(signal.SIGCHLD, lambda *a: None)
            old = signal.set_wakeup_fd(self._wake_w)
        except ValueError:       # not the main thread: cannot handle signals here
            return False
        if old not in (-1, self._wake_w):
            signal.set_wakeup_fd(old)    # someone else's: leave it, poll instead
            return False
        self._sigchld = True
        return True

    def _check_children(self) -> None:
        for pid, cb in list(self._children.items()):
            if pid not in self._pidfds and pid in self._children:
                cb()

    def _poll_children(self) -> None:
        self._child_poll = None
        self._check_children()
        if any(pid not in self._pidfds for pid in self._children) and not self._sigchld:
            self._child_poll = self.call_later(0.05, self._poll_children)

    # -- running ---------------------------------------------------------
    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        while not self._stopped:
            self.run_once(None)

    # max_wait None: until an event or a timer (an idle loop never ticks)
    def run_once(self, max_wait: Optional[float] = None) -> None:
        self._run_at_end()      # what was queued outside a round (before run())
        timeout = max_wait
        now = time.monotonic()
        while self._timers and self._timers[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._timers)[1])
        if self._timers:
            due = max(0.0, self._timers[0][0] - now)
            timeout = due if timeout is None else min(timeout, due)
        with self._pending_lock:
            if self._pending:
                timeout = 0.0
        for fd, events in self._sel.wait(timeout):
            if events & ~_WRITE and fd in self._readers:
                self._readers[fd]()
            if events & ~_READ and fd in self._writers:
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
        self._run_at_end()

    def close(self) -> None:
        for pid in list(self._children):
            self.unwatch_child(pid)
        if self._sigchld:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:
                pass
            self._sigchld = False
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._sel.close()


def _noop() -> None:
    pass


def _quietly(call: Callable[..., None], *args: int) -> bool:
    try:
        call(*args)
        return True
    except (ValueError, OSError):
        return False
