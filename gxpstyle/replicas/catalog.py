"""The replica catalog on the head: which node holds which file of the shared mount.

Keys are absolute paths as users see them on the nodes (under the GMount
mountpoint, e.g. /mnt/gx/work/a.bam); each maps to its replicas, one per node
id: (size, mtime, content hash or None). The GMount service feeds it (each
node's export when the mount comes up, and the files a recipe wrote once it
has acted on them), the make service reads it to place recipes next to their
inputs, and a lost subtree drops its replicas (ReplicaService.node_lost).

Directories, symbolic links and other names are entries too, with their
mode (a mount's nodes answer lookups and listings from it: `listing`); only
regular files have versions (a copy of another size or mtime replaces the
others), and only they are replicas (`replicas`, `holders`: what placement
weighs). A mode of 0 is a regular file whose mode was not said.

Memory is what bounds it, so nothing here is a dict per entry: node ids are
interned (a small int each), a file's replicas are one packed `bytes` of 24
bytes a replica, and paths are split into an interned directory and a name,
so the directory part of a million files in a few directories is stored once.
Measured (tests/replicas/test_replica_catalog.py, which checks it stays under 300 B):
10^6 single-replica entries of 40-character paths in 100,000 directories
grow a process's RSS by 184 MB (184 B an entry), built in 2.5 s; dropping a
lost node's 125,000 replicas takes 0.8 s. Past MAX_ENTRIES the catalog takes no new paths
(placement then falls back to load for those) and counts what it refused.

Head-only; standard library.
"""
from __future__ import annotations

import stat
import struct
from typing import Any, Dict, Iterable, List, Optional, Tuple

from gxpstyle.protocol import wire

_REC = struct.Struct("<IqdI")         # node index, size, mtime, mode: 24 bytes a replica
MAX_ENTRIES = 2_000_000               # paths; ~370 MB at the measured cost an entry

Replica = Tuple[int, float, Optional[str]]   # size, mtime, hash
Holder = Tuple[str, int, float, int]         # node, size, mtime, mode


def _versioned(mode: int) -> bool:
    """A regular file (or an unknown mode): copies of another version are stale."""
    return mode == 0 or stat.S_ISREG(mode)


def _split(path: str) -> Tuple[str, str]:
    i = path.rfind("/")
    return (path[:i] or "/", path[i + 1:]) if i >= 0 else ("", path)


