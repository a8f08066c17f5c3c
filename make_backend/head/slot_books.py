"""The slots each node's `gxpc make` recipes take, and how long each ran.

GNU make decides *what* runs and *when* (the DAG, -j); the head decides *where*:
placement.py makes that choice (input bytes from the replica catalog against
load), reading these books for load. Nothing here picks a node.

Head-only; no I/O here: the daemon sends the messages.
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple


class SlotBooks:
    def __init__(self) -> None:
        self.running: Dict[str, int] = {}                       # node id -> slots its recipes take
        # (client, job) -> (node id, slots, when it started)
        self.jobs: Dict[Tuple[str, int], Tuple[str, int, float]] = {}

    def started(self, key: Tuple[str, int], nid: str, slots: int = 1) -> None:
        self.jobs[key] = (nid, slots, time.monotonic())
        self.running[nid] = self.running.get(nid, 0) + slots

    def finished(self, key: Tuple[str, int]) -> Optional[float]:
        """The job's slots are free again; returns how long it ran."""
        held = self.jobs.pop(key, None)
        if held is None:
            return None
        nid, slots, since = held
        left = self.running.get(nid, slots) - slots
        if left > 0:
            self.running[nid] = left
        else:
            self.running.pop(nid, None)
        return time.monotonic() - since
