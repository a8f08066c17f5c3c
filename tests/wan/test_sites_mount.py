"""GMount and `gxpc make` on the sites bed (issue 28): two sites whose hosts
cannot connect to each other nor to the head. Each mount's data channels to
the other site's exports (and the head's) cannot be made directly; they go
along the tree (gxpstyle/node/tree_streams.py), found by trying. A file only
a host of the other site holds is read, a file written on one site is read
on the other and at home, and `gxpc make` runs a DAG whose recipes read the
other site's files with the results of plain make."""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest
from conftest import Gxp, _finish
from sites_bed import ALL, explore_sites, sites_bed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def bed():
    with sites_bed("gxpwm", fuse=True) as b:
        yield b


@contextlib.contextmanager
def mounted_sites(bed):
    """(session, export, mountpoint): every node of both sites and the head
    explored and mounted; unmounted, quit and removed at the end."""
    user = next(iter(bed.users))
    g = Gxp(bed, user, "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    suffix = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/wanexp-%s" % suffix, "/tmp/wanmnt-%s" % suffix
    try:
        explore_sites(g)
        g.ok("e", "mkdir -p %s %s" % (export, mnt))
        g.ok("mount", export, mnt, timeout=300)
        yield g, export, mnt
    finally:
        g.run("umount", mnt, timeout=120)
        _finish(g)
        for d in (export, mnt):
            shutil.rmtree(d, ignore_errors=True)


def put(bed, host, export, rel, data):
    """A file in `host`'s export, written there directly (only that host holds it)."""
    pw = pwd.getpwnam(next(iter(bed.users)))
    path = os.path.join(bed.host(host).tmp_dir, os.path.basename(export), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def on(bed, host, cmd, timeout=120):
    user = next(iter(bed.users))
    return bed.host(host).exec(["sh", "-c", cmd], user=user, capture_output=True, text=True,
                               timeout=timeout)


def seen_at_home(bed, user, paths, seconds=10.0):
    deadline = time.monotonic() + seconds
    while True:
        r = bed.run_as(user, ["ls"] + paths, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or time.monotonic() > deadline:
            assert r.returncode == 0, r.stderr
            return
        time.sleep(0.1)


MAKEFILE = """\
all: total.txt
a.up: b_in.txt
\ttr a-z A-Z < b_in.txt > a.up
b.up: a_in.txt
\ttr a-z A-Z < a_in.txt > b.up
total.txt: a.up b.up
\tcat a.up b.up > total.txt
\twc -c a.up b.up >> total.txt
"""


def test_mount_read_write_and_make_across_sites(bed):
    baseline = {n: bed.host(n).mounts() for n in ALL}
    with mounted_sites(bed) as (g, export, mnt):
        put(bed, "sb03", export, "only_sb03.txt", "held on site b\n")
        r = on(bed, "sa02", "cat %s/only_sb03.txt" % mnt)
        assert r.returncode == 0 and r.stdout == "held on site b\n", r.stderr
        r = on(bed, "sa02", "echo written on sa02 > %s/from_sa02.txt" % mnt)
        assert r.returncode == 0, r.stderr
        for host in ("sb01", "gb", "ga"):
            r = on(bed, host, "cat %s/from_sa02.txt" % mnt)
            assert r.returncode == 0 and r.stdout == "written on sa02\n", (host, r.stderr)
        r = g.run("e", "cat %s/from_sa02.txt" % mnt, timeout=120)
        assert r.returncode == 0 and r.stdout.count("written on sa02\n") == len(ALL) + 1, r.stderr
        with open(os.path.join(g.session_dir, "gxpd.log")) as f:
            assert "along the tree (no direct connection)" in f.read()
        r = on(bed, "sb04", "ls %s" % mnt)
        assert {"only_sb03.txt", "from_sa02.txt"} <= set(r.stdout.split()), r.stderr
        # a DAG whose recipes read files that only the other site's hosts hold
        work = os.path.join(mnt, "work")
        for host, name, text in (("sa03", "a_in.txt", "alpha on site a"),
                                 ("sb02", "b_in.txt", "beta on site b")):
            r = on(bed, host, "mkdir -p %s && echo '%s' > %s/%s" % (work, text, work, name))
            assert r.returncode == 0, r.stderr
        # a change shows elsewhere within a round trip to the head and back (README)
        seen_at_home(bed, g.user, [os.path.join(work, n) for n in ("a_in.txt", "b_in.txt")])
        r = bed.run_as(g.user, ["sh", "-c", 'cat > "$0"/Makefile', work], input=MAKEFILE,
                       capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        r = g.run("make", "-j", "4", cwd=work, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        local = tempfile.mkdtemp(prefix="wanmk-", dir="/var/tmp")
        try:
            for name, text in (("a_in.txt", "alpha on site a\n"), ("b_in.txt", "beta on site b\n"),
                               ("Makefile", MAKEFILE)):
                with open(os.path.join(local, name), "w") as f:
                    f.write(text)
            subprocess.run(["make", "-s"], cwd=local, check=True, capture_output=True)
            for name in ("a.up", "b.up", "total.txt"):
                with open(os.path.join(local, name)) as f:
                    want = f.read()
                for host in ("sa01", "sb04"):
                    r = on(bed, host, "cat %s/%s" % (work, name))
                    assert r.returncode == 0 and r.stdout == want, (host, name, r.stderr)
        finally:
            shutil.rmtree(local)
    # nothing left behind on any host: no process, no mount
    deadline = time.monotonic() + 10
    while any(bed.host(n).pids() for n in ALL) and time.monotonic() < deadline:
        time.sleep(0.1)
    for n in ALL:
        # (a mount of another run copied into the host at its start may go meanwhile)
        assert bed.host(n).pids() == [] and set(bed.host(n).mounts()) <= set(baseline[n]), n
