"""What runs under GNU make: the compiled hook, its job shell, the relay."""
