"""FUSE ACCESS answered from attributes at most the attribute timeout old
(sshfsmux/fs/access_memo.py): the kernel asks on every access(2) and chdir, and
on a GMount the merged view asks every peer of a name this node lacks.
A change through the mount is seen at once (chmod, rename, unlink drop the
memo), a change made directly in a branch within the attribute timeout.

A real sshfsm mount of two local branches (the file only in the second, as a
GMount name held by a peer); the installed product, as root.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from mount_table import FUSERMOUNT, in_mount_table

VENV = os.environ.get("GXP_VENV", "/opt/gxpstyle/venv")
SSHFSM = os.path.join(VENV, "bin", "sshfsm")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists(SSHFSM) or not FUSERMOUNT
    or not os.path.exists("/dev/fuse") or os.getuid() != 0,
    reason="needs Linux, /dev/fuse, fusermount3, root and the installed sshfsm")


@pytest.fixture
def merged():
    top = tempfile.mkdtemp(prefix="gxp-access-memo-", dir="/var/tmp")
    a, b, mp = (os.path.join(top, n) for n in ("a", "b", "mnt"))
    for d in (a, b, mp):
        os.mkdir(d)
    r = subprocess.run([SSHFSM, a, b, mp], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        yield a, b, mp
    finally:
        if in_mount_table(mp):
            subprocess.run([FUSERMOUNT, "-u", mp], timeout=60)
        deadline = time.monotonic() + 10
        while in_mount_table(mp) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(top, ignore_errors=True)


def test_access_follows_changes_through_the_mount_at_once(merged):
    from sshfsmux.fs.fuse_glue import ATTR_SECONDS
    a, b, mp = merged
    f = os.path.join(b, "f")
    with open(f, "w") as out:
        out.write("x")
    os.chmod(f, 0o644)
    m = os.path.join(mp, "f")
    # root passes every check but X_OK on a file without x bits
    assert not os.access(m, os.X_OK)
    os.chmod(m, 0o755)
    assert os.access(m, os.X_OK), "a chmod through the mount was not seen at once"
    # unlinked and made again with other bits: the old answer must not stay
    os.unlink(m)
    with open(m, "w"):
        pass
    os.chmod(os.path.join(a, "f"), 0o644)      # the new file landed in the first branch
    assert not os.access(m, os.X_OK), "an unlinked name kept its old access answer"
    # a directory renamed, another made under the old name: its files are new
    os.mkdir(os.path.join(mp, "d"))
    with open(os.path.join(mp, "d", "x"), "w"):
        pass
    os.chmod(os.path.join(mp, "d", "x"), 0o755)
    assert os.access(os.path.join(mp, "d", "x"), os.X_OK)
    os.rename(os.path.join(mp, "d"), os.path.join(mp, "e"))
    os.mkdir(os.path.join(mp, "d"))
    with open(os.path.join(mp, "d", "x"), "w"):
        pass
    os.chmod(os.path.join(a, "d", "x"), 0o600)   # behind the mount, so only a rename drops it
    assert not os.access(os.path.join(mp, "d", "x"), os.X_OK), \
        "a name under a renamed directory kept its old access answer"
    # changed directly in a branch: seen within the attribute timeout
    assert os.access(os.path.join(mp, "e", "x"), os.X_OK)
    os.chmod(os.path.join(a, "e", "x"), 0o644)
    time.sleep(ATTR_SECONDS + 0.5)
    assert not os.access(os.path.join(mp, "e", "x"), os.X_OK), \
        "a mode changed in the branch was not seen within the attribute timeout"


def test_memo_keeps_nothing_read_before_a_change():
    # attributes read before a chmod (another FUSE thread) are not kept after it
    from sshfsmux.fs.access_memo import AccessMemo
    memo = AccessMemo(10.0)
    epoch = memo.epoch
    memo.clear()                                 # a chmod meanwhile
    memo.put("/f", {"st_mode": 0o100755, "st_uid": 0, "st_gid": 0}, epoch)
    assert memo.get("/f") is None
    memo.put("/f", {"st_mode": 0o100644, "st_uid": 0, "st_gid": 0}, memo.epoch)
    assert memo.get("/f")[0] == 0o100644
    memo.forget(["/f"])
    assert memo.get("/f") is None
    assert AccessMemo(0).put("/f", {"st_mode": 1}, 0) and AccessMemo(0).get("/f") is None
