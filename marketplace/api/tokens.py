"""Scoped API tokens: creating and revoking them, and authenticating requests that carry one.

The API's one kind of token. A request with ``Authorization: Bearer brk_…`` acts as the token's creator in the
token's organisation, and only within the token's scopes: each API view names the scope it needs
(``required_scopes``), and ``HasScope`` refuses (403, naming the scope) a token without it. A token works only while
its creator is in its organisation (401 after they leave or are removed), and carries no more than the creator's
role now allows (``ROLE_SCOPES``: a creator since made a viewer keeps only the read scopes). A storefront
session acts for its user's active buyer organisation (``request_organization``).

Every API view that reads or changes an organisation's things goes through ``request_organization`` with the
``BuyerPermission`` it needs, which refuses a role short of it (403 naming the role needed).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from marketplace.models import ApiToken, Membership, Organization, Role, TokenScope
from marketplace.orders.selectors import BuyerPermission, buyer_membership, buyer_refusal, buyer_role_allows
from providers.text import name_problem

PREFIX = "brk_"
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)
# The session key under which the storefront keeps the buyer organisation a person chose (marketplace/web/orgs.py).
ACTIVE_ORGANIZATION = "buyer_organization"
READ_SCOPES = frozenset({TokenScope.OFFERS_READ.value, TokenScope.LEDGER_READ.value})
# The scopes each buyer role may hold: a token never carries more than its creator's role allows.
ROLE_SCOPES: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset(TokenScope.values),
    Role.MEMBER: frozenset(TokenScope.values),
    Role.VIEWER: READ_SCOPES,
}


# Where a person gets a token, said in every 401 that a new token would cure.
MADE_WHERE = "(make one under API tokens, or with: manage.py api_token create USER)"


class TokenRefused(exceptions.AuthenticationFailed):
    """A 401 whose code says what was wrong with the token sent: token_malformed, token_unknown, token_revoked
    (revoked, its creator disabled or gone from its organisation). With no token at all the answer is the
    exception handler's token_missing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str  # shown once


def api_token_create(
    *, organization: Organization, user: AbstractBaseUser, name: str, scopes: list[str]
) -> IssuedToken:
    """A new token of ``user`` for ``organization``; the raw token is in the answer only. Raises
    ``PermissionError`` when the user is not in the organisation or their role may not create tokens, and
    ``ValueError`` (``"field: why"``) for unknown scopes, scopes beyond the role's (``ROLE_SCOPES``) or a name
    people could not read as written (``providers.text.name_problem``: control or invisible formatting
    characters)."""
    role = Membership.objects.filter(user=user, organization=organization).values_list("role", flat=True).first()
    if role is None:
        raise PermissionError("you are not in this organisation")
    if not buyer_role_allows(role, BuyerPermission.TOKENS):
        raise PermissionError(buyer_refusal(role, BuyerPermission.TOKENS))
    unknown = sorted(set(scopes) - set(TokenScope.values))
    if unknown or not scopes:
        raise ValueError(
            f"scopes: choose from {', '.join(TokenScope.values)}" + (f" (not {unknown})" if unknown else "")
        )
    beyond = sorted(set(scopes) - ROLE_SCOPES.get(role, frozenset()))
    if beyond:
        raise ValueError(f"scopes: a {role} may not hold {', '.join(beyond)}")
    if problem := name_problem(name):
        raise ValueError(f"name: {problem}")
    raw = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        organization=organization, created_by=user, name=name.strip()[:80] or "token", prefix=raw[:12],
        token_hash=token_hash(raw), scopes=sorted(set(scopes)),
    )  # fmt: skip
    return IssuedToken(token, raw)


def api_token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


