"""The glue between the merged tree and libfuse (through mfusepy): which
libfuse is loaded, how errors become errno values, zero-copy reads handed to
libfuse as (fd, offset), and a FUSE class with the fixes the merge needs.

Standard library plus mfusepy, Python 3.8 syntax (runs on nodes).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
import threading


def _prefer_libfuse3() -> None:
    """mfusepy loads libfuse 2 when both are installed (common: bindfs and
    many desktop tools pull in libfuse2). Our mounts are written for libfuse 3
    (max_threads, rename flags, fuse_config): point mfusepy at it unless the
    user chose a library with FUSE_LIBRARY_PATH."""
    if os.environ.get("FUSE_LIBRARY_PATH"):
        return
    from ctypes.util import find_library
    path = find_library("fuse3")
    if path:
        os.environ["FUSE_LIBRARY_PATH"] = path


_prefer_libfuse3()
from mfusepy import FuseOSError, Operations, fuse_get_context  # noqa: E402,F401

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict

UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


# libfuse's struct fuse_buf / fuse_bufvec (buf[] is inline, one element here)
class _FuseBuf(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class _FuseBufVec(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", _FuseBuf * 1)]


FUSE_BUF_IS_FD, FUSE_BUF_FD_SEEK = 1 << 1, 1 << 2
_BUFVEC_SIZE = ctypes.sizeof(_FuseBufVec)
FUSE_READDIR_PLUS, FUSE_FILL_DIR_PLUS = 1 << 0, 1 << 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def _e(code: int) -> FuseOSError:
    return FuseOSError(code)


# ctypes gives a libfuse worker thread a new Python thread state for every
# callback and frees it on return; one extra PyGILState_Ensure per worker keeps
# it (measured: cold stat through the mount 1.5x faster). `_kept` is per thread
# state, so it reads as unset exactly when ctypes made a fresh one.
_pyapi = ctypes.pythonapi
_pyapi.PyGILState_Ensure.restype = ctypes.c_int
_kept = threading.local()


def fill_stat(st: Any, a: Dict[str, Any]) -> None:
    """A branch's attributes (nanosecond times under st_*time_ns when it has
    them) straight into libfuse's struct stat, which libfuse has zeroed."""
    st.st_mode = a["st_mode"]
    st.st_nlink = a.get("st_nlink") or 1
    st.st_uid = a.get("st_uid", 0)
    st.st_gid = a.get("st_gid", 0)
    size = a.get("st_size", 0)
    st.st_size = size
    st.st_blocks = (size + 511) // 512
    rdev = a.get("st_rdev")
    if rdev:
        st.st_rdev = rdev
    for key, spec in _TIMES:
        ns = a.get(key + "_ns")
        if ns is None:
            ns = int(round(float(a.get(key, 0)) * 1e9))
        ts = getattr(st, spec)
        ts.tv_sec, ts.tv_nsec = divmod(ns, 1000000000)


_TIMES = (("st_atime", "st_atimespec"), ("st_mtime", "st_mtimespec"), ("st_ctime", "st_ctimespec"))



# the same bufvec as bytes (count, idx, off, then buf[0]: size, flags, pad,
# mem, fd, pad, pos): one memmove instead of eight ctypes field writes
_BUFVEC_BYTES = struct.Struct("=QQQQiiQiiq")
_PTR_BYTES = struct.Struct("=Q")


def hand_over(bufpp: Any, h: Any, size: int, offset: int) -> int:
    """read_buf's answer: a range that is in a local file (a replica, a local
    branch: the handle has fd_for) goes to libfuse as (fd, offset), so the data
    never passes through Python; anything else is copied into libfuse's memory.
    libfuse frees both mallocs after its reply."""
    fd_for = getattr(h, "fd_for", None)
    mem = 0
    if fd_for is not None:
        fd, n = fd_for(size, offset)
        raw = _BUFVEC_BYTES.pack(1, 0, 0, n, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, 0, 0, fd, 0, offset)
    else:
        data = h.read(size, offset)
        mem = _libc.malloc(max(1, len(data)))
        if not mem:
            raise _e(errno.ENOMEM)
        ctypes.memmove(mem, data, len(data))
        raw = _BUFVEC_BYTES.pack(1, 0, 0, len(data), 0, 0, mem, -1, 0, 0)
    bv = _libc.malloc(_BUFVEC_SIZE)
    if not bv:
        if mem:
            _libc.free(ctypes.c_void_p(mem))
        raise _e(errno.ENOMEM)
    ctypes.memmove(bv, raw, _BUFVEC_SIZE)
    ctypes.memmove(ctypes.addressof(bufpp.contents), _PTR_BYTES.pack(bv), 8)
    return 0


