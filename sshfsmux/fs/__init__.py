"""The merged tree: one FUSE filesystem over a list of branches."""
