"""Service-account authentication for the GCP sandbox, checked the way Google checks it.

Two flows reach the sandbox:

- **self-signed JWT** (what the GAPIC clients use for a service-account key): the ``Authorization: Bearer`` value is
  a JWT the client signed with its private key (``iss``/``sub`` = the account's email, ``kid`` = the key id, a
  ``scope`` or ``aud`` claim);
- **OAuth JWT-bearer grant** (``POST /token`` with ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``): the
  same kind of JWT as an assertion, exchanged for an opaque access token.

A key the sandbox issued (``KeyRing.new_service_account``) is verified with its public key (RS256). A key it did
not issue can only be checked for shape: three base64url parts, RS256 header, an RSA-sized signature, live
``iat``/``exp``. Emails or key ids starting with ``bad`` are refused, as are accounts outside an allow-list.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

GOOGLE_OAUTH_AUDIENCE = "https://oauth2.googleapis.com/token"  # the aud google-auth puts in grant assertions
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_SKEW_SECONDS = 300
MAX_LIFETIME_SECONDS = 3600  # Google refuses assertions valid for more than an hour
RSA_SIGNATURE_SIZES = frozenset({256, 384, 512})  # 2048-, 3072- and 4096-bit keys
ACCESS_TOKEN_SECONDS = 3599


class AuthRejected(Exception):
    """The credential is refused; ``reason`` is what Google would say."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request authenticated as."""

    email: str
    key_id: str
    verified: bool  # True when the signature was checked against a key the sandbox issued


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise AuthRejected("malformed JWT segment") from None


def _segment_json(part: str) -> dict[str, Any]:
    try:
        value = json.loads(_unb64url(part))
    except ValueError:
        raise AuthRejected("malformed JWT segment") from None
    if not isinstance(value, dict):
        raise AuthRejected("malformed JWT segment")
    return value


class KeyRing:
    """Public keys of the service-account keys the sandbox issued, and the accounts it accepts."""

    def __init__(self) -> None:
        self._keys: dict[str, rsa.RSAPublicKey] = {}
        self._private: rsa.RSAPrivateKey | None = None
        self._allowed: frozenset[str] | None = None
        self._access_tokens: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def _key_material(self) -> rsa.RSAPrivateKey:
        # One RSA key for every account the sandbox issues: generating a 2048-bit key costs ~0.1 s each.
        with self._lock:
            if self._private is None:
                self._private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            return self._private

    def register(self, key_id: str, public_key: rsa.RSAPublicKey) -> None:
        with self._lock:
            self._keys[key_id] = public_key

    def new_service_account(self, *, email: str, project_id: str, token_uri: str) -> dict[str, Any]:
        """A service-account key file (the JSON Google lets you download) whose key the sandbox knows."""
        private = self._key_material()
        key_id = secrets.token_hex(20)
        self.register(key_id, private.public_key())
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        return {
            "type": "service_account",
            "project_id": project_id,
            "private_key_id": key_id,
            "private_key": pem,
            "client_email": email,
            "client_id": str(int(key_id[:15], 16)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email.replace('@', '%40')}",
            "universe_domain": "googleapis.com",
        }

    def accept_only(self, emails: Iterable[str] | None) -> None:
        """Accept only these service-account emails; None restores the default (anything not starting ``bad``)."""
        with self._lock:
            self._allowed = frozenset(emails) if emails is not None else None

    def _check_account(self, email: str, key_id: str) -> None:
        with self._lock:
            allowed = self._allowed
        if not email or email.startswith("bad") or key_id.startswith("bad"):
            raise AuthRejected("Invalid JWT Signature.")
        if allowed is not None and email not in allowed:
            raise AuthRejected(f"Service account {email} is disabled or does not exist.")

    def verify_jwt(self, token: str, *, now: float | None = None) -> tuple[Principal, dict[str, Any]]:
        """Check a JWT's shape, lifetime, account and (for keys the sandbox issued) signature."""
        parts = token.split(".")
        if len(parts) != 3:
            raise AuthRejected("Invalid JWT: Token must be a short-lived token and in a reasonable timeframe")
        header, claims, signature = _segment_json(parts[0]), _segment_json(parts[1]), _unb64url(parts[2])
        if header.get("alg") != "RS256":
            raise AuthRejected(f"Invalid JWT: unsupported algorithm {header.get('alg')!r}")
        email = str(claims.get("iss") or "")
        key_id = str(header.get("kid") or "")
        self._check_account(email, key_id)
        current = time.time() if now is None else now
        try:
            issued, expires = float(claims["iat"]), float(claims["exp"])
        except (KeyError, TypeError, ValueError):
            raise AuthRejected("Invalid JWT: iat and exp are required") from None
        if issued > current + MAX_SKEW_SECONDS or expires < current - MAX_SKEW_SECONDS:
            raise AuthRejected("Invalid JWT: Token must be a short-lived token and in a reasonable timeframe")
        if expires - issued > MAX_LIFETIME_SECONDS + MAX_SKEW_SECONDS:
            raise AuthRejected("Invalid JWT: Token must be a short-lived token (60 minutes) ")
        with self._lock:
            public = self._keys.get(key_id)
        if public is None:
            if len(signature) not in RSA_SIGNATURE_SIZES:
                raise AuthRejected("Invalid JWT Signature.")
            return Principal(email, key_id, verified=False), claims
        try:
            public.verify(signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            raise AuthRejected("Invalid JWT Signature.") from None
        return Principal(email, key_id, verified=True), claims

    def grant(self, form: Mapping[str, str], token_uri: str) -> dict[str, Any]:
        """The token endpoint: a JWT-bearer assertion -> an access token. Raises AuthRejected (invalid_grant)."""
        if form.get("grant_type") != JWT_BEARER_GRANT:
            raise AuthRejected("unsupported_grant_type")
        principal, claims = self.verify_jwt(form.get("assertion", ""))
        if claims.get("aud") not in (GOOGLE_OAUTH_AUDIENCE, token_uri):
            raise AuthRejected("Invalid JWT: Failed audience check.")
        token = f"ya29.sandbox-{secrets.token_urlsafe(24)}"
        with self._lock:
            self._access_tokens[token] = (principal, time.time() + ACCESS_TOKEN_SECONDS)
        return {"access_token": token, "expires_in": ACCESS_TOKEN_SECONDS, "token_type": "Bearer"}

    def authenticate(self, authorization: str) -> Principal:
        """The principal of an ``Authorization`` header: an access token this sandbox issued, or a self-signed JWT."""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthRejected("Request is missing required authentication credential.")
        value = value.strip()
        with self._lock:
            issued = self._access_tokens.get(value)
        if issued is not None:
            principal, expires = issued
            if expires < time.time():
                raise AuthRejected("Request had invalid authentication credentials (expired access token).")
            self._check_account(principal.email, principal.key_id)
            return principal
        principal, claims = self.verify_jwt(value)
        if not claims.get("scope") and not claims.get("aud"):
            raise AuthRejected("Invalid JWT: a self-signed JWT needs a scope or aud claim")
        return principal


def sign_jwt(private_key: rsa.RSAPrivateKey, key_id: str, claims: Mapping[str, Any]) -> str:
    """An RS256 JWT (for tests that need a hand-made token)."""
    header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": key_id}).encode())
    payload = _b64url(json.dumps(dict(claims)).encode())
    signature = private_key.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{header}.{payload}.{_b64url(signature)}"
