"""A mount that would contain itself is refused with one line in the user's
words: a mountpoint inside its export, an export inside its mountpoint, and the
same through a cascade (a branch that is a mount of ours built on a directory
holding, or inside, the new mountpoint). sshfsm and GMount's per-node service.

The in-process tests build "mounts of ours" as plain directories holding the two
virtual files a mount publishes (.sshfsmux-chain, .sshfsmux-branches); the
others mount for real as an ordinary user.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_sshfsm import Env, _skip_reason, mounted, mounts, sshfsm_pids  # noqa: E402

import testbed  # noqa: E402

HOST = socket.gethostname()


# --------------------------------------------------------------------------
# in process
# --------------------------------------------------------------------------

class FakeNode:
    """Only the attributes gmount_node.start may use."""

    def __init__(self, d):
        self.loop = None
        self.name = "head"
        self.opts = {"pin": "0" * 64}
        self.secret = b"s" * 32
        self.dir = d

    def log(self, text):
        pass

    def tls_files(self):
        raise AssertionError("a refused mount must not get as far as TLS")

    def ensure_session_dir(self):
        return self.dir


def fake_mount(root, mountpoint, places):
    """A directory that reads like the root of a mount of ours."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".sshfsmux-chain"), "w") as f:
        f.write("%s:%s\n" % (HOST, mountpoint))
    with open(os.path.join(root, ".sshfsmux-branches"), "w") as f:
        f.write("".join(p + "\n" for p in places))


def refusal(tmp_path, export, mountpoint):
    from sshfsmux.gmount import node as gmount_node
    with pytest.raises(ValueError) as ei:
        gmount_node.start(FakeNode(str(tmp_path / "session")),
                          {"export": str(export), "mountpoint": str(mountpoint)})
    msg = str(ei.value)
    assert "\n" not in msg and "Error" not in msg, msg
    return msg


def test_gmount_refuses_a_mountpoint_inside_its_export_and_the_reverse(tmp_path):
    exp = tmp_path / "exp"
    (exp / "inner").mkdir(parents=True)
    assert refusal(tmp_path, exp, exp / "inner") == (
        "mountpoint %s/inner is inside the export %s: the mount would contain itself" % (exp, exp))
    assert refusal(tmp_path, exp, exp) == (
        "export %s is inside the mountpoint %s: the mount would contain itself" % (exp, exp))
    mnt = tmp_path / "mnt"
    (mnt / "exp").mkdir(parents=True)
    assert refusal(tmp_path, mnt / "exp", mnt) == (
        "export %s/exp is inside the mountpoint %s: the mount would contain itself" % (mnt, mnt))
    # through a symlink: the real paths count
    os.symlink(str(exp), str(tmp_path / "link"))
    assert "is inside the export" in refusal(tmp_path, tmp_path / "link", exp / "inner")


def test_gmount_refuses_an_export_that_is_a_mount_built_around_the_mountpoint(tmp_path):
    data, mnt = tmp_path / "data", tmp_path / "data" / "g"
    mnt.mkdir(parents=True)
    # export M1, a mount of ours whose branch `data` holds the new mountpoint
    m1 = tmp_path / "m1"
    fake_mount(m1, str(m1), ["%s:%s" % (HOST, data)])
    assert refusal(tmp_path, m1, mnt) == (
        "export %s is built on %s, which holds the mountpoint %s: the mount would contain "
        "itself" % (m1, data, mnt))
    # ... or whose branch lies inside the new mountpoint
    mnt2 = tmp_path / "g2"
    (mnt2 / "sub").mkdir(parents=True)
    fake_mount(m1, str(m1), ["other-host:/x", "%s:%s/sub" % (HOST, mnt2)])
    assert refusal(tmp_path, m1, mnt2) == (
        "export %s is built on %s/sub, which is inside the mountpoint %s: the mount would "
        "contain itself" % (m1, mnt2, mnt2))
    # ... or that is built on the new mount itself
    fake_mount(m1, str(mnt2), [])
    assert refusal(tmp_path, m1, mnt2) == (
        "export %s is built on the mount at %s: the mount would contain itself" % (m1, mnt2))


