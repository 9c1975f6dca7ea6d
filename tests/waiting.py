"""Waiting for a state, never for a clock: tests poll what they need to see, within a bound that only a broken
run reaches."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object], what: str, *, timeout: float = 90.0, detail: Callable[[], str] | None = None
) -> None:
    """Return once ``predicate()`` is truthy; fail naming ``what`` (and ``detail()``, when given, such as a
    process's log) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    extra = f"; {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
