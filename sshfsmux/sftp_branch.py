"""A branch on a remote directory, over SFTP against a stock sshd (Paramiko).

Connection: ~/.ssh/config (HostName, User, Port, IdentityFile,
UserKnownHostsFile, HostKeyAlias, ConnectTimeout, ProxyCommand,
ServerAliveInterval, StrictHostKeyChecking, IdentitiesOnly) and known_hosts,
like `ssh -o BatchMode=yes`: an unknown or changed host key is refused, keys
come from -o IdentityFile, the config, ssh-agent and ~/.ssh/id_*; nothing ever
prompts.

SFTP: Paramiko's transport, channel, packet framing (BaseSFTP) and attribute
codec, with our own request multiplexer: one reader thread matches responses to
requests by id, so any number of FUSE threads can have requests in flight at
once (paramiko's SFTPClient reads responses in the calling thread, which is not
safe from several threads, and its prefetch is limited to 32 KiB requests).

Reads: open_read streams the WHOLE file into a replica (replica_cache.py) with
up to STREAM_INFLIGHT requests of STREAM_CHUNK bytes in flight (no round trip
per block); reads are served from the replica as soon as their bytes are there.
The replica becomes visible only when complete, and is reused while the remote
size and mtime are unchanged. A stream whose last reader closes before it is
complete is abandoned and its partial file removed.

Writes: straight to the remote file, pipelined (up to WRITE_INFLIGHT requests in
flight); an error comes back on a later write, flush, fsync or close.

Metadata is cached for ATTR_TTL seconds (positive and negative), invalidated by
every change made through this branch.
"""
from __future__ import annotations

import errno
import getpass
import os
import re
import socket
import stat
import struct
import threading
import time

import paramiko
from paramiko.message import Message
from paramiko.sftp import (BaseSFTP, CMD_CLOSE, CMD_DATA, CMD_EXTENDED,
                           CMD_FSETSTAT, CMD_FSTAT, CMD_INIT,
                           CMD_LSTAT, CMD_MKDIR, CMD_NAME, CMD_OPEN, CMD_OPENDIR,
                           CMD_READ, CMD_READDIR, CMD_READLINK, CMD_REALPATH,
                           CMD_REMOVE, CMD_RENAME, CMD_RMDIR, CMD_SETSTAT, CMD_STAT,
                           CMD_STATUS, CMD_SYMLINK, CMD_VERSION, CMD_WRITE, int64)
from paramiko.sftp_attr import SFTPAttributes

from .branch import Branch, ReadHandle, WriteHandle
from .local_branch import LocalReadHandle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

ATTR_TTL = 5.0
DEFAULT_TIMEOUT = 30.0        # seconds a request may go unanswered before the host counts as gone
RETRY_SECONDS = 5.0           # after a host stopped answering, accesses fail at once this long
STREAM_CHUNK = 255 * 1024     # OpenSSH's largest read (limits@openssh.com says so too)
STREAM_INFLIGHT = 16          # 4 MiB in flight
WRITE_CHUNK = 128 * 1024
WRITE_INFLIGHT = 64
WINDOW = 32 * 1024 * 1024
MAX_PACKET = 256 * 1024

SSH_FXF_READ = 0x01
SSH_FXF_WRITE = 0x02
SSH_FXF_APPEND = 0x04
SSH_FXF_CREAT = 0x08
SSH_FXF_TRUNC = 0x10
SSH_FXF_EXCL = 0x20

FX_OK, FX_EOF, FX_NO_SUCH_FILE, FX_PERMISSION_DENIED, FX_FAILURE = 0, 1, 2, 3, 4
FX_BAD_MESSAGE, FX_NO_CONNECTION, FX_CONNECTION_LOST, FX_OP_UNSUPPORTED = 5, 6, 7, 8
_STATUS_ERRNO = {
    FX_EOF: errno.EIO,  # callers that expect EOF handle it themselves
    FX_NO_SUCH_FILE: errno.ENOENT,
    FX_PERMISSION_DENIED: errno.EACCES,
    FX_FAILURE: errno.EIO,
    FX_BAD_MESSAGE: errno.EINVAL,
    FX_NO_CONNECTION: errno.ENOTCONN,
    FX_CONNECTION_LOST: errno.EIO,
    FX_OP_UNSUPPORTED: errno.ENOTSUP,
}


def _err(code: int, what: str = "") -> OSError:
    return OSError(code, os.strerror(code), what) if what else OSError(code, os.strerror(code))


def _enc(s: "str | bytes") -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class ConnectError(Exception):
    """Could not connect or log in; str() is the one-line reason."""


class ConnectionLost(OSError):
    def __init__(self, reason: str = "connection lost") -> None:
        super().__init__(errno.EIO, reason)


class StatusError(OSError):
    """An SFTP status other than OK, with the SFTP code kept."""

    def __init__(self, code: int, text: str) -> None:
        e = _STATUS_ERRNO.get(code, errno.EIO)
        super().__init__(e, os.strerror(e) if code != FX_FAILURE else "Failure" + (": " + text if text and text != "Failure" else ""))
        self.code = code


# --------------------------------------------------------------------------
# spec and ssh configuration
# --------------------------------------------------------------------------

_SPEC_RE = re.compile(r"^(?:(?P<user>[^@/\[\]]+)@)?"
                      r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/@\[\]]+)):(?P<path>.*)$", re.S)


def parse_spec(spec: str) -> "Tuple[Optional[str], str, str]":
    """'[user@]host:path' -> (user, host, path); '[v6addr]' brackets allowed."""
    m = _SPEC_RE.match(spec)
    if not m:
        raise ValueError("bad remote spec %r" % spec)
    return m.group("user") or None, m.group("v6") or m.group("host"), m.group("path")


