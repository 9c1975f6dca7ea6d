"""Writes on provider accounts, and building an adapter from one."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from providers import ratelimit
from providers.base import ProviderAdapter
from providers.endpoints import account_endpoints_check
from providers.errors import CredentialsRejected, ProviderRequestRejected
from providers.kubernetes.kubeconfig import kubeconfig_credentials
from providers.models import Provider, ProviderAccount, ProviderKind
from providers.registry import ADAPTERS, build_adapter
from providers.secrets import SecretUnreadable


class AccountInvalid(ValueError):
    """The account's settings are wrong; the message names the field."""


def account_credentials_normalise(kind: str, values: dict[str, str], endpoint_url: str) -> tuple[dict[str, str], str]:
    """The credentials and endpoint an account keeps. A Kubernetes account's kubeconfig, pasted once, becomes
    its API server URL, token and CA bundle, and is not kept itself; any other account passes unchanged.
    Raises ``AccountInvalid`` naming the kubeconfig's problem."""
    if kind != ProviderKind.KUBERNETES or not values.get("kubeconfig"):
        return {k: v for k, v in values.items() if k != "kubeconfig"}, endpoint_url
    try:
        server, found = kubeconfig_credentials(values["kubeconfig"])
    except ValueError as exc:
        raise AccountInvalid(f"kubeconfig: {exc}") from None
    rest = {k: v for k, v in values.items() if k not in ("kubeconfig", *found)}
    return {**rest, **found}, server


def adapter_for_account(account: ProviderAccount) -> ProviderAdapter:
    """A fresh adapter for the account (adapters hold SDK clients; build one per task, not per process).

    A misconfigured account (an endpoint it may not point at included: ``providers.endpoints``) raises
    ``ProviderRequestRejected`` and unreadable stored credentials raise
    ``CredentialsRejected``, so callers handle them like any provider refusal instead of crashing.
    """
    try:
        credentials = account.credentials()
    except SecretUnreadable as exc:
        raise CredentialsRejected(str(exc), provider=account.kind) from None
    try:
        account_endpoints_check(credentials, account.options)
        return build_adapter(account.kind, credentials, account.regions, account.options)
    except ValueError as exc:
        raise ProviderRequestRejected(f"account {account.pk} is misconfigured: {exc}", provider=account.kind) from None


@transaction.atomic
def provider_account_connect(
    *,
    provider_name: str,
    kind: str,
    name: str,
    credentials: dict[str, str],
    regions: Sequence[str],
    endpoint_url: str = "",
    options: dict[str, str] | None = None,
) -> ProviderAccount:
    """Create or update a provider's account on a cloud. Idempotent on (provider, account name).

    Raises ``AccountInvalid`` naming the field, before anything is written, for an unknown kind, no regions, no
    credentials, or an option ``rate_limit.<group>`` the cloud has no bucket for or whose figures are not
    ``<capacity>/<refill per second>`` in range (``providers.ratelimit.limits_from_options``).
    """
    if kind not in ProviderKind.values:
        raise AccountInvalid(f"kind: {kind!r} is not one of {', '.join(ProviderKind.values)}")
    if kind not in ADAPTERS:
        raise AccountInvalid(f"kind: no adapter for {kind!r} yet")
    if not regions:
        raise AccountInvalid("regions: name at least one region")
    if not credentials and kind != ProviderKind.COMMUNITY:  # an independent fleet signs per machine instead
        raise AccountInvalid("credentials: none given")
    credentials, endpoint_url = account_credentials_normalise(kind, credentials, endpoint_url)
    if kind == ProviderKind.KUBERNETES and not (endpoint_url and credentials.get("token")):
        raise AccountInvalid("credentials: a cluster needs its API server URL and a service account token")
    try:
        ratelimit.limits_from_options(options or {}, kind)
    except ValueError as exc:
        raise AccountInvalid(str(exc)) from None
    provider, _ = Provider.objects.get_or_create(name=provider_name)
    account, _ = ProviderAccount.objects.get_or_create(provider=provider, name=name, defaults={"kind": kind})
    account.kind = kind
    account.regions = list(regions)
    account.endpoint_url = endpoint_url
    account.options = dict(options or {})
    account.enabled = True
    account.set_credentials(credentials)
    account.save()
    return account
