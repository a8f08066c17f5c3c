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
