"""Bounds on what the client reads: JSON answers and files, and numbers on the command line.

The client stands alone (it imports nothing from the broker), so it has its own small checks. JSON is refused
beyond a size and a nesting depth before ``json.loads`` sees it: the C decoder recurses once per level, and a
process whose recursion limit some library raised would overflow its stack on an answer nested deeply enough.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a whole ledger bundle or receipt list stays well below
MAX_DEPTH = 64

# Strings are dropped first (an escape is a backslash and one character), so brackets inside them do not count.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_OPEN = frozenset("[{")
_CLOSE = frozenset("]}")


def loads(text: str | bytes, *, what: str = "the answer", max_bytes: int = MAX_ANSWER_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:  # fmt: skip
    """``json.loads`` of ``text``, raising ``ValueError`` (naming ``what`` and the limit) when it is longer
    than ``max_bytes`` or nests deeper than ``max_depth``, or holds NaN or Infinity (not JSON numbers)."""
    if len(text) > max_bytes:
        raise ValueError(f"{what} is {len(text)} bytes, over the {max_bytes} this client reads")
    if isinstance(text, bytes):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    depth = 0
    for char in _STRING.sub("", text):
        if char in _OPEN:
            depth += 1
            if depth > max_depth:
                raise ValueError(f"{what} nests deeper than the {max_depth} levels this client reads")
        elif char in _CLOSE:
            depth -= 1
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)


def number(low: float, high: float, *, whole: bool = False) -> Callable[[str], Any]:
    """An argparse ``type``: a number written with the digits 0-9 (no exponent, NaN or Infinity; Python's
    ``int`` and ``float`` would take Arabic-Indic or fullwidth digits) from ``low`` to ``high``."""
    kind = "a whole number" if whole else "a number"

    def parse(text: str) -> Any:
        text = text.strip()
        if len(text) > 40 or not (_WHOLE if whole else _DECIMAL).fullmatch(text):
            raise argparse.ArgumentTypeError(f"{kind} from {low} to {high} in the digits 0-9, not {text[:40]!r}")
        value = int(text) if whole else float(text)
        # A minus sign below a range that starts at 0 is refused as written, as the broker does ("-0" too).
        if not (math.isfinite(value) and low <= value <= high) or (text.startswith("-") and low >= 0):
            raise argparse.ArgumentTypeError(f"{kind} from {low} to {high}, not {text}")
        return value

    parse.__name__ = "whole number" if whole else "number"  # argparse names the type in its own messages
    return parse


def money(low: float, high: float) -> Callable[[str], str]:
    """An argparse ``type`` like ``number`` that keeps the amount as written, so it reaches the broker as the
    decimal the user typed rather than a binary float's expansion (1.1 is not 1.100000000000000088...)."""
    check = number(low, high)

    def parse(text: str) -> str:
        check(text)
        return text.strip()

    parse.__name__ = "amount"
    return parse
