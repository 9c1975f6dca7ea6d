"""Offer sync for thousands of accounts, with backpressure.

A sync round hands accounts to the ``sync`` queue only while fewer than ``OFFER_SYNC_IN_FLIGHT`` are queued or
running; each sync that ends hands over the next due account itself. The queue so never holds more than that
many syncs, whatever the number of accounts, a slow pool never accumulates a second copy of an account's sync
behind the first, and the round still reaches every account, as fast as the sync pool goes.

- *due*: enabled, and not handed over in the last ``OFFER_SYNC_INTERVAL_S`` x ``DUE_FRACTION`` (a failed
  sync waits for the next round like a good one: a broken cloud is not asked again at once);
- *in flight*: handed over, not yet ended, and handed over less than ``STALE_S`` ago (a worker killed mid-sync
  never ends its claim: it lapses after the sync task's hard time limit, and the account is due again);
- oldest hand-over first, so no account starves behind others; an account *wanted* (``offers_sync_soon``: what
  it sells changed since its last hand-over) is due at once and goes before all of them.

Claims are made one claimer at a time (a transaction-scoped advisory lock on PostgreSQL; SQLite serialises
writers), so concurrent claimers never exceed the bound.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, QuerySet, When
from django.utils import timezone

from marketplace.taskkit import enqueue_on_commit
from providers.models import ProviderAccount

# The sync task's hard time limit (marketplace.taskkit.SYNC_LIMITS) and a margin: a claim older has no sync left.
STALE_S = 960 + 60
# An account handed over this fraction of an interval ago is not due yet: beats drift, rounds overlap a little.
DUE_FRACTION = 0.9
_CLAIM_LOCK_KEY = 0x0FF5E75C


def _in_flight(now: dt.datetime) -> QuerySet[ProviderAccount]:
    fresh = Q(sync_claimed_at__gt=now - dt.timedelta(seconds=STALE_S))
    open_claim = Q(sync_done_at__isnull=True) | Q(sync_done_at__lt=F("sync_claimed_at"))
    return ProviderAccount.objects.filter(fresh & open_claim)


def offers_sync_claim(*, now: dt.datetime | None = None, limit: int | None = None) -> list[int]:
    """Claim the due accounts that fit under the in-flight bound, oldest hand-over first; their ids. The caller
    queues one sync for each (``offers_sync_release`` when it ends)."""
    now = now or timezone.now()
    bound = settings.OFFER_SYNC_IN_FLIGHT if limit is None else limit
    due_before = now - dt.timedelta(seconds=settings.OFFER_SYNC_INTERVAL_S * DUE_FRACTION)
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CLAIM_LOCK_KEY])
        room = bound - _in_flight(now).count()
        if room <= 0:
            return []
        wanted = Q(sync_wanted_at__gt=F("sync_claimed_at"))
        due = (
            ProviderAccount.objects.filter(enabled=True)
            .filter(Q(sync_claimed_at__isnull=True) | Q(sync_claimed_at__lt=due_before) | wanted)
            .exclude(pk__in=_in_flight(now).values("pk"))
            .order_by(Case(When(wanted, then=0), default=1), F("sync_claimed_at").asc(nulls_first=True), "pk")
        )
        ids = list(due.values_list("pk", flat=True)[:room])
        ProviderAccount.objects.filter(pk__in=ids).update(sync_claimed_at=now)
    return ids


def offers_sync_soon(*, account_ids: list[int], now: dt.datetime | None = None) -> None:
    """What these accounts sell changed: sync each as soon as the in-flight bound allows, not at the next round.
    An account whose sync is running now is synced again after it (that sync may have read the old state). The
    claim is queued once the caller's transaction commits, so the sync reads what it wrote."""
    ProviderAccount.objects.filter(pk__in=account_ids).update(sync_wanted_at=now or timezone.now())
    enqueue_on_commit("marketplace.offers_sync_soon")


def offers_sync_release(*, account_id: int, now: dt.datetime | None = None) -> None:
    """The account's sync ended (well or not): it no longer counts against the bound."""
    ProviderAccount.objects.filter(pk=account_id).update(sync_done_at=now or timezone.now())


def offers_sync_in_flight(*, now: dt.datetime | None = None) -> int:
    return _in_flight(now or timezone.now()).count()
