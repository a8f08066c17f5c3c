"""Broadcast: `gxpc bcast` on the head, its node side and direct links."""
