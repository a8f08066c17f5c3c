"""Files a verb writes and reads on the user's behalf, checked before use.

What a verb writes (bcast's DEST, make's --joblog and --trace, plot's image)
is only ever a regular file: a missing one is created with the user's umask,
an existing regular file is replaced, and anything else (a device such as
/dev/null, a FIFO, a socket, a directory) is refused with "not a regular
file" before a byte is written. Opening never blocks (a FIFO created between
the check and the open is refused too).

What a verb reads (a cluster file, a trace) is read in bounded memory: a file
over its stated cap is refused in one line.

Head-only (the gxpc process and the session daemon); bcast's agents check
their DEST the same way in bcast/node.py.
"""
from __future__ import annotations

import errno
import io
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs gxpc's start; annotations are strings
    from typing import IO, List, Optional

NOT_REGULAR = "not a regular file"


class PathRefused(OSError):
    """A path a verb may not write or read; str() is `PATH: why`."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EINVAL, why, path)
        self.path, self.why = path, why

    def __str__(self) -> str:
        return "%s: %s" % (self.path, self.why)


def replace_problem(path: str) -> Optional[str]:
    """None when `path` may be written (missing, or a regular file, also
    through a symlink); else why not, in a few words."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            st = os.lstat(path)     # a dangling symlink: writing would create its target
        except OSError:
            return None
        return None if not stat.S_ISLNK(st.st_mode) else "a symlink to nothing"
    except OSError as e:
        return e.strerror or str(e)
    return None if stat.S_ISREG(st.st_mode) else NOT_REGULAR


def check_replaceable(path: str) -> None:
    why = replace_problem(path)
    if why:
        raise PathRefused(path, why)


def open_output(path: str, binary: bool = False) -> IO:
    """`path` opened for writing from its start: a regular file (created with
    the user's umask, or an existing one emptied); anything else PathRefused."""
    check_replaceable(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(path, NOT_REGULAR)
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    raw = io.FileIO(fd, "w")
    raw.name = path         # as open(path) names it, not by its fd number
    buffered = io.BufferedWriter(raw)
    if binary:
        return buffered
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="surrogateescape")


def open_input(path: str, cap: int) -> IO[bytes]:
    """`path` opened for reading: a regular file of at most `cap` bytes,
    else PathRefused naming the cap (or the OSError of opening it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(path, NOT_REGULAR)
        if st.st_size > cap:
            raise PathRefused(path, "%s, over the %s this reads at most" % (size_words(st.st_size),
                                                                             size_words(cap)))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_capped(path: str, cap: int) -> bytes:
    """The whole of a regular file of at most `cap` bytes (it may not grow past
    the cap while we read, either)."""
    with open_input(path, cap) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise PathRefused(path, "over the %s this reads at most" % size_words(cap))
    return data


def size_words(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return "%g %s" % (round(n / size, 1), unit)
    return "%d bytes" % n


def remove_dead_owner_dirs(parent: str, prefix: str) -> List[str]:
    """Remove `parent/PREFIX<pid>-*` directories of ours whose owning process
    (the pid in the name) is gone: what a process killed by SIGKILL left.
    A pid that is alive (maybe reused) keeps its directory. Returns the paths."""
    import shutil
    removed: List[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text, dash, _ = name[len(prefix):].partition("-")
        if not (pid_text.isdigit() and dash):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or _alive(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True     # another user's process: alive
    return True
