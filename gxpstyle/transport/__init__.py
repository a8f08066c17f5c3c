"""The event loop, frame links between neighbours, authenticated TCP links."""
