"""sshfsm: the merged mount as a command of its own."""
