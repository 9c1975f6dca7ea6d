"""Request rates as the settings write them ("600/min"): parsed by the API's throttles and checked by the settings
at start-up. Free of models, so the settings module may import it."""

from __future__ import annotations

RATE_PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def rate_parse(rate: str) -> tuple[int, int]:
    """``"600/min"`` -> (600, 60): requests per period of seconds. Raises ValueError."""
    count, _, period = rate.partition("/")
    if not (count.isascii() and count.isdigit()) or period not in RATE_PERIODS:
        raise ValueError(f"{rate!r} is not a rate like 600/min")
    return int(count), RATE_PERIODS[period]
