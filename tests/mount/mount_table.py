"""What the real-mount tests of this folder share: the unmount command and a
look at the mount table."""
import shutil

FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount")


def in_mount_table(mp):
    """Whether anything is mounted at `mp` (this process's view)."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mp for line in f)
