"""KernelCache.invalidate_paths: what it asks libfuse to drop (a fake libfuse
records the calls; the real one needs a mount's struct fuse)."""
import errno
import os
import select
import shutil
import subprocess
import sys
import tempfile

import pytest
from mount_table import FUSERMOUNT, in_mount_table

from sshfsmux.fs.kernel_cache import KernelCache


class FakeLib:
    def __init__(self, known):
        self.known, self.calls = set(known), []

        class Fn:
            def __call__(_self, fuse, path):
                p = path.decode()
                self.calls.append(p)
                return 0 if p in self.known else -errno.ENOENT
        self.fuse_invalidate_path = Fn()


def test_a_name_that_neither_was_nor_is_leaves_its_directory_alone():
    lib = FakeLib({"/w", "/w/made", "/w/gone"})
    kc = KernelCache(lib, 1)
    there = {"/w/new"}
    dropped = kc.invalidate_paths(["/w/made", "/w/never", "/w/new", "/w/gone"],
                                  exists=lambda p: p in there)
    # a known name and its directory; an unknown name that exists now (made
    # elsewhere): its directory too; a made-up name: only itself
    assert lib.calls == ["/w/made", "/w", "/w/never", "/w/new", "/w/gone"]
    assert dropped == 3


def test_without_an_existence_test_every_directory_is_dropped():
    lib = FakeLib(set())
    kc = KernelCache(lib, 1)
    assert kc.invalidate_paths(["/a/x", "/b/y"]) == 0
    assert lib.calls == ["/a/x", "/a", "/b/y", "/b"]
    lib.calls.clear()
    kc.invalidate_paths(["/a/x"], exists=lambda p: False)
    assert lib.calls == ["/a/x"]


class FakeLowLevel(FakeLib):
    """libfuse with a session: names' dentries are dropped by parent node id."""
    session = 7

    def __init__(self, known):
        super().__init__(known)
        self.entries = []

        def inval_entry(session, parent, name, length):
            assert session == self.session and length == len(name)
            self.entries.append((parent, name.decode()))
            return 0
        self.fuse_lowlevel_notify_inval_entry = inval_entry
        self.fuse_get_session = lambda fuse: self.session


def test_every_name_loses_its_dentry_negative_ones_too(tmp_path):
    """GMount lets the kernel keep misses: a name that appeared elsewhere
    (the kernel holds no inode for it, the export does not hold it) still
    has its negative dentry dropped, by its directory's node id (the
    high-level API's st_ino); names under a directory this mount never
    looked into have none to drop."""
    (tmp_path / "w").mkdir()
    (tmp_path / "gone").mkdir()
    lib = FakeLowLevel({"/w", "/w/known"})
    kc = KernelCache(lib, 1, mountpoint=str(tmp_path), dir_held=lambda d: d in ("/w",))
    kc.invalidate_paths(["/w/new", "/top", "/w/known", "/w/x", "/gone/y"], exists=lambda p: False)
    w = (tmp_path / "w").stat().st_ino
    # a name the kernel holds an inode of keeps its dentry (a directory's is
    # some process's current directory): its attributes go
    assert lib.entries == [(w, "new"), (1, "top"), (w, "x")]
    # the inodes as before (unknown names that are not here leave their
    # directory alone); a directory this mount never looked into ("/gone")
    # is not stat'ed: the kernel holds no name of it
    assert lib.calls == ["/w/new", "/top", "/w/known", "/w", "/w/x", "/gone/y"]


def test_a_name_in_this_nodes_export_keeps_its_dentry(tmp_path):
    """Made through this mount (or behind its back, which the timeout bounds):
    dropping its dentry could race the create and give a reader a new inode."""
    (tmp_path / "w").mkdir()
    lib = FakeLowLevel({"/w"})
    kc = KernelCache(lib, 1, mountpoint=str(tmp_path))
    kc.invalidate_paths(["/w/mine", "/w/theirs"], exists=lambda p: p == "/w/mine")
    assert lib.entries == [((tmp_path / "w").stat().st_ino, "theirs")]


def test_a_name_the_kernel_holds_that_is_gone_everywhere_loses_its_dentry(tmp_path):
    """Removed behind the mount's back: its attributes alone would leave the
    kernel sure it exists for the entry timeout (a recipe's `> out` then
    failed: "Directory nonexistent"); a name that still exists elsewhere
    keeps its dentry."""
    (tmp_path / "w").mkdir()
    lib = FakeLowLevel({"/w", "/w/gone", "/w/changed"})
    kc = KernelCache(lib, 1, mountpoint=str(tmp_path))
    kc.invalidate_paths(["/w/gone", "/w/changed"], exists=lambda p: False,
                        gone=lambda p: p == "/w/gone")
    assert lib.entries == [((tmp_path / "w").stat().st_ino, "gone")]


