"""Reads of the provider dashboard: GPUs rented and idle hour by hour, revenue by day, the leases running,
the interruptible orders against each machine's minimum bid, always scoped to one provider.

Money comes from ``marketplace.orders.payouts`` (its statement lines), so a day's figures add up to the
month's statement to the cent. Every figure is in USD, the currency the broker settles in (``CURRENCY``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Q

from ledger.models import LedgerEntry
from marketplace.models import GpuHold, Instance, Order, OrderState
from marketplace.orders.payouts import payout_statement
from providers.community.adapter import available_now
from providers.models import Machine, MachineState, Provider
from providers.types import PricingModel

CURRENCY = "USD"
_HOUR = dt.timedelta(hours=1)
_TENTH = Decimal("0.1")


@dataclass(frozen=True)
class GpuHour:
    """One whole UTC hour of the provider's machines: mean GPUs listed for sale and mean GPUs rented in it.
    ``listed`` counts a GPU only while its machine was verified (``verified_spans``) and inside an
    availability window, and never falls below ``rented`` (a lease may outlast the window it started in)."""

    start: dt.datetime
    listed: Decimal
    rented: Decimal
    # GPU-hours in the part of the hour counted: the means for a whole hour, less for the current one so far.
    listed_gpu_hours: Decimal
    rented_gpu_hours: Decimal
    current: bool = False

    @property
    def idle(self) -> Decimal:
        return self.listed - self.rented


@dataclass(frozen=True)
class GpuDay:
    day: dt.date
    listed_gpu_hours: Decimal
    rented_gpu_hours: Decimal

    @property
    def idle_gpu_hours(self) -> Decimal:
        return self.listed_gpu_hours - self.rented_gpu_hours

    @property
    def rented_pct(self) -> Decimal | None:
        if not self.listed_gpu_hours:
            return None
        return (self.rented_gpu_hours / self.listed_gpu_hours * 100).quantize(_TENTH)


@dataclass(frozen=True)
class RevenueDay:
    day: dt.date
    orders: int
    gross: Decimal
    commission: Decimal
    net: Decimal
    currency: str = CURRENCY


@dataclass(frozen=True)
class Lease:
    """A running order on the provider's capacity; ``gpu_indexes`` empty where no machine is held GPU by GPU
    (a cloud instance)."""

    order_id: str
    account_id: int
    machine: str
    pricing_model: str
    gpu_count: int
    gpu_indexes: tuple[int, ...]
    since: dt.datetime
    price_per_hour: Decimal
    currency: str = CURRENCY

    @property
    def pricing_label(self) -> str:
        return self.pricing_model.replace("_", "-")

    @property
    def short_id(self) -> str:
        return self.order_id[:8]

    @property
    def price_per_gpu_hour(self) -> Decimal:
        return (self.price_per_hour / self.gpu_count).quantize(Decimal("0.0001"))


@dataclass(frozen=True)
class MachineBid:
    """A machine's minimum interruptible bid (None: not sold interruptible) and the interruptible leases on it."""

    machine: str
    gpu_count: int
    min_bid_per_gpu_hour: Decimal | None
    leases: list[Lease]
    currency: str = CURRENCY


def _overlap(start: dt.datetime, end: dt.datetime, lo: dt.datetime, hi: dt.datetime) -> float:
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


Span = tuple[dt.datetime, dt.datetime]
_STATE_KINDS = [f"machine.{state}" for state in MachineState.values]


