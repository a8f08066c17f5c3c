"""Starting child agents: first stage, payload, channels, batch queues."""
