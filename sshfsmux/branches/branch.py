"""A branch: one directory tree that a merged mount is built from.

Every kind of branch (a local directory, a remote directory over SFTP against a
stock sshd, a remote export of one of our agents over the direct data channel,
and, for cascades, a mount of ours) answers the same calls, so the merged
filesystem (merged_fs.py) never knows where data lives. Errors are OSError with a
proper errno; the merged filesystem passes them to FUSE unchanged.

Paths are always absolute *within the branch* ("/", "/a/b"), already normalised
by the caller: no "..", no empty components.

Standard library only (an agent may load this module to serve or mount).
"""
from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# Attributes a branch reports, as FUSE's getattr wants them.
STAT_KEYS = ("st_mode", "st_size", "st_mtime", "st_atime", "st_ctime", "st_nlink",
             "st_uid", "st_gid")


def stat_dict(st: Any) -> Dict[str, Any]:
    return {k: getattr(st, k) for k in STAT_KEYS}


class ReadHandle:
    """An open file for reading."""

    def read(self, size: int, offset: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass


class WriteHandle(ReadHandle):
    """An open file for writing (and reading back)."""

    def write(self, data: bytes, offset: int) -> int:
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def fsync(self) -> None:
        pass


class Branch:
    """The calls every branch answers. `node` names where the data lives (for the
    location attribute); `local` is True when reads never cross the network."""

    name = "?"
    node = "?"
    local = False
    writable = True

    def getattr(self, path: str) -> Dict[str, Any]:
        raise NotImplementedError

    def readdir(self, path: str) -> List[str]:
        raise NotImplementedError

    def readlink(self, path: str) -> str:
        raise NotImplementedError

    def mkdir(self, path: str, mode: int) -> None:
        raise NotImplementedError

    def rmdir(self, path: str) -> None:
        raise NotImplementedError

    def unlink(self, path: str) -> None:
        raise NotImplementedError

    def rename(self, old: str, new: str) -> None:
        raise NotImplementedError

    def symlink(self, target: str, path: str) -> None:
        raise NotImplementedError

    def chmod(self, path: str, mode: int) -> None:
        raise NotImplementedError

    def truncate(self, path: str, length: int) -> None:
        raise NotImplementedError

    def utimens(self, path: str, times: Optional[Tuple[float, float]]) -> None:
        raise NotImplementedError

    def open_read(self, path: str) -> ReadHandle:
        raise NotImplementedError

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        raise NotImplementedError

    def statfs(self) -> Dict[str, Any]:
        raise NotImplementedError

    def getxattr(self, path: str, name: str) -> bytes:
        raise OSError(errno.ENODATA, os.strerror(errno.ENODATA))

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))

    def listxattr(self, path: str) -> List[str]:
        return []

    def removexattr(self, path: str, name: str) -> None:
        raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))

    def close(self) -> None:
        pass
