"""Which node holds which file of the shared mount."""
