"""The `gxpc make` and `gxpc plot` verbs and the make they run."""
