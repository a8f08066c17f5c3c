"""The session daemon on the head: the tree, services, sessions, exploring."""
