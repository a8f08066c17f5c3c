"""The system calls a local branch makes beyond the os module's, through
ctypes: openat2(2) to walk the directories of a path below the branch's root
fd in one call (refusing symlinks and escapes), libc's openat/fstatat/close
for the fast getattr (struct stat written straight into libfuse's buffer),
and the process umask read without changing it. Each is None where the
kernel or the machine lacks it; the branch then takes its general path.

Standard library only.
"""
from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List

DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
# openat2(2) (Linux >= 5.6): the kernel walks a path of directories below a
# root fd, refusing symlinks and escapes, in one call
_RESOLVE_BENEATH_NO_LINKS = 0x02 | 0x04 | 0x08   # NO_MAGICLINKS | NO_SYMLINKS | BENEATH
OPENAT2_CHUNK = 4000            # bytes of path per openat2 call (below PATH_MAX)


def _load_openat2() -> Any:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError, ImportError):
        return None

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64)]
    how = OpenHow(DIR_FLAGS, 0, _RESOLVE_BENEATH_NO_LINKS)
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    where, size = ctypes.addressof(how), ctypes.sizeof(how)
    get_errno = ctypes.get_errno

    def openat2(dir_fd: int, rel: bytes) -> int:
        fd = fn(437, dir_fd, rel, where, size)
        return fd if fd >= 0 else -get_errno()
    openat2.keep = how  # type: ignore[attr-defined]
    # probe: some kernels (and seccomp filters) do not have it
    r = openat2(-100, b".")
    if r < 0:
        return None
    os.close(r)
    return openat2


openat2 = _load_openat2()


def open_beneath(root_fd: int, comps: List[str]) -> int:
    """An O_PATH fd of directory `comps` below root_fd, or -1 when the walk
    meets a symlink (the caller expands it); other errors are raised."""
    assert openat2 is not None
    rel = "/".join(comps).encode("utf-8", "surrogateescape")
    if len(rel) < OPENAT2_CHUNK:
        fd = openat2(root_fd, rel)
    else:
        sizes = [len(c.encode("utf-8", "surrogateescape")) + 1 for c in comps]
        fd, i = root_fd, 0
        while i < len(comps):
            j, n = i, 0
            while j < len(comps) and (j == i or n + sizes[j] < OPENAT2_CHUNK):
                n += sizes[j]
                j += 1
            nfd = openat2(fd, "/".join(comps[i:j]).encode("utf-8", "surrogateescape"))
            if fd != root_fd:
                os.close(fd)
            fd, i = nfd, j
            if fd < 0:
                break
    if fd >= 0:
        return fd
    if -fd in (errno.ELOOP, errno.EXDEV, errno.ENOSYS, errno.EPERM):
        return -1
    raise OSError(-fd, os.strerror(-fd))


def _load_libc_stat() -> Any:
    """libc's openat/fstatat/close through ctypes, for stat_into: the kernel
    writes struct stat straight into libfuse's buffer (no os.stat_result, no
    dict, no field-by-field copy: the hot path of a cold stat storm)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        openat, fstatat, close = libc.openat, libc.fstatat, libc.close
    except (OSError, AttributeError, ImportError):
        return None
    openat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    fstatat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    close.argtypes = [ctypes.c_int]
    return openat, fstatat, close, ctypes.get_errno


libc_stat = _load_libc_stat() if os.uname().machine in ("x86_64", "aarch64") else None
AT_SYMLINK_NOFOLLOW = 0x100


def process_umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a
    moment, for every thread): Linux >= 4.7 shows it in /proc/self/status."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022      # unknown: assume the usual one (a chmod too many is harmless)
