"""Child exit is an event of the event loop, by each of its mechanisms: pidfd,
SIGCHLD through the wake-up fd (the fallback on Python 3.8 and old kernels),
and, outside the main thread without pidfd, a poll."""
from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from gxpstyle.transport.event_loop import EventLoop


def _exit_seen(loop: EventLoop, how: str, delay: float) -> float:
    """Seconds from the child's exit to our callback."""
    proc = subprocess.Popen(["sleep", str(delay)])
    seen = []

    def cb() -> None:
        if proc.poll() is not None:
            loop.unwatch_child(proc.pid)
            seen.append(time.monotonic())
            loop.stop()

    loop.watch_child(proc.pid, cb, how=how)
    started = time.monotonic()
    deadline = started + delay + 5
    while not seen and time.monotonic() < deadline:
        loop.run_once(max_wait=10.0)    # a timer would have to wake us: none is set
    assert seen, "the child's exit was never seen"
    return seen[0] - started - delay


@pytest.mark.parametrize("how", ["auto", "sigchld"])
def test_child_exit_wakes_the_loop_at_once(how):
    if how == "auto" and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this Python")
    loop = EventLoop()
    try:
        late = _exit_seen(loop, how, 0.3)
        # An event, not a tick: seen within a scheduling delay of the exit
        # (run_once would otherwise sleep for its full 10 s).
        assert late < 1.0
        if how == "auto":
            assert not loop._sigchld and loop._pidfds == {}
        else:
            assert loop._sigchld
    finally:
        loop.close()


def test_exit_before_the_watch_is_still_seen():
    loop = EventLoop()
    try:
        proc = subprocess.Popen(["true"])
        time.sleep(0.2)
        seen = []

        def cb() -> None:
            if proc.poll() is not None:
                loop.unwatch_child(proc.pid)
                seen.append(1)
        loop.watch_child(proc.pid, cb, how="sigchld")
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            loop.run_once(max_wait=1.0)
        assert seen
    finally:
        loop.close()


def test_loop_in_another_thread_without_pidfd_polls():
    loop = EventLoop()
    result = []

    def run() -> None:
        result.append(_exit_seen(loop, "sigchld", 0.2))    # no signals off the main thread
    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    try:
        assert result and result[0] < 1.0
        assert not loop._sigchld
    finally:
        loop.close()
