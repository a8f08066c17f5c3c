"""`gxpc make` on the head: placement, slots and planned transfers."""
