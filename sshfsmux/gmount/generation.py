"""A GMount node's generation file: bytes that change with each change made
through the mount, read by the node's agent before and after each recipe
(gxpstyle/node/node_calls.py's `unless`: a recipe that changed nothing
needs no description, and a run of such recipes costs the mount nothing).

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import os


class Generation:
    """The file: eight random bytes naming this run of the mount,
    then a counter, in a shared mapping, so that a bump is a store into
    memory, no system call. A bump lost to a race between two threads still
    changes the bytes since the last read that came before both."""

    def __init__(self, path: str) -> None:
        import mmap
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, os.urandom(8) + bytes(8))
            self.map = mmap.mmap(fd, 16)
        finally:
            os.close(fd)
        self.path = path
        self.count = memoryview(self.map)[8:16].cast("Q")

    def bump(self) -> None:
        try:
            self.count[0] = (self.count[0] + 1) & 0xFFFFFFFFFFFFFFFF
        except ValueError:      # closed: the mount is stopping
            pass

    def close(self) -> None:
        self.count.release()
        self.map.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
