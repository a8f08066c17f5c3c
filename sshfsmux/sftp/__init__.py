"""Branches over SFTP against a stock sshd."""
