"""Reading what comes from outside: JSON bounded in size and depth before the parser sees it.

Every app reads bodies from the other side (buyers' requests, clouds' and agents' answers, an auditor's
inputs), so this sits below them all and imports nothing of the project's. Standard library only, and Python
3.9 compatible: the lease agent's one-file bundle carries it to machines whose Python may be that old.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from typing import Any

MAX_JSON_BYTES = 256 * 1024
MAX_JSON_DEPTH = 16

# A JSON string (RFC 8259 section 7): a quote, then runs of anything but quote and backslash, each escape a
# backslash and one character. Unrolled, and the closing quote optional (an unclosed string runs to the end,
# which the parser refuses anyway), so no match ever fails and backtracks: linear on any input.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEPS = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})


def json_depth(text: str) -> int:
    """How deep ``text``'s brackets nest outside strings: 0 for a scalar, 1 for ``[]``. Linear and in C but
    for one ``max`` over the brackets, so a megabyte of brackets takes milliseconds."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    # Each opening bracket is 2 and each closing one 0, so the running sum minus the position is the depth.
    steps = brackets.translate(_STEPS).encode("latin-1")
    return max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (RFC 8259 section 6)")


def bounded_json(body: bytes | str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for bodies from the other side, refusing (``ValueError``, naming the limit) more than
    ``max_bytes`` (characters, for text) or nesting deeper than ``max_depth`` before the parser sees them: a
    body nested a hundred thousand deep would otherwise take the parser through the stack. ``NaN`` and
    ``Infinity``, which Python's parser accepts but JSON does not have, are refused too. An empty body is
    ``{}``."""
    if len(body) > max_bytes:
        unit = "characters" if isinstance(body, str) else "bytes"
        raise ValueError(f"the body is {len(body)} {unit}; at most {max_bytes} are read")
    if isinstance(body, (bytes, bytearray)):  # a tuple, not X | Y: Python 3.9 runs the agent
        # As json.loads reads bytes: UTF-8, -16 or -32 by the first bytes (RFC 8259 section 8.1 asks for UTF-8).
        body = bytes(body).decode(json.detect_encoding(body), "surrogatepass")
    depth = json_depth(body)
    if depth > max_depth:
        raise ValueError(f"the body nests deeper than {max_depth} levels: {depth}")
    return json.loads(body or "{}", parse_constant=_no_constant)
