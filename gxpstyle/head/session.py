"""Where a session lives on the head and what secrets it holds.

A session is a directory only its owner can enter (0700). It holds the daemon's
Unix socket and its log. GXP_SESSION or --session names it; the default is
`$XDG_RUNTIME_DIR/gxpstyle/default` (or `/tmp/gxpstyle-<uid>/default`). We refuse
a directory that is a symlink, belongs to someone else or is open to others: a
session gives its holder the user's account on every node.
"""
from __future__ import annotations

import os
import stat

# Types only: every gxpc start loads this module (typing would double its CPU).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import List, Optional, Tuple

SOCKET_NAME = "gxpd.sock"
LOG_NAME = "gxpd.log"


class SessionError(RuntimeError):
    pass


class SessionPathError(SessionError):
    """A session directory whose socket path cannot exist (a usage error)."""


# A Unix socket's path (sun_path) holds 108 bytes, its final NUL included.
MAX_SOCKET_PATH = 107


def default_session_dir() -> str:
    env = os.environ.get("GXP_SESSION")
    if env:
        return os.path.abspath(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    uid = os.getuid()
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == uid:
        base = os.path.join(runtime, "gxpstyle")
    else:
        base = "/tmp/gxpstyle-%d" % uid
    return os.path.join(base, "default")


def check_private_dir(path: str) -> None:
    """Raise SessionError unless path is a real directory of ours, mode 0700."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SessionError("%s: no such session directory" % path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise SessionError("%s: not a directory (refusing a symlink or file)" % path)
    if st.st_uid != os.getuid():
        raise SessionError("%s: belongs to uid %d, not to you" % (path, st.st_uid))
    if st.st_mode & 0o077:
        raise SessionError("%s: mode %o lets others in; must be 0700" % (path, st.st_mode & 0o777))


def ensure_session_dir(path: str) -> str:
    """Create (0700, race-free) or validate the session directory and its parent."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    for d in (parent, path):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except PermissionError:
            raise SessionError("%s: cannot create (permission denied)" % d)
        if d == parent and not parent.startswith("/tmp/gxpstyle-"):
            # A user-chosen parent (e.g. /var/tmp) may be shared and sticky: only
            # the session directory itself must be private.
            continue
        check_private_dir(d)
    return path


def socket_path(session_dir: str) -> str:
    return os.path.join(session_dir, SOCKET_NAME)


def check_path_length(session_dir: str) -> None:
    """SessionPathError when the session's socket path would not fit a Unix
    socket address: said before anything is made."""
    n = len(os.fsencode(socket_path(os.path.abspath(session_dir))))
    if n > MAX_SOCKET_PATH:
        longest = MAX_SOCKET_PATH - len(SOCKET_NAME) - 1
        raise SessionPathError("session directory %s...: %d bytes long; a session directory may "
                               "have at most %d (its socket's path must fit a Unix socket "
                               "address)" % (os.path.abspath(session_dir)[:40],
                                             n - len(SOCKET_NAME) - 1, longest))


def remove_dead_session(path: str) -> List[str]:
    """What a session daemon that died (SIGKILL, out of memory) left on this
    host: its socket, its log, its directory, and the per-session directories
    of its agents here (TLS files, replicas), which died with it. Removes them
    and returns their paths. Only the caller's own entries are touched."""
    from gxpstyle.node.node_dirs import remove_node_dirs
    removed = remove_node_dirs(session_name(path))
    for name in (SOCKET_NAME, LOG_NAME):
        try:
            os.unlink(os.path.join(path, name))
            removed.append(os.path.join(path, name))
        except OSError:
            pass
    try:
        os.rmdir(path)
        removed.append(path)
    except OSError:
        pass
    return removed


def new_secret() -> bytes:
    return os.urandom(32)


def session_name(session_dir: str) -> str:
    """A short non-secret tag for process names and per-node directories."""
    import hashlib
    return hashlib.sha256(os.path.abspath(session_dir).encode()).hexdigest()[:10]


def make_certificate(days: int = 30) -> Tuple[str, str, str]:
    """A self-signed certificate for this session: (cert PEM, key PEM, SHA-256 pin).

    Generated on the head with `cryptography` (a dependency of paramiko); agents
    only load it, with the standard `ssl` module."""
    import datetime
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gxpstyle session")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    pin = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return cert_pem, key_pem, pin


def peer_uid(sock: socket.socket) -> Optional[int]:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    import socket
    import struct
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid
