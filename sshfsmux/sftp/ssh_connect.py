"""Reaching one host over SSH with Paramiko, like `ssh -o BatchMode=yes`.

Connection: ~/.ssh/config (HostName, User, Port, IdentityFile,
UserKnownHostsFile, HostKeyAlias, ConnectTimeout, ProxyCommand,
ServerAliveInterval, StrictHostKeyChecking, IdentitiesOnly) and known_hosts:
an unknown or changed host key is refused, keys come from -o IdentityFile, the
config, ssh-agent and ~/.ssh/id_*; nothing ever prompts. Every failure is a
ConnectError whose str() is one line for the user.
"""
from __future__ import annotations

import getpass
import os
import re
import socket

import paramiko

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

WINDOW = 32 * 1024 * 1024
MAX_PACKET = 256 * 1024


class ConnectError(Exception):
    """Could not connect or log in; str() is the one-line reason."""



# --------------------------------------------------------------------------
# spec and ssh configuration
# --------------------------------------------------------------------------

_SPEC_RE = re.compile(r"^(?:(?P<user>[^@/\[\]]+)@)?"
                      r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/@\[\]]+)):(?P<path>.*)$", re.S)


def parse_spec(spec: str) -> Tuple[Optional[str], str, str]:
    """'[user@]host:path' -> (user, host, path); '[v6addr]' brackets allowed."""
    m = _SPEC_RE.match(spec)
    if not m:
        raise ValueError("bad remote spec %r" % spec)
    return m.group("user") or None, m.group("v6") or m.group("host"), m.group("path")


class SshParams:
    """Everything needed to reach one host, from the command line and ssh_config."""

    def __init__(self, alias: str, user: Optional[str] = None, port: Optional[int] = None,
                 identity_file: Optional[str] = None,
                 config_path: Optional[str] = None) -> None:
        self.alias = alias
        home = os.path.expanduser("~")
        cfg: Dict[str, Any] = {}
        config_path = config_path or os.path.join(home, ".ssh", "config")
        if os.path.exists(config_path):
            try:
                cfg = paramiko.SSHConfig.from_path(config_path).lookup(alias)
            except Exception as e:  # a broken config is the user's to fix: say where
                raise ConnectError("cannot read %s: %s" % (config_path, e))
        self.hostname = cfg.get("hostname", alias)
        self.user = user or cfg.get("user") or getpass.getuser()
        try:
            self.port = int(port or cfg.get("port") or 22)
        except ValueError:
            raise ConnectError("bad port %r" % (port or cfg.get("port")))
        self.identity_files: List[str] = []
        self.explicit_identity = bool(identity_file)
        if identity_file:
            self.identity_files.append(os.path.expanduser(identity_file))
        for f in cfg.get("identityfile", []) or []:
            f = os.path.expanduser(f)
            if f not in self.identity_files:
                self.identity_files.append(f)
        self.identities_only = str(cfg.get("identitiesonly", "no")).lower() == "yes"
        khf = cfg.get("userknownhostsfile")
        if khf:
            self.known_hosts = [os.path.expanduser(x) for x in str(khf).split()]
        else:
            self.known_hosts = [os.path.join(home, ".ssh", "known_hosts"),
                                os.path.join(home, ".ssh", "known_hosts2")]
        gkh = cfg.get("globalknownhostsfile")
        self.known_hosts += ([os.path.expanduser(x) for x in str(gkh).split()] if gkh else
                             ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"])
        self.host_key_alias = cfg.get("hostkeyalias")
        self.strict = str(cfg.get("stricthostkeychecking", "yes")).lower() not in ("no", "off")
        try:
            self.connect_timeout = float(cfg.get("connecttimeout") or 20)
        except ValueError:
            self.connect_timeout = 20.0
        try:
            self.server_alive = int(cfg.get("serveraliveinterval") or 0)
        except ValueError:
            self.server_alive = 0
        self.proxy_command = cfg.get("proxycommand")
        if self.proxy_command and self.proxy_command.lower() == "none":
            self.proxy_command = None
        self.proxy_jump = cfg.get("proxyjump")

    def known_names(self) -> List[str]:
        names = [self.host_key_alias] if self.host_key_alias else [self.hostname]
        if not self.host_key_alias and self.alias not in names:
            names.append(self.alias)
        if self.port != 22:
            names = ["[%s]:%d" % (n, self.port) for n in names]
        return names


def _load_host_keys(files: List[str]) -> paramiko.HostKeys:
    hk = paramiko.HostKeys()
    for f in files:
        try:
            hk.load(f)
        except OSError:
            pass
        except Exception:
            pass
    return hk


_RSA_ALGS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def connect_transport(p: SshParams) -> paramiko.Transport:
    """An authenticated transport, or ConnectError with a one-line reason."""
    if p.proxy_jump and p.proxy_jump.lower() != "none" and not p.proxy_command:
        raise ConnectError("ProxyJump is not supported; use ProxyCommand 'ssh -W %h:%p JUMPHOST'")
    host_keys = _load_host_keys(p.known_hosts)
    known_types: List[str] = []
    for n in p.known_names():
        entry = host_keys.lookup(n)
        if entry:
            for t in entry.keys():
                for a in (_RSA_ALGS if t == "ssh-rsa" else (t,)):
                    if a not in known_types:
                        known_types.append(a)
    where = "%s port %d" % (p.hostname, p.port)
    try:
        if p.proxy_command:
            cmd = (p.proxy_command.replace("%h", p.hostname).replace("%p", str(p.port))
                   .replace("%r", p.user).replace("%%", "%"))
            sock = paramiko.ProxyCommand(cmd)
        else:
            sock = socket.create_connection((p.hostname, p.port), timeout=p.connect_timeout)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except socket.gaierror as e:
        raise ConnectError("could not resolve hostname %s: %s" % (p.hostname, e.strerror or e))
    except socket.timeout:
        raise ConnectError("connect to %s: Connection timed out" % where)
    except OSError as e:
        raise ConnectError("connect to %s: %s" % (where, e.strerror or e))
    t = paramiko.Transport(sock, default_window_size=WINDOW, default_max_packet_size=MAX_PACKET)
    t.banner_timeout = t.auth_timeout = p.connect_timeout
    try:
        opts = t.get_security_options()
        ciphers = list(opts.ciphers)
        fast = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if c in ciphers]
        opts.ciphers = tuple(fast + [c for c in ciphers if c not in fast])
        if known_types:
            kt = list(opts.key_types)
            first = [k for k in known_types if k in kt]
            opts.key_types = tuple(first + [k for k in kt if k not in first])
        try:
            t.start_client(timeout=p.connect_timeout)
        except paramiko.SSHException as e:
            raise ConnectError("ssh handshake with %s failed: %s" % (where, e))
        except EOFError:
            raise ConnectError("connection to %s closed by remote host" % where)
        key = t.get_remote_server_key()
        _check_host_key(p, host_keys, key)
        _authenticate(t, p)
        if p.server_alive:
            t.set_keepalive(p.server_alive)
        return t
    except BaseException:
        t.close()
        raise


