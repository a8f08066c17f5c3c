"""The agent on every node: routing, jobs, its own clean-up."""