def safe(fn: Callable) -> Callable:
    """Errors out as errno, never a traceback; -d logs every operation."""
    name = fn.__name__.replace("raw_", "")     # raw_getattr logs as getattr

    @functools.wraps(fn)
    def op(self: Any, *args: Any) -> Any:
        if self.debug:
            shown = tuple(("<%d bytes>" % len(a)) if isinstance(a, (bytes, bytearray)) else a
                          for a in args)
            try:
                r = fn(self, *args)
            except OSError as e:
                code = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO
                self.log("%s%r -> %s" % (name, shown, errno.errorcode.get(code, code)))
                raise _e(code)
            except Exception as e:
                self.log("%s%r -> EIO (internal error: %s: %s)" % (name, shown, type(e).__name__, e))
                raise _e(errno.EIO)
            res = ("<%d bytes>" % len(r)) if isinstance(r, (bytes, bytearray)) else (
                "ok" if r in (None, 0) else r if not isinstance(r, (list, dict)) else
                "<%d entries>" % len(r))
            self.log("%s%r -> %s" % (name, shown, res))
            return r
        try:
            return fn(self, *args)
        except OSError as e:
            if isinstance(e.errno, int) and e.errno > 0:
                raise
            raise _e(errno.EIO)
        except Exception as e:
            self.log("internal error in %s: %s: %s" % (name, type(e).__name__, e))
            raise _e(errno.EIO)
    return op


# getattr as libfuse calls it, in plain C types: the path as bytes (or None),
# the struct stat and the file info as addresses (ints, None for NULL), so
# ctypes makes no pointer objects per call
_GETATTR_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)
_pending = threading.local()     # the callback a mount being started installs


def _fast_getattr(fuse: Any, into: Callable[[bytes, int], int],
                  path: Any, buf: Any, fip: Any) -> int:
    """The cold-stat path: the branch lstats into libfuse's buffer itself
    (0 or -errno); anything it cannot answer (1) takes mfusepy's way."""
    if not getattr(_kept, "on", False):
        _kept.on = True
        _pyapi.PyGILState_Ensure()
    if path is not None and not fip:
        try:
            rc = into(path, buf)
        except Exception:
            rc = 1
        if rc <= 0:
            return rc
    import mfusepy
    return fuse._wrapper(fuse.getattr_fuse_3, path, ctypes.cast(buf, ctypes.POINTER(mfusepy.c_stat)),
                         ctypes.cast(fip, ctypes.POINTER(mfusepy.fuse_file_info)))


def _patch_main(mfusepy: Any) -> None:
    """mfusepy builds the operations table inside FUSE.__init__ and hands it
    to fuse_main_real at once: a wrapper of that call puts the fast getattr
    in (kept alive by the mount's own frame until libfuse returns)."""
    if getattr(mfusepy, "_gxp_patched", False):
        return
    real = mfusepy.fuse_main_real
    field = dict(mfusepy.fuse_operations._fields_).get("getattr")

    def main_real(argc, argv, ops, size, data):  # type: ignore[no-untyped-def]
        fast = getattr(_pending, "getattr", None)
        if fast is not None and field is not None and ops.contents.getattr:
            ops.contents.getattr = ctypes.cast(fast, field)
        return real(argc, argv, ops, size, data)
    mfusepy.fuse_main_real = main_real
    mfusepy._gxp_patched = True