def verified_spans(machines: Iterable[Machine], until: dt.datetime) -> dict[int, list[Span]]:
    """When each machine was verified, up to ``until``: from the ledger's record of its state changes (each
    ``machine.<state>`` entry names the state before it, so the first one also says how the machine started).
    A machine with no such entry has never changed state through the broker: its current state throughout."""
    by_subject = {f"machine:{m.key_id}": m for m in machines}
    changes: dict[str, list[tuple[dt.datetime, str, str]]] = defaultdict(list)
    rows = LedgerEntry.objects.filter(subject__in=list(by_subject), kind__in=_STATE_KINDS).values_list(
        "subject", "kind", "created_at", "payload"
    )
    for subject, kind, at, payload in rows:
        changes[subject].append((at, kind.removeprefix("machine."), str(json.loads(payload).get("previous"))))
    spans: dict[int, list[Span]] = {}
    for subject, machine in by_subject.items():
        history = changes.get(subject)
        if not history:
            spans[machine.pk] = [(machine.created_at, until)] if machine.state == MachineState.VERIFIED else []
            continue
        state, since, verified = history[0][2], machine.created_at, []
        for at, new_state, _ in history:
            if state == MachineState.VERIFIED and at > since:
                verified.append((since, at))
            state, since = new_state, at
        if state == MachineState.VERIFIED and until > since:
            verified.append((since, until))
        spans[machine.pk] = verified
    return spans


def _listed_fraction(machine: Machine, hour: dt.datetime, verified: list[Span], end: dt.datetime) -> float:
    """The share of [``hour``, ``end``) the machine was for sale (verified, and inside its availability
    windows), sampled per minute (windows are set to the minute)."""
    if not any(start < end and stop > hour for start, stop in verified):
        return 0.0
    minutes = [hour + dt.timedelta(minutes=m) for m in range(60) if hour + dt.timedelta(minutes=m) < end]
    if not minutes:
        return 0.0
    return sum(
        1
        for t in minutes
        if any(start <= t < stop for start, stop in verified)
        and (not machine.availability or available_now(machine.availability, t))
    ) / len(minutes)


def _machine_instances(machines: Iterable[Machine], since: dt.datetime, until: dt.datetime) -> list[Instance]:
    """Instances that ran on the machines at some point in [since, until). A community offer's zone names its
    machine within the account, and so does the instance's."""
    by_machine = Q(pk__in=[])
    for machine in machines:
        by_machine |= Q(account_id=machine.account_id, zone=machine.name)
    return list(
        Instance.objects.filter(by_machine, running_at__isnull=False, running_at__lt=until)
        .filter(Q(terminated_at__isnull=True) | Q(terminated_at__gt=since))
        .select_related("attempt__offer")
    )


def provider_gpu_hours(*, provider: Provider, now: dt.datetime, hours: int) -> list[GpuHour]:
    """The last ``hours`` UTC hours, oldest first, for the provider's independent machines: the whole hours
    before the current one and, last, the current hour so far (its means over the minutes elapsed, so four
    leases running now read 4.0 at once). Rented is each instance's running interval (provider's "running" to
    termination, or now) times its offer's GPU count."""
    until = now.replace(minute=0, second=0, microsecond=0)
    whole_hours = hours if now == until else hours - 1
    since = until - whole_hours * _HOUR
    all_machines = list(Machine.objects.filter(account__provider=provider).order_by("name"))
    spans = verified_spans(all_machines, now)
    # (running from, running until, GPUs): the query keeps only instances that reached running.
    runs = [
        (inst.running_at, inst.terminated_at or now, inst.attempt.offer.gpu_count)
        for inst in _machine_instances(all_machines, since, now)
        if inst.running_at is not None
    ]
    periods = [(since + i * _HOUR, since + (i + 1) * _HOUR) for i in range(whole_hours)]
    if now > until:
        periods.append((until, now))
    series = []
    for start, end in periods:
        hours_counted = Decimal((end - start).total_seconds()) / 3600
        rented_hours = Decimal(sum(_overlap(began, ended, start, end) * gpus for began, ended, gpus in runs)) / 3600
        listed_hours = hours_counted * Decimal(
            sum(_listed_fraction(m, start, spans[m.pk], end) * m.gpu_count for m in all_machines)
        )
        listed_hours = max(listed_hours, rented_hours)
        series.append(
            GpuHour(
                start=start,
                listed=(listed_hours / hours_counted).quantize(_TENTH),
                rented=(rented_hours / hours_counted).quantize(_TENTH),
                listed_gpu_hours=listed_hours,
                rented_gpu_hours=rented_hours,
                current=end == now,
            )
        )
    return series


