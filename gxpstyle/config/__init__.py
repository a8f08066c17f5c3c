"""What a user gives: use rules, cluster files, host patterns, ranges, names."""
