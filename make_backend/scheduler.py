"""The head's choice of node for each `gxpc make` recipe.

GNU make decides *what* runs and *when* (the DAG, -j); the head decides *where*.
These are the books (slots each node's recipes take); the choice itself,
input bytes from the replica catalog against load, is placement.py's.
`pick` is the load-only rule (the node with the lowest share of its slots
busy, ties going round the nodes in turn).

Head-only; no I/O here: the daemon sends the messages.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple


class MakeScheduler:
    def __init__(self) -> None:
        self.running: Dict[str, int] = {}            # node id -> slots its recipes take
        self.jobs: Dict[Tuple[str, int], str] = {}   # (client, job) -> node id
        self.slots: Dict[Tuple[str, int], int] = {}  # (client, job) -> slots (GXP_SLOTS), if not 1
        self._turn = 0

    def pick(self, candidates: Sequence[Tuple[str, int]]) -> Optional[str]:
        """The node for the next recipe, from (node id, slots) pairs; None if empty."""
        if not candidates:
            return None
        n = len(candidates)
        start = self._turn % n
        self._turn += 1
        best, best_load = None, None
        for i in range(n):
            nid, slots = candidates[(start + i) % n]
            load = self.running.get(nid, 0) / float(max(1, slots))
            if best_load is None or load < best_load:
                best, best_load = nid, load
        return best

    def started(self, key: Tuple[str, int], nid: str, slots: int = 1) -> None:
        self.jobs[key] = nid
        if slots != 1:
            self.slots[key] = slots
        self.running[nid] = self.running.get(nid, 0) + slots

    def finished(self, key: Tuple[str, int]) -> None:
        nid = self.jobs.pop(key, None)
        if nid is not None:
            left = self.running.get(nid, 1) - self.slots.pop(key, 1)
            if left > 0:
                self.running[nid] = left
            else:
                self.running.pop(nid, None)

    def jobs_of(self, client: str) -> List[Tuple[str, int]]:
        return [k for k in self.jobs if k[0] == client]
