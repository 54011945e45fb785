"""Frontends: model-building helpers that build ops (they never call backends)."""
