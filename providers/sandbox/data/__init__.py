"""Seed data for the sandboxes (a package only so the CSV files ship with the wheel)."""
