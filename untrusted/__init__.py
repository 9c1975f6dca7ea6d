"""Helpers for input from outside the broker; below every app, importing none (docs/ARCHITECTURE.md)."""
