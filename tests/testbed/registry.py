"""Beds of this process, torn down at interpreter exit and on SIGTERM/SIGHUP."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:   # a bed holds its hosts; only annotations name it here
    from .bed import TestBed


_LIVE: set[TestBed] = set()


_LIVE_LOCK = threading.Lock()


_HOOKS_INSTALLED = False


def _teardown_live() -> None:
    with _LIVE_LOCK:
        beds = list(_LIVE)
    for bed in beds:
        try:
            bed.teardown()
        except Exception as e:   # pragma: no cover - best effort at exit
            print(f"testbed: teardown of {bed.dir} failed: {e}",
                  file=sys.stderr)


def _on_signal(signum, frame):
    _teardown_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(_teardown_live)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _on_signal)
            except (ValueError, OSError):
                pass
