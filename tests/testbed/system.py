"""Constants of the test bed and the small system helpers every part of it
uses: commands, files, namespaces, processes, the global lock."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import Iterable

BASE_DIR = "/var/tmp"


DIR_PREFIX = "gxptb-"


NS_PREFIX = "gxptb"


BRIDGE_PREFIX = "gxb"


VETH_PREFIX = "gxv"


USER_MARK = "gxptb"


NET_PREFIX = "10.200"


LOCK_FILE = os.path.join(BASE_DIR, ".gxptb.lock")


CGROUP_CPU = "/sys/fs/cgroup/cpu"      # cgroup v1 cpu controller


CFS_PERIOD_US = 100000


SSHD = "/usr/sbin/sshd"


SFTP_SERVER = "/usr/lib/openssh/sftp-server"


USER_PATH = "/usr/local/bin:/usr/bin:/bin"


ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


START_TIMEOUT = 20.0      # seconds to wait for one sshd to listen


KILL_TIMEOUT = 10.0       # seconds to wait for processes to disappear


MAX_WORKERS = 16


_TAG_RE = re.compile(r"^[0-9a-f]{6}$")


_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


_NS_RE = re.compile(r"^gxptb([0-9a-f]{6})-")


_BR_RE = re.compile(r"^gxb([0-9a-f]{6})[0-9]{0,3}$")   # [0-9]: a site's bridge


_VETH_RE = re.compile(r"^gxv([0-9a-f]{6})[0-9]+$")


_DIR_RE = re.compile(r"^gxptb-([0-9a-z_]+)$")


class TestBedError(RuntimeError):
    """A command of the bed failed or the bed is misused."""

    __test__ = False   # keep pytest from collecting it


def _run(argv: list[str], *, check: bool = True, input: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess:
    env = {"PATH": ROOT_PATH, "LANG": "C.UTF-8"}
    r = subprocess.run(argv, input=input, capture_output=True, text=True,
                       env=env, timeout=timeout,
                       stdin=None if input is not None else subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise TestBedError(f"{shlex.join(argv)} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()}")
    return r


def _write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _mkdir(path: str, mode: int) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)   # not subject to umask


def _ns_link(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _netns_id(ns: str) -> str | None:
    try:
        return f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"
    except OSError:
        return None


def _proc_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return int(data.rsplit(")", 1)[1].split()[19])


def _pids_in(net_ids: Iterable[str | None] = (),
             mnt_ids: Iterable[str | None] = ()) -> list[int]:
    """All pids whose net ns is in net_ids or whose mount ns is in mnt_ids.

    Never returns this process, pid 1, or anything in our own or init's
    namespaces (guards against killing the world because of a bogus id)."""
    net = {i for i in net_ids if i}
    mnt = {i for i in mnt_ids if i}
    me = os.getpid()
    for pid in (me, 1):
        net.discard(_ns_link(pid, "net"))
        mnt.discard(_ns_link(pid, "mnt"))
    if not net and not mnt:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in (1, me):
            continue
        if (net and _ns_link(pid, "net") in net) or \
           (mnt and _ns_link(pid, "mnt") in mnt):
            out.append(pid)
    return sorted(out)


def _kill_all(net_ids, mnt_ids, extra_pids: Iterable[int] = (),
              timeout: float = KILL_TIMEOUT) -> list[int]:
    """SIGKILL everything in the given namespaces until nothing is left.
    Returns the pids still alive after the timeout (normally [])."""
    for pid in extra_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        pids = _pids_in(net_ids, mnt_ids)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > deadline:
            return pids
        time.sleep(0.01)


def _clean_env(user: pwd.struct_passwd, extra: dict | None) -> dict:
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell or "/bin/sh",
        "PATH": USER_PATH if user.pw_uid else ROOT_PATH,
    }
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _setpriv(user: pwd.struct_passwd) -> list[str]:
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
            "--init-groups", "--"]


def _argv(argv) -> list[str]:
    if isinstance(argv, str):
        return ["/bin/sh", "-c", argv]
    return [os.fspath(a) for a in argv]


def free_subnets() -> list[int]:
    """The X of every 10.200.X.0/24 no address or route of this machine uses
    (other beds' included: hold the global lock while choosing)."""
    used = set()
    for line in (_run(["ip", "-o", "-4", "addr", "show"]).stdout +
                 _run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout).splitlines():
        for m in re.finditer(r"\b10\.200\.(\d+)\.", line):
            used.add(int(m.group(1)))
    return [x for x in range(1, 255) if x not in used]


def _global_lock():
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _global_unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def requirements_missing() -> str | None:
    """Why the bed cannot run here (None if it can)."""
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces, useradd)"
    for tool in ("ip", "tc", "unshare", "nsenter", "setpriv", "useradd",
                 "userdel", "pkill", "ssh", "ssh-keygen", "mount"):
        if not shutil.which(tool, path=ROOT_PATH):
            return f"the multi-host test bed needs {tool!r}"
    if not os.access(SSHD, os.X_OK):
        return f"the multi-host test bed needs {SSHD} (openssh-server)"
    if not os.path.isdir("/sys/class/net"):
        return "no /sys/class/net"
    return None


def sha256_of(path: str) -> str:
    """The SHA-256 of a file (a copy on a host, seen from here), in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
