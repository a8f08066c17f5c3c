"""The parallel shell: `gxpc e` on the head and its client side."""
