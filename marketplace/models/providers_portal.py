"""A provider organisation's standing on the marketplace, and invitations to join its team."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from marketplace.models.organizations import Organization, Role


class ProviderState(models.TextChoices):
    PENDING = "pending", "pending verification"
    VERIFIED = "verified", "verified"
    SUSPENDED = "suspended", "suspended"


class ProviderProfile(models.Model):
    """A provider organisation's business details, its acceptance of the terms and its verification state.

    Only a verified provider's accounts sell (``ProviderAccount.enabled``). The state changes only through
    ``marketplace.portal.services.provider_state_change``, which follows ``TRANSITIONS``, claims the row with
    a conditional update and ledgers the decision in the same transaction.
    """

    TRANSITIONS: dict[str, frozenset[str]] = {
        ProviderState.PENDING: frozenset({ProviderState.VERIFIED}),
        ProviderState.VERIFIED: frozenset({ProviderState.SUSPENDED}),
        ProviderState.SUSPENDED: frozenset({ProviderState.VERIFIED}),
    }

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="provider_profile")
    legal_name = models.CharField(max_length=200, blank=True, default="")
    country = models.CharField(max_length=2, blank=True, default="", help_text="ISO 3166-1 alpha-2")
    registered_address = models.TextField(blank=True, default="")
    tax_id = models.CharField(max_length=32, blank=True, default="", verbose_name="tax / VAT id")
    contact_email = models.EmailField(blank=True, default="")
    details_updated_at = models.DateTimeField(null=True, blank=True)
    terms_version = models.CharField(max_length=32, blank=True, default="")
    terms_accepted_at = models.DateTimeField(null=True, blank=True)
    terms_accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state = models.CharField(max_length=16, choices=ProviderState.choices, default=ProviderState.PENDING)
    state_reason = models.TextField(blank=True, default="")
    state_changed_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ProviderState.values), name="provider_profile_state_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.organization.name} ({self.state})"

    @property
    def details_complete(self) -> bool:
        return all((self.legal_name, self.country, self.registered_address, self.tax_id, self.contact_email))

    @property
    def terms_accepted(self) -> bool:
        return bool(self.terms_version and self.terms_accepted_at)


class InvitationStatus(models.TextChoices):
    OPEN = "open", "open"
    ACCEPTED = "accepted", "accepted"
    REVOKED = "revoked", "revoked"
    EXPIRED = "expired", "expired"


class Invitation(models.Model):
    """An invitation to join an organisation's team (buyer or provider) with one of its kind's roles.

    Only the SHA-256 of the link's random token is stored: the link is shown once, to the person who made
    it. At most one open (neither accepted nor revoked) invitation per address and organisation; inviting
    the address again revokes the previous one.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "email"],
                condition=Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="invitation_one_open_per_email",
            ),
            # Which roles fit the organisation's kind is checked by ``invitation_create``: a constraint
            # cannot read the organisation row.
            models.CheckConstraint(condition=Q(role__in=Role.values), name="invitation_role_known"),
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.organization} as {self.role}"

    def status(self, *, now: dt.datetime | None = None) -> InvitationStatus:
        if self.accepted_at is not None:
            return InvitationStatus.ACCEPTED
        if self.revoked_at is not None:
            return InvitationStatus.REVOKED
        if self.expires_at <= (now or timezone.now()):
            return InvitationStatus.EXPIRED
        return InvitationStatus.OPEN
