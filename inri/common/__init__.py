"""Shared layer below node, bootstrap and simulations (see docs/architecture.md)."""
