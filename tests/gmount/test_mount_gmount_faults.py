"""GMount with a node that goes away: its sshd and agent SIGKILLed after its
cable is cut (no FIN, no RST reaches the peers, as when a machine loses power).
Every access to its files under the mount fails with EIO within the mount's
bound (direct_branch.CALL_SECONDS, documented in README), later ones at once,
until the session sees the node lost: then its files leave the mounts (ENOENT);
the other nodes' files stay readable and `gxpc umount` leaves no mount behind.

On a bed of its own (the killed host does not come back), as an ordinary user.
"""
import os
import shutil
import subprocess
import time
import uuid

import pytest
from conftest import module_bed
from test_mount_timeouts import assert_eio

pytestmark = pytest.mark.testbed

HOSTS = ["tk01", "tk02", "tk03"]
SLACK = 15          # generous: the kernel's FUSE round trips on a loaded machine


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpk", fuse=True) as b:
        yield b


@pytest.fixture
def g(bed, make_gxp):
    return make_gxp(bed=bed, user=next(iter(bed.users)))


def head_fuse_mounts(mountpoint):
    with open("/proc/mounts") as f:
        return [l for l in f if l.split()[1] == mountpoint]


def timed(bed, user, argv, limit):
    """(result, seconds); not finishing within `limit` is a failure (a hang)."""
    t0 = time.monotonic()
    try:
        r = bed.run_as(user, argv, timeout=limit, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("%s did not finish within %ss (a hang)" % (" ".join(argv), limit))
    return r, time.monotonic() - t0


def test_a_gone_node_gives_eio_within_the_bound_and_umount_works(bed, g):
    from sshfsmux.direct.branch import CALL_SECONDS
    user = next(iter(bed.users))
    g.ok("use", "ssh", "head", "tk*")
    g.ok("explore", *HOSTS)
    tag = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    try:
        g.ok("e", "echo x > %s/f-$GXP_HOSTNAME && mkdir %s/d-$GXP_HOSTNAME" % (mnt, mnt))
        assert sorted(os.listdir(os.path.join(bed.host("tk03").tmp_dir, "gxpexp-" + tag))) == [
            "d-tk03", "f-tk03"]
        bed.host("tk03").kill(unplug=True)
        # seen from the head's own mount: stat, then cat, of the dead node's files
        r, took = timed(bed, user, ["stat", mnt + "/d-tk03/nothing-here"], CALL_SECONDS + SLACK)
        print("first access took %.1fs" % took)
        # a name in its directory: EIO while the head's listing of it is on
        # its way (every peer is asked, tk03 never answers), or the listing's
        # own answer (no such name) once it came: never a hang
        if not r.stderr.rstrip().endswith("No such file or directory"):
            assert_eio(r)
        # its file: EIO within the bound (at once if the stat above already
        # waited for tk03); or, once the session has seen tk03 lost (its ssh
        # link timed out meanwhile), no such file: its files left the catalog
        # and the survivors' mounts (make rebuilds what only it held)
        for bound in (CALL_SECONDS + SLACK, 3):
            r, took = timed(bed, user, ["cat", mnt + "/f-tk03"], CALL_SECONDS + SLACK)
            if not r.stderr.rstrip().endswith("No such file or directory"):
                assert_eio(r)
            assert took < bound, "an access waited %.1fs (at most %ds)" % (took, bound)
        deadline = time.monotonic() + 60
        while g.stat_nodes().get("tk03") == "up":
            assert time.monotonic() < deadline, "tk03 was never seen lost"
            time.sleep(0.5)
        deadline = time.monotonic() + 10
        while True:
            r, took = timed(bed, user, ["cat", mnt + "/f-tk03"], CALL_SECONDS + SLACK)
            if r.stderr.rstrip().endswith("No such file or directory") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.returncode == 1 and r.stderr.rstrip().endswith("No such file or directory"), r.stderr
        r, _ = timed(bed, user, ["cat", mnt + "/f-tk01"], CALL_SECONDS + SLACK)
        assert (r.returncode, r.stdout) == (0, "x\n"), r.stderr
        # the host stays unreachable: umount must not wait for it
        r = g.run("umount", timeout=90)
        assert r.returncode == 0, r.stderr
        assert head_fuse_mounts(mnt) == []
        for n in ("tk01", "tk02"):
            # ours only: a mount another session made on the head shows on the hosts too
            assert [l for l in bed.host(n).mounts() if " fuse" in l and mnt in l] == []
    finally:
        if head_fuse_mounts(mnt):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        for d in (export, mnt):
            shutil.rmtree(d, ignore_errors=True)
