"""The file descriptions a GMount node sends the head, as named records.

On the wire each is a list (export_scan.scan_page, export_scan.describe,
change_report.copies_of and export_state build them); the head reads them only through these,
and drops an entry that is not of the shape it should be (a node of another
version, a bad peer) instead of failing the whole answer.

Head side.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple


class ScannedFile(NamedTuple):
    """A "scan" page's entry: [rel, size, mtime, mode] (a node of an older
    version sends [rel, size, mtime]: a regular file)."""
    rel: str
    size: int
    mtime: float
    mode: int

    @classmethod
    def from_wire(cls, item: Any) -> Optional[ScannedFile]:
        fields = _fields(item, 4) or _fields(item, 3)
        if fields is None:
            return None
        mode = int(fields[3]) if len(fields) == 4 else 0
        return cls(str(fields[0]), int(fields[1]), float(fields[2]), mode)


class DescribedFile(NamedTuple):
    """A "changed" answer's entry: [rel, size, mtime, sha256 or "", mode]
    (mode left out, or 0: a regular file)."""
    rel: str
    size: int
    mtime: float
    sha256: Optional[str]
    mode: int

    @classmethod
    def from_wire(cls, item: Any) -> Optional[DescribedFile]:
        fields = _fields(item, 5) or _fields(item, 4)
        if fields is None:
            return None
        mode = int(fields[4]) if len(fields) == 5 else 0
        return cls(str(fields[0]), int(fields[1]), float(fields[2]), str(fields[3]) or None, mode)


class FileCopy(NamedTuple):
    """A "changes" answer's entry: one complete copy (or a node holding a
    directory or link of that name), [rel, size, mtime, node name, mode]
    (mode 0, or left out: a regular file)."""
    rel: str
    size: int
    mtime: float
    node: str
    mode: int

    @classmethod
    def from_wire(cls, item: Any) -> Optional[FileCopy]:
        fields = _fields(item, 5) or _fields(item, 4)
        if fields is None:
            return None
        mode = int(fields[4]) if len(fields) == 5 else 0
        return cls(str(fields[0]), int(fields[1]), float(fields[2]), str(fields[3]), mode)


def parse(record: Any, items: Any) -> List[Any]:
    """`items` (a list from the wire) read as `record`s, malformed ones left out."""
    out = []
    for item in items if isinstance(items, list) else []:
        try:
            r = record.from_wire(item)
        except (TypeError, ValueError):
            continue
        if r is not None:
            out.append(r)
    return out


def _fields(item: Any, count: int) -> Optional[List[Any]]:
    return item if isinstance(item, list) and len(item) == count else None


def export_changes(catalog: Any, mountpoint: str, nid: str, result: Dict[str, Any],
                   adopted: Set[Any]) -> List[str]:
    """Names changed in node `nid`'s export behind its mount (a peer's change
    made there included), from a `changes` answer's "here" ([rel, size, mtime,
    mode], a ScannedFile) and "not_here" (rel): that node holds them or not, and the other
    holders stay (its merged view may not know of them yet). A name the export
    now holds is no longer a replica store's copy there (`adopted`: (node id,
    rel)); one it lacks but the store holds stays. Returns the names whose
    catalog entry changed, and every name the export holds: its file may
    have changed within one timestamp tick, and the nodes' replicas of it
    must go (gmount/replica_trust.py). Malformed items are skipped."""
    changed = []
    for f in parse(ScannedFile, result.get("here")):
        path = os.path.join(mountpoint, f.rel)
        adopted.discard((nid, f.rel))
        catalog.add(path, nid, f.size, f.mtime, None, f.mode)
        changed.append(f.rel)
    for rel in result.get("not_here") or []:
        if not isinstance(rel, str) or (nid, rel) in adopted:
            continue
        path = os.path.join(mountpoint, rel)
        before = catalog.entry(path)
        catalog.remove(path, nid)
        if catalog.entry(path) != before:
            changed.append(rel)
    return changed


def take_copies(catalog: Any, mountpoint: str, by_name: Dict[str, str], items: Any,
                adopted: Set[Any]) -> List[str]:
    """The catalog takes a mount's merged view of changed names (FileCopy
    items: every complete copy of each, by node name; `by_name`: name -> node
    id; `adopted`: (node id, rel) of replica store copies, which an export's
    own file replaces). Returns every name: a file written through a mount
    may read the same size and mtime (one timestamp tick), and the nodes'
    replicas of it must go all the same (gmount/replica_trust.py)."""
    copies: Dict[str, Dict[str, Tuple[int, float, int]]] = {}
    for c in parse(FileCopy, items):
        where = copies.setdefault(c.rel, {})
        if c.node in by_name:
            where[by_name[c.node]] = (c.size, c.mtime, c.mode)
            adopted.discard((by_name[c.node], c.rel))
    for rel, where in copies.items():
        catalog.set_replicas(os.path.join(mountpoint, rel), where)
    return list(copies)
