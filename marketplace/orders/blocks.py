"""Failures that block their scope for every order for a while: failover that learns across orders.

A capacity error blocks the (account, zone, instance type) it came from, a quota error the account's
region, refused credentials the whole account, each for its window (``BROKER_BLOCK_*_S``). The record is
the attempts table itself: a block is a failed attempt younger than its window, so there is nothing to
expire or clean up, and a block is visible to every worker the moment the failed attempt commits.

A clock block stands in for what the broker cannot see: a cloud's stock. A finite listing's free units (an
independent host's GPUs, a Kubernetes node's, held in ``reservations.py``) the broker counts itself, exactly,
so its own refusal of one (``SOLD_OUT``: the reservation found too few units) blocks nothing: the next order
is ranked on the units free at that moment, and gets them the moment they are released. A capacity error the
host or cluster itself answers (an agent that does not reply, a pod nobody can schedule) is news the count
does not hold, and blocks on the clock like a cloud's.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from marketplace.matching import Exclusion
from marketplace.models import Attempt, AttemptOutcome, Order
from providers.errors import CapacityUnavailable, CredentialsRejected, QuotaExceeded

# The provider code of an attempt refused by the broker's own count of a finite listing's free units.
SOLD_OUT = "listing.sold_out"


def _windows() -> dict[str, int]:
    return {
        CapacityUnavailable.error_class: settings.BLOCK_CAPACITY_S,
        QuotaExceeded.error_class: settings.BLOCK_QUOTA_S,
        CredentialsRejected.error_class: settings.BLOCK_CREDENTIALS_S,
    }


def _scopes(attempts: list[Attempt]) -> Exclusion:
    zone_types: set[tuple[int, str, str]] = set()
    account_regions: set[tuple[int, str]] = set()
    accounts: set[int] = set()
    for attempt in attempts:
        offer = attempt.offer
        if attempt.provider_code == SOLD_OUT:
            continue  # the exact count of free units decides the next try, not a window
        if attempt.error_class == CapacityUnavailable.error_class:
            zone_types.add((offer.account_id, offer.zone, offer.instance_type))
        elif attempt.error_class == QuotaExceeded.error_class:
            account_regions.add((offer.account_id, offer.region))
        elif attempt.error_class == CredentialsRejected.error_class:
            accounts.add(offer.account_id)
    return Exclusion(
        zone_types=frozenset(zone_types), account_regions=frozenset(account_regions), accounts=frozenset(accounts)
    )


def provider_blocks(*, now: dt.datetime) -> Exclusion:
    """What every order should avoid now, from all orders' recent failures."""
    windows = {error_class: seconds for error_class, seconds in _windows().items() if seconds > 0}
    if not windows:
        return Exclusion()
    # One range on the failures' partial index back to the longest window, each class's own window applied
    # to what it returns: a plan that stays a range scan, where one OR per class made the planner weigh each.
    failed = (
        Attempt.objects.filter(
            outcome=AttemptOutcome.FAILED,
            finished_at__gte=now - dt.timedelta(seconds=max(windows.values())),
            error_class__in=sorted(windows),
        )
        .exclude(provider_code=SOLD_OUT)
        .order_by()  # in no order: the attempts' own ordering would join their orders to sort them
        .select_related("offer")
        .only(
            "error_class",
            "provider_code",
            "finished_at",
            "offer__account_id",
            "offer__zone",
            "offer__instance_type",
            "offer__region",
        )
    )
    return _scopes(
        [
            a
            for a in failed
            if a.finished_at is not None and a.finished_at >= now - dt.timedelta(seconds=windows[a.error_class])
        ]
    )


def order_exclusion(order: Order, *, now: dt.datetime) -> Exclusion:
    """What ``order`` must not try next: every offer it already tried, the scopes its own failures imply
    (for the order's whole life), and the scopes other orders' recent failures block. A finite listing the
    broker found sold out keeps only its offer out of this order's failover (so the loop ends), never its
    instance type, for this order or any other."""
    own = list(order.attempts.select_related("offer").filter(outcome=AttemptOutcome.FAILED))
    mine, shared = _scopes(own), provider_blocks(now=now)
    return Exclusion(
        offer_ids=frozenset(a.offer_id for a in own),
        zone_types=mine.zone_types | shared.zone_types,
        account_regions=mine.account_regions | shared.account_regions,
        accounts=mine.accounts | shared.accounts,
    )
