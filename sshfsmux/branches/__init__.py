"""Branches: what a merged mount is built from, and the replica store."""
