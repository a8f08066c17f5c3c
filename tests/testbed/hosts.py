"""The bed's hosts (a network, mount and UTS namespace running sshd) and users."""

from __future__ import annotations

import os
import pwd
import subprocess

from .removal import _in_cgroup
from .system import (
    CGROUP_CPU,
    KILL_TIMEOUT,
    NS_PREFIX,
    VETH_PREFIX,
    TestBedError,
    _argv,
    _clean_env,
    _kill_all,
    _netns_id,
    _ns_link,
    _pids_in,
    _proc_start,
    _run,
    _setpriv,
)

TYPE_CHECKING = False
if TYPE_CHECKING:   # a bed holds its hosts; only annotations name it here
    from .bed import TestBed


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

    def __init__(self, bed: TestBed, name: str, ip: str, index: int):
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
        # its network: eth0 on `bridge` with `lan_ip` (the address others
        # know it by, `ip`, differs for a site's gateway: sites.py), the
        # commands that create its other links (run once its netns exists)
        # and the lines that set its routes and links up inside the netns
        self.bridge = bed.bridge
        self.lan_ip = ip
        self.link_commands: list[list[str]] = []
        self.net_lines = [f"ip route add default via {bed.gateway_ip}"]
        self.site: str | None = None
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
                "killed": self.killed, "site": self.site, "lan_ip": self.lan_ip}

    @classmethod
    def _from_state(cls, bed, name, d) -> Host:
        h = cls(bed, name, d["ip"], d["index"])
        h.ns, h.veth = d["ns"], d["veth"]
        h.down, h.no_python = d.get("down", False), d.get("no_python", False)
        h.net_id, h.mnt_id = d.get("net_id"), d.get("mnt_id")
        h.killed = d.get("killed", False)
        h.site, h.lan_ip = d.get("site"), d.get("lan_ip", h.ip)
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
