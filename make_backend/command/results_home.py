"""`gxpc make --home`: copying what a make's recipes made on other hosts to
this host, so that losing those hosts afterwards loses no result (MFS's
"outputs at home once a job has exited").

The head names each file (its path in the GMount) and where this host's own
export keeps it; the copy is read through the mount (from the one holder
the catalog names), written beside its destination under a hidden name,
given the file's mode and mtime (so every node's mount takes the two for
replicas of one version, not a conflict) and renamed into place. A name
already at the destination is left alone. With DIR, files go into DIR
instead, at their path below make's directory (or below the mount's root).
Files are copied HOME_COPIES at a time: each is a read from another host, a
round trip or more before its first byte, and a wide make's results are
mostly small files (benchmarks/wan.py's workflow, 17 files of the sites'
hosts across the WAN: 2.2 s one at a time, 0.6 s 16 at a time).

Runs in the gxpc make process on the head; standard library.
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

HOME_COPIES = 16


def destination(path: str, export_path: str, rel: str, home_dir: Optional[str], cwd: str) -> str:
    """Where `path` goes: its place in this host's export, or in home_dir
    (at its path below make's directory, else below the mount's root: `rel`)."""
    if home_dir is None:
        return export_path
    below = os.path.relpath(path, cwd)
    return os.path.join(home_dir, rel if below.startswith("..") else below)


def copy_home(src: str, dst: str) -> str:
    """Copy src (a path in the mount) to dst; '' or what went wrong."""
    if os.path.lexists(dst):
        return ""
    try:
        st = os.stat(src)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), ".gxphome-%d-%s" % (os.getpid(), os.path.basename(dst)))
        try:
            with open(src, "rb") as r, open(tmp, "xb") as w:
                shutil.copyfileobj(r, w, 1 << 20)
            os.chmod(tmp, st.st_mode & 0o7777)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.rename(tmp, dst)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except OSError as e:
        return "%s: cannot bring it home to %s: %s" % (src, dst, e.strerror or e)
    return ""


def bring_home(files: List[Tuple[str, str, str]], home_dir: Optional[str], cwd: str) -> List[str]:
    """Each (path, export path, path below the mount's root) copied; returns
    a line per failure."""
    if not files:
        return []
    with ThreadPoolExecutor(min(HOME_COPIES, len(files))) as pool:
        whys = pool.map(lambda f: copy_home(f[0], destination(f[0], f[1], f[2], home_dir, cwd)),
                        files)
        return [why for why in whys if why]