class ScopedTokenAuthentication(authentication.BaseAuthentication):
    """The API's one kind of token: ``Authorization: Bearer brk_…``. Any other ``Authorization`` header is
    refused (401) saying what was wrong with it, rather than passed over to end as "credentials were not
    provided"; a request with none falls through to the storefront's session, and without one the exception
    handler says no token was sent (``marketplace.api.errors``)."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").strip()
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        if scheme != self.keyword or not raw.startswith(PREFIX) or " " in raw:
            raise TokenRefused("token_malformed", f"the Authorization header must be 'Bearer {PREFIX}…' {MADE_WHERE}")
        # The creator's role now, read with the token: one query, and None once they left the organisation.
        role = Membership.objects.filter(user=OuterRef("created_by"), organization=OuterRef("organization"))
        token = (
            ApiToken.objects.select_related("created_by", "organization")
            .annotate(creator_role=Subquery(role.values("role")[:1]))
            .filter(token_hash=token_hash(raw))
            .first()
        )
        if token is None:
            raise TokenRefused("token_unknown", f"no such API token (mistyped or from another broker?) {MADE_WHERE}")
        if token.revoked_at is not None:
            raise TokenRefused(
                "token_revoked", f"the API token {token.prefix}… was revoked on {token.revoked_at:%Y-%m-%d}"
            )
        if not token.created_by.is_active:
            raise TokenRefused("token_revoked", f"the API token {token.prefix}…'s creator's account is disabled")
        if not creator_role(token):
            raise TokenRefused(
                "token_revoked", f"the API token {token.prefix}…'s creator is no longer in its organisation"
            )
        now = timezone.now()
        # To the minute is all a token list needs; writing on every request would double a read's cost.
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.created_by, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def creator_role(token: ApiToken) -> str:
    """The token's creator's role in its organisation, as ``ScopedTokenAuthentication`` read it ("" if not)."""
    return str(getattr(token, "creator_role", None) or "")


def token_scopes(token: ApiToken) -> frozenset[str]:
    """What the token may do now: its scopes, within what its creator's current role may hold."""
    return frozenset(token.scopes) & ROLE_SCOPES.get(creator_role(token), frozenset())


class HasScope(permissions.BasePermission):
    """A scoped token must carry one of the view's ``required_scopes`` for the request's method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not isinstance(request.auth, ApiToken):
            return True
        needed: dict[str, tuple[str, ...]] = getattr(view, "required_scopes", {})
        wanted = needed.get(request.method or "GET", needed.get("*", ()))
        if not wanted or not set(wanted) & token_scopes(request.auth):
            self.message = f"this token lacks the scope {' or '.join(wanted) or 'for this endpoint'}"
            if set(wanted) & set(request.auth.scopes):
                self.message += f" now that its creator is a {creator_role(request.auth)}"
            return False
        return True


def request_organization(request: Request, permission: BuyerPermission = BuyerPermission.READ) -> Organization:
    """The buyer organisation the request acts for, once its role may do ``permission``.

    A scoped token acts in its own organisation with its creator's role there (both read at authentication);
    a storefront session in the user's active organisation (the storefront's choice, else their oldest).
    Raises ``PermissionDenied`` (403) for a user in no buyer organisation or a role short of ``permission``.
    """
    if isinstance(request.auth, ApiToken):
        organization, role = request.auth.organization, creator_role(request.auth)
    else:
        session = getattr(request, "session", None)
        active = session.get(ACTIVE_ORGANIZATION) if session is not None else None
        membership = buyer_membership(request.user, active=active if isinstance(active, int) else None)
        if membership is None:
            raise exceptions.PermissionDenied("your account belongs to no buyer organisation")
        organization, role = membership.organization, membership.role
    if not buyer_role_allows(role, permission):
        raise exceptions.PermissionDenied(buyer_refusal(role, permission))
    return organization


class ScopedTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call,misc]
    """How the OpenAPI schema describes the bearer tokens."""

    target_class = "marketplace.api.tokens.ScopedTokenAuthentication"
    name = "scopedToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "a brk_... token made under API tokens"}
