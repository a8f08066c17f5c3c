"""Letting the bed's ordinary users open /dev/fuse for the length of a test."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil

from .system import BASE_DIR, _global_lock, _global_unlock

FUSE_DEVICE = "/dev/fuse"


FUSE_HOLDERS = os.path.join(BASE_DIR, ".gxptb-fuse")   # a file per run holding it open, and "mode"


def _live_fuse_holders() -> list[str]:
    """Holder files of runs still alive; those of dead runs are removed."""
    live = []
    for name in os.listdir(FUSE_HOLDERS):
        if name == "mode":
            continue
        try:
            os.kill(int(name.split("-")[0]), 0)
            live.append(name)
        except (ValueError, ProcessLookupError):
            os.unlink(os.path.join(FUSE_HOLDERS, name))
        except PermissionError:
            live.append(name)
    return live


def open_fuse_to_users() -> str:
    """/dev/fuse 0666, as on real systems (0600 on this machine), until every
    run that asked has closed it: each run saving and restoring the mode on
    its own left it 0666 when two overlapped. Returns the token for
    close_fuse_to_users()."""
    fd = _global_lock()
    try:
        os.makedirs(FUSE_HOLDERS, mode=0o700, exist_ok=True)
        saved = os.path.join(FUSE_HOLDERS, "mode")
        if not os.path.exists(saved):   # the first holder: remember the mode to restore
            with open(saved, "w") as f:
                f.write("%o\n" % (os.stat(FUSE_DEVICE).st_mode & 0o7777))
        token = "%d-%s" % (os.getpid(), secrets.token_hex(4))
        open(os.path.join(FUSE_HOLDERS, token), "w").close()
        os.chmod(FUSE_DEVICE, 0o666)
        return token
    finally:
        _global_unlock(fd)


def close_fuse_to_users(token: str | None = None) -> bool:
    """Drop this run's hold (token None: only clean up after dead runs); the
    last holder restores the saved mode. True if the mode was restored."""
    fd = _global_lock()
    try:
        if not os.path.isdir(FUSE_HOLDERS):
            return False
        if token is not None:
            try:
                os.unlink(os.path.join(FUSE_HOLDERS, token))
            except FileNotFoundError:
                pass
        if _live_fuse_holders():
            return False
        saved = os.path.join(FUSE_HOLDERS, "mode")
        try:
            with open(saved) as f:
                os.chmod(FUSE_DEVICE, int(f.read().strip(), 8))
        except (OSError, ValueError):
            os.chmod(FUSE_DEVICE, 0o600)    # what this machine has
        shutil.rmtree(FUSE_HOLDERS, ignore_errors=True)
        return True
    finally:
        _global_unlock(fd)


@contextlib.contextmanager
def fuse_open_to_users():
    """open_fuse_to_users() for the length of a with block."""
    token = open_fuse_to_users()
    try:
        yield
    finally:
        close_fuse_to_users(token)
