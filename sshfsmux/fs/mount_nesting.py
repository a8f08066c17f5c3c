"""A mount must never contain itself: the checks shared by sshfsm and GMount.

A merged mount whose branch lies inside its mountpoint, or whose mountpoint lies
inside a branch that the mount would show, nests forever: every lookup of the
mountpoint goes back into the mount, and the FUSE threads end up waiting on
each other. The same happens through a cascade: a branch that is itself one of
our mounts, built (at any depth) on a directory that holds or lies in the new
mountpoint. Every mount of ours therefore publishes two virtual files at its
root (see merged_fs): /.sshfsmux-chain (host:mountpoint of the mounts it is
built on) and /.sshfsmux-branches (host:path of every branch at every depth).

A problem is reported as one line in the user's words (NestingError's str()).

Standard library only, Python 3.8 syntax (runs on nodes).
"""
from __future__ import annotations

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

CHAIN_NAME = ".sshfsmux-chain"
BRANCHES_NAME = ".sshfsmux-branches"
FSTYPE = "fuse.sshfsm"
MAX_READ = 1 << 20


class NestingError(Exception):
    """A mount that would contain itself; str() is the one-line reason."""


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def our_mounts(text: str, mountinfo: bool) -> List[str]:
    """Mountpoints of our mounts in /proc/self/mountinfo or /proc/mounts text."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        try:
            if mountinfo:
                sep = parts.index("-")
                mp, fstype = parts[4], parts[sep + 1]
            else:
                mp, fstype = parts[1], parts[2]
        except (ValueError, IndexError):
            continue
        if fstype == FSTYPE:
            out.append(_unescape(mp))
    return out


def inside(path: str, top: str) -> bool:
    """`path` is `top` or lies below it (both absolute and normalized)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def containing(mounts: List[str], path: str) -> Optional[str]:
    """The innermost of `mounts` that `path` is in."""
    best = None
    for mp in mounts:
        if inside(path, mp) and (best is None or len(mp) > len(best)):
            best = mp
    return best


def lines(data: Optional[bytes]) -> List[str]:
    if not data:
        return []
    return [x.strip() for x in data.decode("utf-8", "surrogateescape").splitlines() if x.strip()]


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ)
    except OSError:
        return None


def _mount_of(path: str) -> Optional[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = our_mounts(f.read(), True)
    except OSError:
        mounts = []
    return containing(mounts, path)


def local_lists(path: str) -> Tuple[List[str], List[str]]:
    """(chain, branch places) of the mount of ours that local `path` is in;
    empty lists if it is in none."""
    real = os.path.realpath(path)
    for top in (_mount_of(real), real):
        if not top:
            continue
        data = _read(os.path.join(top, CHAIN_NAME))
        if data is None:
            continue
        return lines(data), lines(_read(os.path.join(top, BRANCHES_NAME)))
    return [], []


def split_place(place: str) -> Tuple[str, str]:
    """'host:/path' -> (host, /path)."""
    host, _, path = place.partition(":")
    return host, path


def check_places(spec: str, places: List[str], host: str, mountpoint: str) -> None:
    """Refuse when a branch place of `spec` (a mount of ours) on this host holds
    or lies in `mountpoint`."""
    for place in places:
        h, p = split_place(place)
        if h != host or not p.startswith("/"):
            continue
        if inside(p, mountpoint):
            raise NestingError("%s is built on %s, which is inside the mountpoint %s: "
                               "the mount would contain itself" % (spec, p, mountpoint))
        if inside(mountpoint, p):
            raise NestingError("%s is built on %s, which holds the mountpoint %s: "
                               "the mount would contain itself" % (spec, p, mountpoint))


def check_export(export: str, mountpoint: str, host: str) -> List[str]:
    """GMount: refuse an export and a mountpoint that hold one another, directly
    or through the mounts the export is built on. Returns the export's branch
    places (this export first) for the new mount's /.sshfsmux-branches."""
    export, mountpoint = os.path.realpath(export), os.path.realpath(mountpoint)
    if inside(export, mountpoint):
        raise NestingError("export %s is inside the mountpoint %s: the mount would contain "
                           "itself" % (export, mountpoint))
    if inside(mountpoint, export):
        raise NestingError("mountpoint %s is inside the export %s: the mount would contain "
                           "itself" % (mountpoint, export))
    chain, places = local_lists(export)
    me = "%s:%s" % (host, mountpoint)
    if me in chain:
        raise NestingError("export %s is built on the mount at %s: the mount would contain "
                           "itself" % (export, mountpoint))
    check_places("export " + export, places, host, mountpoint)
    return ["%s:%s" % (host, export)] + places
