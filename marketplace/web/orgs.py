"""Which buyer organisation a storefront request acts for, and what its role there may do.

A person may belong to several buyer organisations; the one they chose is kept in the session
(``ACTIVE_ORGANIZATION``) and checked against their memberships on every request, so a membership removed
meanwhile falls back to another organisation of theirs, never to the one they left. Every storefront view
that touches an organisation's things goes through ``buyer_access``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from marketplace.api.tokens import ACTIVE_ORGANIZATION
from marketplace.models import Membership, Organization
from marketplace.orders.selectors import (
    BuyerPermission,
    buyer_membership,
    buyer_membership_list,
    buyer_refusal,
    buyer_role_allows,
)

_CACHE = "_buyer_membership"


def active_membership(request: HttpRequest, *, fresh: bool = False) -> Membership | None:
    """The membership the request acts through, read once per request unless ``fresh`` (after a change of the
    user's memberships); None for someone in no buyer organisation.

    Keeps the session's choice in step: a choice no longer valid is replaced by the fallback, with a message.
    """
    if hasattr(request, _CACHE) and not fresh:
        cached: Membership | None = getattr(request, _CACHE)
        return cached
    chosen = request.session.get(ACTIVE_ORGANIZATION)
    chosen = chosen if isinstance(chosen, int) else None
    membership = buyer_membership(request.user, active=chosen)
    if membership is None:
        request.session.pop(ACTIVE_ORGANIZATION, None)
    elif membership.organization_id != chosen:
        if chosen is not None:
            name = membership.organization.name
            messages.info(request, f"You are no longer in the organisation you had chosen; now acting for {name}.")
        request.session[ACTIVE_ORGANIZATION] = membership.organization_id
    setattr(request, _CACHE, membership)
    return membership


def activate(request: HttpRequest, organization: Organization) -> None:
    """Make ``organization`` the one the session acts for (the caller checked the user belongs to it)."""
    request.session[ACTIVE_ORGANIZATION] = organization.pk
    if hasattr(request, _CACHE):
        delattr(request, _CACHE)


def buyer_access(request: HttpRequest, permission: BuyerPermission = BuyerPermission.READ) -> Membership:
    """The active membership, once its role may do ``permission``. Raises ``Http404`` for someone in no buyer
    organisation and ``PermissionDenied`` (403, naming the role needed) for a role short of it."""
    membership = active_membership(request)
    if membership is None:
        raise Http404("no buyer organisation")
    if not buyer_role_allows(membership.role, permission):
        raise PermissionDenied(buyer_refusal(membership.role, permission))
    return membership


@dataclass(frozen=True)
class HeaderAccess:
    """What the page header and the templates need: the active membership, the others to switch to, and what
    the role may do (``can.order`` and so on, one entry per ``BuyerPermission``)."""

    membership: Membership
    memberships: list[Membership]
    can: dict[str, bool]


def header_access(request: HttpRequest) -> HeaderAccess | None:
    membership = active_membership(request)
    if membership is None:
        return None
    can = {p.value: buyer_role_allows(membership.role, p) for p in BuyerPermission}
    return HeaderAccess(membership=membership, memberships=buyer_membership_list(request.user), can=can)
