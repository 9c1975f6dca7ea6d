"""Cursor (keyset) pagination for the API's lists.

A page is ``{"results": [...], "next_cursor": str | null, "next": url | null}``; ``?limit=`` sets its size
and ``?cursor=`` continues where the last page ended. The cursor carries the sort key and id of the last row
given, so a page costs the same however deep it is and rows inserted meanwhile neither repeat nor vanish.
It also carries a tag of the listing it belongs to (the sort and the filters), and a cursor from another
listing is refused rather than silently paging the wrong set.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from untrusted.jsonbody import bounded_json

M = TypeVar("M", bound=Model)

DEFAULT_LIMIT = 100
MAX_LIMIT = 500


# A cursor is decoded from the client's text: every value it carries is checked before it is converted and
# compared in SQL (a 1e1000000 there would be rounded, or turned into an integer, for a minute).
MAX_CURSOR = 1024
PARAMETERS = [
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        description=f"rows per page, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})",
    ),
    OpenApiParameter(
        "cursor", {"type": "string", "maxLength": MAX_CURSOR}, description="the next_cursor of the page before"
    ),
]
MAX_KEY_TEXT = 64
_INTEGER = re.compile(r"-?[0-9]{1,19}", re.ASCII)
_NUMBER = re.compile(r"-?[0-9]{1,30}(?:\.[0-9]{0,30})?(?:[eE][+-]?[0-9]{1,2})?", re.ASCII)
_BIGINT = 2**63  # ids and counts are 64-bit columns


def int_key(text: str) -> int:
    if not _INTEGER.fullmatch(text) or not -_BIGINT <= int(text) < _BIGINT:
        raise ValueError(f"not a 64-bit integer: {text[:20]!r}")
    return int(text)


def decimal_key(text: str) -> Decimal:
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"not a plain number: {text[:20]!r}")
    return Decimal(text)


def float_key(text: str) -> float:
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"not a plain number: {text[:20]!r}")
    return float(text)


def datetime_key(text: str) -> dt.datetime:
    if not text.isascii():
        raise ValueError(f"not an ISO 8601 time: {text[:20]!r}")
    return dt.datetime.fromisoformat(text)


@dataclass(frozen=True)
class Key:
    """One column of the ordering: a field or annotation, its direction, and how its cursor text reads back."""

    field: str
    descending: bool = False
    parse: Callable[[str], Any] = int_key


def _text(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)  # round-trips exactly, so the boundary row compares equal to itself
    return str(value)


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    next_cursor: str | None

    def body(self, request: Request, results: Any) -> dict[str, Any]:
        next_url = None
        if self.next_cursor is not None:
            query = request.query_params.copy()
            query["cursor"] = self.next_cursor
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return {"results": results, "next_cursor": self.next_cursor, "next": next_url}


def listing_tag(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def limit_from(request: Request, default: int = DEFAULT_LIMIT) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationError({"limit": [f"a whole number from 1 to {MAX_LIMIT}"]})
    return int(raw)


def _decode(raw: str, keys: Sequence[Key], tag: str) -> list[Any]:
    wrong = ValidationError({"cursor": ["not a cursor of this listing: use next_cursor from the page before"]})
    if len(raw) > MAX_CURSOR or not raw.isascii():
        raise wrong
    try:
        data = bounded_json(base64.urlsafe_b64decode(raw.encode() + b"=" * (-len(raw) % 4)), max_depth=2)
        if data["t"] != tag or len(data["v"]) != len(keys):
            raise wrong
        texts = data["v"]
        if not all(isinstance(text, str) and len(text) <= MAX_KEY_TEXT for text in texts):
            raise wrong
        return [key.parse(text) for key, text in zip(keys, texts, strict=True)]
    except (ValueError, KeyError, TypeError, InvalidOperation, binascii.Error, UnicodeError):
        raise wrong from None


def _encode(values: list[Any], tag: str) -> str:
    data = json.dumps({"t": tag, "v": [_text(v) for v in values]}, separators=(",", ":"))
    return base64.urlsafe_b64encode(data.encode()).decode().rstrip("=")


def _after(keys: Sequence[Key], values: list[Any]) -> Q:
    """Rows strictly after ``values`` in the ordering: (k1 > v1) or (k1 = v1 and k2 > v2) or ..."""
    condition = Q()
    for i, key in enumerate(keys):
        step = Q(**{f"{key.field}__{'lt' if key.descending else 'gt'}": values[i]})
        for earlier, value in zip(keys[:i], values[:i], strict=True):
            step &= Q(**{earlier.field: value})
        condition |= step
    return condition


def paginate(
    request: Request,
    queryset: QuerySet[M],
    *,
    keys: Sequence[Key],
    tag: str,
    fetch: Callable[[QuerySet[M], int], list[M]] | None = None,
) -> Page:
    """One page of ``queryset``, which must already be ordered by ``keys`` (the last of them unique).
    ``fetch(queryset, n)`` reads its first n rows, if slicing is not the best way."""
    limit = limit_from(request)
    raw = request.query_params.get("cursor")
    if raw:
        queryset = queryset.filter(_after(keys, _decode(raw, keys, tag)))
    rows = fetch(queryset, limit + 1) if fetch else list(queryset[: limit + 1])
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    last = rows[-1]
    return Page(rows, _encode([getattr(last, key.field) for key in keys], tag))
