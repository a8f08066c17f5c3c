"""The test bed: its directory and state file, the bridge, hosts brought up
in parallel, and teardown."""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import threading
import warnings
from typing import Iterable

from .bed_users import BedUsers
from .hosts import Host, User
from .registry import _LIVE, _LIVE_LOCK, _install_hooks
from .removal import _delete_net, _remove_cgroups, _remove_dir, _remove_user
from .sites import SiteNetwork
from .sshd_hosts import SshdHosts
from .system import (
    _NAME_RE,
    BASE_DIR,
    BRIDGE_PREFIX,
    CGROUP_CPU,
    DIR_PREFIX,
    KILL_TIMEOUT,
    NET_PREFIX,
    SSHD,
    TestBedError,
    _global_lock,
    _global_unlock,
    _kill_all,
    _mkdir,
    _netns_id,
    _proc_start,
    _run,
    _write,
    free_subnets,
    requirements_missing,
)


class TestBed(SiteNetwork, SshdHosts, BedUsers):
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
        self._bridges_made: list[str] = []          # a sites bed's bridges
        self._procs: list[subprocess.Popen] = []    # e.g. the WAN relay
        self.sites: dict[str, list[str]] = {}       # site -> its hosts
        self.gateways: dict[str, str] = {}          # site -> its gateway
        self.wan: dict | None = None                # rate, rtt_ms, subnet

    # -- context manager ----------------------------------------------
    def __enter__(self) -> TestBed:
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
            "users": self._users_made, "bridges": self._bridges_made,
            "sites": self.sites, "gateways": self.gateways, "wan": self.wan,
            "hosts": {n: h._to_state() for n, h in self.hosts.items()},
        }

    def _save(self) -> None:
        with self._lock:
            if self.dir and not self._done and os.path.isdir(self.dir):
                _write(os.path.join(self.dir, "state.json"),
                       json.dumps(self._state(), indent=1), 0o644)

    @classmethod
    def attach(cls, path: str) -> TestBed:
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
        bed._bridges_made = list(st.get("bridges", []))
        bed.sites, bed.gateways = st.get("sites", {}), st.get("gateways", {})
        bed.wan = st.get("wan")
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

        return self._start_all()

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
            free = free_subnets()
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
            procs = [h._proc for h in hosts if h._proc is not None] + self._procs
            mine = [p.pid for p in procs if p.poll() is None]
            left = _kill_all(net_ids, mnt_ids, mine)
            if left:
                problems.append(f"processes survived SIGKILL: {left}")
            for p in procs:
                try:
                    p.wait(timeout=KILL_TIMEOUT)
                except subprocess.TimeoutExpired:
                    problems.append(f"process {p.args[:4]} did not exit")
                if p.stdout is not None:
                    p.stdout.close()
            for h in hosts:
                h._release()
            for u in list(dict.fromkeys(self._users_made)):
                try:
                    _remove_user(u)
                except Exception as e:
                    problems.append(str(e))
            self.users.clear()
            problems += _remove_cgroups([h.cgroup for h in hosts if h.cgroup])
            problems += _delete_net(nss, self._veths_made,
                                    ([self.bridge] if self.bridge else []) + self._bridges_made)
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
