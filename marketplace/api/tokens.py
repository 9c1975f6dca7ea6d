"""Scoped API tokens: creating and revoking them, and authenticating requests that carry one.

A request with ``Authorization: Bearer brk_…`` acts as the token's creator in the token's organisation, and
only within the token's scopes: each API view names the scope it needs (``required_scopes``), and
``HasScope`` refuses (403, naming the scope) a token without it. A web session or a legacy DRF token keeps
the full access of its user.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from marketplace.models import ApiToken, Organization, TokenScope

PREFIX = "brk_"
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str  # shown once


def api_token_create(
    *, organization: Organization, user: AbstractBaseUser, name: str, scopes: list[str]
) -> IssuedToken:
    unknown = sorted(set(scopes) - set(TokenScope.values))
    if unknown or not scopes:
        raise ValueError(
            f"scopes: choose from {', '.join(TokenScope.values)}" + (f" (not {unknown})" if unknown else "")
        )
    raw = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        organization=organization, created_by=user, name=name.strip()[:80] or "token", prefix=raw[:12],
        token_hash=token_hash(raw), scopes=sorted(set(scopes)),
    )  # fmt: skip
    return IssuedToken(token, raw)


def api_token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


class ScopedTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header.startswith(f"{self.keyword} {PREFIX}"):
            return None
        raw = header[len(self.keyword) + 1 :].strip()
        token = (
            ApiToken.objects.select_related("created_by", "organization")
            .filter(token_hash=token_hash(raw), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.created_by.is_active:
            raise exceptions.AuthenticationFailed("the API token is unknown or revoked")
        now = timezone.now()
        # To the minute is all a token list needs; writing on every request would double a read's cost.
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.created_by, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class HasScope(permissions.BasePermission):
    """A scoped token must carry one of the view's ``required_scopes`` for the request's method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not isinstance(request.auth, ApiToken):
            return True
        needed: dict[str, tuple[str, ...]] = getattr(view, "required_scopes", {})
        wanted = needed.get(request.method or "GET", needed.get("*", ()))
        if not wanted or not set(wanted) & set(request.auth.scopes):
            self.message = f"this token lacks the scope {' or '.join(wanted) or 'for this endpoint'}"
            return False
        return True


class ScopedTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call,misc]
    """How the OpenAPI schema describes the bearer tokens."""

    target_class = "marketplace.api.tokens.ScopedTokenAuthentication"
    name = "scopedToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "a brk_... token made under API tokens"}