class _FixedFUSE:
    """What fuse_class puts over mfusepy.FUSE's methods (it is the first base
    there, so super() is mfusepy's FUSE): the fast getattr, a quieter wrapper,
    readdirplus, and the three fixes fuse_class names. Here and not inside
    fuse_class so that mfusepy is imported only when a mount starts."""
    _mfusepy: Any = None      # the module, set by fuse_class

    def __init__(self, operations, mountpoint, **kwargs):  # type: ignore[no-untyped-def]
        # a one-branch mount's getattr goes straight to the branch's
        # stat_into through a callback of plain C types (_main_real)
        # the operations' generation (GMount: gmount/generation.py), bumped by
        # each call that changes something
        self._generation = getattr(operations, "generation", None)
        self._missing = getattr(operations, "missing", None)
        into = getattr(operations, "stat_into", None)
        if into is not None and self._mfusepy.fuse_version_major == 3:
            _pending.getattr = _GETATTR_T(functools.partial(_fast_getattr, self, into))
        try:
            super().__init__(operations, mountpoint, **kwargs)
        finally:
            _pending.getattr = None

    def _wrapper(self, func, *args):  # type: ignore[no-untyped-def]
        # mfusepy's wrapper without its per-error logging work (our
        # operations already turned every failure into an OSError); init
        # and the critical exceptions still go through mfusepy's
        if not getattr(_kept, "on", False):
            _kept.on = True
            _pyapi.PyGILState_Ensure()
        if func.__name__.startswith("init"):
            return super()._wrapper(func, *args)
        if self._generation is not None and func.__name__ in _CHANGES:
            self._generation.bump()
        try:
            return func(*args) or 0
        except OSError as e:
            code = e.errno
            return -code if isinstance(code, int) and code > 0 else -errno.EIO
        except Exception:
            return -errno.EIO
        except BaseException as e:
            failure = e

            def again(*_args):  # type: ignore[no-untyped-def]
                raise failure
            again.__name__ = func.__name__
            return super()._wrapper(again)

    def readdir_fuse_3(self, path, buf, filler, offset, fip, flags):  # type: ignore[no-untyped-def]
        # readdirplus: names with attributes, so ls -l, find and make need
        # no lookup per entry (entries without attributes get one)
        plus = getattr(self.operations, "readdir_plus", None)
        if not flags & FUSE_READDIR_PLUS or plus is None:
            return super().readdir_fuse_3(path, buf, filler, offset, fip, flags)
        enc, errs = self.encoding, self.errors
        st = self._mfusepy.c_stat()
        size = ctypes.sizeof(st)
        # offsets, not offset 0: libfuse (< 3.17) drops the attributes of
        # entries it buffers itself
        entries = plus(path.decode(enc, errs), fip.contents.fh, offset)
        for i in range(offset, len(entries)):
            name, a = entries[i]
            if a is None:
                full = filler(buf, name.encode(enc, errs), None, i + 1, 0)
            else:
                ctypes.memset(ctypes.byref(st), 0, size)
                fill_stat(st, a)
                full = filler(buf, name.encode(enc, errs), st, i + 1, FUSE_FILL_DIR_PLUS)
            if full:
                break
        return 0

    def getattr_fuse_3(self, path, buf, fip):  # type: ignore[no-untyped-def]
        # a branch that lstats into buf itself (0 or -errno; 1: it cannot)
        into = getattr(self.operations, "stat_into", None) if path is not None and not fip else None
        if into is not None:
            rc = into(path, buf)
            if rc <= 0:
                return rc
        # a miss the operations can tell at once (a GMount node's copy)
        missing = self._missing
        if missing is not None and path is not None and not fip and \
                missing(path, path.decode(self.encoding, self.errors), buf):
            return -errno.ENOENT
        # the branch's attributes as they are, no dict copies on the way
        a = self.operations.raw_getattr(
            None if path is None else path.decode(self.encoding, self.errors),
            fip.contents.fh if fip else None)
        fill_stat(buf.contents, a)
        return 0

    def utimens_fuse_3(self, path, buf, fip):  # type: ignore[no-untyped-def]
        times = None
        if buf:
            def conv(ts):  # type: ignore[no-untyped-def]
                if ts.tv_nsec == UTIME_NOW:
                    return "now"
                if ts.tv_nsec == UTIME_OMIT:
                    return None
                return ts.tv_sec * 10 ** 9 + ts.tv_nsec
            times = (conv(buf.contents.actime), conv(buf.contents.modtime))
        return self.operations.utimens(
            None if path is None else path.decode(self.encoding, self.errors), times)

    def read_buf(self, path, bufpp, size, offset, fip):  # type: ignore[no-untyped-def]
        return self.operations.read_buf(
            None if path is None else path.decode(self.encoding, self.errors),
            bufpp, size, offset, fip.contents.fh)

    def create(self, path, mode, fip):  # type: ignore[no-untyped-def]
        # mfusepy asks inspect.signature of our create at every call (a third
        # of a create's CPU); ours always takes the flags
        fi = fip.contents
        fi.fh = self.operations.create(path.decode(self.encoding, self.errors), mode, fi.flags)
        self._no_flush(fi)
        return 0

    def open(self, path, fip):  # type: ignore[no-untyped-def]
        fi = fip.contents
        if self._generation is not None and fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            self._generation.bump()
        fi.fh = self.operations.open(path.decode(self.encoding, self.errors), fi.flags)
        self._no_flush(fi)
        return 0

    def _no_flush(self, fi):  # type: ignore[no-untyped-def]
        # a handle with nothing to do at flush (a read, a local file's write)
        # is opened with FOPEN_NOFLUSH: the kernel does not send FLUSH at
        # each close (libfuse >= 3.11, Linux >= 5.15; older ones ignore it)
        handles = getattr(self.operations, "handles", None)
        if _HAS_NOFLUSH and handles is not None:
            h = handles.get(fi.fh)
            if h is not None and not getattr(h, "needs_flush", False):
                fi.noflush = 1

    def rename_fuse_3(self, old, new, flags):  # type: ignore[no-untyped-def]
        return self.operations.rename2(old.decode(self.encoding, self.errors),
                                       new.decode(self.encoding, self.errors), flags)


