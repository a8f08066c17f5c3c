"""gxpc's GMount verbs: `mount`, `umount` and GXP's `mw gmnt`.

Registered with gxpc through the `gxpstyle.verbs` entry points (setup.py); the
head's side of a mount is sshfsmux/gmount/service.py.
"""
from __future__ import annotations

import os

from gxpstyle.config import limits
from gxpstyle.gxpc.verbs import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Arg,
    Opt,
    UsageError,
    Verb,
    err,
    write_stream,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List

    from gxpstyle.gxpc.client import Client


def mount_options(values: List[str]) -> Dict[str, str]:
    opts: Dict[str, str] = {}
    for v in values:
        for item in v.split(","):
            k, _, val = item.partition("=")
            if k not in ("ro", "rw", "cipher", "allow_other", "cache_size", "timeout", "site_cache"):
                raise UsageError("mount: unknown option %r (known: ro, rw, cipher=none, allow_other, "
                                 "cache_size=SIZE, timeout=N, site_cache=off)" % k)
            if k == "site_cache" and val != "off":
                raise UsageError("mount: site_cache takes only 'off' (site caches are on by default)")
            if k == "timeout":
                val = str(_timeout(val))
            if k == "cipher" and val != "none":
                raise UsageError("mount: cipher takes only 'none' (authentication stays on)")
            if k == "cache_size":
                try:
                    val = str(limits.parse_size(val, "cache_size", "mount: cache_size"))
                except limits.RangeError as e:
                    raise UsageError(str(e))
            opts[k] = val
    return opts


def _timeout(text: str) -> int:
    """-o timeout=N: whole seconds in limits.RANGES["mount_timeout"]."""
    try:
        n = int(text)
    except ValueError:
        raise UsageError("mount: timeout takes whole seconds, e.g. timeout=30 (got %r)" % text) from None
    try:
        return int(limits.check("mount_timeout", n, "mount: timeout"))
    except limits.RangeError as e:
        raise UsageError(str(e)) from None


def check_mount(a: Any) -> None:
    for what, path in (("EXPORT", a.export), ("MOUNTPOINT", a.mountpoint)):
        if not path:
            raise UsageError("mount: %s must not be empty" % what)
    a.opts = mount_options(a.options)


def cmd_mount(c: Client, a: Any) -> int:
    args = {"export": os.path.abspath(a.export), "mountpoint": os.path.abspath(a.mountpoint),
            "ro": "ro" in a.opts, "cipher": a.opts.get("cipher") != "none"}
    if "allow_other" in a.opts:
        args["allow_other"] = True
    if "cache_size" in a.opts:
        args["cache_size"] = int(a.opts["cache_size"])
    if "timeout" in a.opts:
        args["timeout"] = int(a.opts["timeout"])
    if "site_cache" in a.opts:
        args["site_cache"] = False
    status, result = c.call("mount", args, on_print=write_stream)
    if status == 2:
        err(result.get("error", "mount failed"))
        return EXIT_USAGE
    return EXIT_FAILED if status else EXIT_OK


def cmd_umount(c: Client, a: Any) -> int:
    args = {"mountpoint": os.path.abspath(a.mountpoint) if a.mountpoint else None}
    status, result = c.call("umount", args, on_print=write_stream)
    if status == 2:
        err(result.get("error", "umount failed"))
        return EXIT_USAGE
    return EXIT_FAILED if status else EXIT_OK


def check_mw(a: Any) -> None:
    """GXP compatibility: `gxpc mw gmnt EXPORT MOUNT` and `gxpc mw gmnt -u [MOUNT]`."""
    if a.program != "gmnt":
        raise UsageError("mw: only the gmnt program is built in (got %r)" % a.program)
    if a.unmount:
        if len(a.args) > 1:
            raise UsageError("mw gmnt -u [MOUNTPOINT]")
        a.mountpoint = a.args[0] if a.args else None
        return
    if len(a.args) != 2:
        raise UsageError("mw gmnt EXPORT MOUNTPOINT, or mw gmnt -u")
    a.export, a.mountpoint = a.args
    a.options = []
    check_mount(a)


def cmd_mw(c: Client, a: Any) -> int:
    return cmd_umount(c, a) if a.unmount else cmd_mount(c, a)


MOUNT = Verb(
    "mount", "GMount: every node exports EXPORT and mounts the merged view", cmd_mount, check=check_mount,
    description="Every explored node (the head included) exports EXPORT and mounts, at MOUNTPOINT, "
                "its own EXPORT merged with every other node's.",
    args=[Arg("export", metavar="EXPORT"), Arg("mountpoint", metavar="MOUNTPOINT")],
    options=[Opt(("-o",), "append", dest="options", metavar="OPT",
                 help="ro (read-only, enforced by every export), cipher=none (no TLS on the data "
                      "channel; authentication stays on), allow_other (other users may enter; "
                      "the kernel checks permissions, default_permissions; needs "
                      "user_allow_other in every node's /etc/fuse.conf unless run as root), "
                      "cache_size=SIZE (bytes of replicas each node keeps in its session "
                      "directory's replicas/, e.g. 512M or 4G, 1M at least; default half the "
                      "free space there; least recently used evicted first, never a running "
                      "recipe's input nor a file being read), timeout=N (seconds, %d to %d, "
                      "default 20: a peer that leaves a request unanswered that long gives "
                      "EIO), site_cache=off (each node reads another site's files itself, "
                      "not through its site's caches)" % limits.RANGES["mount_timeout"][:2])])

UMOUNT = Verb("umount", "unmount the session's GMount everywhere", cmd_umount,
              args=[Arg("mountpoint", "?", metavar="MOUNTPOINT")])

MW = Verb("mw", "GXP compatibility: mw gmnt EXPORT MOUNT / mw gmnt -u", cmd_mw, check=check_mw,
          args=[Arg("program", metavar="PROGRAM"), Arg("args", "*", metavar="ARG")],
          options=[Opt(("-u",), "flag", dest="unmount", help="unmount")])