class ReplicaCatalog:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._node_ids: List[str] = []             # index -> node id
        self._node_index: Dict[str, int] = {}
        self._dirs: Dict[str, Dict[str, bytes]] = {}   # directory -> {name: packed replicas}
        self._hashes: Dict[str, str] = {}          # path|node -> hash, only where known
        self.entries = 0
        self.refused = 0
        self.bytes_moved = 0                       # what placement expected nodes to fetch

    # -- nodes ---------------------------------------------------------------
    def _index(self, node: str) -> int:
        i = self._node_index.get(node)
        if i is None:
            i = len(self._node_ids)
            self._node_ids.append(node)
            self._node_index[node] = i
        return i

    # -- changes -------------------------------------------------------------
    def add(self, path: str, node: str, size: int, mtime: float,
            digest: Optional[str] = None, mode: int = 0) -> bool:
        """`node` holds a complete copy of `path` (of `mode`: 0 for a regular
        file). A file's replica whose size or mtime differs from the others'
        replaces them (the file changed: the old copies are stale). False if
        the catalog is full."""
        d, name = _split(path)
        names = self._dirs.get(d)
        old = names.get(name) if names is not None else None
        if old is None and self.entries >= self.max_entries:
            self.refused += 1
            return False
        idx = self._index(node)
        kept = bytearray()
        versioned = _versioned(mode)
        if old is not None:
            for i, s, m, md in _REC.iter_unpack(old):
                if i != idx and (not versioned and not _versioned(md)
                                 or s == size and int(m) == int(mtime)):
                    kept += _REC.pack(i, s, m, md)
                elif i != idx:
                    self._hashes.pop(path + "|" + self._node_ids[i], None)
        kept += _REC.pack(idx, int(size), float(mtime), mode)
        if names is None:
            names = self._dirs[d] = {}
        if old is None:
            self.entries += 1
        names[name] = bytes(kept)
        key = path + "|" + node
        if digest:
            self._hashes[key] = digest
        elif not any(i == idx and s == size and int(m) == int(mtime)
                     for i, s, m, _ in _REC.iter_unpack(old or b"")):
            self._hashes.pop(key, None)      # a new version: the old hash is wrong
        return True

    def set_replicas(self, path: str, copies: Dict[str, Tuple[Any, ...]]) -> bool:
        """`path`'s complete copies are exactly `copies` (node -> size, mtime
        and, if known, mode; none: the path is gone): a mount's merged view
        of a changed name.
        A known hash stays with a copy whose size and mtime did not change.
        False if the catalog is full."""
        old = self.replicas(path)
        d, name = _split(path)
        names = self._dirs.get(d)
        known = names is not None and name in names
        if not copies:
            self.remove(path)
            return True
        if not known and self.entries >= self.max_entries:
            self.refused += 1
            return False
        packed = bytearray()
        for node, (size, mtime, *mode) in copies.items():
            packed += _REC.pack(self._index(node), int(size), float(mtime),
                                int(mode[0]) if mode else 0)
        for node, (s, m, _) in old.items():
            now = copies.get(node)
            if now is None or now[0] != s or int(now[1]) != int(m):
                self._hashes.pop(path + "|" + node, None)
        if names is None:
            names = self._dirs[d] = {}
        if not known:
            self.entries += 1
        names[name] = bytes(packed)
        return True

    def remove(self, path: str, node: Optional[str] = None) -> None:
        """`path` is gone (from `node` only, or everywhere)."""
        d, name = _split(path)
        names = self._dirs.get(d)
        old = names.get(name) if names is not None else None
        if old is None or names is None:
            return
        idx = self._node_index.get(node, -1) if node is not None else -1
        kept = bytearray()
        for i, s, m, md in _REC.iter_unpack(old):
            if node is not None and i != idx:
                kept += _REC.pack(i, s, m, md)
            else:
                self._hashes.pop(path + "|" + self._node_ids[i], None)
        self._store(d, names, name, bytes(kept))

    def _store(self, d: str, names: Dict[str, bytes], name: str, packed: bytes) -> None:
        if packed:
            names[name] = packed
            return
        del names[name]
        self.entries -= 1
        if not names:
            del self._dirs[d]

    def drop_node(self, lost: str) -> int:
        """Every node under `lost` (itself included) is gone, and its copies
        with it; returns how many replicas were dropped. One pass over the
        catalog: a loss is rare, a lookup is not."""
        gone = {i for i, n in enumerate(self._node_ids) if wire.is_descendant(n, lost)}
        if not gone:
            return 0
        dropped = 0
        for d in list(self._dirs):
            names = self._dirs[d]
            for name in list(names):
                recs = list(_REC.iter_unpack(names[name]))
                keep = [r for r in recs if r[0] not in gone]
                if len(keep) != len(recs):
                    dropped += len(recs) - len(keep)
                    self._store(d, names, name, b"".join(_REC.pack(*r) for r in keep))
        for key in [k for k in self._hashes if self._node_of_key(k) in gone]:
            del self._hashes[key]
        return dropped

    def _node_of_key(self, key: str) -> int:
        return self._node_index.get(key.rsplit("|", 1)[1], -1)

    def replace_tree(self, node: str, root: str, files: Iterable[Tuple[Any, ...]]) -> int:
        """A fresh scan of what `node` holds under `root` (rel, size, mtime
        and, if known, mode; rel relative to `root`): its older replicas
        under `root` are forgotten first. Returns how many names were taken."""
        idx = self._node_index.get(node)
        prefix = root.rstrip("/") + "/"
        if idx is not None:
            for d in [d for d in self._dirs if d == root or d.startswith(prefix)]:
                names = self._dirs[d]
                for name in list(names):
                    if any(r[0] == idx for r in _REC.iter_unpack(names[name])):
                        self.remove(d.rstrip("/") + "/" + name, node)
        taken = 0
        for rel, size, mtime, *mode in files:
            if self.add(prefix + rel.lstrip("/"), node, size, mtime, None,
                        int(mode[0]) if mode else 0):
                taken += 1
        return taken

    def forget_tree(self, root: str) -> None:
        """Everything under `root` (a mount that went away)."""
        prefix = root.rstrip("/") + "/"
        for d in [d for d in self._dirs if d == root or d.startswith(prefix)]:
            names = self._dirs.pop(d)
            self.entries -= len(names)
            for name in names:
                p = d.rstrip("/") + "/" + name
                for r in _REC.iter_unpack(names[name]):
                    self._hashes.pop(p + "|" + self._node_ids[r[0]], None)

    # -- questions -----------------------------------------------------------
    def replicas(self, path: str) -> Dict[str, Replica]:
        """node id -> (size, mtime, hash or None) for every complete copy."""
        d, name = _split(path)
        packed = self._dirs.get(d, {}).get(name)
        if packed is None:
            return {}
        out: Dict[str, Replica] = {}
        for i, s, m, md in _REC.iter_unpack(packed):
            if _versioned(md):
                node = self._node_ids[i]
                out[node] = (s, m, self._hashes.get(path + "|" + node))
        return out

    def listing(self, directory: str) -> Dict[str, List[Holder]]:
        """Every name the catalog knows in `directory` (a path, no trailing
        slash): name -> its holders (node, size, mtime, mode), in the order
        they were added."""
        out: Dict[str, List[Holder]] = {}
        for name, packed in self._dirs.get(directory.rstrip("/") or "/", {}).items():
            out[name] = [(self._node_ids[i], s, m, md) for i, s, m, md in _REC.iter_unpack(packed)]
        return out

    def entry(self, path: str) -> List[Holder]:
        """The holders of one name (listing's record of it), [] if none."""
        d, name = _split(path)
        packed = self._dirs.get(d, {}).get(name)
        return [(self._node_ids[i], s, m, md)
                for i, s, m, md in _REC.iter_unpack(packed or b"")]

    def holders(self, path: str) -> List[str]:
        return list(self.replicas(path))

    def bytes_by_node(self, paths: Iterable[str]) -> Tuple[Dict[str, int], int]:
        """For a recipe's inputs: bytes each node holds locally, and the
        total size of the inputs the catalog knows (the largest copy each)."""
        held: Dict[str, int] = {}
        total = 0
        for p in paths:
            reps = self.replicas(p)
            if not reps:
                continue
            total += max(s for s, _, _ in reps.values())
            for node, (s, _, _) in reps.items():
                held[node] = held.get(node, 0) + s
        return held, total

    def __len__(self) -> int:
        return self.entries

    def stat(self) -> Dict[str, int]:
        return {"catalog_entries": self.entries, "catalog_refused": self.refused,
                "bytes_moved": self.bytes_moved}
