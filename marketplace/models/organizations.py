"""Organisations and their people. Every object a user can see belongs to one organisation."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from providers.models import Provider


class OrganizationKind(models.TextChoices):
    BUYER = "buyer", "buyer"
    PROVIDER = "provider", "provider"


class Role(models.TextChoices):
    """Buyers use owner, member and viewer; providers owner, operator and viewer (``PROVIDER_ROLES``)."""

    OWNER = "owner", "owner"
    MEMBER = "member", "member"
    OPERATOR = "operator", "operator"
    VIEWER = "viewer", "viewer"


PROVIDER_ROLES = (Role.OWNER, Role.OPERATOR, Role.VIEWER)
BUYER_ROLES = (Role.OWNER, Role.MEMBER, Role.VIEWER)


class PaymentTerms(models.TextChoices):
    """How an organisation pays: prepaid credit (every sign-up), or invoiced monthly (staff grant it)."""

    PREPAID = "prepaid", "prepaid credit"
    INVOICED = "invoiced", "invoiced monthly"


class Organization(models.Model):
    """A buyer or provider company."""

    name = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=16, choices=OrganizationKind.choices)
    provider = models.OneToOneField(Provider, null=True, blank=True, on_delete=models.PROTECT)
    # Spending limits (USD; NULL: none). New orders are refused when they would take the hourly rate of the
    # organisation's live orders above ``budget_per_hour``, or once this month's usage reached
    # ``budget_monthly``; placing an order warns from ``BUDGET_WARN_SHARE`` of either.
    budget_per_hour = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    budget_monthly = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    # Prepaid: orders hold credit before they launch. Invoiced (granted by staff): usage is billed monthly.
    payment_terms = models.CharField(max_length=8, choices=PaymentTerms.choices, default=PaymentTerms.PREPAID)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in an organisation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # NULL for memberships made before the date was kept (migration 0018): their day is unknown.
    joined_at = models.DateTimeField(null=True, blank=True, default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} as {self.role}"
