"""A wide-area bed: sites of hosts behind their gateways, joined by a WAN.

    bed.up_sites({"sa": ["sa01", "sa02"], "sb": ["sb01", "sb02"]},
                 gateways={"sa": "ga", "sb": "gb"},
                 wan_rate="20mbit", wan_rtt_ms=100)

Layout (X, Y, W: free 10.200.N subnets)::

    head (root ns) 10.200.W.254 ─┐
                                 │ veth gxv<tag>999 (tbf wan_rate both ends)
          router ns gxptb<tag>-_router, 10.200.W.1 on every link:
          nftables redirects forwarded TCP to the WAN relay (wan_relay.py:
          half the RTT each way); no route to any site's subnet
                │ veth (tbf wan_rate)        │ veth (tbf wan_rate)
    ga: wan0 10.200.W.2                gb: wan0 10.200.W.3
        eth0 10.200.X.1                    eth0 10.200.Y.1
          bridge gxb<tag>0                   bridge gxb<tag>1
    sa01 10.200.X.2, sa02 .3           sb01 10.200.Y.2, sb02 .3

A gateway is known everywhere by its WAN address (ssh_config, /etc/hosts);
its site's hosts reach that address through the gateway's address on their
bridge (a host route) and have no other route off their subnet, so anything
else fails at once ("Network is unreachable").  A gateway routes only the
WAN's subnet, to the router: another site's host is unreachable from it at
once too.  The head routes the sites' subnets to the router, which has no
route for them: connecting from the head to a site's host fails at once
("Network is unreachable", the router's ICMP answer; within a second when
that answer races connect() and waits for the SYN's retransmission: ICMP is
not queued for a socket its owner holds, so no answer here can be both
immediate and certain short of a route in the root namespace that would
outlive a crash).
Gateways do not forward.  Every TCP connection between a gateway and another
gateway or the head crosses the router and so the relay: one-way delay
wan_rtt_ms / 2 per direction; tbf on both ends of each WAN link gives each
site (and the head) wan_rate in and out.

Everything carries the bed's tag: the router namespace (its relay dies with
it), the veths, the site bridges gxb<tag><n>; the head's routes go with its
veth.  teardown() and sweep() remove them like the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from .hosts import Host
from .system import (
    _NAME_RE,
    BRIDGE_PREFIX,
    MAX_WORKERS,
    NET_PREFIX,
    NS_PREFIX,
    ROOT_PATH,
    START_TIMEOUT,
    VETH_PREFIX,
    TestBedError,
    _global_lock,
    _global_unlock,
    _run,
    free_subnets,
    requirements_missing,
)

RELAY_PORT = 7999
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wan_relay.py")
TBF_BURST = "64kb"         # a few ms at WAN rates: the rate holds over any window


def sites_requirements_missing() -> str | None:
    """Why a sites bed cannot run here (None if it can): the bed's own needs
    and nftables (the router's redirect to the WAN relay)."""
    missing = requirements_missing()
    if missing:
        return missing
    if not shutil.which("nft", path=ROOT_PATH):
        return "the sites bed needs 'nft' (nftables: scripts/install brings it)"
    return None


def _tbf(rate: str) -> list[str]:
    return ["root", "tbf", "rate", rate, "burst", TBF_BURST, "latency", "100ms"]


class SiteNetwork:
    """TestBed's part that builds sites and the WAN (a mixin: the state is TestBed's)."""

    def up_sites(self, sites: dict[str, list[str]], gateways: dict[str, str],
                 wan_rate: str = "20mbit", wan_rtt_ms: float = 100,
                 bw: str | None = None, hide_paths: Iterable[str] = (),
                 cpu_share: float | None = None) -> list[Host]:
        """Create and start the sites' hosts and gateways (see the module
        docstring).  bw shapes the links inside each site (None: unshaped);
        hide_paths and cpu_share as in up().  Returns the hosts, gateways
        first."""
        names = self._check_sites(sites, gateways, wan_rate, wan_rtt_ms)
        missing = sites_requirements_missing()
        if missing:
            raise TestBedError(missing)
        with self._lock:
            if self.hosts:
                raise TestBedError("a bed is brought up once (up() or up_sites())")
            self._ensure_dir()
            self.cpu_share, self.bw = cpu_share, bw
            self.hide_paths = self._check_hide(hide_paths)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
            subnets = self._claim_subnets(len(sites) + 1)
            self.sites = {s: list(hs) for s, hs in sites.items()}
            self.gateways = dict(gateways)
            self.wan = {"rate": wan_rate, "rtt_ms": wan_rtt_ms, "subnet": subnets[0]}
            self._save()
            self._make_router(subnets, wan_rate, wan_rtt_ms)
            for i, site in enumerate(sites):
                self._make_site(i, site, subnets[0], subnets[i + 1], names)
            self._save()
        return self._start_all()

    @staticmethod
    def _check_sites(sites, gateways, wan_rate, wan_rtt_ms) -> dict[str, int]:
        if not sites:
            raise TestBedError("no sites given")
        if set(gateways) != set(sites):
            raise TestBedError(f"every site needs one gateway: sites {sorted(sites)}, "
                               f"gateways {sorted(gateways)}")
        names = list(gateways.values()) + [h for hs in sites.values() for h in hs]
        if len(set(names)) != len(names):
            raise TestBedError(f"duplicate host names: {names}")
        if len(names) > 250 or len(sites) > 50:
            raise TestBedError("at most 250 hosts and 50 sites per bed")
        for n in names:
            if not _NAME_RE.match(n):
                raise TestBedError(f"bad host name {n!r}")
        if not re.match(r"^[0-9]+(\.[0-9]+)?[kmg]?bit$", wan_rate):
            raise TestBedError(f"bad WAN rate {wan_rate!r} (e.g. 20mbit)")
        if not 0 <= wan_rtt_ms <= 10000:
            raise TestBedError(f"WAN RTT {wan_rtt_ms} ms is not in 0..10000")
        return {n: i for i, n in enumerate(names)}

    def _claim_subnets(self, count: int) -> list[str]:
        """`count` free 10.200.N prefixes, held by routes in the root
        namespace before the global lock is let go (other beds look there)."""
        fd = _global_lock()
        try:
            free = free_subnets()
            if len(free) < count:
                raise TestBedError(f"no {count} free 10.200.X.0/24 subnets")
            subnets = [f"{NET_PREFIX}.{x}" for x in free[:count]]
            self._make_head_link(subnets)
            return subnets
        finally:
            _global_unlock(fd)

    @property
    def router_ns(self) -> str:
        return f"{NS_PREFIX}{self.tag}-_router"

    def _make_head_link(self, subnets: list[str]) -> None:
        wan = subnets[0]
        veth = f"{VETH_PREFIX}{self.tag}999"
        self._netns_made.append(self.router_ns)
        self._veths_made.append(veth)
        self.gateway_ip = f"{wan}.254"      # the head, as the hosts know it
        self._save()
        _run(["ip", "netns", "add", self.router_ns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "head0",
              "netns", self.router_ns])
        self._sysctl_if(veth)
        _run(["ip", "addr", "add", self.gateway_ip, "peer", f"{wan}.1", "dev", veth])
        _run(["ip", "link", "set", veth, "up"])
        # routes through the head's veth: they go when it goes
        for net in subnets:
            _run(["ip", "route", "add", f"{net}.0/24", "via", f"{wan}.1", "dev", veth])

    def _make_router(self, subnets: list[str], rate: str, rtt_ms: float) -> None:
        wan, r = subnets[0], self.router_ns
        veth = f"{VETH_PREFIX}{self.tag}999"
        _run(["tc", "qdisc", "add", "dev", veth] + _tbf(rate))
        script = "\n".join([
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
            # "unreachable" answers to every connect, not to the first few a second
            "echo 0 > /proc/sys/net/ipv4/icmp_ratelimit",
            "echo 100000 > /proc/sys/net/ipv4/icmp_msgs_per_sec",
            "echo 10000 > /proc/sys/net/ipv4/icmp_msgs_burst",
            "ip link set lo up",
            f"ip addr add {wan}.1 peer {self.gateway_ip} dev head0",
            "ip link set head0 up",
            f"tc qdisc add dev head0 {' '.join(_tbf(rate))}",
            "nft -f - <<'EOF'",
            "table ip gxwan {",
            "  chain prerouting {",
            "    type nat hook prerouting priority dstnat; policy accept;",
            f"    ip daddr {wan}.0/24 ip daddr != {wan}.1 meta l4proto tcp "
            f"redirect to :{RELAY_PORT}",
            "  }",
            "}",
            "EOF",
        ])
        _run(["ip", "netns", "exec", r, "/bin/sh", "-ec", script])
        self._start_relay(rtt_ms / 2)

    def _start_relay(self, one_way_ms: float) -> None:
        log = open(os.path.join(self.dir, "wan_relay.log"), "ab")
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.router_ns, sys.executable, RELAY,
                 str(RELAY_PORT), str(one_way_ms)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                env={"PATH": ROOT_PATH, "LANG": "C.UTF-8"},
                start_new_session=True, close_fds=True)
        finally:
            log.close()
        self._procs.append(proc)
        line = self._first_line(proc)
        if line != b"ready\n":
            raise TestBedError(f"the WAN relay did not start (see {self.dir}/wan_relay.log)")

    @staticmethod
    def _first_line(proc: subprocess.Popen) -> bytes:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(proc.stdout.readline)
            try:
                return future.result(timeout=START_TIMEOUT)
            except Exception:
                proc.kill()
                return future.result()

    def _make_site(self, i: int, site: str, wan: str, lan: str,
                   index: dict[str, int]) -> None:
        br = f"{BRIDGE_PREFIX}{self.tag}{i}"
        self._bridges_made.append(br)
        self._save()
        _run(["ip", "link", "add", br, "type", "bridge"])
        self._sysctl_if(br)
        _run(["ip", "link", "set", br, "up"])
        gw_name = self.gateways[site]
        gw_wan, router = f"{wan}.{i + 2}", f"{wan}.1"
        gw = Host(self, gw_name, gw_wan, index[gw_name])
        gw.site, gw.bridge, gw.lan_ip = site, br, f"{lan}.1"
        rif, tbf = f"s{i}", " ".join(_tbf(self.wan["rate"]))
        gw.link_commands = [
            ["ip", "-n", self.router_ns, "link", "add", rif, "type", "veth",
             "peer", "name", "wan0", "netns", gw.ns],
            ["ip", "-n", self.router_ns, "addr", "add", router, "peer", gw_wan, "dev", rif],
            ["ip", "-n", self.router_ns, "link", "set", rif, "up"],
            ["tc", "-n", self.router_ns, "qdisc", "add", "dev", rif] + _tbf(self.wan["rate"]),
        ]
        gw.net_lines = [
            "echo 1 > /proc/sys/net/ipv6/conf/wan0/disable_ipv6 || true",
            f"ip addr add {gw_wan} peer {router} dev wan0",
            "ip link set wan0 up",
            # the WAN's addresses only: another site's subnet is unreachable here, at once
            f"ip route add {wan}.0/24 via {router} dev wan0",
            f"tc qdisc add dev wan0 {tbf}",
        ]
        self.hosts[gw_name] = gw
        for j, name in enumerate(self.sites[site]):
            h = Host(self, name, f"{lan}.{j + 2}", index[name])
            h.site, h.bridge = site, br
            h.net_lines = [f"ip route add {gw_wan}/32 via {gw.lan_ip} dev eth0"]
            self.hosts[name] = h

    def _start_all(self) -> list[Host]:
        hosts = list(self.hosts.values())
        workers = max(1, min(MAX_WORKERS, len(hosts)))
        errors = []
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(self._prepare_host, hosts))
            self._write_shared_files()
            for f in [pool.submit(self._start_host, h) for h in hosts]:
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
        return hosts

    def site_of(self, name: str) -> str | None:
        """The site of host `name` (None: the head or a flat bed's host)."""
        h = self.hosts.get(name)
        return h.site if h else None

    def wan_shell(self, script: str) -> subprocess.CompletedProcess:
        """Run a shell script in the router's namespace (as root)."""
        return _run(["ip", "netns", "exec", self.router_ns, "/bin/sh", "-c", script],
                    check=False)