def test_a_directorys_node_id_is_kept_until_the_kernel_or_the_mount_moves_it(tmp_path, monkeypatch):
    """The stat that finds a parent's node id is a call into the mount itself
    (each call ends by dropping the directory's attributes): the id is kept
    between calls, found again when the kernel no longer holds that node or
    after forget_dirs (a directory removed or renamed through the mount)."""
    from sshfsmux.fs import kernel_cache
    (tmp_path / "w").mkdir()
    stats = []
    real_lstat = os.lstat

    def counting_lstat(path):
        stats.append(path)
        return real_lstat(path)
    monkeypatch.setattr(kernel_cache.os, "lstat", counting_lstat)
    lib = FakeLowLevel({"/w"})
    held = {(tmp_path / "w").stat().st_ino}
    lib.fuse_lowlevel_notify_inval_inode = lambda s, node, off, n: 0 if node in held else -errno.ENOENT
    kc = KernelCache(lib, 1, mountpoint=str(tmp_path))
    w = (tmp_path / "w").stat().st_ino
    for name in ("a", "b"):
        kc.invalidate_paths(["/w/" + name], exists=lambda p: False)
    assert (len(stats), lib.entries) == (1, [(w, "a"), (w, "b")])
    kc.forget_dirs()
    kc.invalidate_paths(["/w/c"], exists=lambda p: False)
    assert len(stats) == 2
    held.clear()                                # the kernel forgot the node
    kc.invalidate_paths(["/w/d"], exists=lambda p: False)
    assert len(stats) == 3


# -- a real mount (root, /dev/fuse): what the kernel does with the calls ----
VENV = os.environ.get("GXP_VENV", "/opt/gxpstyle/venv")
HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_cache_mount.py")
needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not FUSERMOUNT or not os.path.exists("/dev/fuse")
    or os.getuid() != 0, reason="needs Linux, /dev/fuse, fusermount3 and root")


class Mount:
    """kernel_cache_mount.py serving a MergedFS of `branch` at `mp`."""

    def __init__(self, top):
        self.branch, self.mp = os.path.join(top, "b"), os.path.join(top, "mnt")
        os.mkdir(self.branch)
        os.mkdir(self.mp)
        self.proc = subprocess.Popen([os.path.join(VENV, "bin", "python"), HARNESS, self.branch, self.mp],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.expires = self._line(60).split()[1:] == ["expire"]

    def _line(self, limit):
        """The harness's next line; none within `limit` seconds fails the test."""
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        assert ready, "the mount did not answer within %ss" % limit
        line = self.proc.stdout.readline()
        assert line, "the mount ended"
        return line

    def drop(self, path):
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        assert self._line(30).strip() == "done"

    def close(self):
        if in_mount_table(self.mp):
            subprocess.run([FUSERMOUNT, "-u", self.mp], timeout=60)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()


@pytest.fixture
def mount():
    top = tempfile.mkdtemp(prefix="gxp-kcache-", dir="/var/tmp")
    m = None
    try:
        m = Mount(top)
        if not m.expires:
            pytest.skip("this kernel cannot expire a FUSE entry (Linux 6.2 on)")
        yield m
    finally:
        if m is not None:
            m.close()
        shutil.rmtree(top, ignore_errors=True)


@needs_fuse
def test_a_directory_whose_entry_expires_stays_its_processes_cwd(mount):
    """A lookup answered after the node found a name missing, then the drop
    for it: the directory's dentry stays (a dropped one left the process
    working in it without a cwd: `sh: getcwd() failed`)."""
    os.mkdir(os.path.join(mount.branch, "d"))
    code = ("import os, sys; os.chdir(sys.argv[1]); print('in', flush=True); sys.stdin.readline();"
            " print(os.getcwd(), flush=True)")
    inside = subprocess.Popen([sys.executable, "-c", code, os.path.join(mount.mp, "d")], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert inside.stdout.readline() == "in\n"
        mount.drop("/d")
        out, err = inside.communicate("\n", timeout=30)
        assert (inside.returncode, out, err) == (0, os.path.join(mount.mp, "d") + "\n", "")
    finally:
        if inside.poll() is None:
            inside.kill()
            inside.communicate()


@needs_fuse
def test_a_miss_is_kept_until_the_name_is_announced(mount):
    """The kernel keeps a miss (no call into the mount) until its entry
    expires; a name gone everywhere is asked again at once."""
    x = os.path.join(mount.mp, "x")
    assert not os.path.exists(x)
    open(os.path.join(mount.branch, "x"), "w").close()       # behind the mount's back
    assert not os.path.exists(x), "the kernel did not keep the miss"
    mount.drop("/x")
    assert os.path.exists(x), "the announced name stayed missing"
    os.unlink(os.path.join(mount.branch, "x"))
    assert os.path.exists(x)                                   # its entry, kept for 1 s
    mount.drop("/x")
    assert not os.path.exists(x), "a name gone everywhere stayed"


@needs_fuse
def test_a_directory_made_again_through_the_mount_has_its_misses_announced(mount):
    """A directory renamed through the mount keeps its node (and the misses
    under it); one made at its old path is another node: a name announced
    there reaches the new directory's miss, not the renamed one's."""
    d, e = os.path.join(mount.mp, "d"), os.path.join(mount.mp, "e")
    os.mkdir(d)
    assert not os.path.exists(os.path.join(d, "x"))
    mount.drop("/d/x")                                         # the node id of /d is kept
    os.rename(d, e)
    assert not os.path.exists(os.path.join(e, "x"))           # a miss under the renamed node
    os.mkdir(d)
    x = os.path.join(d, "x")
    assert not os.path.exists(x)
    open(os.path.join(mount.branch, "d", "x"), "w").close()   # behind the mount's back
    assert not os.path.exists(x), "the kernel did not keep the miss"
    mount.drop("/d/x")
    assert os.path.exists(x), "the announced name stayed missing in the new directory"
