"""The adapter contract every provider package implements.

Adapters are ORM-free: DTOs from ``providers.types`` in and out, errors from ``providers.errors``
raised. Only a provider's ``client.py`` imports its SDK.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from providers.errors import QuotaExceeded
from providers.types import Credentials, InstanceHandle, LaunchSpec, OfferQuote, QuotaUse


class ProviderAdapter(abc.ABC):
    """One provider account's view of a cloud.

    Every method makes real SDK calls with explicit timeouts. Errors raised are always subclasses of
    ``providers.errors.ProviderError``; no SDK exception escapes.
    """

    kind: str = ""

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        self.credentials = credentials
        self.regions = tuple(regions)
        self.options = dict(options or {})

    @abc.abstractmethod
    def check_credentials(self) -> None:
        """A cheap real read that proves the credentials work.

        Raises ``CredentialsRejected`` when the provider refuses them, ``TransientProviderError`` when it
        could not be reached. Safe to call any number of times.
        """

    @abc.abstractmethod
    def list_offers(self) -> list[OfferQuote]:
        """Every GPU offer this account can buy in its regions: catalogue, on-demand and spot prices.

        Read-only and safe to repeat. Rows are returned as the provider states them; validation and
        quarantine happen in the broker's ingestion, not here.
        """

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """Start one instance.

        Idempotent on ``spec.client_token`` within ``spec.region``: a repeat with the same token returns the
        instance the first call created instead of a second one. Raises ``CapacityUnavailable``,
        ``QuotaExceeded``, ``CredentialsRejected``, ``TransientProviderError`` or ``ProviderRequestRejected``.
        The SDK's own retries are off for this call: the broker decides whether to retry or fail over.
        """

    def quota_check(self, spec: LaunchSpec) -> None:
        """Refuse, before any launch call, a launch the account's published quotas cannot hold.

        Raises ``QuotaExceeded`` (code ``precheck``) naming the quota, its limit, its usage and what the launch
        needs. Returns when there is room, or when the provider publishes no quota this launch counts against
        (the default: the launch itself is then the only judge). Read-only; may raise
        ``TransientProviderError`` or ``CredentialsRejected``, after which a caller may still try the launch.
        """
        return None  # AWS, Alibaba and Tencent: their quotas surface as launch errors only

    @abc.abstractmethod
    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` if the provider does not know it."""

    @abc.abstractmethod
    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Ask the provider to terminate the instance. Idempotent: terminating a terminated instance is a no-op."""

    @abc.abstractmethod
    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Instances tagged with the broker's order reference, in every region of the account (for reconciling)."""


def quota_refuse_short(provider: str, region: str, quotas: dict[str, QuotaUse], needs: dict[str, float]) -> None:
    """Raise ``QuotaExceeded`` for the first quota in ``needs`` (name -> amount the launch adds) that ``quotas``
    cannot hold; quotas the provider did not report are not judged."""
    for name, needed in needs.items():
        quota = quotas.get(name)
        if quota is None or needed <= 0:
            continue
        if quota.usage + needed > quota.limit:
            raise QuotaExceeded(
                f"quota {name} in {region}: {quota.usage:g} of {quota.limit:g} in use, the launch needs {needed:g}",
                code="precheck",
                provider=provider,
            )
