"""Command line of sshfsm, parsed like sshfs's, and the checks made before
anything connects.

    sshfsm [options] BRANCH... MOUNTPOINT

Errors are one line: UsageError (exit 2) for a command line that can never
work, MountError (exit 1) for a mount that cannot be made here and now.

Standard library only.
"""
from __future__ import annotations

import errno
import os
import re

from gxpstyle.config.limits import RangeError, parse_size
from sshfsmux.gmount.node import fuse_conf_allows_other  # noqa: F401  (one reading of fuse.conf for both)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

VERSION = "0.1.0"
DEFAULT_TIMEOUT = 30
MAX_TIMEOUT = 3600

USAGE = """\
usage: sshfsm [options] BRANCH... MOUNTPOINT

Mount one or more branches as one merged tree. A BRANCH is [user@]host:/path
(SFTP against a stock sshd; host as in ~/.ssh/config) or a local directory.
Unmount with: fusermount -u MOUNTPOINT (or fusermount3 -u).

options:
    -h, --help             print this help and exit
    -V, --version          print the version and exit
    -f                     stay in the foreground
    -d                     debug: log every operation to stderr (implies -f)
    -p PORT                same as -o port=PORT
    -o opt[,opt...]        mount options:
        port=N               ssh port of every remote branch
        IdentityFile=FILE    ssh private key to try first
        reconnect            re-open a dropped ssh connection (once per drop)
        ServerAliveInterval=N  ssh keepalive every N seconds
        timeout=N            a branch host that answers no request for N
                             seconds (1-3600, default 30) counts as gone:
                             accesses to it fail with EIO (Input/output
                             error), and fail at once for 5 s after that
        ro                   read-only mount (writes fail with EROFS)
        rw                   read-write mount (default)
        allow_other          let other users in (needs user_allow_other in
                             /etc/fuse.conf unless run by root; implies
                             default_permissions)
        default_permissions  let the kernel check permissions
        cache_dir=DIR        where the per-mount replica cache is made
                             (default $XDG_CACHE_HOME, else /tmp); a
                             missing DIR is made (0700), its parent must
                             exist
        cache_size=SIZE      bytes of replicas it keeps (512M, 4G; 1M at
                             least; default half the free space there); the
                             least recently used go first, never one
                             open for reading
        transport=ssh        SFTP over ssh (default); transport=direct is for
                             gxpc mount
        debug                same as -d

merge rules: see docs/merge-semantics.md
"""


def is_remote(spec: str) -> bool:
    """scp's rule: a colon before the first slash makes a remote branch
    ([user@]host:path, or [user@][v6addr]:path); './a:b' is local."""
    if spec.startswith("/") or spec.startswith("."):
        return False
    if spec.startswith("[") or "@[" in spec:
        return "]:" in spec
    colon, slash = spec.find(":"), spec.find("/")
    return colon > 0 and (slash < 0 or colon < slash)


def host_of(spec: str) -> str:
    """The host part of a remote branch spec (as given)."""
    m = re.match(r"^(?:[^@/\[\]]+@)?(?:\[([^\]]+)\]|([^:/@\[\]]+)):", spec)
    return (m.group(1) or m.group(2)) if m else spec


class UsageError(Exception):
    """A command line that can never work (exit 2)."""


class MountError(Exception):
    """A mount that cannot be made (exit 1); str() is the reason."""


class Options:
    def __init__(self) -> None:
        self.branches: List[str] = []
        self.mountpoint = ""
        self.port: Optional[int] = None
        self.identity_file: Optional[str] = None
        self.reconnect = False
        self.server_alive = 0
        self.timeout = DEFAULT_TIMEOUT
        self.ro = False
        self.allow_other = False
        self.default_permissions = False
        self.cache_dir: Optional[str] = None
        self.cache_size: Optional[int] = None
        self.transport = "ssh"
        self.foreground = False
        self.debug = False
        self.help = False
        self.version = False

    def __repr__(self) -> str:
        return "Options(%r)" % self.__dict__


def _int(name: str, value: str, lo: int, hi: int) -> int:
    try:
        n = int(value, 10)
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise UsageError("bad value for option '%s': '%s' (a whole number from %d to %d)"
                         % (name, value, lo, hi))
    return n


