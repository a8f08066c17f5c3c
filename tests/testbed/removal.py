"""Removing what a bed made (users, cgroups, namespaces, links, its directory),
shared by TestBed.teardown() and sweep()."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import time
from typing import Iterable

from .system import DIR_PREFIX, KILL_TIMEOUT, USER_MARK, TestBedError, _run


def _user_pids(uid: int) -> list[int]:
    """Live (non-zombie) processes with `uid` as real, effective or saved
    uid.  (pgrep also counts zombies, and PID 1 here reaps orphans lazily.)"""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        m = re.search(r"^State:\s*(\S)", status, re.M)
        u = re.search(r"^Uid:\s*(\d+)\s+(\d+)\s+(\d+)", status, re.M)
        if m and u and m.group(1) not in "ZX" and \
                uid in (int(u.group(1)), int(u.group(2)), int(u.group(3))):
            out.append(int(entry))
    return out


def _remove_user(name: str) -> None:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return
    if not pw.pw_gecos.startswith(USER_MARK) or pw.pw_uid == 0:
        raise TestBedError(f"refusing to remove {name}: not made by the bed")
    _run(["pkill", "-KILL", "-u", name], check=False)
    deadline = time.monotonic() + KILL_TIMEOUT
    while True:
        pids = _user_pids(pw.pw_uid)
        if not pids:
            break
        if time.monotonic() > deadline:
            raise TestBedError(f"processes of {name} survived SIGKILL: {pids}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    # -f: zombies of the user that PID 1 has not reaped yet make plain
    # userdel refuse ("user is currently used by process").
    for _attempt in range(50):
        r = _run(["userdel", "-f", "-r", name], check=False)
        # 0 ok, 6 no such user, 12 could not remove home/mail spool
        if r.returncode in (0, 6, 12):
            break
        time.sleep(0.1)   # e.g. /etc/passwd locked by a concurrent useradd
    else:
        raise TestBedError(f"userdel {name} failed: {r.stderr.strip()}")
    if pw.pw_dir.startswith("/home/") and os.path.isdir(pw.pw_dir):
        shutil.rmtree(pw.pw_dir, ignore_errors=True)


def _in_cgroup(cgroup: str) -> list[str]:
    """argv prefix that moves the command into `cgroup` before it starts."""
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup]


def _remove_cgroups(paths: Iterable[str]) -> list[str]:
    """rmdir each cgroup (its processes were killed; a dying one may take a
    moment to leave it)."""
    left = []
    for p in paths:
        deadline = time.monotonic() + KILL_TIMEOUT
        while os.path.isdir(p):
            try:
                os.rmdir(p)
            except OSError:
                if time.monotonic() > deadline:
                    left.append(p)
                    break
                time.sleep(0.05)
    return [f"could not remove cgroups {left}"] if left else []


def _delete_net(nss: list[str], veths: list[str], bridges: list[str]) -> list[str]:
    problems = []
    existing = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    cmds = [f"link del {v}" for v in veths
            if os.path.exists(f"/sys/class/net/{v}")]
    cmds += [f"netns del {n}" for n in nss if n in existing]
    cmds += [f"link del {b}" for b in bridges
             if os.path.exists(f"/sys/class/net/{b}")]
    if cmds:
        _run(["ip", "-force", "-batch", "-"], check=False,
             input="\n".join(cmds) + "\n")
    left = [n for n in nss if os.path.exists(f"/run/netns/{n}")]
    left += [d for d in veths + bridges if os.path.exists(f"/sys/class/net/{d}")]
    if left:
        problems.append(f"could not delete {left}")
    return problems


def _remove_dir(path: str | None) -> list[str]:
    if not path:
        return []
    real = os.path.realpath(path)
    if not os.path.basename(real).startswith(DIR_PREFIX) or \
            os.path.dirname(real) in ("", "/"):
        return [f"refusing to remove {path}"]
    # never rm -rf through a mount point
    try:
        with open("/proc/self/mounts") as f:
            mps = [line.split()[1] for line in f]
    except OSError:
        mps = []
    for mp in sorted((m for m in mps if m.startswith(real + "/")),
                     key=len, reverse=True):
        _run(["umount", "-l", mp], check=False)
    shutil.rmtree(real, ignore_errors=True)
    return [f"could not remove {path}"] if os.path.exists(real) else []
