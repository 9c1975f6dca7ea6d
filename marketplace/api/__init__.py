"""The REST API for automated procurement."""
