"""TC3-HMAC-SHA256 request signatures, checked the way Tencent Cloud API 3.0 computes them.

The signer (the SDK) builds a canonical request from the method, path, query, the signed headers and the body
hash; hashes it into a string to sign with the timestamp and the credential scope ``date/service/tc3_request``;
and signs that with a key derived from ``"TC3" + secret_key`` through the date, the service and
``tc3_request``. The sandbox recomputes the signature with the secret it knows for the secret id.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

ALGORITHM = "TC3-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_CLOCK_SKEW_SECONDS = 300  # Tencent rejects a timestamp more than five minutes away from its clock
# The one key the sandbox knows from the start (the demo account's): its signatures are checked as Tencent checks them.
DEFAULT_SECRETS = {"AKIDsandbox00000001": "sandbox-secret-key-0001"}
_AUTHORIZATION = re.compile(
    r"^TC3-HMAC-SHA256 Credential=(?P<secret_id>[^/\s]+)/(?P<date>\d{4}-\d{2}-\d{2})/(?P<service>[a-z0-9]+)"
    r"/tc3_request, SignedHeaders=(?P<headers>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})$"
)


@dataclass(frozen=True, slots=True)
class Authorization:
    """The parts of an ``Authorization: TC3-HMAC-SHA256 ...`` header."""

    secret_id: str
    date: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """What the signature covers. ``headers`` has lower-case names."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    timestamp: str


def parse_authorization(value: str) -> Authorization | None:
    """None when the header is missing or not a TC3 header."""
    match = _AUTHORIZATION.match(value.strip())
    if match is None:
        return None
    return Authorization(
        secret_id=match["secret_id"],
        date=match["date"],
        service=match["service"],
        signed_headers=tuple(match["headers"].split(";")),
        signature=match["signature"],
    )


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def signature(secret_key: str, auth: Authorization, request: SignedRequest) -> str:
    """The hex signature Tencent expects for ``request`` signed with ``secret_key`` under ``auth``'s scope."""
    if request.headers.get("x-tc-content-sha256") == UNSIGNED_PAYLOAD:
        payload_hash = hashlib.sha256(UNSIGNED_PAYLOAD.encode()).hexdigest()
    else:
        payload_hash = hashlib.sha256(request.body).hexdigest()
    canonical_headers = "".join(f"{name}:{request.headers.get(name, '').strip()}\n" for name in auth.signed_headers)
    canonical = "\n".join(
        [
            request.method,
            request.path or "/",
            request.query,
            canonical_headers,
            ";".join(auth.signed_headers),
            payload_hash,
        ]
    )
    scope = f"{auth.date}/{auth.service}/tc3_request"
    to_sign = "\n".join([ALGORITHM, request.timestamp, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(_hmac(_hmac(("TC3" + secret_key).encode("utf-8"), auth.date), auth.service), "tc3_request")
    return hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def timestamp_problem(auth: Authorization, timestamp: str, now: float) -> tuple[str, str] | None:
    """(error code, message) when the request's time is unacceptable, else None."""
    try:
        seconds = int(timestamp)
    except ValueError:
        return "AuthFailure.SignatureFailure", "X-TC-Timestamp is not a Unix time"
    if abs(now - seconds) > MAX_CLOCK_SKEW_SECONDS:
        return "AuthFailure.SignatureExpire", "Signature expired: X-TC-Timestamp is more than 5 minutes off."
    if datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d") != auth.date:
        return "AuthFailure.SignatureFailure", "The credential scope date is not the UTC date of X-TC-Timestamp."
    return None


def matches(secret_key: str, auth: Authorization, request: SignedRequest) -> bool:
    return hmac.compare_digest(signature(secret_key, auth, request), auth.signature)
