"""A seller's SLA commitment (issue 38): an independent host's or a cluster's seller chooses the availability its
offers state, never below the market's floor; clouds state their provider's published figure instead."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.sla.published import PCT, SELLER_CHOSEN
from providers.models import ProviderAccount


class CommitmentRefused(ValueError):
    """The commitment cannot be set; the message names the field's problem."""

    field = "sla_commitment_pct"


def floor_pct() -> Decimal:
    return Decimal(str(settings.SLA_FLOOR_PCT)).quantize(PCT)


def account_sla_commit(*, account: ProviderAccount, pct: Decimal) -> ProviderAccount:
    """Set the account's committed availability to ``pct`` percent: from the market's floor to 100, at most three
    decimal places, on a host or cluster account only (``CommitmentRefused`` otherwise). Its offers state it from
    their next sync, which is asked for now; ledgered, as a promise to buyers. Setting the same figure again
    changes nothing."""
    if account.kind not in SELLER_CHOSEN:
        raise CommitmentRefused(
            "a cloud account's offers state their cloud's published SLA; there is nothing to choose"
        )
    if not pct.is_finite() or pct != pct.quantize(PCT) or not floor_pct() <= pct <= 100:
        raise CommitmentRefused(f"choose from the market's floor, {floor_pct()} %, to 100 %, with at most 3 decimals")
    pct = pct.quantize(PCT)
    if account.sla_commitment_pct == pct:
        return account
    with transaction.atomic():
        ProviderAccount.objects.filter(pk=account.pk).update(sla_commitment_pct=pct, sync_wanted_at=timezone.now())
        ledger_append(
            kind="provider.sla_committed",
            subject=f"provider_account:{account.pk}",
            payload={"account": account.pk, "kind": account.kind, "availability_pct": format(pct, "f")},
        )
    account.sla_commitment_pct = pct
    return account