def _apply(o: Options, opt: str) -> None:
    if not opt:
        return
    key, eq, value = opt.partition("=")
    k = key.lower()
    if k == "port" and eq:
        o.port = _int(key, value, 1, 65535)
    elif k == "identityfile" and eq:
        if not value:
            raise UsageError("bad value for option '%s': ''" % key)
        o.identity_file = value
    elif k == "serveraliveinterval" and eq:
        o.server_alive = _int(key, value, 0, 86400)
    elif k == "timeout" and eq:
        o.timeout = _int(key, value, 1, MAX_TIMEOUT)
    elif k == "cache_dir" and eq:
        if not value:
            raise UsageError("bad value for option 'cache_dir': ''")
        o.cache_dir = value
    elif k == "cache_size" and eq:
        try:
            o.cache_size = parse_size(value, "cache_size")
        except RangeError as e:
            raise UsageError(str(e))
    elif k == "transport" and eq:
        if value == "ssh":
            o.transport = "ssh"
        elif value == "direct":
            raise UsageError("transport=direct needs gxpc mount")
        else:
            raise UsageError("bad value for option 'transport': '%s' (ssh or direct)" % value)
    elif eq:
        raise UsageError("unknown option '%s'" % opt)
    elif k == "reconnect":
        o.reconnect = True
    elif k == "ro":
        o.ro = True
    elif k == "rw":
        o.ro = False
    elif k == "allow_other":
        o.allow_other = True
    elif k == "default_permissions":
        o.default_permissions = True
    elif k == "debug":
        o.debug = o.foreground = True
    else:
        raise UsageError("unknown option '%s'" % opt)


def parse(argv: List[str]) -> Options:
    o = Options()
    pos: List[str] = []
    i = 0
    only_args = False
    while i < len(argv):
        a = argv[i]
        i += 1
        if only_args or a == "-" or not a.startswith("-"):
            pos.append(a)
            continue
        if a == "--":
            only_args = True
        elif a in ("-h", "--help"):
            o.help = True
        elif a in ("-V", "--version"):
            o.version = True
        elif a == "-f":
            o.foreground = True
        elif a == "-d":
            o.debug = o.foreground = True
        elif a in ("-o", "-p"):
            if i >= len(argv):
                raise UsageError("option '%s' needs a value" % a)
            v = argv[i]
            i += 1
            if a == "-p":
                o.port = _int("port", v, 1, 65535)
            else:
                for opt in v.split(","):
                    _apply(o, opt)
        elif a.startswith("-o"):
            for opt in a[2:].split(","):
                _apply(o, opt)
        elif a.startswith("-p") and a[2:].isdigit():
            o.port = _int("port", a[2:], 1, 65535)
        elif a.startswith("--"):
            raise UsageError("unknown option '%s'" % a[2:])
        else:
            raise UsageError("unknown option '%s'" % a[1:])
    if o.help or o.version:
        return o
    if len(pos) < 2:
        raise UsageError("missing %s (usage: sshfsm [options] BRANCH... MOUNTPOINT)"
                         % ("mountpoint" if len(pos) == 1 else "branch and mountpoint"))
    o.branches, o.mountpoint = pos[:-1], pos[-1]
    if o.allow_other:
        o.default_permissions = True
    return o


# --------------------------------------------------------------------------
# checks made before anything connects
# --------------------------------------------------------------------------

def check_allow_other(o: Options) -> None:
    if o.allow_other and os.getuid() != 0 and not fuse_conf_allows_other():
        raise MountError("allow_other needs 'user_allow_other' in /etc/fuse.conf "
                         "(ask your administrator)")


def check_mountpoint(path: str, must_be_empty: bool = True) -> str:
    """The absolute mountpoint, or MountError with one clear line."""
    ap = os.path.abspath(path)
    try:
        st = os.stat(ap)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise MountError("mountpoint %s does not exist" % path)
        if e.errno == errno.ENOTCONN:
            raise MountError("mountpoint %s: %s (a dead mount: fusermount -u %s)"
                             % (path, e.strerror, path))
        raise MountError("mountpoint %s: %s" % (path, e.strerror))
    import stat as _stat
    if not _stat.S_ISDIR(st.st_mode):
        raise MountError("mountpoint %s is not a directory" % path)
    if must_be_empty:
        try:
            entries = os.listdir(ap)
        except OSError as e:
            raise MountError("mountpoint %s: %s" % (path, e.strerror))
        if entries:
            raise MountError("mountpoint %s is not empty" % path)
    return os.path.realpath(ap)
