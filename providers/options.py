"""Parsing of provider account options (all strings, as stored on the account) shared by every adapter."""

from __future__ import annotations

import math


def option_number(options: dict[str, str], key: str, default: float, *, allow_zero: bool = False) -> float:
    """``options[key]`` as a positive (or, with ``allow_zero``, non-negative) finite number, else ``default``.

    Raises ``ValueError`` naming the option when the value is not such a number; the broker reports that as
    a misconfigured account.
    """
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"options.{key}: {raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"options.{key}: must be a {'non-negative' if allow_zero else 'positive'} number")
    return value
