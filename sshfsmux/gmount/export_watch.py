"""Changes made straight into this node's export, not through the mount (a
program writing into the export directory, a file copied there by hand):
inotify tells of them, and they go the way a change through the mount goes
(gmount/node.py's change feed: the head's catalog, then every node holding
that directory), so every mount shows them within the feed's bound, without
rescanning the export.

One watch per directory of the export (Linux's inotify, through ctypes),
added as directories appear; a file is reported when it is created, closed
after writing, has its attributes changed, is moved or removed. A queue
overflow (more changes than the kernel kept) is logged: those changes show
at the next change of the same names, or at the next mount.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List

IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x4, 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x100, 0x200, 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
WATCHED = IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_EVENT = struct.Struct("iIII")          # wd, mask, cookie, length of the name
BURST_HOLD = 0.02       # seconds between reads in a burst (the change feed's COALESCE)


class ExportWatch:
    """Reports "/rel" of every name changed under `root` to `on_change`
    (from a thread of its own, the names of one read of the kernel's queue
    in one call) until close()."""

    def __init__(self, root: str, on_change: Callable[[List[str]], None],
                 log: Callable[[str], None]) -> None:
        self.root = root
        self.on_change = on_change
        self.log = log
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, "inotify: %s" % os.strerror(e))
        self.stop_r, self.stop_w = os.pipe()
        self.dirs: Dict[int, str] = {}        # watch -> directory below root ("" the root)
        self.full_logged = False
        self._add_tree("", report=False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _add(self, rel: str) -> bool:
        path = os.path.join(self.root, rel) if rel else self.root
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path),
                                          WATCHED | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            if not self.full_logged:
                self.full_logged = True
                self.log("cannot watch %s for changes behind the mount: %s"
                         % (path, os.strerror(ctypes.get_errno())))
            return False
        self.dirs[wd] = rel
        return True

    def _add_tree(self, rel: str, report: bool) -> None:
        """Watch directory `rel` and every one below it; with `report`, tell
        of every name in them (a directory moved in comes with its contents)."""
        if not self._add(rel):
            return
        top = os.path.join(self.root, rel) if rel else self.root
        for d, dirs, files in os.walk(top):
            below = os.path.relpath(d, self.root)
            below = "" if below == "." else below
            for name in dirs:
                self._add(os.path.join(below, name))
            if report and dirs + files:
                self.on_change(["/" + os.path.join(below, name) for name in dirs + files])

    def _run(self) -> None:
        last = 0.0
        while True:
            try:
                ready, _, _ = select.select([self.fd, self.stop_r], [], [])
                # a burst (every file a tar writes through the mount comes
                # back as three or four events; each woke this thread, which
                # took the GIL from the FUSE threads): the first change after
                # a quiet spell goes at once, then a read at most every
                # BURST_HOLD, with all that gathered meanwhile
                wait = last + BURST_HOLD - time.monotonic()
                if wait > 0 and self.stop_r not in ready:
                    ready, _, _ = select.select([self.stop_r], [], [], wait)
            except (OSError, ValueError):
                return
            if self.stop_r in ready:
                return
            last = time.monotonic()
            data = []
            try:
                while True:     # all that gathered
                    data.append(os.read(self.fd, 1 << 16))
            except BlockingIOError:
                pass
            except OSError:
                return
            try:
                for chunk in data:
                    self._events(chunk)
            except Exception as e:      # a report that failed must not end the watch
                self.log("watching the export: %s" % e)

    def _events(self, data: bytes) -> None:
        changed: List[str] = []
        try:
            self._parse(data, changed)
        finally:
            if changed:
                self.on_change(changed)

    def _parse(self, data: bytes, changed: List[str]) -> None:
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            raw = data[at + _EVENT.size:at + _EVENT.size + length]
            at += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self.log("too many changes behind the mount at once: some show only at "
                         "their next change")
                continue
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            d = self.dirs.get(wd)
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            if d is None or not name:
                continue
            rel = os.path.join(d, name) if d else name
            changed.append("/" + rel)
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                self._add_tree(rel, report=True)

    def close(self) -> None:
        try:
            os.write(self.stop_w, b"x")
        except OSError:
            pass
        self.thread.join()
        for fd in (self.fd, self.stop_r, self.stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
