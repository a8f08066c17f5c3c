"""GMount: the merged mount as a gxpc service (head, node side, verbs)."""
