"""Beds on this machine: listing them and sweeping the leftovers of crashed runs."""

from __future__ import annotations

import glob
import os
import pwd
import time

from . import fuse_access
from .bed import TestBed
from .removal import _remove_cgroups, _remove_dir, _remove_user
from .system import (
    _BR_RE,
    _DIR_RE,
    _NS_RE,
    _TAG_RE,
    _VETH_RE,
    BASE_DIR,
    CGROUP_CPU,
    DIR_PREFIX,
    USER_MARK,
    TestBedError,
    _kill_all,
    _netns_id,
    _run,
)


def list_beds(base: str = BASE_DIR) -> list[dict]:
    """Bed directories with their state: dicts with dir, tag, persistent,
    owner_alive, hosts, users (state None if unreadable)."""
    out = []
    for d in sorted(glob.glob(os.path.join(base, DIR_PREFIX + "*"))):
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        info = {"dir": d, "tag": None, "persistent": False,
                "owner_alive": False, "hosts": [], "users": [], "state": None}
        try:
            bed = TestBed.attach(d)
        except (OSError, ValueError, KeyError):
            m = _DIR_RE.match(os.path.basename(d))
            info["tag"] = m.group(1) if m else None
        else:
            info.update(tag=bed.tag, persistent=bed.persistent,
                        owner_alive=bed.owner_alive(),
                        hosts=[(h.name, h.ip) for h in bed.hosts.values()],
                        users=list(bed._users_made), state=bed)
        out.append(info)
    return out


def _tag_in_use(tag: str, all: bool, base: str = BASE_DIR) -> bool:
    if all:
        return False
    d = os.path.join(base, DIR_PREFIX + tag)
    try:
        bed = TestBed.attach(d)
    except (OSError, ValueError, KeyError):
        # directory being created right now (no state yet)?  keep it if young
        try:
            return time.time() - os.stat(d).st_mtime < 30
        except OSError:
            return False
    return bed.persistent or bed.owner_alive()


def sweep(all: bool = False, base: str = BASE_DIR,
          log=None) -> list[str]:
    """Remove leftovers of crashed runs: bed directories, network
    namespaces (gxptb*), bridges (gxb*), veths (gxv*) and users (GECOS
    'gxptb ...').  Beds whose owning process is still alive, and beds made
    persistent by detach() (`scripts/testbed up`), are kept unless
    all=True.  Returns a list of what was removed."""
    done: list[str] = []

    def note(msg):
        done.append(msg)
        if log:
            log(msg)

    for info in list_beds(base):
        if info["tag"] and _tag_in_use(info["tag"], all, base):
            continue
        bed = info["state"]
        if bed is not None:
            bed.teardown()
        _remove_dir(info["dir"])
        note(f"bed {info['dir']}")

    # orphans whose bed directory is gone (or never had state)
    nss = _run(["ip", "netns", "list"], check=False).stdout.split()
    for ns in nss:
        m = _NS_RE.match(ns)
        if not m or _tag_in_use(m.group(1), all, base):
            continue
        left = _kill_all([_netns_id(ns)], [])
        _run(["ip", "netns", "del", ns], check=False)
        note(f"netns {ns}" + (f" (survivors {left})" if left else ""))
    cgroups = os.listdir(CGROUP_CPU) if os.path.isdir(CGROUP_CPU) else []
    for cg in cgroups:
        m = _NS_RE.match(cg)
        if not m or _tag_in_use(m.group(1), all, base):
            continue
        path = os.path.join(CGROUP_CPU, cg)
        with open(os.path.join(path, "cgroup.procs")) as f:
            _kill_all([], [], [int(p) for p in f.read().split()])
        left_cg = _remove_cgroups([path])
        note(f"cgroup {path}" + (f" ({left_cg[0]})" if left_cg else ""))
    for dev in sorted(os.listdir("/sys/class/net")):
        m = _BR_RE.match(dev) or _VETH_RE.match(dev)
        if not m or _tag_in_use(m.group(1), all, base):
            continue
        _run(["ip", "link", "del", dev], check=False)
        note(f"link {dev}")
    for pw in pwd.getpwall():
        if not pw.pw_gecos.startswith(USER_MARK):
            continue
        parts = pw.pw_gecos.split()
        tag = parts[1] if len(parts) > 1 else ""
        if _TAG_RE.match(tag) and _tag_in_use(tag, all, base):
            continue
        try:
            _remove_user(pw.pw_name)
            note(f"user {pw.pw_name}")
        except TestBedError as e:
            note(f"user {pw.pw_name}: {e}")
    if os.path.isdir(fuse_access.FUSE_HOLDERS) and fuse_access.close_fuse_to_users(None):
        note(f"{fuse_access.FUSE_DEVICE} mode restored (the runs that opened it died)")
    return done
