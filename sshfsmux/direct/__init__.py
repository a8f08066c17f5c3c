"""The direct data channel between agents: client branches and the export server."""
