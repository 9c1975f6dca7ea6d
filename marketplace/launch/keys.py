"""A buyer organisation's SSH public keys: added, listed and removed. Orders install the keys their launch
configuration names (every key of the organisation by default)."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from marketplace.models import Organization, SshKey
from providers.sshkeys import MAX_NAME, SshKeyInvalid, ssh_key_parse
from providers.text import name_problem

MAX_KEYS_PER_ORGANIZATION = 200


class SshKeyRefused(ValueError):
    """A key that cannot be added; ``field`` is the input it concerns, the message says why (never the text)."""

    def __init__(self, field: str, message: str, *, code: str = "invalid"):
        super().__init__(message)
        self.field = field
        self.code = code


def ssh_key_add(*, organization: Organization, user: AbstractBaseUser, public_key: str, name: str = "") -> SshKey:
    """Parse, check and store one public key. The name defaults to the key's comment, else its type and the
    start of its fingerprint. Raises ``SshKeyRefused``: a key that does not parse, is a private key (never
    stored or logged), is too weak, is already here (code ``duplicate``), or a name already taken."""
    try:
        parsed = ssh_key_parse(public_key)
    except SshKeyInvalid as exc:
        raise SshKeyRefused("public_key", str(exc)) from None
    name = (name or "").strip() or parsed.comment or f"{parsed.key_type} {parsed.fingerprint[7:15]}"
    if len(name) > MAX_NAME or "\n" in name:
        raise SshKeyRefused("name", f"at most {MAX_NAME} characters on one line")
    if problem := name_problem(name):
        raise SshKeyRefused("name", problem)
    existing = SshKey.objects.filter(organization=organization, fingerprint=parsed.fingerprint).first()
    if existing is not None:
        raise SshKeyRefused("public_key", f"this key is already added, as {existing.name!r}", code="duplicate")
    if SshKey.objects.filter(organization=organization).count() >= MAX_KEYS_PER_ORGANIZATION:
        raise SshKeyRefused("public_key", f"an organisation keeps at most {MAX_KEYS_PER_ORGANIZATION} keys")
    try:
        with transaction.atomic():
            return SshKey.objects.create(
                organization=organization,
                name=name,
                key_type=parsed.key_type,
                public_key=parsed.public_key,
                fingerprint=parsed.fingerprint,
                bits=parsed.bits,
                created_by=user,
            )
    except IntegrityError:
        # A concurrent add of the same key, or the same name: the constraints decide, we explain.
        if SshKey.objects.filter(organization=organization, fingerprint=parsed.fingerprint).exists():
            raise SshKeyRefused("public_key", "this key is already added", code="duplicate") from None
        raise SshKeyRefused("name", f"the organisation already has a key called {name!r}") from None


def ssh_key_delete(*, key: SshKey) -> None:
    """Remove a key; orders already placed keep the keys their configuration snapshotted."""
    SshKey.objects.filter(pk=key.pk).delete()


def ssh_key_list(*, organization: Organization) -> QuerySet[SshKey]:
    return SshKey.objects.filter(organization=organization).select_related("created_by")


def ssh_key_get(*, organization: Organization, public_id: str) -> SshKey | None:
    try:
        return ssh_key_list(organization=organization).filter(public_id=uuid.UUID(str(public_id))).first()
    except ValueError:
        return None
