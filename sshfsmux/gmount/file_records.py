"""The file descriptions a GMount node sends the head, as named records.

On the wire each is a list (export_scan.scan_page, export_scan.describe,
gmount_node.copies_of build them); the head reads them only through these,
and drops an entry that is not of the shape it should be (a node of another
version, a bad peer) instead of failing the whole answer.

Head side.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional


class ScannedFile(NamedTuple):
    """A "scan" page's entry: [rel, size, mtime]."""
    rel: str
    size: int
    mtime: float

    @classmethod
    def from_wire(cls, item: Any) -> Optional["ScannedFile"]:
        fields = _fields(item, 3)
        return None if fields is None else cls(str(fields[0]), int(fields[1]), float(fields[2]))


class DescribedFile(NamedTuple):
    """A "changed" answer's entry: [rel, size, mtime, sha256 or ""]."""
    rel: str
    size: int
    mtime: float
    sha256: Optional[str]

    @classmethod
    def from_wire(cls, item: Any) -> Optional["DescribedFile"]:
        fields = _fields(item, 4)
        if fields is None:
            return None
        return cls(str(fields[0]), int(fields[1]), float(fields[2]), str(fields[3]) or None)


class FileCopy(NamedTuple):
    """A "changes" answer's entry: one complete copy, [rel, size, mtime, node name]."""
    rel: str
    size: int
    mtime: float
    node: str

    @classmethod
    def from_wire(cls, item: Any) -> Optional["FileCopy"]:
        fields = _fields(item, 4)
        return None if fields is None else cls(str(fields[0]), int(fields[1]), float(fields[2]),
                                               str(fields[3]))


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
