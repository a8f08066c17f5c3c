"""A GMount node's replicas of its peers' files, opened without asking the
holder: the head's catalog announces every change of a file to each node
holding its directory (namespace_feed.py, a rewrite within one timestamp
tick included), and the node drops its replicas of that file as it takes
the announcement, before it answers. So a replica still in the store is
the file as the namespace copy names it, and opening it needs no round trip
(direct/branch.py: `known`), even of a file written a moment ago, whose
times alone would not tell a later change apart. make's order holds: a
recipe starts only once its node's mount took every change before it.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple


def known_file(copy_of: Callable[[], Any], node: str
               ) -> Callable[[str], Optional[Tuple[int, float]]]:
    """(size, mtime) of `node`'s file rel ("a/b") as the namespace copy
    (copy_of(), or None) names it, or None."""
    def known(rel: str) -> Optional[Tuple[int, float]]:
        ns = copy_of()
        d, name = os.path.split(rel)
        listing = ns.dirs.get(d) if ns is not None else None
        for h in (listing or {}).get(name, ()):
            if h[0] == node:
                return h[1], h[2]
        return None
    return known


def drop_announced(branches: List[Any], copy: Any, dirs: Any) -> None:
    """The head announced (or listed) `dirs` (key -> name -> holders, as
    the wire has them): the replicas of each name read from the holders it
    names, and from those the copy named, go."""
    if not isinstance(dirs, dict):
        return
    by_node: Dict[str, Any] = {b.node: b for b in branches if getattr(b, "known", None)}
    if not by_node:
        return
    rels: Dict[str, List[str]] = {}
    for key, names in dirs.items():
        if not isinstance(names, dict):
            continue
        before = copy.dirs.get(key) or {} if copy is not None else {}
        for name, holders in names.items():
            rel = (str(key) + "/" if key else "") + str(name)
            nodes = {h[0] for h in before.get(name, ())}
            if isinstance(holders, list):
                nodes.update(h[0] for h in holders if isinstance(h, list) and h)
            for n in nodes:
                if n in by_node:
                    rels.setdefault(n, []).append(rel)
    for n, names in rels.items():
        by_node[n].drop_replicas(names)
