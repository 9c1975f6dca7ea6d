"""Canonical JSON: one byte string per value, so a hash computed anywhere matches ours.

Keys sorted, no insignificant whitespace, UTF-8, and no floats: money and measurements go in as strings
(``Decimal`` is written as its exact string), because a float's text differs between languages.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from json.encoder import encode_basestring
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


# A string as json.dumps(..., ensure_ascii=False) writes it, quotes included.
_json_text: Callable[[str], str] = encode_basestring


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_bytes(value: Any) -> bytes:
    return _dumps(_normalise(value))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_envelope(
    *, sequence: int, kind: str, subject: str, created_at: dt.datetime | str, payload_hash: str, prev_hash: str
) -> bytes:
    """The bytes ``entry_hash`` is computed over; also the entry's Merkle leaf. ``created_at`` may be the
    datetime or its canonical text (``2026-12-03T11:49:00Z``, as published): both give the same bytes."""
    created = _normalise(created_at)
    texts = (kind, subject, created, payload_hash, prev_hash)
    # The sequencer builds one envelope per entry it chains, beside the writers: with plain text fields and an
    # int, the canonical JSON is written directly, keys in their sorted order, each text escaped as json.dumps
    # escapes it (the same bytes; tests/ledger/test_chain.py compares them).
    if type(sequence) is int and all(type(text) is str for text in texts):
        escaped = [_json_text(text) for text in texts]
        return (
            f'{{"created_at":{escaped[2]},"kind":{escaped[0]},"payload_sha256":{escaped[3]},'
            f'"prev":{escaped[4]},"sequence":{sequence},"subject":{escaped[1]}}}'
        ).encode()
    return canonical_bytes(
        {
            "sequence": sequence,
            "kind": kind,
            "subject": subject,
            "created_at": created,
            "payload_sha256": payload_hash,
            "prev": prev_hash,
        }
    )