class SshParams:
    """Everything needed to reach one host, from the command line and ssh_config."""

    def __init__(self, alias: str, user: "Optional[str]" = None, port: "Optional[int]" = None,
                 identity_file: "Optional[str]" = None,
                 config_path: "Optional[str]" = None) -> None:
        self.alias = alias
        home = os.path.expanduser("~")
        cfg = {}  # type: Dict[str, Any]
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
        self.identity_files = []  # type: List[str]
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

    def known_names(self) -> "List[str]":
        names = [self.host_key_alias] if self.host_key_alias else [self.hostname]
        if not self.host_key_alias and self.alias not in names:
            names.append(self.alias)
        if self.port != 22:
            names = ["[%s]:%d" % (n, self.port) for n in names]
        return names


def _load_host_keys(files: "List[str]") -> "paramiko.HostKeys":
    hk = paramiko.HostKeys()
    for f in files:
        try:
            hk.load(f)
        except (OSError, IOError):
            pass
        except Exception:
            pass
    return hk


_RSA_ALGS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def connect_transport(p: SshParams) -> "paramiko.Transport":
    """An authenticated transport, or ConnectError with a one-line reason."""
    if p.proxy_jump and p.proxy_jump.lower() != "none" and not p.proxy_command:
        raise ConnectError("ProxyJump is not supported; use ProxyCommand 'ssh -W %h:%p JUMPHOST'")
    host_keys = _load_host_keys(p.known_hosts)
    known_types = []  # type: List[str]
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


def _check_host_key(p: SshParams, host_keys: "paramiko.HostKeys", key: "paramiko.PKey") -> None:
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


def _load_key(path: str) -> "Optional[paramiko.PKey]":
    try:
        return paramiko.PKey.from_path(path)
    except (OSError, IOError):
        return None
    except paramiko.PasswordRequiredException:
        return None
    except Exception:
        return None


def _authenticate(t: "paramiko.Transport", p: SshParams) -> None:
    tried = []  # type: List[str]
    keys = []  # type: List[paramiko.PKey]
    notes = []  # type: List[str]
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


# --------------------------------------------------------------------------
# the request multiplexer
# --------------------------------------------------------------------------

class _Req:
    __slots__ = ("event", "t", "data", "error", "callback", "sent")

    def __init__(self, callback: "Optional[Callable]" = None) -> None:
        self.event = None if callback else threading.Event()
        self.sent = time.monotonic()
        self.t = 0
        self.data = b""
        self.error = None  # type: Optional[BaseException]
        self.callback = callback


def _pack(msg: Message, args: tuple) -> None:
    for a in args:
        if isinstance(a, int64):
            msg.add_int64(a)
        elif isinstance(a, int):
            msg.add_int(a)
        elif isinstance(a, SFTPAttributes):
            a._pack(msg)
        else:
            msg.add_string(_enc(a))


def check_status(t: int, data: bytes) -> None:
    """Raise for a STATUS response other than OK (data without the request id)."""
    if t != CMD_STATUS:
        return
    m = Message(data)
    code = m.get_int()
    if code == FX_OK:
        return
    try:
        text = m.get_text()
    except Exception:
        text = ""
    raise StatusError(code, text)


