"""KernelCache.invalidate_paths: what it asks libfuse to drop (a fake libfuse
records the calls; the real one needs a mount's struct fuse)."""
import errno

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
