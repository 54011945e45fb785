"""Shared frontend pieces: the standard axes."""
