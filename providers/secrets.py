"""Encryption of provider credentials at rest (Fernet, rotatable through MultiFernet)."""

from __future__ import annotations

import base64
import hashlib
import json

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class SecretUnreadable(Exception):
    """The stored secret cannot be decrypted with any configured key."""


def _fernet() -> MultiFernet:
    keys: list[str] = list(getattr(settings, "SECRETS_KEYS", []))
    if not keys:
        # Development fallback: a key derived from SECRET_KEY, so a fresh machine needs no extra setting.
        digest = hashlib.sha256(("broker-secrets:" + settings.SECRET_KEY).encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(f"BROKER_SECRETS_KEYS holds an invalid Fernet key: {exc}") from None


def encrypt_secret(values: dict[str, str]) -> str:
    return _fernet().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


def decrypt_secret(token: str) -> dict[str, str]:
    if not token:
        return {}
    try:
        data = json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        raise SecretUnreadable("stored credentials cannot be decrypted with the configured keys") from None
    if not isinstance(data, dict):
        raise SecretUnreadable("stored credentials are not a key/value object")
    return {str(k): str(v) for k, v in data.items()}
