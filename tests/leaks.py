"""What a test run leaves behind on the machine.

`snapshot()` records what the suite could leave: entries in /tmp and /var/tmp,
FUSE mounts, named network namespaces, the test bed's cpu cgroups and users, and processes that
belong to the product or the test bed (owned by a test-bed user, or with a
gxpstyle agent, daemon, test-bed or batch-queue mark in their command line).
`leftovers(before, after)` is what appeared in between and is still there.

The comparison assumes the run has the machine to itself, as CI does: two runs
at once on one machine see each other's files. GXP_LEAK_CHECK=report turns the
failure into a report for such a machine.
"""
from __future__ import annotations

import os
import pwd
import time

TEMP_DIRS = ("/tmp", "/var/tmp")
# pytest's own base temp dir is kept between runs on purpose (the last three).
KEPT = ("pytest-of-",)
USER_MARK = "gxptb"
PROCESS_MARKS = ("gxp-agent", "gxpstyle.head.daemon", "/var/tmp/gxptb-", "/var/tmp/gxpslurm-")


def _temp_entries() -> set:
    out = set()
    for d in TEMP_DIRS:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        out.update(os.path.join(d, n) for n in names if not n.startswith(KEPT))
    return out


def _fuse_mounts() -> set:
    with open("/proc/mounts") as f:
        return {"%s (%s)" % (p[1], p[2]) for p in (line.split() for line in f)
                if len(p) > 2 and p[2].startswith("fuse") and p[1] != "/sys/fs/fuse/connections"}


def _netns() -> set:
    try:
        return set(os.listdir("/run/netns"))
    except OSError:
        return set()


def _cgroups() -> set:
    """The test bed's per-host cpu cgroups (tests/testbed/, cpu_share)."""
    base = "/sys/fs/cgroup/cpu"
    try:
        return {os.path.join(base, n) for n in os.listdir(base) if n.startswith(USER_MARK)}
    except OSError:
        return set()


def _bed_users() -> dict:
    return {p.pw_name: p.pw_uid for p in pwd.getpwall() if p.pw_gecos.startswith(USER_MARK)}


def _processes(bed_uids: set) -> set:
    """'pid starttime user: cmdline' of every process the suite may have started."""
    out = set()
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z" and not cmd:
                cmd = "<zombie>"
            uid = os.stat("/proc/%s" % name).st_uid
        except (OSError, IndexError):
            continue        # gone meanwhile
        if uid in bed_uids or any(m in cmd for m in PROCESS_MARKS):
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                user = str(uid)
            # The start time tells a leftover from a new process that reused a pid.
            out.add("%s %s %s: %s" % (name, fields[19], user, cmd[:200]))
    return out


def snapshot() -> dict:
    users = _bed_users()
    return {
        "file or directory": _temp_entries(),
        "FUSE mount": _fuse_mounts(),
        "network namespace": _netns(),
        "cpu cgroup": _cgroups(),
        "test-bed user": set(users),
        "process": _processes(set(users.values())),
    }


def leftovers(before: dict, wait: float = 10.0) -> list:
    """Sorted 'kind: what' lines for everything new since `before`. Processes get
    `wait` seconds to finish exiting (a quit is asynchronous)."""
    deadline = time.monotonic() + wait
    while True:
        after = snapshot()
        new = {kind: sorted(after[kind] - before.get(kind, set())) for kind in after}
        if not new["process"] or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return ["%s: %s" % (kind, what) for kind in sorted(new) for what in new[kind]]
