"""Backends: where a program's requests go. See base.Backend for the contract."""
