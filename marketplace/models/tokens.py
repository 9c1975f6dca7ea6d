"""API tokens a buyer organisation creates for automated procurement, each limited to scopes."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from marketplace.models.organizations import Organization


class TokenScope(models.TextChoices):
    OFFERS_READ = "offers:read", "read offers and prices"
    ORDERS_PLACE = "orders:place", "quote, place and list orders"
    INSTANCES_MANAGE = "instances:manage", "list and terminate orders' instances"
    LEDGER_READ = "ledger:read", "read ledger receipts"
    WEBHOOKS_MANAGE = "webhooks:manage", "create, list and delete webhooks and read their deliveries"
    KEYS_MANAGE = "keys:manage", "add, list and remove SSH keys; save launch templates"
    BILLING_MANAGE = "billing:manage", "read credit, top-ups and invoices; top up credit"


class ApiToken(models.Model):
    """A bearer token (``brk_…``), stored only as its SHA-256; ``prefix`` identifies it in lists."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_tokens")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
