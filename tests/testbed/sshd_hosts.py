"""Starting one host: its namespaces, sshd configuration and boot script, and
the ssh_config and known_hosts files every user shares."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import time

from .hosts import Host
from .removal import _in_cgroup
from .system import (
    CFS_PERIOD_US,
    ROOT_PATH,
    SFTP_SERVER,
    SSHD,
    START_TIMEOUT,
    USER_PATH,
    TestBedError,
    _mkdir,
    _netns_id,
    _run,
    _write,
)


class SshdHosts:
    """TestBed's part that starts hosts (a mixin: the state is TestBed's)."""

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
        _run(["ip", "link", "set", h.veth, "master", h.bridge, "up"])
        for argv in h.link_commands:
            _run(argv)
        inner = [
            "echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 || true",
            "ip link set lo up",
            f"ip addr add {h.lan_ip}/24 dev eth0",
            "ip link set eth0 up",
        ] + h.net_lines
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
