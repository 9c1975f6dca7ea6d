"""Encryption of provider credentials at rest (Fernet, rotatable through MultiFernet)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction


class SecretUnreadable(Exception):
    """The stored secret cannot be decrypted with any configured key."""


def _keys() -> list[str]:
    """The configured Fernet keys, newest first."""
    keys: list[str] = list(getattr(settings, "SECRETS_KEYS", []))
    if not keys:
        # Development fallback: a key derived from SECRET_KEY, so a fresh machine needs no extra setting.
        digest = hashlib.sha256(("broker-secrets:" + settings.SECRET_KEY).encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    return keys


def _fernet() -> MultiFernet:
    keys = _keys()
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


# --- Key rotation ---------------------------------------------------------------------------------------------

ENCRYPTED_SUFFIX = "_encrypted"


def encrypted_fields() -> list[tuple[type[models.Model], str]]:
    """Every model field holding a value of ``encrypt_secret``: by convention, the fields named ``*_encrypted``
    (a provider account's credentials, an independent machine's agent secret, ...)."""
    return [
        (model, field.name)
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if field.name.endswith(ENCRYPTED_SUFFIX)
    ]


@dataclass(frozen=True)
class RotateReport:
    """How many stored secrets each ``app.Model.field`` had re-encrypted with the newest key."""

    rotated: dict[str, int]
    keys: int

    @property
    def total(self) -> int:
        return sum(self.rotated.values())


def secrets_rotate() -> RotateReport:
    """Re-encrypt every stored secret with the first (newest) configured key (``MultiFernet.rotate``), so the
    older keys can then be dropped from ``BROKER_SECRETS_KEYS``.

    All or nothing, in one transaction with the rows locked: when any secret cannot be decrypted with any
    configured key, raises ``SecretUnreadable`` naming each one, and nothing is rewritten. Safe to run again.
    """
    fernet = _fernet()
    plan: list[tuple[type[models.Model], str, object, str, str]] = []
    unreadable: list[str] = []
    with transaction.atomic():
        for model, name in encrypted_fields():
            rows = (
                model._default_manager.select_for_update().exclude(**{name: ""}).order_by("pk").values_list("pk", name)
            )
            for pk, token in rows.iterator():
                try:
                    plan.append((model, name, pk, token, fernet.rotate(token.encode()).decode()))
                except InvalidToken:
                    unreadable.append(f"{model._meta.label} {pk} ({name})")
        if unreadable:
            more = f" and {len(unreadable) - 20} more" if len(unreadable) > 20 else ""
            raise SecretUnreadable(
                f"no configured key decrypts {len(unreadable)} stored secret(s): {', '.join(unreadable[:20])}{more}; "
                "nothing was rotated (add the key they were written with, newest first)"
            )
        rotated: dict[str, int] = {f"{model._meta.label}.{name}": 0 for model, name in encrypted_fields()}
        for model, name, pk, old, new in plan:
            # The row is locked; the old value in the filter also keeps a concurrent rewrite (SQLite) intact.
            rotated[f"{model._meta.label}.{name}"] += model._default_manager.filter(pk=pk, **{name: old}).update(
                **{name: new}
            )
    return RotateReport(rotated=rotated, keys=len(_keys()))
