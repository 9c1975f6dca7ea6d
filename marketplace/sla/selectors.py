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
from marketplace.sla.published import CLOUD_SLAS, SELLER_CHOSEN
from providers.models import Provider, ProviderAccount

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
        # Through the relations: a list of orders prefetches them (orders.selectors.order_list).
        outages=sorted(order.outages.all(), key=lambda o: (o.started_at, o.pk)),
        credits=sorted(order.sla_credits.all(), key=lambda c: c.period_start),
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
        .prefetch_related("instances", "stopped_periods", "outages")
        .distinct()
    )
    return orders_availability(orders, now=now, window=window)


def accounts_availability(
    *, now: dt.datetime, account_ids: Iterable[int] | None = None, window: dt.timedelta = WINDOW
) -> dict[int, Measured]:
    """``account_availability`` of several accounts (every account when None), in one read of their orders and
    outages; accounts without any are left out (nothing measured: no evidence either way)."""
    orders = Order.objects.filter(_ran_since(now - window))
    if account_ids is not None:
        orders = orders.filter(offer__account_id__in=list(account_ids))
    orders = orders.select_related("offer").prefetch_related("instances", "stopped_periods", "outages").distinct()
    by_account: dict[int, list[Order]] = {}
    for order in orders:
        by_account.setdefault(order.offer.account_id, []).append(order)
    return {
        account_id: measured
        for account_id, group in by_account.items()
        if (measured := orders_availability(group, now=now, window=window)).measured_seconds > 0
    }


def machines_availability(*, now: dt.datetime, window: dt.timedelta = WINDOW) -> dict[tuple[int, str], Measured]:
    """Per independent machine (account, machine name = its offers' zone), the measured availability of the
    orders it ran over the last ``window``; machines with nothing measured are left out."""
    orders = (
        Order.objects.filter(_ran_since(now - window), offer__account__kind="community")
        .select_related("offer")
        .prefetch_related("instances", "stopped_periods", "outages")
        .distinct()
    )
    by_machine: dict[tuple[int, str], list[Order]] = {}
    for order in orders:
        by_machine.setdefault((order.offer.account_id, order.offer.zone), []).append(order)
    return {
        key: measured
        for key, group in by_machine.items()
        if (measured := orders_availability(group, now=now, window=window)).measured_seconds > 0
    }


def open_outages_by_cause() -> dict[str, int]:
    """For the metrics: open outages per cause."""
    rows = Outage.objects.filter(ended_at__isnull=True).values("cause").annotate(n=Count("pk"))
    return {row["cause"]: row["n"] for row in rows}


def orders_below_sla(*, now: dt.datetime) -> dict[str, int]:
    """For the metrics: running orders whose availability this month so far is below their SLA, per provider
    kind. Reads only orders with an open outage or one this month (the others are at 100 %)."""
    start = month_start(now)
    candidates = (
        Order.objects.filter(state=OrderState.RUNNING, offer__sla_availability__isnull=False)
        # Through the outages themselves: a join would match an order with none (its outage columns NULL).
        .filter(pk__in=Outage.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start)).values("order_id"))
        .select_related("offer__account")
        .prefetch_related("instances", "stopped_periods", "outages")
    )
    below: dict[str, int] = {}
    for order in candidates:
        judged = sla_judge(order, period_start=start, period_end=now)
        if judged is not None and judged.measured.availability_pct < judged.committed_pct:
            kind = order.offer.account.kind
            below[kind] = below.get(kind, 0) + 1
    return below


def credits_posted() -> tuple[int, int]:
    """For the metrics: SLA credits paid so far, as (count, sum in minor units)."""
    row = SlaCredit.objects.filter(amount_minor__gt=0).aggregate(n=Count("pk"), total=Sum("amount_minor"))
    return int(row["n"] or 0), int(row["total"] or 0)


def account_committed_pct(account: ProviderAccount, *, floor: Decimal) -> Decimal:
    """What the account's on-demand offers state: its cloud's published figure, or its seller's choice (at least
    the floor)."""
    if account.kind in SELLER_CHOSEN:
        return max(account.sla_commitment_pct or floor, floor)
    published = CLOUD_SLAS.get(account.kind)
    return published.availability_pct if published is not None else Decimal(0)


@dataclass(frozen=True)
class SlaRow:
    """One row of the portal's SLA table: an account, or one machine of an independent host's account."""

    account: ProviderAccount
    machine: str
    committed_pct: Decimal
    measured: Measured | None  # None: nothing ran in the last 30 days

    @property
    def below(self) -> bool:
        return self.measured is not None and self.measured.availability_pct < self.committed_pct


def provider_sla_rows(*, provider: Provider, now: dt.datetime, floor: Decimal) -> list[SlaRow]:
    """Each of the provider's accounts, and each machine of its host accounts, with its measured availability
    over the last 30 days against its commitment."""
    accounts = list(ProviderAccount.objects.filter(provider=provider).order_by("name", "pk"))
    orders = (
        Order.objects.filter(_ran_since(now - WINDOW), offer__account__provider=provider)
        .select_related("offer")
        .prefetch_related("instances", "stopped_periods", "outages")
        .distinct()
    )
    by_account: dict[int, list[Order]] = {}
    by_machine: dict[tuple[int, str], list[Order]] = {}
    for order in orders:
        by_account.setdefault(order.offer.account_id, []).append(order)
        by_machine.setdefault((order.offer.account_id, order.offer.zone), []).append(order)
    rows = []
    for account in accounts:
        committed = account_committed_pct(account, floor=floor)
        group = by_account.get(account.pk)
        measured = orders_availability(group, now=now) if group else None
        rows.append(SlaRow(account, "", committed, measured))
        if account.kind == "community":
            for (account_id, machine), machine_orders in sorted(by_machine.items()):
                if account_id == account.pk:
                    rows.append(SlaRow(account, machine, committed, orders_availability(machine_orders, now=now)))
    return rows