class SftpSession(BaseSFTP):
    """One SFTP channel with a reader thread; thread-safe.

    A watchdog thread bounds every request: when the oldest request in flight
    has had no answer for `request_timeout` seconds, the host is taken for gone
    and the session dies (every request in flight fails with EIO, the transport
    is closed). One answer-less request is enough, since SFTP answers in order
    of work and a live server answers a stat in milliseconds."""

    def __init__(self, transport: "paramiko.Transport", timeout: float = 20.0,
                 request_timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        self.transport = transport
        self.request_timeout = request_timeout
        self.timed_out = False
        self.dead_at = 0.0
        chan = transport.open_session(window_size=WINDOW, max_packet_size=MAX_PACKET,
                                      timeout=timeout)
        chan.settimeout(timeout)       # for the handshake only
        chan.invoke_subsystem("sftp")
        self.sock = chan
        self.chan = chan
        m = Message()
        m.add_int(3)
        self._send_packet(CMD_INIT, m)
        try:
            t, data = self._read_packet()
        except socket.timeout:
            raise ConnectError("the SFTP subsystem did not answer")
        chan.settimeout(None)
        if t != CMD_VERSION:
            raise ConnectError("the server did not start an SFTP subsystem")
        m = Message(data)
        self.version = m.get_int()
        self.extensions = {}  # type: Dict[str, bytes]
        while m.get_remainder():
            try:
                name = _dec(m.get_string())
                self.extensions[name] = m.get_string()
            except Exception:
                break
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)   # pending became non-empty, or dead
        self._send_lock = threading.Lock()
        self._pending = {}  # type: Dict[int, _Req]   in the order sent
        self._next = 1
        self.dead = None  # type: Optional[str]
        self._thread = threading.Thread(target=self._run, name="sftp-reader", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, name="sftp-watchdog", daemon=True).start()
        self.read_chunk = STREAM_CHUNK
        self.write_chunk = WRITE_CHUNK
        if "limits@openssh.com" in self.extensions:
            try:
                t, data = self.request(CMD_EXTENDED, "limits@openssh.com")
                m = Message(data)
                m.get_int64()                       # max packet length
                max_read, max_write = m.get_int64(), m.get_int64()
                if max_read > 0:
                    self.read_chunk = max(32 * 1024, min(max_read, 1024 * 1024))
                if max_write > 0:
                    self.write_chunk = max(32 * 1024, min(max_write, 1024 * 1024))
            except (OSError, Exception):
                pass

    # -- framing -------------------------------------------------------
    def _read_all(self, n: int) -> bytes:
        parts = []
        while n > 0:
            x = self.chan.recv(n)
            if not x:
                raise EOFError()
            parts.append(x)
            n -= len(x)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_packet(self) -> "Tuple[int, bytes]":
        head = self._read_all(5)
        size, t = struct.unpack(">IB", head)
        if size > 64 * 1024 * 1024 or size < 1:
            raise EOFError("garbage packet")
        return t, self._read_all(size - 1) if size > 1 else b""

    def _send_packet(self, t: int, packet: Message) -> None:
        body = packet.asbytes()
        self.chan.sendall(struct.pack(">IB", len(body) + 1, t) + body)

    # -- requests ------------------------------------------------------
    def send(self, t: int, args: tuple, callback: "Optional[Callable]" = None) -> _Req:
        req = _Req(callback)
        with self._lock:
            if self.dead:
                raise ConnectionLost(self.dead)
            rid = self._next
            self._next = (self._next + 1) & 0xFFFFFFFF or 1
            if not self._pending:
                self._changed.notify()
            self._pending[rid] = req
        msg = Message()
        msg.add_int(rid)
        _pack(msg, args)
        try:
            with self._send_lock:
                self._send_packet(t, msg)
        except Exception as e:
            with self._lock:
                self._pending.pop(rid, None)
            self._die("send failed: %s" % e)
            raise ConnectionLost(self.dead or "connection lost")
        return req

    def request(self, t: int, *args: "Any") -> "Tuple[int, bytes]":
        """Send and wait; returns (type, data after the id). STATUS errors raise."""
        req = self.send(t, args)
        # the watchdog ends the wait; the bound here only guards against a bug there
        if not req.event.wait(self.request_timeout * 2 + 5):
            self._expire()
        if req.error is not None:
            raise req.error
        check_status(req.t, req.data)
        return req.t, req.data

    def _run(self) -> None:
        try:
            while True:
                t, data = self._read_packet()
                if len(data) < 4:
                    continue
                rid = struct.unpack_from(">I", data)[0]
                with self._lock:
                    req = self._pending.pop(rid, None)
                if req is None:
                    continue
                if req.callback is not None:
                    try:
                        req.callback(t, data, None)
                    except Exception:
                        pass
                else:
                    req.t, req.data = t, data[4:]
                    req.event.set()
        except BaseException as e:
            self._die("connection lost (%s)" % (e or type(e).__name__))

    def _watch(self) -> None:
        with self._lock:
            while self.dead is None:
                if not self._pending:
                    self._changed.wait()
                    continue
                oldest = next(iter(self._pending.values()))
                left = oldest.sent + self.request_timeout - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                break
        if self.dead is None:
            self._expire()

    def _expire(self) -> None:
        """No answer within the bound: the host is gone (or unreachable)."""
        self.timed_out = True
        self._die("no answer within %gs" % self.request_timeout)
        try:
            self.transport.close()     # unblocks a send stuck on a full window too
        except Exception:
            pass

    def _die(self, reason: str) -> None:
        with self._lock:
            if self.dead is None:
                self.dead = reason
                self.dead_at = time.monotonic()
            pending, self._pending = self._pending, {}
            self._changed.notify_all()
        err = ConnectionLost(self.dead or reason)
        for req in pending.values():
            if req.callback is not None:
                try:
                    req.callback(0, b"", err)
                except Exception:
                    pass
            else:
                req.error = err
                req.event.set()

    @property
    def alive(self) -> bool:
        return self.dead is None and self.transport.is_active()

    def close(self) -> None:
        self._die("closed")
        try:
            self.chan.close()
        except Exception:
            pass


def _handle_of(data: bytes) -> bytes:
    return Message(data).get_string()


# --------------------------------------------------------------------------
# handles
# --------------------------------------------------------------------------