def gpu_days(series: list[GpuHour]) -> list[GpuDay]:
    """The hourly series summed per UTC day, in GPU-hours, oldest first."""
    listed: dict[dt.date, Decimal] = defaultdict(Decimal)
    rented: dict[dt.date, Decimal] = defaultdict(Decimal)
    for hour in series:
        listed[hour.start.date()] += hour.listed_gpu_hours
        rented[hour.start.date()] += hour.rented_gpu_hours
    return [
        GpuDay(day=day, listed_gpu_hours=listed[day].quantize(_TENTH), rented_gpu_hours=rented[day].quantize(_TENTH))
        for day in sorted(listed)
    ]


def provider_revenue_by_day(*, provider: Provider, today: dt.date, days: int) -> list[RevenueDay]:
    """Gross, commission and net per UTC day (by when each order ended), newest first, over the ``days`` days up
    to ``today``; days without an ended order show zero. The figures are the payout statements' lines, summed."""
    first = today - dt.timedelta(days=days - 1)
    months = sorted({(first + dt.timedelta(days=d)).strftime("%Y-%m") for d in range(days)})
    # Cents from the start, so a quiet day reads 0.00 like the others.
    zero = Decimal("0.00")
    totals: dict[dt.date, list[Decimal]] = {first + dt.timedelta(days=d): [zero] * 4 for d in range(days)}
    for month in months:
        for line in payout_statement(provider=provider, month=month).lines:
            row = totals.get(line.ended_at.astimezone(dt.UTC).date())
            if row is not None:
                row[0] += 1
                row[1] += line.gross_usd
                row[2] += line.commission_usd
                row[3] += line.net_usd
    return [
        RevenueDay(day=day, orders=int(row[0]), gross=row[1], commission=row[2], net=row[3])
        for day, row in sorted(totals.items(), reverse=True)
    ]


def provider_leases(*, provider: Provider) -> list[Lease]:
    """The orders running on the provider's capacity now, newest first, each with the GPU indexes it holds."""
    orders = list(
        Order.objects.filter(offer__account__provider=provider, state=OrderState.RUNNING)
        .select_related("offer")
        .prefetch_related("instances")
        .order_by("-state_changed_at", "-pk")
    )
    held: dict[int, list[int]] = defaultdict(list)
    holds = GpuHold.objects.filter(attempt__order__in=orders).order_by("gpu_index")
    for order_id, index in holds.values_list("attempt__order_id", "gpu_index"):
        held[order_id].append(index)
    leases = []
    for order in orders:
        instance = order.instance
        since = (instance.running_at if instance else None) or order.state_changed_at
        leases.append(
            Lease(
                order_id=str(order.public_id),
                account_id=order.offer.account_id,
                machine=order.offer.zone,
                pricing_model=order.pricing_model,
                gpu_count=order.offer.gpu_count,
                gpu_indexes=tuple(held[order.pk]),
                since=since,
                price_per_hour=order.price_per_hour,
            )
        )
    return leases


def provider_machine_bids(*, provider: Provider, leases: list[Lease]) -> list[MachineBid]:
    """Each of the provider's machines with its minimum interruptible bid and the interruptible leases running
    on it (from ``provider_leases``)."""
    machines = Machine.objects.filter(account__provider=provider).order_by("name")
    spot = [lease for lease in leases if lease.pricing_model == PricingModel.SPOT]
    return [
        MachineBid(
            machine=m.name,
            gpu_count=m.gpu_count,
            min_bid_per_gpu_hour=m.min_bid_per_gpu_hour,
            leases=[lease for lease in spot if (lease.account_id, lease.machine) == (m.account_id, m.name)],
        )
        for m in machines
    ]
