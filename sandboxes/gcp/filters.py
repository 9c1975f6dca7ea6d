"""The ``filter`` parameter of Compute Engine list calls, as far as the sandbox needs it.

Supported: one or more comparisons joined by ``AND`` (or juxtaposed, optionally in parentheses), each
``field OP value`` with ``=``, ``!=``, ``:`` (has / contains), or the legacy regular-expression forms ``eq`` and
``ne``. Fields are dotted camelCase paths into the resource (``labels.broker-order``, ``targetLink``, ``status``);
values may be quoted. ``OR`` and ``NOT`` raise ``ValueError`` (the sandbox answers 400, as GCP does for a filter
it cannot parse), so a client that relies on them finds out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(r"""\s*(\(|\)|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|!=|=|:|[^\s()=!:"']+)""")
_OPERATORS = {"=", "!=", ":", "eq", "ne"}
Predicate = Callable[[Mapping[str, Any]], bool]


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"Invalid value for field 'filter': {text!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", token[1:-1])
    return token


def _lookup(resource: Mapping[str, Any], path: str) -> Any:
    value: Any = resource
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _comparison(field: str, operator: str, value: str) -> Predicate:
    def check(resource: Mapping[str, Any]) -> bool:
        actual = _lookup(resource, field)
        if operator == ":":
            if isinstance(actual, Mapping):
                return value == "*" or value in actual
            return actual is not None and (value == "*" or value in str(actual))
        text = None if actual is None else str(actual).lower() if isinstance(actual, bool) else str(actual)
        if operator in ("eq", "ne"):
            matched = text is not None and re.fullmatch(value, text) is not None
            return matched if operator == "eq" else not matched
        return (text == value) if operator == "=" else (text != value)

    return check


def parse(text: str | None) -> Predicate:
    """A predicate over a resource dict; an empty filter matches everything. Raises ``ValueError``."""
    tokens = _tokens(text or "")
    predicates: list[Predicate] = []
    index = 0
    depth = 0
    while index < len(tokens):
        part = tokens[index]
        if part == "(":
            depth += 1
            index += 1
            continue
        if part == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("Invalid value for field 'filter': unbalanced parentheses")
            index += 1
            continue
        if part.upper() == "AND":
            index += 1
            continue
        if part.upper() in ("OR", "NOT"):
            raise ValueError(f"Invalid value for field 'filter': the sandbox does not support {part.upper()}")
        if index + 2 >= len(tokens):
            raise ValueError(f"Invalid value for field 'filter': incomplete comparison at {part!r}")
        field, operator, value = part, tokens[index + 1], tokens[index + 2]
        if operator not in _OPERATORS or value in ("(", ")"):
            raise ValueError(f"Invalid value for field 'filter': bad comparison {field} {operator} {value}")
        predicates.append(_comparison(field, operator, _unquote(value)))
        index += 3
    if depth != 0:
        raise ValueError("Invalid value for field 'filter': unbalanced parentheses")
    return lambda resource: all(p(resource) for p in predicates)
