"""Multi-host test bed for gxpstyle: many "hosts" on one Linux machine.

Every host is a network namespace (its own IP on a private bridge) plus its
own mount and UTS namespace (own hostname, private /tmp, private scratch
directory, optionally hidden paths and a broken python3), running a real
OpenSSH server.  Ordinary users created by the bed can ``ssh tb01`` etc. with
public-key authentication, exactly like on a cluster with a shared /home.

Standard library only (this must run before any venv exists); needs root,
iproute2, util-linux (unshare, nsenter, setpriv) and openssh-server.

Typical use::

    with TestBed() as bed:
        bed.up(["tb01", "tb02", "tb03"], no_python={"tb03"})
        bed.add_user("alice")
        r = bed.run_as("alice", ["ssh", "tb01", "hostname"],
                       capture_output=True, text=True)
        assert r.stdout.strip() == "tb01"
        assert bed.host("tb01").pids() == []

Layout of the bed directory ``/var/tmp/gxptb-<tag>`` (0755)::

    state.json            everything needed by teardown()/sweep()/attach()
    ssh_config            Host entries for every host (IdentityFile %d/...)
    known_hosts           host keys of every host, by name and by IP
    etc_hosts             bind-mounted over /etc/hosts on every host
    resolv.conf           bind-mounted over /etc/resolv.conf: the hosts have
                          no DNS (lookups fail at once instead of timing out)
    scratch/              same path on every host; each host bind-mounts
                          hosts/<name>/scratch over it
    hosts/<name>/tmp      backing directory of the host's private /tmp
    hosts/<name>/scratch  backing directory of the host's scratch dir
    hosts/<name>/keys/    host keys (0700)
    hosts/<name>/sshd_config, boot.sh, sshd.log, sshd.pid

CPU share (optional, ``up(..., cpu_share=0.25)``): a cgroup v1 cpu controller
group ``/sys/fs/cgroup/cpu/gxptb<tag>-<host>`` per host whose CFS quota is that
fraction of one CPU; the host's sshd starts in it, so every process of the
host (ssh sessions, agents, recipes; ``Host.exec`` too) shares that CPU time,
as on a machine of its own.  teardown() and sweep() remove the groups.

Clean-up: ``teardown()`` (idempotent; also run by the context manager, by
atexit and on SIGTERM/SIGHUP) and ``sweep()`` for leftovers of crashed runs.
Everything the bed creates carries a recognisable name: network namespaces
``gxptb<tag>-<host>``, bridge ``gxb<tag>``, veths ``gxv<tag><n>``, directory
``/var/tmp/gxptb-<tag>``, users with GECOS ``gxptb <tag>``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

__all__ = ["TestBed", "Host", "User", "TestBedError", "sweep", "list_beds",
           "requirements_missing"]

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
_BR_RE = re.compile(r"^gxb([0-9a-f]{6})$")
_VETH_RE = re.compile(r"^gxv([0-9a-f]{6})[0-9]+$")
_DIR_RE = re.compile(r"^gxptb-([0-9a-z_]+)$")


class TestBedError(RuntimeError):
    """A command of the bed failed or the bed is misused."""

    __test__ = False   # keep pytest from collecting it


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# registry for atexit / signals
# --------------------------------------------------------------------------

_LIVE: set["TestBed"] = set()
_LIVE_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def _teardown_live() -> None:
    with _LIVE_LOCK:
        beds = list(_LIVE)
    for bed in beds:
        try:
            bed.teardown()
        except Exception as e:   # pragma: no cover - best effort at exit
            print(f"testbed: teardown of {bed.dir} failed: {e}",
                  file=sys.stderr)


def _on_signal(signum, frame):
    _teardown_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(_teardown_live)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _on_signal)
            except (ValueError, OSError):
                pass


# --------------------------------------------------------------------------
# hosts and users
# --------------------------------------------------------------------------

class User:
    """A user created by the bed (name, uid, gid, home, key = private key)."""

    __test__ = False

    def __init__(self, name: str):
        pw = pwd.getpwnam(name)
        self.name = name
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.home = pw.pw_dir
        self.key = os.path.join(self.home, ".ssh", "id_ed25519")

    def __repr__(self):
        return f"User({self.name!r}, uid={self.uid})"


class Host:
    """One host of the bed.

    Attributes: name, ip, ns (netns name), veth (bridge-side veth),
    dir (<bed>/hosts/<name>), scratch_dir and tmp_dir (backing directories
    in the root namespace of the host's scratch dir and /tmp), down (True if
    no sshd was started), pid (the sshd listener that holds the host's mount
    and UTS namespace; None if down), net_id / mnt_id (namespace ids as
    recorded at start; informational -- namespace inode numbers are reused
    once a namespace dies, so killing and pids() use _ids()).
    """

    __test__ = False

    def __init__(self, bed: "TestBed", name: str, ip: str, index: int):
        self.bed = bed
        self.name = name
        self.ip = ip
        self.index = index
        self.ns = f"{NS_PREFIX}{bed.tag}-{name}"
        self.veth = f"{VETH_PREFIX}{bed.tag}{index}"
        self.dir = os.path.join(bed.dir, "hosts", name)
        self.scratch_dir = os.path.join(self.dir, "scratch")
        self.tmp_dir = os.path.join(self.dir, "tmp")
        self.down = False
        self.no_python = False
        self.pid: int | None = None
        self.net_id: str | None = None
        self.mnt_id: str | None = None
        self.killed = False
        self._proc: subprocess.Popen | None = None
        self._mnt_fd: int | None = None   # pins the mount ns (and its id)
        # cpu cgroup holding every process of the host (None: no CPU share)
        self.cgroup = os.path.join(CGROUP_CPU, self.ns) if bed.cpu_share else None

    def __repr__(self):
        state = "down" if self.down else ("killed" if self.killed else "up")
        return f"Host({self.name!r}, {self.ip}, {state})"

    # -- state ---------------------------------------------------------
    def _to_state(self) -> dict:
        return {"ip": self.ip, "index": self.index, "ns": self.ns,
                "veth": self.veth, "down": self.down,
                "no_python": self.no_python, "pid": self.pid,
                "pid_start": _proc_start(self.pid) if self.pid else None,
                "net_id": self.net_id, "mnt_id": self.mnt_id,
                "killed": self.killed}

    @classmethod
    def _from_state(cls, bed, name, d) -> "Host":
        h = cls(bed, name, d["ip"], d["index"])
        h.ns, h.veth = d["ns"], d["veth"]
        h.down, h.no_python = d.get("down", False), d.get("no_python", False)
        h.net_id, h.mnt_id = d.get("net_id"), d.get("mnt_id")
        h.killed = d.get("killed", False)
        pid = d.get("pid")
        if pid and d.get("pid_start") and _proc_start(pid) == d["pid_start"]:
            h.pid = pid
        return h

    @property
    def host_key(self) -> str | None:
        """'ssh-ed25519 AAAA...' of this host (None before up())."""
        try:
            with open(os.path.join(self.dir, "keys",
                                   "ssh_host_ed25519_key.pub")) as f:
                return " ".join(f.read().split()[:2])
        except OSError:
            return None

    @property
    def alive(self) -> bool:
        """True if the host's sshd listener is running."""
        if self.pid is None:
            return False
        if self._proc is not None:
            return self._proc.poll() is None
        return self.mnt_id is not None and _ns_link(self.pid, "mnt") == self.mnt_id

    def _ids(self) -> tuple[str | None, str | None]:
        """(net, mnt) namespace ids that certainly are this host's.

        The net ns is pinned by /run/netns/<ns>.  The mount ns is pinned by
        an open fd in the process that started the host; otherwise (bed
        attached from another process) the recorded id is trusted only if
        some process of the host's netns is in it, because a dead
        namespace's inode number can be handed to a new, unrelated one."""
        net = _netns_id(self.ns)
        if self._mnt_fd is not None or not self.mnt_id:
            return net, self.mnt_id
        if net and any(_ns_link(p, "mnt") == self.mnt_id
                       for p in _pids_in([net])):
            return net, self.mnt_id
        return net, None

    def _release(self) -> None:
        if self._mnt_fd is not None:
            os.close(self._mnt_fd)
            self._mnt_fd = None

    # -- inspection ----------------------------------------------------
    def pids(self) -> list[int]:
        """Every process in this host's net or mount namespace, except the
        sshd listener (the bed's namespace holder)."""
        net, mnt = self._ids()
        return [p for p in _pids_in([net], [mnt]) if p != self.pid]

    def mounts(self) -> list[str]:
        """Lines of /proc/<pid>/mounts as seen on the host ([] if dead)."""
        if not self.alive:
            return []
        try:
            with open(f"/proc/{self.pid}/mounts") as f:
                return f.read().splitlines()
        except OSError:
            return []

    def exec(self, argv, user: str | None = None, env: dict | None = None,
             **kw) -> subprocess.CompletedProcess:
        """Run argv (list, or str for /bin/sh -c) inside this host's net,
        mount and UTS namespaces, as root or as `user` (clean login-like
        environment, cwd = home unless cwd= is given; cwd is interpreted on
        the host).  Other keyword arguments go to subprocess.run; stdin
        defaults to /dev/null."""
        if self.down or not self.alive:
            raise TestBedError(f"host {self.name} is not running")
        pw = pwd.getpwnam(user) if user else pwd.getpwuid(0)
        cwd = kw.pop("cwd", None) or (pw.pw_dir if user else "/")
        cmd = ["nsenter", "-t", str(self.pid), "-n", "-m", "-u",
               f"--wdns={cwd}", "--"]
        if user:
            cmd += _setpriv(pw)
        if self.cgroup:
            cmd = _in_cgroup(self.cgroup) + cmd
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(cmd + _argv(argv), env=_clean_env(pw, env), **kw)

    # -- failures ------------------------------------------------------
    def kill(self, unplug: bool = False) -> None:
        """SIGKILL everything on the host, sshd included (a crashed
        machine).  Afterwards ssh to it fails with "Connection refused"
        (the IP stays).  With unplug=True the host's link is cut first,
        so peers see neither FIN nor RST and new connections time out
        ("No route to host")."""
        if unplug:
            self.unplug()
        net, mnt = self._ids()
        left = _kill_all([net], [mnt], [self.pid] if self.alive else [])
        if self._proc is not None:
            try:
                self._proc.wait(timeout=KILL_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        self.killed = True
        self.bed._save()
        if left:
            raise TestBedError(f"{self.name}: processes survived SIGKILL: {left}")

    def unplug(self) -> None:
        """Cut the host's network cable (bridge side of its veth down)."""
        _run(["ip", "link", "set", "dev", self.veth, "down"])

    def plug(self) -> None:
        """Undo unplug()."""
        _run(["ip", "link", "set", "dev", self.veth, "up"])


# --------------------------------------------------------------------------
# the bed
# --------------------------------------------------------------------------

class TestBed:
    """A set of ssh-reachable hosts in namespaces; see the module docstring.

    Nothing is created before up() or add_user().  Use as a context
    manager; teardown() also runs at interpreter exit and on SIGTERM/SIGHUP
    unless detach() was called (the CLI does that).
    """

    __test__ = False

    def __init__(self, base: str = BASE_DIR):
        self.base = base
        self.tag: str | None = None
        self.dir: str | None = None
        self.bridge: str | None = None
        self.subnet: str | None = None       # e.g. "10.200.7"
        self.gateway_ip: str | None = None   # bridge IP, e.g. "10.200.7.1"
        self.hosts: dict[str, Host] = {}
        self.users: dict[str, User] = {}
        self.bw: str | None = None
        self.cpu_share: float | None = None   # of one CPU, per host
        self.hide_paths: list[str] = []
        self.persistent = False
        self._owner = (os.getpid(), _proc_start(os.getpid()))
        self._lock = threading.RLock()
        self._done = False
        self._netns_made: list[str] = []
        self._veths_made: list[str] = []
        self._users_made: list[str] = []

    # -- context manager ----------------------------------------------
    def __enter__(self) -> "TestBed":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def __repr__(self):
        return f"TestBed({self.dir!r}, hosts={list(self.hosts)})"

    # -- paths ---------------------------------------------------------
    @property
    def ssh_config(self) -> str:
        return os.path.join(self.dir, "ssh_config")

    @property
    def known_hosts(self) -> str:
        return os.path.join(self.dir, "known_hosts")

    @property
    def scratch(self) -> str:
        """<bed>/scratch: same path on every host, private per host."""
        return os.path.join(self.dir, "scratch")

    def host(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    # -- state file ----------------------------------------------------
    def _state(self) -> dict:
        return {
            "tag": self.tag, "dir": self.dir, "owner_pid": self._owner[0],
            "owner_start": self._owner[1], "persistent": self.persistent,
            "bridge": self.bridge, "subnet": self.subnet,
            "gateway_ip": self.gateway_ip, "bw": self.bw,
            "cpu_share": self.cpu_share,
            "hide_paths": self.hide_paths,
            "netns": self._netns_made, "veths": self._veths_made,
            "users": self._users_made,
            "hosts": {n: h._to_state() for n, h in self.hosts.items()},
        }

    def _save(self) -> None:
        with self._lock:
            if self.dir and not self._done and os.path.isdir(self.dir):
                _write(os.path.join(self.dir, "state.json"),
                       json.dumps(self._state(), indent=1), 0o644)

    @classmethod
    def attach(cls, path: str) -> "TestBed":
        """A TestBed object for an existing bed directory (e.g. made by
        `scripts/testbed up`), able to inspect it and tear it down."""
        with open(os.path.join(path, "state.json")) as f:
            st = json.load(f)
        bed = cls(base=os.path.dirname(path.rstrip("/")))
        bed.tag, bed.dir = st["tag"], st["dir"]
        bed.bridge, bed.subnet = st.get("bridge"), st.get("subnet")
        bed.gateway_ip, bed.bw = st.get("gateway_ip"), st.get("bw")
        bed.cpu_share = st.get("cpu_share")
        bed.hide_paths = st.get("hide_paths", [])
        bed.persistent = st.get("persistent", False)
        bed._owner = (st.get("owner_pid"), st.get("owner_start"))
        bed._netns_made = list(st.get("netns", []))
        bed._veths_made = list(st.get("veths", []))
        bed._users_made = list(st.get("users", []))
        for n, d in st.get("hosts", {}).items():
            bed.hosts[n] = Host._from_state(bed, n, d)
        for u in bed._users_made:
            try:
                bed.users[u] = User(u)
            except KeyError:
                pass
        return bed

    def detach(self) -> None:
        """Leave the bed running after this process exits (no atexit
        teardown); `scripts/testbed down DIR` or sweep(all=True) removes it."""
        with self._lock:
            self.persistent = True
            self._save()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    # -- creation ------------------------------------------------------
    def _ensure_dir(self) -> None:
        if self._done:
            raise TestBedError("this bed was torn down already")
        if self.dir:
            return
        if requirements_missing():
            raise TestBedError(requirements_missing())
        os.makedirs(self.base, exist_ok=True)
        for _ in range(100):
            tag = secrets.token_hex(3)
            if os.path.exists(f"/sys/class/net/{BRIDGE_PREFIX}{tag}"):
                continue
            path = os.path.join(self.base, DIR_PREFIX + tag)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover
            raise TestBedError("could not create a bed directory")
        os.chmod(path, 0o755)
        self.tag, self.dir = tag, path
        with _LIVE_LOCK:
            _LIVE.add(self)
        _install_hooks()
        self._save()
        _mkdir(os.path.join(path, "hosts"), 0o755)
        _mkdir(self.scratch, 0o1777)

    def up(self, names: Iterable[str], bw: str | None = None,
           no_python: Iterable[str] = frozenset(),
           down: Iterable[str] = frozenset(),
           hide_paths: Iterable[str] = (),
           cpu_share: float | None = None) -> list[Host]:
        """Create and start the hosts `names` (in parallel).

        bw:         e.g. "100mbit": tbf qdisc on both ends of every veth.
        no_python:  hosts on which python3 exits 127 "command not found".
        down:       hosts that get an IP, ssh config and known_hosts entries
                    but no sshd ("Connection refused").
        hide_paths: paths covered by an empty tmpfs (0755) on every host.
        cpu_share:  CPU time of each host, a fraction of one CPU (e.g. 0.25:
                    8 hosts fit in 2 cores without contending); None: the
                    hosts share the machine's CPUs freely.
        Returns the Host objects in order.  On failure, raises; whatever was
        created is still removed by teardown()."""
        names = list(names)
        no_python, down = set(no_python), set(down)
        with self._lock:
            if self.hosts:
                raise TestBedError("up() can only be called once per bed")
            if not names:
                raise TestBedError("no host names given")
            if len(set(names)) != len(names):
                raise TestBedError(f"duplicate host names: {names}")
            if len(names) > 250:
                raise TestBedError("at most 250 hosts per bed")
            for n in names:
                if not _NAME_RE.match(n):
                    raise TestBedError(f"bad host name {n!r}")
            for what, s in (("no_python", no_python), ("down", down)):
                if s - set(names):
                    raise TestBedError(f"{what} names unknown hosts: "
                                       f"{sorted(s - set(names))}")
            if cpu_share is not None:
                if not 0.01 <= cpu_share <= (os.cpu_count() or 1):
                    raise TestBedError(f"cpu_share {cpu_share} is not in "
                                       f"0.01..{os.cpu_count()}")
                if not os.path.isdir(CGROUP_CPU):
                    raise TestBedError(f"no cgroup v1 cpu controller at {CGROUP_CPU}")
            self._ensure_dir()
            self.cpu_share = cpu_share
            hide = self._check_hide(hide_paths)
            self.bw, self.hide_paths = bw, hide
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
            self._make_bridge()
            for i, n in enumerate(names):
                h = Host(self, n, f"{self.subnet}.{i + 2}", i)
                h.down = n in down
                h.no_python = n in no_python
                self.hosts[n] = h
            self._save()

        workers = max(1, min(MAX_WORKERS, len(names)))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(self._prepare_host, self.hosts.values()))
            self._write_shared_files()
            futures = [pool.submit(self._start_host, h)
                       for h in self.hosts.values()]
            errors = []
            for f in futures:
                try:
                    f.result()
                except Exception as e:
                    errors.append(e)
        self._save()
        with self._lock:
            for u in self.users.values():
                self._write_user_files(u)
        if errors:
            raise errors[0]
        return list(self.hosts.values())

    def _check_hide(self, paths: Iterable[str]) -> list[str]:
        out = []
        protect = [self.dir, SSHD, "/run/sshd", "/etc/ssh", "/home",
                   "/usr/bin/python3", "/usr/lib/openssh"]
        for p in paths:
            p = os.path.realpath(os.fspath(p))
            for q in protect:
                if q == p or q.startswith(p.rstrip("/") + "/"):
                    raise TestBedError(f"hide path {p} would hide {q}")
            out.append(p)
        return out

    def _make_bridge(self) -> None:
        br = f"{BRIDGE_PREFIX}{self.tag}"
        fd = _global_lock()
        try:
            used = set()
            for line in (_run(["ip", "-o", "-4", "addr", "show"]).stdout +
                         _run(["ip", "-4", "route", "show", "table", "all"],
                              check=False).stdout).splitlines():
                for m in re.finditer(r"\b10\.200\.(\d+)\.", line):
                    used.add(int(m.group(1)))
            free = [x for x in range(1, 255) if x not in used]
            if not free:
                raise TestBedError("no free 10.200.X.0/24 subnet")
            x = random.choice(free)
            self.bridge = br
            self.subnet = f"{NET_PREFIX}.{x}"
            self.gateway_ip = f"{self.subnet}.1"
            self._save()
            _run(["ip", "link", "add", br, "type", "bridge"])
            self._sysctl_if(br)
            _run(["ip", "addr", "add", f"{self.gateway_ip}/24", "dev", br])
            _run(["ip", "link", "set", br, "up"])
        finally:
            _global_unlock(fd)

    @staticmethod
    def _sysctl_if(dev: str) -> None:
        # No IPv6 chatter, and never forward the hosts' packets anywhere.
        for path, val in ((f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "1"),
                          (f"/proc/sys/net/ipv4/conf/{dev}/forwarding", "0")):
            try:
                with open(path, "w") as f:
                    f.write(val)
            except OSError:
                pass

    def _prepare_host(self, h: Host) -> None:
        _mkdir(h.dir, 0o755)
        _mkdir(h.tmp_dir, 0o1777)
        _mkdir(h.scratch_dir, 0o1777)
        keys = os.path.join(h.dir, "keys")
        _mkdir(keys, 0o700)
        key = os.path.join(keys, "ssh_host_ed25519_key")
        if not os.path.exists(key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                  "-C", f"root@{h.name}", "-f", key])
        _write(os.path.join(h.dir, "sshd_config"), self._sshd_config(h), 0o644)
        _write(os.path.join(h.dir, "boot.sh"), self._boot_script(h), 0o755)
        if h.no_python:
            _write(os.path.join(h.dir, "fake-python"),
                   "#!/bin/sh\necho 'python3: command not found' >&2\n"
                   "exit 127\n", 0o755)

    def _sshd_config(self, h: Host) -> str:
        return "\n".join([
            f"# gxptb host {h.name}",
            f"ListenAddress {h.ip}:22",
            f"HostKey {h.dir}/keys/ssh_host_ed25519_key",
            f"PidFile {h.dir}/sshd.pid",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "StrictModes yes",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "LogLevel ERROR",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "MaxStartups 200",
            "MaxSessions 100",
            "AcceptEnv LANG LC_*",
            f"Subsystem sftp {SFTP_SERVER}",
            "",
        ])

    @staticmethod
    def _python_files() -> list[str]:
        """Real files behind python/python3/python3.N in the users' PATH."""
        out = []
        for d in USER_PATH.split(":"):
            for p in glob.glob(os.path.join(d, "python*")):
                base = os.path.basename(p)
                if not re.match(r"^python(3(\.\d+)?)?$", base):
                    continue
                real = os.path.realpath(p)
                if os.path.isfile(real) and real not in out:
                    out.append(real)
        return out

    def _boot_script(self, h: Host) -> str:
        q = shlex.quote
        lines = [
            "#!/bin/sh",
            "# run by: ip netns exec NS unshare --mount --uts "
            "--propagation private",
            "set -e",
            # copies of other beds' /run/netns/* mounts would pin their netns
            "umount -l /run/netns 2>/dev/null || true",
            f"hostname {q(h.name)}",
            f"mount --bind {q(h.tmp_dir)} /tmp",
            f"mount --bind {q(h.scratch_dir)} {q(self.scratch)}",
            f"mount --bind {q(os.path.join(self.dir, 'etc_hosts'))} /etc/hosts",
            "if [ -e /etc/resolv.conf ]; then mount --bind "
            f"{q(os.path.join(self.dir, 'resolv.conf'))} /etc/resolv.conf; fi",
        ]
        if h.no_python:
            fake = os.path.join(h.dir, "fake-python")
            for real in self._python_files():
                lines.append(f"mount --bind {q(fake)} {q(real)}")
        for p in self.hide_paths:
            lines.append(f"if [ -e {q(p)} ]; then mount -t tmpfs -o "
                         f"mode=0755,size=1m gxptb-hidden {q(p)}; fi")
        lines.append(f"exec {SSHD} -D -e -f {q(os.path.join(h.dir, 'sshd_config'))}")
        return "\n".join(lines) + "\n"

    def _write_shared_files(self) -> None:
        try:
            with open("/etc/hosts") as f:
                etc_hosts = f.read()
        except OSError:
            etc_hosts = "127.0.0.1 localhost\n"
        if not etc_hosts.endswith("\n"):
            etc_hosts += "\n"
        etc_hosts += f"# gxptb bed {self.tag}\n" + "".join(
            f"{h.ip}\t{h.name}\n" for h in self.hosts.values())
        _write(os.path.join(self.dir, "etc_hosts"), etc_hosts, 0o644)
        # The hosts cannot reach any name server; point them at their own
        # loopback so that a lookup of an unknown name fails immediately.
        _write(os.path.join(self.dir, "resolv.conf"),
               "# gxptb test host: no DNS; bed hosts are in /etc/hosts\n"
               "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n", 0o644)
        _write(self.known_hosts, self._known_hosts_text(), 0o644)
        _write(self.ssh_config, self._ssh_config_text(None), 0o644)

    def _known_hosts_text(self) -> str:
        out = []
        for h in self.hosts.values():
            key = h.host_key
            if key:
                out.append(f"{h.name},{h.ip} {key}\n")
        return "".join(out)

    def _ssh_config_text(self, user: str | None) -> str:
        out = [f"# gxptb bed {self.dir}\n"]
        for h in self.hosts.values():
            out.append(f"Host {h.name}\n    HostName {h.ip}\n")
            if user:
                out.append(f"    User {user}\n"
                           "    IdentityFile ~/.ssh/id_ed25519\n")
            else:
                out.append("    IdentityFile %d/.ssh/id_ed25519\n"
                           f"    UserKnownHostsFile {self.known_hosts}\n")
            out.append("    StrictHostKeyChecking yes\n"
                       "    BatchMode yes\n"
                       "    ConnectTimeout 5\n")
        return "".join(out)

    def _start_host(self, h: Host) -> None:
        with self._lock:
            self._netns_made.append(h.ns)
            self._veths_made.append(h.veth)
            self._save()
        _run(["ip", "netns", "add", h.ns])
        h.net_id = _netns_id(h.ns)
        _run(["ip", "link", "add", h.veth, "type", "veth",
              "peer", "name", "eth0", "netns", h.ns])
        self._sysctl_if(h.veth)
        _run(["ip", "link", "set", h.veth, "master", self.bridge, "up"])
        inner = [
            "echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 || true",
            "ip link set lo up",
            f"ip addr add {h.ip}/24 dev eth0",
            "ip link set eth0 up",
            f"ip route add default via {self.gateway_ip}",
        ]
        if self.bw:
            tbf = f"tbf rate {shlex.quote(self.bw)} burst 256kb latency 50ms"
            inner.append(f"tc qdisc add dev eth0 root {tbf}")
        _run(["ip", "netns", "exec", h.ns, "/bin/sh", "-ec",
              "\n".join(inner)])
        if self.bw:
            _run(["tc", "qdisc", "add", "dev", h.veth, "root", "tbf", "rate",
                  self.bw, "burst", "256kb", "latency", "50ms"])
        if h.down:
            return
        wrap = []
        if h.cgroup and self.cpu_share:
            os.mkdir(h.cgroup)
            for knob, val in (("cpu.cfs_period_us", CFS_PERIOD_US),
                              ("cpu.cfs_quota_us", int(CFS_PERIOD_US * self.cpu_share))):
                with open(os.path.join(h.cgroup, knob), "w") as f:
                    f.write(f"{val}\n")
            wrap = _in_cgroup(h.cgroup)   # before ip netns exec hides /sys/fs/cgroup
        log = open(os.path.join(h.dir, "sshd.log"), "ab")
        try:
            h._proc = subprocess.Popen(
                wrap + ["ip", "netns", "exec", h.ns, "unshare", "--mount", "--uts",
                        "--propagation", "private", "--", "/bin/sh",
                        os.path.join(h.dir, "boot.sh")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={"PATH": ROOT_PATH, "LANG": "C.UTF-8"},
                start_new_session=True, close_fds=True)
        finally:
            log.close()
        h.pid = h._proc.pid
        self._save()
        self._wait_listening(h)
        fd = os.open(f"/proc/{h.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        h._mnt_fd = fd
        h.mnt_id = f"mnt:[{os.fstat(fd).st_ino}]"
        self._save()

    def _wait_listening(self, h: Host) -> None:
        want = bytes(reversed(bytes(int(x) for x in h.ip.split(".")))).hex()
        want = f"{want.upper()}:0016"
        deadline = time.monotonic() + START_TIMEOUT
        delay = 0.002
        while True:
            if h._proc.poll() is not None:
                raise TestBedError(
                    f"sshd of {h.name} exited ({h._proc.returncode}): "
                    f"{self._log_tail(h)}")
            try:
                with open(f"/proc/{h.pid}/net/tcp") as f:
                    for line in f.read().splitlines()[1:]:
                        fields = line.split()
                        if fields[1] == want and fields[3] == "0A":
                            return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TestBedError(f"sshd of {h.name} did not listen within "
                                   f"{START_TIMEOUT}s: {self._log_tail(h)}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    @staticmethod
    def _log_tail(h: Host) -> str:
        try:
            with open(os.path.join(h.dir, "sshd.log"), errors="replace") as f:
                return f.read()[-2000:].strip()
        except OSError:
            return ""

    # -- users ---------------------------------------------------------
    def add_user(self, name: str) -> User:
        """Create an ordinary user (useradd -m -s /bin/bash, GECOS
        'gxptb <tag>') with an ed25519 key authorized on every host, and
        ~/.ssh/known_hosts and ~/.ssh/config for all hosts of the bed."""
        if not re.match(r"^[a-z_][a-z0-9_-]{0,30}$", name):
            raise TestBedError(f"bad user name {name!r}")
        with self._lock:
            self._ensure_dir()
            try:
                pwd.getpwnam(name)
            except KeyError:
                pass
            else:
                raise TestBedError(f"user {name} exists already")
            if os.path.lexists(os.path.join("/home", name)):
                raise TestBedError(f"/home/{name} exists already")
            self._users_made.append(name)
            self._save()
            argv = ["useradd", "-m", "-s", "/bin/bash", "-c",
                    f"{USER_MARK} {self.tag}", "-p", "*", name]
            for attempt in range(50):   # /etc/passwd may be locked briefly
                r = _run(argv, check=False)
                if r.returncode == 0:
                    break
                if r.returncode not in (1, 10) or attempt == 49:
                    raise TestBedError(f"useradd {name} failed: {r.stderr}")
                time.sleep(0.1)
            u = User(name)
            ssh = os.path.join(u.home, ".ssh")
            _mkdir(ssh, 0o700)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                  "-C", f"{name}@gxptb", "-f", u.key])
            with open(u.key + ".pub") as f:
                pub = f.read()
            _write(os.path.join(ssh, "authorized_keys"), pub, 0o600)
            for fn in ("", "id_ed25519", "id_ed25519.pub", "authorized_keys"):
                p = os.path.join(ssh, fn)
                os.chown(p, u.uid, u.gid)
                os.chmod(p, 0o700 if fn == "" else 0o600)
            self.users[name] = u
            self._write_user_files(u)
            return u

    def _write_user_files(self, u: User) -> None:
        ssh = os.path.join(u.home, ".ssh")
        for fn, text in (("known_hosts", self._known_hosts_text()),
                         ("config", self._ssh_config_text(u.name))):
            p = os.path.join(ssh, fn)
            _write(p, text, 0o600)
            os.chown(p, u.uid, u.gid)

    def remove_user(self, name: str) -> None:
        """Kill all processes of the user and userdel -r it."""
        with self._lock:
            _remove_user(name)
            self.users.pop(name, None)
            if name in self._users_made:
                self._users_made.remove(name)
            self._save()

    def run_as(self, user: str, argv, env: dict | None = None,
               **kw) -> subprocess.CompletedProcess:
        """Run argv (list, or str for /bin/sh -c) as `user` in the root
        namespaces (the "local" machine) with a clean login-like
        environment (HOME USER LOGNAME SHELL PATH=/usr/local/bin:/usr/bin:/bin
        plus `env`), cwd = home unless given, stdin = /dev/null unless
        given.  Other keyword arguments go to subprocess.run."""
        pw = pwd.getpwnam(user)
        kw.setdefault("cwd", pw.pw_dir)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(_setpriv(pw) + _argv(argv),
                              env=_clean_env(pw, env), **kw)

    def popen_as(self, user: str, argv, env: dict | None = None,
                 **kw) -> subprocess.Popen:
        """Like run_as but returns a Popen."""
        pw = pwd.getpwnam(user)
        kw.setdefault("cwd", pw.pw_dir)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(_setpriv(pw) + _argv(argv),
                                env=_clean_env(pw, env), **kw)

    # -- teardown ------------------------------------------------------
    def teardown(self) -> None:
        """Remove everything this bed created.  Idempotent; works after a
        partial up(); problems are reported as warnings, not raised."""
        with self._lock:
            if self._done or self.dir is None:
                self._done = True
                return
            problems = []
            hosts = list(self.hosts.values())
            nss = list(dict.fromkeys(self._netns_made + [h.ns for h in hosts]))
            ids = [h._ids() for h in hosts]
            net_ids = [i[0] for i in ids] + [_netns_id(n) for n in nss]
            mnt_ids = [i[1] for i in ids]
            mine = [h._proc.pid for h in hosts
                    if h._proc is not None and h._proc.poll() is None]
            left = _kill_all(net_ids, mnt_ids, mine)
            if left:
                problems.append(f"processes survived SIGKILL: {left}")
            for h in hosts:
                if h._proc is not None:
                    try:
                        h._proc.wait(timeout=KILL_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        problems.append(f"sshd of {h.name} did not exit")
                h._release()
            for u in list(dict.fromkeys(self._users_made)):
                try:
                    _remove_user(u)
                except Exception as e:
                    problems.append(str(e))
            self.users.clear()
            problems += _remove_cgroups([h.cgroup for h in hosts if h.cgroup])
            problems += _delete_net(nss, self._veths_made,
                                    [self.bridge] if self.bridge else [])
            problems += _remove_dir(self.dir)
            self._done = True
            with _LIVE_LOCK:
                _LIVE.discard(self)
            for p in problems:
                warnings.warn(f"testbed teardown {self.dir}: {p}",
                              RuntimeWarning, stacklevel=2)

    def owner_alive(self) -> bool:
        pid, start = self._owner
        return bool(pid) and start is not None and _proc_start(pid) == start


# --------------------------------------------------------------------------
# removal helpers shared by teardown() and sweep()
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------

def sha256_of(path: str) -> str:
    """The SHA-256 of a file (a copy on a host, seen from here), in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    if os.path.isdir(FUSE_HOLDERS) and close_fuse_to_users(None):
        note(f"{FUSE_DEVICE} mode restored (the runs that opened it died)")
    return done


# ---------------------------------------------------------------------------
# /dev/fuse open to ordinary users, shared by concurrent runs

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