# mfusepy's callbacks that change the tree or a file (open: with write flags)
_CHANGES = frozenset((
    "mknod", "mkdir", "unlink", "rmdir", "symlink", "rename", "rename_fuse_3", "link",
    "chmod", "chmod_fuse_3", "chown", "chown_fuse_3", "truncate", "truncate_fuse_3",
    "ftruncate", "utimens", "utimens_fuse_3", "write", "write_buf", "create", "setxattr",
    "removexattr", "fallocate", "copy_file_range"))


def _has_noflush() -> bool:
    import mfusepy
    return any(f[0] == "noflush" for f in mfusepy.fuse_file_info._fields_)


_HAS_NOFLUSH = _has_noflush()


def fuse_class() -> type:
    """mfusepy's FUSE with three fixes: UTIME_NOW/UTIME_OMIT kept apart from
    real times, rename flags (RENAME_NOREPLACE/EXCHANGE) passed on instead of
    dropped, and read_buf that accepts the NULL path of an unlinked open file."""
    import mfusepy

    _patch_main(mfusepy)
    return type("_FUSE", (_FixedFUSE, mfusepy.FUSE), {"_mfusepy": mfusepy})


ATTR_SECONDS = 1.0      # how long the kernel trusts a name's attributes (libfuse's default)
# FUSE worker threads kept waiting: libfuse's default let a worker end after
# each request and started another for the next (a thread start, a new Python
# thread state and a burst of GIL hand-offs per file system call)
IDLE_THREADS = 16


def run_fuse(fs: Any, mountpoint: str, foreground: bool = True,
             negative_seconds: float = 0.0, **options: Any) -> None:
    """Mount `fs` at `mountpoint` and serve it until it is unmounted (blocks).
    Options go to libfuse (-o); defaults: fsname=sshfsmux, subtype=sshfsm,
    hard_remove (no .fuse_hidden files in the branches), max_threads=64 (readers
    waiting for a stream must not starve everything else), ro if fs is
    read-only; names and attributes trusted for ATTR_SECONDS (a change made
    behind the mount's back is seen within that), a missing name for
    `negative_seconds` (0: asked every time; only safe longer when every
    writer invalidates). Not auto_cache: it served a remote file's old bytes
    after a change (test_sshfsm). libfuse's nonzero status
    (also after SIGTERM) raises RuntimeError."""
    opts = dict(fsname="sshfsmux", subtype="sshfsm", hard_remove=True, max_threads=64,
                max_idle_threads=IDLE_THREADS,
                entry_timeout=ATTR_SECONDS, attr_timeout=ATTR_SECONDS,
                negative_timeout=negative_seconds)
    if fs.readonly:
        opts["ro"] = True
    opts.update(options)
    fuse_class()(fs, mountpoint, foreground=foreground, **opts)
