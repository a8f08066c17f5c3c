"""`gxpc make --trace=FILE`: one JSON line per recipe and per transfer.

    {"kind": "recipe", "node": "tb03", "recipe": "bwa mem ref.fa r1.fq > r1.sam",
     "start": 1.7e9, "end": 1.7e9, "status": 0}
    {"kind": "transfer", "node": "tb05", "file": "/mnt/gx/ref.fa", "bytes": 104857600,
     "start": 1.7e9, "end": 1.7e9, "mode": "push", "source": "tb01"}

    {"kind": "pool", "event": "up", "pool": "slurm head job[[1-8]]", "what": "job3",
     "up": 3, "time": 1.7e9}
    {"kind": "wan", "bytes": 8650752, "sites": {"ga": [4325376, 12288], "gb": [8192, 4325376]},
     "time": 1.7e9}

The wan line, last, is what crossed between sites while the make ran (`gxpc
stat`'s WAN line: bytes in and out over each site gateway's link to the head,
everything the session sent that way, not only the make's); none without sites.

A pool line is an elastic pool's change while the make runs (gxpstyle/head/
elastic.py): `event` submit (a batch job for agent `what`), up, release (the
agent is marked leaving and told to quit), gone, cancel (a queued job
cancelled), lost, failed (`what` says why); `up` is the pool's agents up then.
`recipe` is the first line of the recipe's command. Times are seconds since
the epoch (the head's clock). A transfer line is written when the copy is in
place on its node (adopted by the mount); `source` is the holder the copy
started from (a push may reach the node through other nodes of the tree).
`gxpc plot FILE` draws it. The head writes the file (it runs as the user who
started the session, on the machine of `gxpc make`).

Head-only.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

from gxpstyle.config import safe_paths


class TraceFile:
    def __init__(self, path: str) -> None:
        self.path = path
        # a regular file only (PathRefused, an OSError, names the path)
        self.f = safe_paths.open_output(path)

    def _write(self, rec: Dict[str, Any]) -> None:
        if self.f.closed:
            return
        self.f.write(json.dumps(rec, sort_keys=True) + "\n")
        self.f.flush()

    def recipe(self, node: str, recipe: str, start: float, end: float, status: int) -> None:
        self._write({"kind": "recipe", "node": node, "recipe": recipe, "start": round(start, 6),
                     "end": round(end, 6), "status": status})

    def transfer(self, node: str, path: str, nbytes: int, start: float, end: float, mode: str,
                 source: str) -> None:
        self._write({"kind": "transfer", "node": node, "file": path, "bytes": nbytes,
                     "start": round(start, 6), "end": round(end, 6), "mode": mode,
                     "source": source})

    def pool(self, event: str, pool: str, what: str, up: int, when: float) -> None:
        self._write({"kind": "pool", "event": event, "pool": pool, "what": what, "up": up,
                     "time": round(when, 6)})

    def wan(self, sites: Dict[str, List[int]], when: float) -> None:
        self._write({"kind": "wan", "bytes": sum(i + o for i, o in sites.values()),
                     "sites": sites, "time": round(when, 6)})

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()
