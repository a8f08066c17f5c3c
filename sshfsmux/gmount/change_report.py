"""What a GMount node's change feed tells the head of changed names: the
merged view's holders of names changed through the mount (copies_of), and
the export's own state of names changed in it behind the mount
(export_state). gmount/node.py answers the head's "changes" call with them;
the head reads them through file_records.py.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


def holders_of(fs: Any, rel: str) -> List[List[Any]]:
    """[rel, size, mtime, node, mode] of every holder of `rel` that the
    catalog should name (fs has a namespace copy): of a regular file, the
    copies of the visible version; of anything else, every node holding it."""
    import stat
    found = fs.fresh_holders("/" + rel)
    first = found[0]
    if stat.S_ISREG(first[3]):
        found = [h for h in found if h[1] == first[1] and int(h[2]) == int(first[2])]
    return [[rel, size, mtime, node, mode] for node, size, mtime, mode in found]


def copies_of(fs: Any, rels: List[str]) -> Tuple[List[List[Any]], List[str]]:
    """What the merged view says of changed names: ([rel, size, mtime, node]
    for every complete copy, the very list the location xattr names
    (Xattrs.copies), [rel with no file: gone from every branch, or not a
    regular file]). A write through this mount goes to the branches holding
    the file, so "not in this export" is not "gone". A name some branch
    cannot answer for (a peer that errs) is in neither list: the catalog
    keeps what it knew."""
    import errno
    copies: List[List[Any]] = []
    gone: List[str] = []
    for rel in rels:
        try:
            if fs is None:
                raise OSError(errno.ENOENT, "not mounted")
            if fs.namespace is not None:
                copies.extend(holders_of(fs, rel))
                continue
            found = fs.file_copies("/" + rel)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                gone.append(rel)
            continue
        if not found:
            gone.append(rel)
        copies.extend([rel, size, mtime, node] for node, size, mtime in found)
    return copies, gone


def _signature(st: os.stat_result) -> Tuple[int, ...]:
    # a write or chmod changes the ctime; a file put in its place, the inode
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def export_signature(export: str, rel: str) -> Optional[Tuple[int, ...]]:
    """The state of the export's `rel` that any change to it alters (None:
    the export holds nothing of that name)."""
    try:
        return _signature(os.lstat(os.path.join(export, rel)))
    except OSError:
        return None


def export_state(export: str, rels: List[str], echoes: Optional[Dict[str, Tuple[int, ...]]] = None
                 ) -> Tuple[List[List[Any]], List[str]]:
    """What the export alone holds of `rels`: ([rel, size, mtime, mode] of
    each name it holds, [each it does not]). For names changed in the export
    behind the mount (inotify), a peer's change made there included: the
    merged view may not have heard of it yet, the export itself has. A name
    whose state is what `echoes` says this mount's own change left is left
    out: that change went to the head with the merged view's holders."""
    here: List[List[Any]] = []
    not_here: List[str] = []
    for rel in rels:
        try:
            st = os.lstat(os.path.join(export, rel))
        except OSError:
            not_here.append(rel)
            continue
        if echoes and echoes.get(rel) == _signature(st):
            continue
        here.append([rel, st.st_size, st.st_mtime, st.st_mode])
    return here, not_here
