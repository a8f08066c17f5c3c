"""gxpc, the command line, and the client library it is built on."""
