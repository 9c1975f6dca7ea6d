"""Webhook signatures. Stdlib only, so a receiver can copy ``signature_verify`` as it is.

``Broker-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" keyed with the endpoint secret>``.
The timestamp is inside the signed text, so a captured request cannot be replayed later with a new one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

HEADER = "Broker-Signature"


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: str | Sequence[str], body: bytes, *, timestamp: int | None = None) -> str:
    """The ``Broker-Signature`` value for ``body`` sent at ``timestamp`` (default: now). Given several secrets,
    one ``v1=`` per secret, as during a rotation, when the old and the new secret both sign."""
    t = int(time.time()) if timestamp is None else timestamp
    keys = [secret] if isinstance(secret, str) else list(secret)
    return ",".join([f"t={t}", *(f"v1={_mac(key, t, body)}" for key in keys)])


def signature_verify(
    secret: str, header: str, body: bytes, tolerance_s: int = 300, *, now: float | None = None
) -> bool:
    """Whether ``header`` (the ``Broker-Signature`` value) signs ``body`` (the raw bytes received, before any
    JSON parsing) with ``secret``, at a time within ``tolerance_s`` seconds of ``now`` (default: the clock).

    Never raises on a malformed header: it simply does not verify. Any one of several ``v1=`` values may
    match. Compares in constant time.
    """
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        return False
    expected = _mac(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
