"""What the merged tree holds per name and per open file: the View of the
branches under one name, the virtual read-only files, and a file open for
writing in every branch holding its visible version.
"""
from __future__ import annotations

import errno
import stat

from sshfsmux.branches.branch import Branch, ReadHandle, WriteHandle
from sshfsmux.fs.fuse_glue import _e

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple


class View:
    """What the branches hold under one name."""
    __slots__ = ("path", "holders", "visible", "attrs", "replicas", "conflicts")

    def __init__(self, path: str, holders: List[Tuple[Branch, Dict[str, Any]]]) -> None:
        self.path = path
        self.holders = holders
        self.visible, self.attrs = holders[0]
        self.replicas = [holders[0]]      # holders of the visible version
        self.conflicts: List[Tuple[Branch, Dict[str, Any]]] = []  # another version (or type)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.attrs["st_mode"])


class _VirtualHandle(ReadHandle):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int, offset: int) -> bytes:
        return self.data[offset:offset + size]


class MultiWriteHandle(WriteHandle):
    """One open file written in every branch holding its visible version."""

    def __init__(self, fs: Any, path: str,
                 pairs: List[Tuple[Branch, WriteHandle]]) -> None:
        self.fs = fs
        self.path = path
        self.pairs = pairs
        self.written = False
        # a remote branch's write reports its errors at flush (close());
        # a local file's flush has nothing to do (fuse_glue: noflush)
        self.needs_flush = any(not b.local for b, _ in pairs)

    def read(self, size: int, offset: int) -> bytes:
        return self.pairs[0][1].read(size, offset)

    def write(self, data: bytes, offset: int) -> int:
        self.written = True
        n = self.pairs[0][1].write(data, offset)
        for _, h in self.pairs[1:]:
            h.write(data, offset)
        return n

    def _all(self, what: str, *args: Any) -> None:
        first = None
        for _, h in self.pairs:
            try:
                getattr(h, what)(*args)
            except OSError as e:
                if first is None:
                    first = e
        if first is not None:
            raise first

    def truncate(self, length: int) -> None:
        self.written = True
        self._all("truncate", length)

    def flush(self) -> None:
        self._all("flush")

    def fsync(self) -> None:
        self._all("fsync")

    def fstat(self) -> Dict[str, Any]:
        h = self.pairs[0][1]
        if hasattr(h, "fstat"):
            return h.fstat()
        raise _e(errno.ENOENT)

    def close(self) -> None:
        try:
            self._all("close")
        finally:
            if len(self.pairs) > 1 and self.written:
                self.fs._align_times(self.path, [b for b, _ in self.pairs])
