"""Canonical JSON: one byte string per value, so a hash computed anywhere matches ours.

Keys sorted, no insignificant whitespace, UTF-8, and no floats: money and measurements go in as strings
(``Decimal`` is written as its exact string), because a float's text differs between languages.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from decimal import Decimal
from typing import Any


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise TypeError("naive datetime in a ledger payload; use an aware UTC datetime")
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float):
        raise TypeError("float in a ledger payload; pass a Decimal or a string")
    raise TypeError(f"cannot put {type(value).__name__} in a ledger payload")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_bytes(value: Any) -> bytes:
    return _dumps(_normalise(value))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_ENVELOPE_TEXT = ("kind", "subject", "created_at", "payload_sha256", "prev")


def entry_envelope(
    *, sequence: int, kind: str, subject: str, created_at: dt.datetime | str, payload_hash: str, prev_hash: str
) -> bytes:
    """The bytes ``entry_hash`` is computed over; also the entry's Merkle leaf. ``created_at`` may be the
    datetime or its canonical text (``2026-12-03T11:49:00Z``, as published): both give the same bytes."""
    fields = {
        "sequence": sequence,
        "kind": kind,
        "subject": subject,
        "created_at": _normalise(created_at),
        "payload_sha256": payload_hash,
        "prev": prev_hash,
    }
    # The sequencer builds one envelope per entry it chains: when every field is already plain text and an
    # int, ``_normalise`` would hand them back unchanged, so the walk through it is skipped (same bytes).
    if type(sequence) is int and all(type(fields[name]) is str for name in _ENVELOPE_TEXT):
        return _dumps(fields)
    return canonical_bytes(fields)
