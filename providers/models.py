"""Sellers and their connections to clouds."""

from __future__ import annotations

from django.db import models

from providers.registry import ADAPTERS
from providers.secrets import decrypt_secret, encrypt_secret
from providers.types import Credentials


class ProviderKind(models.TextChoices):
    AWS = "aws", "Amazon Web Services"
    AZURE = "azure", "Microsoft Azure"
    GCP = "gcp", "Google Cloud"
    ALIBABA = "alibaba", "Alibaba Cloud"
    TENCENT = "tencent", "Tencent Cloud"
    COMMUNITY = "community", "Independent provider"


class Provider(models.Model):
    """A seller on the marketplace: a cloud reseller or an independent owner of machines."""

    name = models.CharField(max_length=120, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class SyncStatus(models.TextChoices):
    NEVER = "never", "never synced"
    OK = "ok", "ok"
    FAILED = "failed", "failed"


class ProviderAccount(models.Model):
    """One provider's account on one cloud. Credentials are encrypted at rest and never rendered."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="accounts")
    kind = models.CharField(max_length=16, choices=ProviderKind.choices)
    name = models.CharField(max_length=120)
    credentials_encrypted = models.TextField(blank=True, default="")
    endpoint_url = models.URLField(blank=True, default="", help_text="override for sovereign or local endpoints")
    regions = models.JSONField(default=list)
    options = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    sync_status = models.CharField(max_length=16, choices=SyncStatus.choices, default=SyncStatus.NEVER)
    sync_error = models.TextField(blank=True, default="")
    last_synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "name"], name="provider_account_unique_name")]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.name} ({self.kind})"

    @property
    def is_supported(self) -> bool:
        return self.kind in ADAPTERS

    def set_credentials(self, values: dict[str, str]) -> None:
        self.credentials_encrypted = encrypt_secret(values)

    def credentials(self) -> Credentials:
        return Credentials(
            kind=self.kind,
            values=decrypt_secret(self.credentials_encrypted),
            endpoint_url=self.endpoint_url or None,
        )