class SftpWriteHandle(WriteHandle):
    """A remote file open for writing; writes are pipelined."""

    def __init__(self, branch: "SftpBranch", full: bytes, path: str, session: SftpSession,
                 handle: bytes) -> None:
        self.branch = branch
        self.full = full
        self.path = path
        self.session = session
        self.handle = handle
        self._cond = threading.Condition()
        self._inflight = 0
        self._error = None  # type: Optional[OSError]
        self.closed = False

    def _done(self, t: int, data: bytes, err: "Optional[BaseException]") -> None:
        with self._cond:
            self._inflight -= 1
            if err is not None:
                if self._error is None:
                    self._error = err if isinstance(err, OSError) else _err(errno.EIO)
            else:
                try:
                    check_status(t, data[4:])
                except OSError as e:
                    if self._error is None:
                        self._error = _err(errno.ENOSPC) if getattr(e, "code", 0) == FX_FAILURE else e
            self._cond.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def write(self, data: bytes, offset: int) -> int:
        if self.closed:
            raise _err(errno.EBADF)
        self._raise_error()
        pos = 0
        n = len(data)
        wc = self.session.write_chunk
        while pos < n:
            chunk = data[pos:pos + wc] if (pos or n > wc) else data
            with self._cond:
                while self._inflight >= WRITE_INFLIGHT:
                    self._cond.wait()
                self._inflight += 1
            try:
                self.session.send(CMD_WRITE, (self.handle, int64(offset + pos), chunk), self._done)
            except OSError:
                with self._cond:
                    self._inflight -= 1
                raise
            pos += len(chunk)
        return n

    def wait(self) -> None:
        """Until every write sent so far is answered (errors kept for later)."""
        with self._cond:
            while self._inflight > 0:
                self._cond.wait()

    def drain(self) -> None:
        self.wait()
        self._raise_error()

    def read(self, size: int, offset: int) -> bytes:
        self.drain()
        return read_range(self.session, self.handle, size, offset)

    def truncate(self, length: int) -> None:
        self.drain()
        a = SFTPAttributes()
        a.st_size = length
        self.session.request(CMD_FSETSTAT, self.handle, a)
        self.branch._invalidate(self.full)

    def flush(self) -> None:
        self.drain()

    def fsync(self) -> None:
        self.drain()
        if "fsync@openssh.com" in self.session.extensions:
            self.session.request(CMD_EXTENDED, "fsync@openssh.com", self.handle)

    def fstat(self) -> "Dict[str, Any]":
        self.drain()
        t, data = self.session.request(CMD_FSTAT, self.handle)
        return self.branch._attrs(SFTPAttributes._from_msg(Message(data)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.drain()
        finally:
            try:
                self.session.request(CMD_CLOSE, self.handle)
            except OSError:
                pass
            self.branch._writer_closed(self)


class _Stream:
    """Streams one remote file into a replica download; shared by the readers
    of that version while it runs."""

    def __init__(self, branch: "SftpBranch", full: bytes, key: str, size: int, mtime: int) -> None:
        self.branch = branch
        self.full = full
        self.key = key
        self.size = size
        self.mtime = mtime
        self.session = branch._session()
        t, data = branch._call_on(self.session, CMD_OPEN, full, SSH_FXF_READ, SFTPAttributes())
        self.handle = _handle_of(data)
        try:
            self.download = branch.cache.begin(key, size, mtime)
        except OSError:
            self.session.send(CMD_CLOSE, (self.handle,), lambda t, d, e: None)
            raise
        self.fd = self.download.fd
        self.cond = threading.Condition()
        self.next_off = 0
        self.inflight = 0
        self.contiguous = 0
        self.ranges = {}  # type: Dict[int, int]   start -> end, beyond `contiguous`
        self.eof = size
        self.error = None  # type: Optional[OSError]
        self.refs = 1
        self.cancelled = False
        self.finished = False   # no more data will arrive (complete, eof, error, cancel)
        self.committed = False
        self._retry = []  # type: List[Tuple[int, int]]
        self.thread = threading.Thread(target=self._pump, name="sftp-stream", daemon=True)
        self.thread.start()

    # runs in its own thread: issues requests, never in the reader thread
    def _pump(self) -> None:
        try:
            while True:
                with self.cond:
                    while (not self.cancelled and self.error is None and self.inflight >= STREAM_INFLIGHT):
                        self.cond.wait()
                    if self.cancelled or self.error is not None:
                        break
                    if self._retry:
                        off, n = self._retry.pop()
                    elif self.next_off < self.eof:
                        off = self.next_off
                        n = min(self.session.read_chunk, self.eof - off)
                        self.next_off += n
                    elif self.inflight == 0:
                        break
                    else:
                        self.cond.wait()
                        continue
                    self.inflight += 1
                try:
                    self.session.send(CMD_READ, (self.handle, int64(off), n), self._reply(off, n))
                except OSError as e:
                    with self.cond:
                        self.inflight -= 1
                        self.error = e
                        self.cond.notify_all()
                    break
        finally:
            self._wind_up()

    def _reply(self, off: int, n: int) -> "Callable":
        def done(t: int, data: bytes, err: "Optional[BaseException]") -> None:
            failure = None
            got = 0
            if err is not None:
                failure = err if isinstance(err, OSError) else _err(errno.EIO)
            elif t == CMD_DATA:
                got = struct.unpack_from(">I", data, 4)[0]
                if not self.cancelled:
                    try:
                        os.pwrite(self.fd, memoryview(data)[8:8 + got], off)
                    except OSError as e:
                        failure = e
            else:
                try:
                    check_status(t, data[4:])
                    failure = _err(errno.EIO)
                except StatusError as e:
                    if e.code != FX_EOF:
                        failure = e
                except OSError as e:
                    failure = e
            with self.cond:
                self.inflight -= 1
                if failure is not None:
                    if self.error is None:
                        self.error = failure
                elif got < n:
                    if got == 0 and t != CMD_DATA:
                        self.eof = min(self.eof, off)   # the file is shorter than it was
                    else:
                        self._retry.append((off + got, n - got))
                if got:
                    self._add_range(off, off + got)
                self.cond.notify_all()
        return done

    def _add_range(self, start: int, end: int) -> None:
        if start <= self.contiguous:
            self.contiguous = max(self.contiguous, end)
            while self.contiguous in self.ranges:
                self.contiguous = max(self.contiguous, self.ranges.pop(self.contiguous))
        else:
            self.ranges[start] = max(end, self.ranges.get(start, 0))

    def _wind_up(self) -> None:
        """All requests answered (or given up): close the remote handle, publish
        the replica if every byte of this version arrived."""
        with self.cond:
            while self.inflight > 0:
                self.cond.wait()
            ok = (not self.cancelled and self.error is None and self.eof == self.size
                  and self.contiguous >= self.size)
        if ok:
            # the version must not have changed while it streamed in
            try:
                t, data = self.session.request(CMD_FSTAT, self.handle)
                a = SFTPAttributes._from_msg(Message(data))
                ok = a.st_size == self.size and int(a.st_mtime or 0) == self.mtime
            except OSError:
                ok = False
        try:
            self.session.send(CMD_CLOSE, (self.handle,), lambda t, d, e: None)
        except OSError:
            pass
        path = self.download.commit() if ok else None
        with self.cond:
            self.committed = path is not None
            if not ok:
                self.download.abort()
            self.finished = True
            self.cond.notify_all()
            refs = self.refs
        if refs == 0:
            self._close_fd()
        self.branch._stream_done(self)

    def _close_fd(self) -> None:
        with self.cond:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def wait(self, size: int, offset: int) -> "Tuple[int, int]":
        """Wait until [offset, offset+size) (cut at EOF) is in the replica file;
        returns (fd, bytes available there)."""
        with self.cond:
            end = min(offset + size, self.eof)
            while self.contiguous < end and not self.finished and self.error is None:
                self.cond.wait()
                end = min(offset + size, self.eof)
            if self.contiguous < end:
                raise self.error or _err(errno.EIO)
            # a read that reaches the end returns once the replica is published
            # (or known not to be), so "read it all, then look" sees it
            while end >= self.size and not self.finished:
                self.cond.wait()
            return self.fd, max(0, end - offset)

    def read(self, size: int, offset: int) -> bytes:
        fd, n = self.wait(size, offset)
        return os.pread(fd, n, offset) if n else b""

    def release(self) -> None:
        with self.cond:
            self.refs -= 1
            if self.refs > 0:
                return
            if not self.finished:
                if self.contiguous < self.size:
                    self.cancelled = True   # a partial replica is never kept
                    self.cond.notify_all()
                return                      # the pump thread cleans up (or commits)
        self._close_fd()


class StreamReadHandle(ReadHandle):
    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.closed = False

    def read(self, size: int, offset: int) -> bytes:
        return self.stream.read(size, offset)

    def fd_for(self, size: int, offset: int) -> "Tuple[int, int]":
        return self.stream.wait(size, offset)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.release()


class DirectReadHandle(ReadHandle):
    """Reads of a file too large for the replica cache: one request per read."""

    def __init__(self, session: SftpSession, handle: bytes) -> None:
        self.session = session
        self.handle = handle

    def read(self, size: int, offset: int) -> bytes:
        return read_range(self.session, self.handle, size, offset)

    def close(self) -> None:
        try:
            self.session.request(CMD_CLOSE, self.handle)
        except OSError:
            pass


def read_range(session: "SftpSession", handle: bytes, size: int, offset: int) -> bytes:
    """Read `size` bytes at `offset` from an open remote file, in server-sized
    requests; short at end of file."""
    out = []
    got = 0
    while got < size:
        try:
            t, data = session.request(CMD_READ, handle, int64(offset + got),
                                      min(size - got, STREAM_CHUNK))
        except StatusError as e:
            if e.code == FX_EOF:
                break
            raise
        if t != CMD_DATA:
            break
        chunk = Message(data).get_string()
        if not chunk:
            break
        out.append(chunk)
        got += len(chunk)
    return b"".join(out)


# --------------------------------------------------------------------------
# the branch
# --------------------------------------------------------------------------

class SftpBranch(Branch):
    local = False
    writable = True

    def __init__(self, spec: str, port: "Optional[int]" = None,
                 identity_file: "Optional[str]" = None, reconnect: bool = False,
                 cache: "Any" = None, server_alive: int = 0,
                 connect: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.spec = spec
        self.name = spec
        user, host, path = parse_spec(spec)
        self.node = host
        self.host = host
        self.params = SshParams(host, user=user, port=port, identity_file=identity_file)
        if server_alive:
            self.params.server_alive = server_alive
        self.timeout = timeout
        # a connection attempt is a request too: bounded the same way
        self.params.connect_timeout = min(self.params.connect_timeout, timeout)
        self._retry_at = 0.0      # no reconnect attempt before this (monotonic)
        self.reconnect = reconnect
        self.cache = cache
        self.remote_path = path
        self._conn_lock = threading.Lock()
        self._sess = None  # type: Optional[SftpSession]
        self._transport = None  # type: Optional[paramiko.Transport]
        self._reconnected = 0
        self._attr = {}  # type: Dict[bytes, Tuple[float, Any]]
        self._dirs = {}  # type: Dict[bytes, Tuple[float, List[str]]]
        self._cache_lock = threading.Lock()
        self._writers = {}  # type: Dict[bytes, set]
        self._streams = {}  # type: Dict[Tuple[str, int, int], _Stream]
        self._streams_lock = threading.Lock()
        self.root = b"/"
        self.remote_uid = self.remote_gid = -1
        self.local_uid, self.local_gid = os.getuid(), os.getgid()
        if connect:
            self.connect()

    # -- connection ----------------------------------------------------
    def connect(self) -> None:
        """Connect, log in, start SFTP and find the branch root (ConnectError /
        OSError on failure)."""
        self._open_session()
        sess = self._sess
        try:
            t, data = sess.request(CMD_REALPATH, _enc(self.remote_path or "."))
        except OSError as e:
            raise OSError(e.errno, os.strerror(e.errno), self.spec)
        m = Message(data)
        m.get_int()
        self.root = m.get_string()
        try:
            t, data = sess.request(CMD_STAT, self.root)
        except OSError as e:
            raise OSError(e.errno, os.strerror(e.errno), self.spec)
        a = SFTPAttributes._from_msg(Message(data))
        if not stat.S_ISDIR(a.st_mode or 0):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.spec)
        try:
            t, data = sess.request(CMD_STAT, b".")
            h = SFTPAttributes._from_msg(Message(data))
            self.remote_uid, self.remote_gid = h.st_uid, h.st_gid
        except OSError:
            self.remote_uid, self.remote_gid = a.st_uid, a.st_gid

    def _open_session(self) -> None:
        t = connect_transport(self.params)
        try:
            sess = SftpSession(t, self.params.connect_timeout, self.timeout)
        except ConnectError:
            t.close()
            raise
        except Exception as e:
            t.close()
            raise ConnectError("cannot start SFTP: %s" % e)
        self._transport, self._sess = t, sess

    def _session(self) -> SftpSession:
        sess = self._sess
        if sess is not None and sess.alive:
            return sess
        if not self.reconnect:
            raise ConnectionLost("connection to %s lost" % self.host)
        with self._conn_lock:
            if self._sess is not None and self._sess.alive:
                return self._sess
            old = self._sess
            if old is not None and old.timed_out:
                # a host that stopped answering gets a pause before the next try,
                # so that accesses meanwhile fail at once instead of waiting again
                self._retry_at = max(self._retry_at, old.dead_at + RETRY_SECONDS)
            if time.monotonic() < self._retry_at:
                raise ConnectionLost("%s is not answering" % self.host)
            if old is not None:
                old.close()
                try:
                    old.transport.close()
                except Exception:
                    pass
            try:
                self._open_session()
            except (ConnectError, OSError, paramiko.SSHException, EOFError) as e:
                self._sess = None
                self._retry_at = time.monotonic() + RETRY_SECONDS
                raise ConnectionLost("reconnect to %s failed: %s" % (self.host, e))
            self._reconnected += 1
            self._clear_caches()
            return self._sess

    def _call_on(self, sess: SftpSession, t: int, *args: "Any") -> "Tuple[int, bytes]":
        return sess.request(t, *args)

    def _call(self, t: int, *args: "Any") -> "Tuple[int, bytes]":
        sess = self._session()
        try:
            return sess.request(t, *args)
        except ConnectionLost:
            if not self.reconnect:
                raise
        sess = self._session()   # re-open the connection once, then retry
        return sess.request(t, *args)

    def close(self) -> None:
        with self._streams_lock:
            streams = list(self._streams.values())
        for s in streams:
            with s.cond:
                s.cancelled = True
                s.cond.notify_all()
        sess, self._sess = self._sess, None
        if sess is not None:
            sess.close()
        if self._transport is not None:
            try:
                self._transport.close()
            except Exception:
                pass

    # -- paths and caches ----------------------------------------------
    def _full(self, path: str) -> bytes:
        if path == "/":
            return self.root
        p = _enc(path)
        return p if self.root == b"/" else self.root + p

    def _key(self, path: str) -> str:
        return self.name + "|" + path

    def _attrs(self, a: SFTPAttributes) -> "Dict[str, Any]":
        mode = a.st_mode or 0
        mt = float(a.st_mtime or 0)
        uid, gid = a.st_uid, a.st_gid
        if uid == self.remote_uid:
            uid = self.local_uid
        if gid == self.remote_gid:
            gid = self.local_gid
        return {"st_mode": mode, "st_size": a.st_size or 0, "st_mtime": mt,
                "st_atime": float(a.st_atime if a.st_atime is not None else mt),
                "st_ctime": mt, "st_nlink": 2 if stat.S_ISDIR(mode) else 1,
                "st_uid": uid if uid is not None else self.local_uid,
                "st_gid": gid if gid is not None else self.local_gid}

    def _clear_caches(self) -> None:
        with self._cache_lock:
            self._attr.clear()
            self._dirs.clear()

    def _invalidate(self, full: bytes, tree: bool = False) -> None:
        parent = full.rsplit(b"/", 1)[0] or b"/"
        with self._cache_lock:
            self._attr.pop(full, None)
            self._dirs.pop(full, None)
            self._dirs.pop(parent, None)
            if tree:
                pre = full.rstrip(b"/") + b"/"
                for k in [k for k in self._attr if k.startswith(pre)]:
                    del self._attr[k]
                for k in [k for k in self._dirs if k.startswith(pre)]:
                    del self._dirs[k]

    def _cached(self, full: bytes) -> "Any":
        with self._cache_lock:
            c = self._attr.get(full)
        if c is None or c[0] < time.monotonic():
            return None
        return c[1]

    def _remember(self, full: bytes, value: "Any") -> None:
        with self._cache_lock:
            self._attr[full] = (time.monotonic() + ATTR_TTL, value)

    def _drop_replicas(self, path: str, tree: bool = False) -> None:
        if self.cache is None:
            return
        if tree:
            self.cache.invalidate_prefix(self._key(path))
        else:
            self.cache.invalidate(self._key(path))

    # -- metadata ------------------------------------------------------
    def getattr(self, path: str) -> "Dict[str, Any]":
        full = self._full(path)
        writers = self._writers.get(full)
        if writers:
            for w in list(writers):
                w.wait()      # sizes are never behind the writes sent
        else:
            c = self._cached(full)
            if c is not None:
                if isinstance(c, int):
                    raise _err(c, path)
                return c
            # a missing or non-directory ancestor answers without a round trip
            if path != "/":
                anc = full
                while True:
                    anc = anc.rsplit(b"/", 1)[0]
                    if len(anc) < len(self.root) or not anc:
                        break
                    ca = self._cached(anc)
                    if ca is None:
                        continue
                    if isinstance(ca, int) or not stat.S_ISDIR(ca["st_mode"]):
                        raise _err(errno.ENOENT, path)
                    break
        return self._lstat(full, path)

    def _lstat(self, full: bytes, path: str) -> "Dict[str, Any]":
        try:
            t, data = self._call(CMD_LSTAT, full)
        except StatusError as e:
            if e.errno == errno.ENOENT:
                self._remember(full, errno.ENOENT)
            raise _err(e.errno, path)
        d = self._attrs(SFTPAttributes._from_msg(Message(data)))
        self._remember(full, d)
        return d

    def readdir(self, path: str) -> "List[str]":
        full = self._full(path)
        with self._cache_lock:
            c = self._dirs.get(full)
        if c is not None and c[0] >= time.monotonic():
            return list(c[1])
        sess = self._session()
        t, data = sess.request(CMD_OPENDIR, full)
        h = _handle_of(data)
        names = []  # type: List[str]
        now = time.monotonic()
        base = full if full.endswith(b"/") else full + b"/"
        try:
            while True:
                try:
                    t, data = sess.request(CMD_READDIR, h)
                except StatusError as e:
                    if e.code == FX_EOF:
                        break
                    raise
                if t != CMD_NAME:
                    break
                m = Message(data)
                for _ in range(m.get_int()):
                    fn = m.get_string()
                    m.get_string()  # longname
                    a = SFTPAttributes._from_msg(m)
                    if fn in (b".", b".."):
                        continue
                    names.append(_dec(fn))
                    with self._cache_lock:
                        self._attr[base + fn] = (now + ATTR_TTL, self._attrs(a))
        finally:
            try:
                sess.request(CMD_CLOSE, h)
            except OSError:
                pass
        with self._cache_lock:
            self._dirs[full] = (now + ATTR_TTL, names)
        return list(names)

    def readlink(self, path: str) -> str:
        t, data = self._call(CMD_READLINK, self._full(path))
        m = Message(data)
        m.get_int()
        return _dec(m.get_string())

    def _exists(self, full: bytes) -> "Optional[Dict[str, Any]]":
        try:
            t, data = self._call(CMD_LSTAT, full)
        except StatusError:
            return None
        return self._attrs(SFTPAttributes._from_msg(Message(data)))

    def mkdir(self, path: str, mode: int) -> None:
        full = self._full(path)
        a = SFTPAttributes()
        a.st_mode = mode & 0o7777
        try:
            self._call(CMD_MKDIR, full, a)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE and self._exists(full) is not None:
                raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)
        if mode & 0o022:
            # the server's umask may have taken bits the caller asked for
            try:
                self.chmod(path, mode & 0o7777)
            except OSError:
                pass

    def rmdir(self, path: str) -> None:
        full = self._full(path)
        try:
            self._call(CMD_RMDIR, full)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and not stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.ENOTDIR, path)
                if st is not None:
                    raise _err(errno.ENOTEMPTY, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full, tree=True)
        self._drop_replicas(path, tree=True)

    def unlink(self, path: str) -> None:
        full = self._full(path)
        try:
            self._call(CMD_REMOVE, full)
        except StatusError as e:
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.EISDIR, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)
            self._drop_replicas(path)

    def rename(self, old: str, new: str) -> None:
        fo, fn = self._full(old), self._full(new)
        sess = self._session()
        try:
            if "posix-rename@openssh.com" in sess.extensions:
                self._call(CMD_EXTENDED, "posix-rename@openssh.com", fo, fn)
            else:
                self._call(CMD_RENAME, fo, fn)
        except StatusError as e:
            if e.code == FX_FAILURE:
                so, sn = self._exists(fo), self._exists(fn)
                if so is not None and sn is not None:
                    if stat.S_ISDIR(sn["st_mode"]) and not stat.S_ISDIR(so["st_mode"]):
                        raise _err(errno.EISDIR, new)
                    if stat.S_ISDIR(so["st_mode"]) and not stat.S_ISDIR(sn["st_mode"]):
                        raise _err(errno.ENOTDIR, new)
                    if stat.S_ISDIR(sn["st_mode"]):
                        raise _err(errno.ENOTEMPTY, new)
                    raise _err(errno.EEXIST, new)
            raise _err(e.errno, old)
        finally:
            self._invalidate(fo, tree=True)
            self._invalidate(fn, tree=True)
            self._drop_replicas(old, tree=True)
            self._drop_replicas(new, tree=True)

    def symlink(self, target: str, path: str) -> None:
        full = self._full(path)
        try:
            # OpenSSH's sftp-server takes (target, linkpath), like paramiko sends it
            self._call(CMD_SYMLINK, _enc(target), full)
        except StatusError as e:
            if e.code == FX_FAILURE and self._exists(full) is not None:
                raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        finally:
            self._invalidate(full)

    def _setstat(self, path: str, a: SFTPAttributes) -> None:
        full = self._full(path)
        try:
            self._call(CMD_SETSTAT, full, a)
        except StatusError as e:
            raise _err(e.errno if e.code != FX_FAILURE else errno.EPERM, path)
        finally:
            self._invalidate(full)

    def chmod(self, path: str, mode: int) -> None:
        a = SFTPAttributes()
        a.st_mode = mode & 0o7777
        self._setstat(path, a)

    def chown(self, path: str, uid: int, gid: int) -> None:
        cur = self.getattr(path)
        a = SFTPAttributes()
        ruid = cur["st_uid"] if uid < 0 else uid
        rgid = cur["st_gid"] if gid < 0 else gid
        a.st_uid = self.remote_uid if ruid == self.local_uid else ruid
        a.st_gid = self.remote_gid if rgid == self.local_gid else rgid
        try:
            self._setstat(path, a)
        except OSError as e:
            if e.errno == errno.EACCES:
                raise _err(errno.EPERM, path)
            raise

    def truncate(self, path: str, length: int) -> None:
        a = SFTPAttributes()
        a.st_size = length
        self._setstat(path, a)
        self._drop_replicas(path)

    def utimens(self, path: str, times: "Optional[Tuple[float, float]]") -> None:
        a = SFTPAttributes()
        if times is None:
            now = int(time.time())
            a.st_atime, a.st_mtime = now, now
        else:
            a.st_atime, a.st_mtime = int(times[0]), int(times[1])
        self._setstat(path, a)
        self._drop_replicas(path)

    def statfs(self) -> "Dict[str, Any]":
        sess = self._session()
        if "statvfs@openssh.com" not in sess.extensions:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 0, "f_bfree": 0,
                    "f_bavail": 0, "f_files": 0, "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
        t, data = self._call(CMD_EXTENDED, "statvfs@openssh.com", self.root)
        m = Message(data)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                "f_ffree", "f_favail", "f_fsid", "f_flag", "f_namemax")
        d = {k: m.get_int64() for k in keys}
        d.pop("f_fsid")
        d.pop("f_flag")
        return d

    # -- data ----------------------------------------------------------
    def open_read(self, path: str) -> ReadHandle:
        full = self._full(path)
        writers = self._writers.get(full)
        for w in list(writers or ()):
            w.wait()
        st = self._lstat(full, path)      # fresh: close-to-open consistency
        if stat.S_ISDIR(st["st_mode"]):
            raise _err(errno.EISDIR, path)
        size, mtime = st["st_size"], int(st["st_mtime"])
        cache = self.cache
        # a file open for writing here changes under any replica: read it directly
        if (cache is None or writers or not cache.fits(size)
                or not stat.S_ISREG(st["st_mode"])):
            sess = self._session()
            t, data = sess.request(CMD_OPEN, full, SSH_FXF_READ, SFTPAttributes())
            return DirectReadHandle(sess, _handle_of(data))
        key = self._key(path)
        f = cache.get(key, size, mtime)
        if f is not None:
            try:
                return LocalReadHandle(os.open(f, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                pass
        with self._streams_lock:
            s = self._streams.get((key, size, mtime))
            if s is not None:
                with s.cond:
                    if not s.cancelled and (not s.finished or s.fd >= 0):
                        s.refs += 1
                        return StreamReadHandle(s)
            try:
                s = _Stream(self, full, key, size, mtime)
            except StatusError as e:
                raise _err(e.errno, path)
            self._streams[(key, size, mtime)] = s
        return StreamReadHandle(s)

    def _stream_done(self, s: _Stream) -> None:
        with self._streams_lock:
            if self._streams.get((s.key, s.size, s.mtime)) is s:
                del self._streams[(s.key, s.size, s.mtime)]

    def has_replica(self, path: str, size: int, mtime: int) -> bool:
        return self.cache is not None and self.cache.has(self._key(path), size, mtime)

    def open_write(self, path: str, flags: int, mode: int, create: bool) -> WriteHandle:
        full = self._full(path)
        pf = SSH_FXF_WRITE
        if (flags & os.O_ACCMODE) == os.O_RDWR:
            pf |= SSH_FXF_READ
        if create:
            pf |= SSH_FXF_CREAT
            if flags & os.O_EXCL:
                pf |= SSH_FXF_EXCL
        if flags & os.O_TRUNC:
            pf |= SSH_FXF_TRUNC
        a = SFTPAttributes()
        if create:
            a.st_mode = mode & 0o7777
        self._drop_replicas(path)
        sess = self._session()
        try:
            t, data = sess.request(CMD_OPEN, full, pf, a)
        except StatusError as e:
            self._invalidate(full)
            if e.code == FX_FAILURE:
                st = self._exists(full)
                if st is not None and stat.S_ISDIR(st["st_mode"]):
                    raise _err(errno.EISDIR, path)
                if st is not None and create and flags & os.O_EXCL:
                    raise _err(errno.EEXIST, path)
            raise _err(e.errno, path)
        self._invalidate(full)
        h = SftpWriteHandle(self, full, path, sess, _handle_of(data))
        with self._cache_lock:
            self._writers.setdefault(full, set()).add(h)
        return h

    def _writer_closed(self, h: SftpWriteHandle) -> None:
        with self._cache_lock:
            s = self._writers.get(h.full)
            if s is not None:
                s.discard(h)
                if not s:
                    del self._writers[h.full]
        self._invalidate(h.full)
        self._drop_replicas(h.path)

    # -- chain of cascaded mounts ----------------------------------------
    def read_small(self, path: bytes, limit: int = 1 << 20) -> "Optional[bytes]":
        """Content of a small remote file by absolute remote path, or None."""
        try:
            sess = self._session()
            t, data = sess.request(CMD_OPEN, path, SSH_FXF_READ, SFTPAttributes())
        except OSError:
            return None
        h = _handle_of(data)
        out = []
        got = 0
        try:
            while got < limit:
                try:
                    t, data = sess.request(CMD_READ, h, int64(got), 65536)
                except StatusError:
                    break
                chunk = Message(data).get_string()
                if not chunk:
                    break
                out.append(chunk)
                got += len(chunk)
        finally:
            try:
                sess.request(CMD_CLOSE, h)
            except OSError:
                pass
        return b"".join(out)
