"""Reads of the provider portal, always scoped to the caller's provider organisation, and what each role may do."""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from marketplace.models import Invitation, Membership, NodeHold, Organization, OrganizationKind, Role
from providers.models import ClusterNode, ProviderAccount
from providers.secrets import SecretUnreadable


class Permission(enum.Enum):
    READ = "read"
    ACCOUNTS = "accounts"  # connect, edit and sync cloud accounts (later: machines)
    TEAM = "team"  # invite, revoke, change roles, remove members
    DETAILS = "details"  # business details and the terms


ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    Role.OWNER: frozenset(Permission),
    Role.OPERATOR: frozenset({Permission.READ, Permission.ACCOUNTS}),
    Role.VIEWER: frozenset({Permission.READ}),
}


def role_allows(role: str, permission: Permission) -> bool:
    return permission in ROLE_PERMISSIONS.get(role, frozenset())


def provider_membership(user: AbstractBaseUser | AnonymousUser) -> Membership | None:
    """The user's membership of a provider organisation (a user belongs to at most one); None for anyone else."""
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("organization__provider", "organization__provider_profile")
        .filter(user=user, organization__kind=OrganizationKind.PROVIDER, organization__provider__isnull=False)
        .order_by("pk")
        .first()
    )


def account_list(*, organization: Organization) -> QuerySet[ProviderAccount]:
    return ProviderAccount.objects.filter(provider_id=organization.provider_id).order_by("name", "pk")


@dataclass(frozen=True)
class NodeRow:
    """One node of a seller's cluster as the broker sells it: per extended resource, the units the last sync saw
    free of other pods, and how many of them the broker's orders hold now."""

    account_id: int
    name: str
    resources: list[tuple[str, int, int]]  # (resource, free at the sync, held by orders)
    synced_at: dt.datetime | None

    @property
    def on_sale(self) -> bool:
        return bool(self.resources)


def cluster_nodes(*, organization: Organization) -> dict[int, list[NodeRow]]:
    """Per Kubernetes account of the organisation's provider, its nodes by name (two queries)."""
    nodes = list(
        ClusterNode.objects.filter(account__provider_id=organization.provider_id).order_by("account_id", "name")
    )
    held: dict[tuple[int, str], int] = {}
    for node_id, resource, units in NodeHold.objects.filter(node__in=nodes).values_list("node_id", "resource", "units"):
        held[(node_id, resource)] = held.get((node_id, resource), 0) + units
    found: dict[int, list[NodeRow]] = {}
    for node in nodes:
        resources = [(r, int(n), held.get((node.pk, r), 0)) for r, n in sorted((node.units or {}).items())]
        found.setdefault(node.account_id, []).append(NodeRow(node.account_id, node.name, resources, node.synced_at))
    return found


def account_get(*, organization: Organization, account_id: int) -> ProviderAccount | None:
    """The account if it belongs to the organisation's provider; None otherwise (a stranger learns nothing)."""
    return account_list(organization=organization).filter(pk=account_id).first()


def member_list(*, organization: Organization) -> QuerySet[Membership]:
    return Membership.objects.filter(organization=organization).select_related("user").order_by("pk")


def member_get(*, organization: Organization, membership_id: int) -> Membership | None:
    return member_list(organization=organization).filter(pk=membership_id).first()


def invitation_list(*, organization: Organization, limit: int = 50) -> list[Invitation]:
    """The newest invitations, open or not (their status shows which)."""
    qs = Invitation.objects.filter(organization=organization).select_related("invited_by", "accepted_by")
    return list(qs.order_by("-created_at", "-pk")[:limit])


def invitation_get(*, organization: Organization, invitation_id: int) -> Invitation | None:
    return Invitation.objects.filter(organization=organization, pk=invitation_id).first()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def invitation_by_token(token: str) -> Invitation | None:
    """The invitation a link's token names, in any status; None for an unknown token."""
    if not token or len(token) > 128:
        return None
    return Invitation.objects.select_related("organization").filter(token_hash=token_hash(token)).first()


def account_credential_keys(account: ProviderAccount) -> frozenset[str] | None:
    """Which credential fields the account has a value for (never the values); None when no configured key
    can decrypt them."""
    try:
        return frozenset(k for k, v in account.credentials().values.items() if v)
    except SecretUnreadable:
        return None