def _check_host_key(p: SshParams, host_keys: paramiko.HostKeys, key: paramiko.PKey) -> None:
    kname = key.get_name()
    seen_other = False
    for n in p.known_names():
        entry = host_keys.lookup(n)
        if not entry:
            continue
        if kname in entry:
            if entry[kname] == key:
                return
            raise ConnectError("host key for %s has changed (%s; possible man-in-the-middle); "
                               "fix known_hosts" % (n, kname))
        seen_other = True
    if not p.strict:
        return
    if seen_other:
        raise ConnectError("host key for %s (%s) is not the type known in known_hosts"
                           % (p.known_names()[0], kname))
    raise ConnectError("host key for %s is not known (not in %s); connect once with ssh to "
                       "check and add it" % (p.known_names()[0], p.known_hosts[0]))


def _load_key(path: str) -> Optional[paramiko.PKey]:
    try:
        return paramiko.PKey.from_path(path)
    except OSError:
        return None
    except paramiko.PasswordRequiredException:
        return None
    except Exception:
        return None


def _authenticate(t: paramiko.Transport, p: SshParams) -> None:
    tried: List[str] = []
    keys: List[paramiko.PKey] = []
    notes: List[str] = []
    for f in p.identity_files:
        k = _load_key(f)
        if k is not None:
            keys.append(k)
        elif p.explicit_identity and f == p.identity_files[0]:
            # like ssh: go on with the other keys, but say why this one was not used
            notes.append("identity file %s %s" % (
                f, "not found" if not os.path.exists(f) else "unreadable or has a passphrase"))
    if not p.identities_only and os.environ.get("SSH_AUTH_SOCK"):
        try:
            keys.extend(paramiko.Agent().get_keys())
        except Exception:
            pass
    if not p.explicit_identity:
        for n in ("id_ed25519", "id_ecdsa", "id_rsa"):
            f = os.path.join(os.path.expanduser("~"), ".ssh", n)
            if f not in p.identity_files and os.path.exists(f):
                k = _load_key(f)
                if k is not None:
                    keys.append(k)
    for k in keys:
        fp = k.get_fingerprint()
        if fp in tried:
            continue
        tried.append(fp)
        try:
            t.auth_publickey(p.user, k)
        except paramiko.AuthenticationException:
            continue
        except paramiko.SSHException as e:
            raise ConnectError("authentication as %s failed: %s" % (p.user, e))
        if t.is_authenticated():
            return
    raise ConnectError("permission denied (publickey) for %s%s"
                       % (p.user, "".join("; " + n for n in notes)))
