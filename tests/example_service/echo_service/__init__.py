"""An example service: `echo` reaches the node side on every explored node,
and each answers with a message of its own (docs/writing-a-service.md)."""
