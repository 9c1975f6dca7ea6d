"""The beat schedule as the settings module builds it: each interval entry carries its interval in its messages'
headers, so a run can tell a beat's tick from a run sent by hand (``marketplace/jobs.py``). Imported before the
apps are loaded, so it imports no model."""

from __future__ import annotations

from typing import Any

INTERVAL_HEADER = "periodic_interval_s"


def beat_schedule(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The beat schedule with each interval entry's interval in its messages' headers (see the module's doc)."""
    scheduled = {}
    for key, entry in entries.items():
        entry = dict(entry)
        every = entry.get("schedule")
        if isinstance(every, int | float):
            options = dict(entry.get("options") or {})
            options["headers"] = {**(options.get("headers") or {}), INTERVAL_HEADER: float(every)}
            entry["options"] = options
        scheduled[key] = entry
    return scheduled
