"""A GMount node's mount settings from the head, checked before anything starts.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict


def fuse_conf_allows_other(path: str = "/etc/fuse.conf") -> bool:
    try:
        with open(path) as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False



def is_mounted(mountpoint: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == mountpoint for line in f if len(line.split()) > 1)
    except OSError:
        return False


class MountSettings:
    """A mount's configuration from the head, checked: every bad value is a
    ValueError in one line, raised before anything is started."""

    def __init__(self, config: Dict[str, Any], node_name: str) -> None:
        from sshfsmux.direct.branch import CALL_SECONDS, MAX_CALL_SECONDS
        from sshfsmux.fs import mount_nesting

        self.export = os.path.abspath(config["export"])
        self.mountpoint = os.path.abspath(config["mountpoint"])
        self.ro = bool(config.get("ro"))
        self.cipher = bool(config.get("cipher", True))
        # how long a peer may leave a request unanswered before its files give EIO
        timeout = config.get("timeout", CALL_SECONDS)
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 1 <= timeout <= MAX_CALL_SECONDS):
            raise ValueError("timeout %r: give a number of seconds from 1 to %d"
                             % (timeout, MAX_CALL_SECONDS))
        self.timeout = float(timeout)
        self.allow_other = bool(config.get("allow_other"))
        # bytes of replicas this host's store keeps (-o cache_size=); None: half the free space
        self.cache_size = config.get("cache_size")
        if self.allow_other and os.getuid() != 0 and not fuse_conf_allows_other():
            raise ValueError("allow_other needs 'user_allow_other' in /etc/fuse.conf on %s"
                             % socket.gethostname())
        if not os.path.isdir(self.export):
            raise ValueError("export %s: no such directory" % self.export)
        if not os.path.isdir(self.mountpoint):
            # as mount(8) and sshfs: the mountpoint is the user's directory, never made here
            raise ValueError("mountpoint %s: %s" % (self.mountpoint, "not a directory" if os.path.lexists(
                self.mountpoint) else "no such directory (make it first, e.g. gxpc e mkdir -p DIR)"))
        if is_mounted(self.mountpoint):
            raise ValueError("mountpoint %s: already a mount point" % self.mountpoint)
        try:
            self.places = mount_nesting.check_export(self.export, self.mountpoint,
                                                     socket.gethostname())
        except mount_nesting.NestingError as e:
            raise ValueError(str(e))
        # The name peers and the location attribute know this host by (as explored).
        self.host_name = str(config.get("node") or node_name)
