"""Reads of SLAs (issue 38): an order's SLA, measured availability, outages and credits for its page and the API;
a seller's measured availability over the last 30 days for the ranking and the portal; cheap counts for the
metrics."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Q, Sum

from marketplace.models import Order, OrderState, Outage, SlaCredit
from marketplace.sla.availability import Measured
from marketplace.sla.credits import month_start, sla_judge

WINDOW = dt.timedelta(days=30)


@dataclass(frozen=True)
class OrderSla:
    """What an order's page and the API show: the SLA its offer states (None: none, spot), this month's
    measurement so far, every outage and every credit paid."""

    committed_pct: Decimal | None
    source: str
    tiers: list[list[str]]
    measured_pct: Decimal | None
    measured_seconds: int
    down_seconds: int
    outages: list[Outage]
    credits: list[SlaCredit]

    @property
    def credited_minor(self) -> int:
        return sum(c.amount_minor for c in self.credits)


def order_sla(order: Order, *, now: dt.datetime) -> OrderSla:
    """The order's SLA as its page shows it; this month's measurement runs to ``now`` (or the order's end)."""
    judged = sla_judge(order, period_start=month_start(now), period_end=now)
    return OrderSla(
        committed_pct=order.offer.sla_availability,
        source=order.offer.sla_source,
        tiers=list(order.offer.sla_credits or []),
        measured_pct=judged.measured.availability_pct if judged is not None else None,
        measured_seconds=judged.measured.measured_seconds if judged is not None else 0,
        down_seconds=judged.measured.down_seconds if judged is not None else 0,
        outages=list(Outage.objects.filter(order=order).order_by("started_at", "pk")),
        credits=list(SlaCredit.objects.filter(order=order).order_by("period_start")),
    )


def orders_availability(orders: Iterable[Order], *, now: dt.datetime, window: dt.timedelta = WINDOW) -> Measured:
    """The orders' measured availability over the last ``window`` together: seconds owed and down summed over
    every order that ran in it (SLA or not: reliability is what the broker saw, whatever was promised)."""
    measured = down = 0
    for order in orders:
        judged = sla_judge(order, period_start=now - window, period_end=now, require_sla=False)
        if judged is not None:
            measured += judged.measured.measured_seconds
            down += judged.measured.down_seconds
    return Measured(measured, down)


def _ran_since(since: dt.datetime) -> Q:
    return Q(instances__ready_at__isnull=False) & ~Q(state__in=Order.FINAL_STATES, state_changed_at__lt=since)


def account_availability(*, account_id: int, now: dt.datetime, window: dt.timedelta = WINDOW) -> Measured:
    """One provider account's measured availability over the last 30 days, over the orders its offers sold."""
    orders = (
        Order.objects.filter(_ran_since(now - window), offer__account_id=account_id)
        .select_related("offer")
        .prefetch_related("instances", "stopped_periods")
        .distinct()
    )
    return orders_availability(orders, now=now, window=window)


def accounts_availability(
    *, account_ids: Iterable[int], now: dt.datetime, window: dt.timedelta = WINDOW
) -> dict[int, Measured]:
    """``account_availability`` of several accounts, in one read of their orders; accounts without any are
    left out (nothing measured: no evidence either way)."""
    orders = (
        Order.objects.filter(_ran_since(now - window), offer__account_id__in=list(account_ids))
        .select_related("offer")
        .prefetch_related("instances", "stopped_periods")
        .distinct()
    )
    by_account: dict[int, list[Order]] = {}
    for order in orders:
        by_account.setdefault(order.offer.account_id, []).append(order)
    return {
        account_id: measured
        for account_id, group in by_account.items()
        if (measured := orders_availability(group, now=now, window=window)).measured_seconds > 0
    }


def open_outages_by_cause() -> dict[str, int]:
    """For the metrics: open outages per cause."""
    rows = Outage.objects.filter(ended_at__isnull=True).values("cause").annotate(n=Count("pk"))
    return {row["cause"]: row["n"] for row in rows}


def orders_below_sla(*, now: dt.datetime) -> int:
    """For the metrics: running orders whose availability this month so far is below their SLA. Reads only
    orders with an open outage or one this month (the others are at 100 %)."""
    start = month_start(now)
    candidates = (
        Order.objects.filter(state=OrderState.RUNNING, offer__sla_availability__isnull=False)
        .filter(Q(outages__ended_at__isnull=True) | Q(outages__ended_at__gt=start))
        .select_related("offer")
        .prefetch_related("instances", "stopped_periods")
        .distinct()
    )
    below = 0
    for order in candidates:
        judged = sla_judge(order, period_start=start, period_end=now)
        if judged is not None and judged.measured.availability_pct < judged.committed_pct:
            below += 1
    return below


def credits_posted() -> tuple[int, int]:
    """For the metrics: SLA credits paid so far, as (count, sum in minor units)."""
    row = SlaCredit.objects.filter(amount_minor__gt=0).aggregate(n=Count("pk"), total=Sum("amount_minor"))
    return int(row["n"] or 0), int(row["total"] or 0)