def test_places_on_other_hosts_do_not_count(tmp_path):
    from sshfsmux.fs import mount_nesting
    m1, mnt = tmp_path / "m1", tmp_path / "g"
    mnt.mkdir()
    fake_mount(m1, "elsewhere:/m", ["elsewhere:%s" % tmp_path, "elsewhere:%s/g/x" % tmp_path])
    places = mount_nesting.check_export(str(m1), str(mnt), HOST)
    assert places == ["%s:%s" % (HOST, m1), "elsewhere:%s" % tmp_path, "elsewhere:%s/g/x" % tmp_path]


# --------------------------------------------------------------------------
# sshfsm, for real
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(user_bed):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    if user_bed is None:
        pytest.skip("needs root")
    fuse_token = testbed.open_fuse_to_users()
    e = Env(user_bed, next(iter(user_bed.users)))
    try:
        yield e
    finally:
        for mp, t, _ in mounts():
            if t == "fuse.sshfsm" and mp.startswith(e.home + "/"):
                subprocess.run(["umount", "-l", mp], capture_output=True)
        testbed.close_fuse_to_users(fuse_token)


def test_sshfsm_publishes_its_branches_and_refuses_cascades_around_its_mountpoint(env):
    data = env.mkdir()
    inner = os.path.join(data, "inner")
    os.mkdir(inner)
    os.chown(inner, env.uid, env.gid)
    with env.mount(data) as m1:
        assert env.sh("cat %s/.sshfsmux-branches" % m1) == "%s:%s\n" % (HOST, data)
        assert ".sshfsmux-branches" not in env.sh("ls -A %s" % m1).split()
        # M1 shows `data`, which holds inner: mounting M1 at inner nests forever
        r = env.sshfsm(m1, inner)
        assert (r.returncode, r.stderr) == (1, "sshfsm: %s is built on %s, which holds the "
                                               "mountpoint %s: the mount would contain itself\n"
                                            % (m1, data, inner))
        # a second level: M2 over M1, then M1's branch is two mounts down
        with env.mount(m1) as m2:
            assert env.sh("cat %s/.sshfsmux-branches" % m2).splitlines() == [
                "%s:%s" % (HOST, m1), "%s:%s" % (HOST, data)]
            r = env.sshfsm(m2, inner)
            assert (r.returncode, r.stderr) == (1, "sshfsm: %s is built on %s, which holds the "
                                                   "mountpoint %s: the mount would contain "
                                                   "itself\n" % (m2, data, inner))
        assert not mounted(inner)
    # and the reverse: a mount whose branch is inside the new mountpoint
    outer = env.mkdir()
    sub = os.path.join(outer, "sub")
    os.mkdir(sub)
    os.chown(sub, env.uid, env.gid)
    with env.mount(sub) as m3:
        r = env.sshfsm(m3, outer)
        assert (r.returncode, r.stderr) == (1, "sshfsm: %s is built on %s, which is inside the "
                                               "mountpoint %s: the mount would contain itself\n"
                                            % (m3, sub, outer))
    assert sshfsm_pids(uid=env.uid) == []


def test_gxpc_mount_refuses_a_mountpoint_inside_its_export(make_gxp, user_bed, env):
    g = make_gxp(bed=user_bed)
    tag = secrets.token_hex(3)
    export = "/tmp/gxpexp-" + tag
    try:
        g.ok("explore", "--local", "1")
        g.ok("e", "mkdir -p %s/inner" % export)
        r = g.run("mount", export, export + "/inner", timeout=60)
        assert r.returncode != 0
        assert ("mountpoint %s/inner is inside the export %s: the mount would contain itself"
                % (export, export)) in r.stderr, r.stderr
        assert [m for m, t, _ in mounts() if m.startswith(export)] == []
        r = g.run("mount", export + "/inner", export, timeout=60)
        assert r.returncode != 0
        assert ("export %s/inner is inside the mountpoint %s: the mount would contain itself"
                % (export, export)) in r.stderr, r.stderr
        assert [m for m, t, _ in mounts() if m.startswith(export)] == []
    finally:
        subprocess.run(["rm", "-rf", export])
