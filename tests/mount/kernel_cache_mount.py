"""A MergedFS over one local directory whose kernel keeps misses as a GMount
node's does, serving until unmounted: `python kernel_cache_mount.py BRANCH
MOUNTPOINT`. It prints "ready" and, with "expire" or "drop" after it, whether
the kernel can expire entries; then each line on stdin is a path ("/d") whose
kernel entry it drops as a name announced gone (the GMount node's call),
answered "done". Used by test_mount_kernel_cache.py."""
import sys
import threading

from sshfsmux.branches.local_branch import LocalBranch
from sshfsmux.fs.kernel_cache import MISS_SECONDS, KernelCache
from sshfsmux.fs.merged_fs import ATTR_SECONDS, MergedFS, run_fuse


def main(branch: str, mountpoint: str) -> None:
    def serve(kc: KernelCache) -> None:
        for line in sys.stdin:
            kc.invalidate_paths([line.strip()], exists=lambda p: False, gone=lambda p: True)
            print("done", flush=True)

    def ready() -> None:
        kc = KernelCache.capture(mountpoint)
        fs.dirs_moved = kc.forget_dirs
        threading.Thread(target=serve, args=(kc,), daemon=True).start()
        print("ready", "expire" if kc.expires else "drop", flush=True)

    fs = MergedFS([LocalBranch(branch)], mountpoint=mountpoint, on_ready=ready)
    fs.miss_seconds = MISS_SECONDS
    run_fuse(fs, mountpoint, foreground=True, negative_seconds=ATTR_SECONDS)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
