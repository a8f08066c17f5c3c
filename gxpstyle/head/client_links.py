"""The session daemon's links to its clients, and a bound on what they make it hold.

Every client (gxpc, a library user, make's job shells) may have one frame of up
to 4 MiB half sent: the daemon holds those bytes until the rest arrives. Only
the session's own user can connect, but one runaway script with many
connections must not grow the daemon without bound, so the daemon keeps at
most MAX_CLIENTS connections and MAX_PENDING_BYTES of unfinished client frames
in all. A connection past the first is refused, and the client whose read
takes the total past the second is closed; each with a line in the session
log (at most one such line per LOG_EVERY seconds, with a count of the rest).

Head-only.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from gxpstyle.transport.links import Link

MAX_CLIENTS = 4096
MAX_PENDING_BYTES = 64 << 20
LOG_EVERY = 10.0


class ClientBudget:
    """What every client link together holds in unfinished frames."""

    def __init__(self, max_clients: int = MAX_CLIENTS,
                 max_pending: int = MAX_PENDING_BYTES) -> None:
        self.max_clients = max_clients
        self.max_pending = max_pending
        self.pending = 0
        self._quiet_until = 0.0
        self._unlogged = 0

    def admit_problem(self, clients: int) -> Optional[str]:
        """Why a new connection is refused when `clients` are connected, or None."""
        if clients < self.max_clients:
            return None
        return "refused a client connection: %d clients are connected, the most a session " \
               "serves" % clients

    def log_line(self, text: str) -> Optional[str]:
        """`text` if it may be logged now, else None (counted and summed up later)."""
        now = time.monotonic()
        if now < self._quiet_until:
            self._unlogged += 1
            return None
        self._quiet_until = now + LOG_EVERY
        if self._unlogged:
            text += " (and %d more such in %gs)" % (self._unlogged, LOG_EVERY)
            self._unlogged = 0
        return text


class ClientLink(Link):
    """A Link whose unfinished frame counts against the daemon's ClientBudget."""

    def __init__(self, budget: ClientBudget, *args: Any) -> None:
        self.budget = budget
        self.counted = 0
        super().__init__(*args)

    def _consume(self, data: bytes) -> None:
        super()._consume(data)
        if self.closed:
            return
        now = self.reader.pending
        self.budget.pending += now - self.counted
        self.counted = now
        if now and self.budget.pending > self.budget.max_pending:
            self.close("its unfinished frame takes the clients' unfinished frames past %d MiB, "
                       "the most the session daemon holds" % (self.budget.max_pending >> 20))

    def close(self, why: str = "closed") -> None:
        self.budget.pending -= self.counted
        self.counted = 0
        super().close(why)
