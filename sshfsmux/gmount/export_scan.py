"""What a GMount node tells the head's replica catalog about its own export.

`scan_page`: the names under the export (relative path, size, mtime, mode:
files, directories, links), in a fixed order, a page at a time so that no
reply outgrows a frame.
`describe`: size, mtime and (for files up to HASH_LIMIT) the SHA-256 of the
files a recipe just wrote, as the export holds them.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import hashlib
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Tuple

PAGE = 20000                  # files a reply; ~1.5 MB of frame at most
HASH_LIMIT = 16 << 20         # bytes: hashing a bigger output would delay make's exit status
SMALL = 256 << 10             # bytes: hashed on the mount's loop (small)


def _walk(root: str) -> Any:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            yield os.path.join(d, name)


def scan_page(export: str, offset: int) -> Tuple[List[List[Any]], bool]:
    """Names number offset .. offset+PAGE of the export, and whether more follow."""
    out: List[List[Any]] = []
    i = 0
    for path in _walk(export):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if i >= offset:
            if len(out) >= PAGE:
                return out, True
            out.append([os.path.relpath(path, export), st.st_size, st.st_mtime, st.st_mode])
        i += 1
    return out, False


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return h.hexdigest()
            h.update(block)


def small(export: str, rels: List[str], limit: int = SMALL) -> bool:
    """Each of `rels` is missing from the export or no bigger than `limit`
    bytes (describing them costs a few stats and reads, no long hash)."""
    for rel in rels:
        try:
            if os.lstat(os.path.join(export, rel.lstrip("/"))).st_size > limit:
                return False
        except OSError:
            continue
    return True


def describe(export: str, rels: List[str], hashes: bool = True) -> List[List[Any]]:
    """[rel, size, mtime, sha256 or '', mode] for each rel the export holds
    (a directory or link too, without hash); names the export lacks are left
    out. `hashes`: hash regular files up to HASH_LIMIT (else never)."""
    out: List[List[Any]] = []
    for rel in rels:
        path = os.path.join(export, rel.lstrip("/"))
        try:
            st = os.lstat(path)
            digest = (_sha256(path) if hashes and stat.S_ISREG(st.st_mode)
                      and st.st_size <= HASH_LIMIT else "")
        except OSError:
            continue
        out.append([rel, st.st_size, st.st_mtime, digest, st.st_mode])
    return out
