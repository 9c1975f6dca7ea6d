"""Reads of orders, always scoped to the caller's organisation."""

from __future__ import annotations

import datetime as dt
import enum
import json
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Avg, Max, QuerySet
from django.db.models.functions import TruncMinute

from ledger.selectors import entries_for_subject, latest_hashes
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    InvoiceLine,
    Lease,
    LeaseHeartbeat,
    Membership,
    Order,
    Organization,
    OrganizationKind,
    Role,
)
from marketplace.models.organizations import BUYER_ROLES
from marketplace.orders.budgets import LIVE_STATES
from providers.models import Machine, MachineHeartbeat, ProviderKind


class BuyerPermission(enum.Enum):
    """What a buyer role may do; ``BUYER_ROLE_PERMISSIONS`` is the one table the storefront and the API check."""

    READ = "read"  # browse offers, see orders, invoices, receipts, the team and the tokens
    ORDER = "order"  # quote, place and terminate orders
    TOKENS = "tokens"  # create and revoke API tokens
    WEBHOOKS = "webhooks"  # everything about webhooks, their deliveries included
    BUDGETS = "budgets"  # change the spending limits
    TEAM = "team"  # invite, revoke invitations, change roles, remove members
    PAY = "pay"  # top up credit, set the card, the billing country and the auto top-up


BUYER_ROLE_PERMISSIONS: dict[str, frozenset[BuyerPermission]] = {
    Role.OWNER: frozenset(BuyerPermission),
    Role.MEMBER: frozenset(BuyerPermission) - {BuyerPermission.BUDGETS, BuyerPermission.TEAM, BuyerPermission.PAY},
    Role.VIEWER: frozenset({BuyerPermission.READ}),
}


def buyer_role_allows(role: str, permission: BuyerPermission) -> bool:
    return permission in BUYER_ROLE_PERMISSIONS.get(role, frozenset())


def buyer_refusal(role: str, permission: BuyerPermission) -> str:
    """Why ``role`` may not do ``permission``, naming the roles that may (for a 403)."""
    allowed = [r for r in BUYER_ROLES if buyer_role_allows(r, permission)]
    return f"this needs the {' or '.join(allowed)} role; you are a {role} of this organisation"


def buyer_membership_list(user: AbstractBaseUser | AnonymousUser) -> list[Membership]:
    """The user's buyer memberships, by organisation name (the switcher's order)."""
    if not user.is_authenticated:
        return []
    return list(
        Membership.objects.select_related("organization")
        .filter(user=user, organization__kind=OrganizationKind.BUYER)
        .order_by("organization__name", "pk")
    )


def buyer_membership(user: AbstractBaseUser | AnonymousUser, *, active: int | None = None) -> Membership | None:
    """The membership the user acts through: of organisation ``active`` (the session's choice) while they still
    belong to it, else of their oldest buyer organisation; None for someone in none. Never an organisation the
    user left: only current memberships are read."""
    if not user.is_authenticated:
        return None
    mine = Membership.objects.select_related("organization").filter(
        user=user, organization__kind=OrganizationKind.BUYER
    )
    chosen = mine.filter(organization_id=active).first() if active is not None else None
    return chosen or mine.order_by("pk").first()


def buyer_organization(user: AbstractBaseUser | AnonymousUser, *, active: int | None = None) -> Organization | None:
    """The buyer organisation the user acts for (``buyer_membership``'s)."""
    membership = buyer_membership(user, active=active)
    return None if membership is None else membership.organization


def order_list(*, organization: Organization) -> QuerySet[Order]:
    return (
        Order.objects.filter(organization=organization)
        .select_related("gpu_model", "offer", "launch_config", "cluster")
        .prefetch_related(
            "attempts__offer",
            "instances",
            "leases",
            "silent_periods__instance",
            "stopped_periods",
            "outages",
            "sla_credits",
        )
    )


def order_get(*, organization: Organization, public_id: str) -> Order | None:
    """The order if it belongs to ``organization``; None otherwise (a stranger learns nothing)."""
    try:
        uuid.UUID(str(public_id))
    except ValueError:
        return None
    return order_list(organization=organization).filter(public_id=public_id).first()


def order_ledger_heads(orders: list[Order]) -> dict[int, str]:
    by_subject = latest_hashes(f"order:{o.public_id}" for o in orders)
    return {o.pk: by_subject.get(f"order:{o.public_id}", "") for o in orders}


@dataclass(frozen=True)
class Usage:
    """What an order has used: seconds its instances ran (stopped time left out), and what that costs at the
    order's locked price plus what its stopped time costs (``stopped_seconds`` at each stop's own rate)."""

    seconds: int
    amount_usd: Decimal
    stopped_seconds: int = 0
    stopped_usd: Decimal = Decimal(0)


def _overlap(start: dt.datetime, end: dt.datetime, low: dt.datetime, high: dt.datetime) -> int:
    return max(0, int((min(end, high) - max(start, low)).total_seconds()))


def _usage(order: Order, *, start: dt.datetime | None, end: dt.datetime) -> Usage:
    """Metered seconds from each instance's ready report to its termination (``end`` while active), within
    [start, end); a stopped period of the instance is left out of them and charged at its own rate."""
    seconds = stopped_seconds = 0
    stopped_usd = Decimal(0)
    periods: dict[int, list[Any]] = {}
    for period in order.stopped_periods.all():
        periods.setdefault(period.instance_id, []).append(period)
    for instance in order.instances.all():
        if instance.ready_at is None:
            continue
        stop = instance.terminated_at or (end if instance.active else instance.ready_at)
        low, high = max(instance.ready_at, start or instance.ready_at), min(stop, end)
        seconds += max(0, int((high - low).total_seconds()))
        for period in periods.get(instance.pk, ()):
            # An open period runs to the instance's end (a stopped order terminated) or ``end``.
            off = _overlap(period.started_at, period.ended_at or high, low, high)
            seconds -= off
            stopped_seconds += off
            stopped_usd += period.usd_per_hour * off / 3600
    amount = (order.price_per_hour * seconds / 3600 + stopped_usd).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    return Usage(
        seconds=max(0, seconds),
        amount_usd=amount,
        stopped_seconds=stopped_seconds,
        stopped_usd=stopped_usd.quantize(Decimal("0.000001"), ROUND_HALF_UP),
    )


def order_usage(order: Order, *, now: dt.datetime) -> Usage:
    """Per-second metering from each instance's ready report to its termination (or ``now`` while it runs).

    An instance that never became ready (failed before running, never booted, the wrong GPUs) costs nothing;
    the price is the one locked on the order. Time the buyer had the machine stopped is charged at what the
    provider bills for a stopped machine (``StoppedPeriod.usd_per_hour``), not at the price.
    """
    return _usage(order, start=None, end=now)


def order_spent_usd(order: Order, *, now: dt.datetime) -> Decimal:
    """What the order has cost so far, over every machine it ran on (its spend cap counts against this)."""
    order = Order.objects.prefetch_related("instances", "stopped_periods").get(pk=order.pk)
    return order_usage(order, now=now).amount_usd


def month_bounds(raw: str) -> tuple[dt.datetime, dt.datetime]:
    """The UTC start of the month ``raw`` ("YYYY-MM") and of the month after; ValueError when malformed."""
    if len(raw) != 7 or raw[4] != "-":
        # strptime alone would accept "2024-1", and a month the page then names differently.
        raise ValueError(f"not a YYYY-MM month: {raw!r}")
    start = dt.datetime.strptime(raw, "%Y-%m").replace(tzinfo=dt.UTC)
    return start, (start + dt.timedelta(days=32)).replace(day=1)


def invoice_line_list(*, organization: Organization, start: dt.datetime, end: dt.datetime) -> QuerySet[InvoiceLine]:
    """The organisation's invoice lines of orders that ended in [start, end), oldest first, with their orders."""
    return InvoiceLine.objects.filter(organization=organization, ended_at__gte=start, ended_at__lt=end).select_related(
        "order"
    )


def order_usage_between(order: Order, *, start: dt.datetime, end: dt.datetime) -> Usage:
    """Like ``order_usage``, counting only the metered seconds that fall in [start, end)."""
    return _usage(order, start=start, end=end)


def live_order_costs(
    *, organization: Organization, start: dt.datetime, end: dt.datetime, now: dt.datetime
) -> list[tuple[Order, Usage]]:
    """The organisation's live orders (not yet invoiced) with what they ran up in [start, min(end, now))."""
    orders = order_list(organization=organization).filter(state__in=LIVE_STATES).order_by("created_at", "id")
    return [(o, order_usage_between(o, start=start, end=min(end, now))) for o in orders]


@dataclass(frozen=True)
class HistoryEntry:
    """One ledger entry of an order, as the order page lists it."""

    at: dt.datetime
    kind: str
    state: str
    reason: str
    entry_hash: str


def order_failed_attempts(order: Order) -> list[Attempt]:
    """The order's failed attempts, first first, each with its offer and the offer's provider account: where it
    was tried and why it failed, as the order page lists them."""
    return list(
        Attempt.objects.filter(order=order, outcome=AttemptOutcome.FAILED)
        .select_related("offer__account__provider")
        .order_by("number")
    )


def _attempt_reason(kind: str, payload: dict[str, Any], attempts: dict[int, Attempt]) -> str:
    """An attempt's ledger entry has no ``reason`` of its own: say what the entry records, with where the
    attempt was made (the ledger's fields first: they are what was signed)."""
    number = payload.get("attempt")
    attempt = attempts.get(number) if isinstance(number, int) else None
    zone = str(payload.get("zone") or (attempt.offer.zone if attempt else ""))
    where = f"attempt {number}" + (f" in {zone}" if zone else "")
    if kind == "attempt.failed":
        code = payload.get("provider_code")
        return f"{where} failed: {payload.get('error_class') or 'failed'}" + (f" ({code})" if code else "")
    if kind == "attempt.launched":
        return f"{where} launched {payload.get('instance', '')}".rstrip()
    if kind == "attempt.started":
        return f"{where}: {payload.get('instance_type', '')}".rstrip(": ")
    return ""


def order_history(order: Order) -> list[HistoryEntry]:
    """The order's ledger entries, oldest first: every state change, with its reason, as the ledger recorded it;
    an attempt's entries with where it was made and, for a failed one, why."""
    attempts = {a.number: a for a in order.attempts.all()}
    history = []
    for entry in entries_for_subject(f"order:{order.public_id}"):
        payload = json.loads(entry.payload)
        reason = str(payload.get("reason", ""))
        if not reason and entry.kind.startswith("attempt."):
            reason = _attempt_reason(entry.kind, payload, attempts)
        history.append(
            HistoryEntry(
                at=entry.created_at,
                kind=entry.kind,
                state=str(payload.get("state", "")),
                reason=reason,
                entry_hash=entry.entry_hash,
            )
        )
    return history


@dataclass(frozen=True)
class Telemetry:
    """A machine's heartbeats while it ran the order: per-minute means, oldest first, and the latest beat."""

    machine: str
    minutes: list[tuple[dt.datetime, Decimal, Decimal, Decimal]]  # (minute, utilization %, temperature C, power W)
    latest: MachineHeartbeat | LeaseHeartbeat | None
    tdp_w: int | None  # the whole machine's rated power (TDP x GPUs), when the spec table knows it
    # "lease": the lease agent on the machine; "host": an independent host's own agent; "dcgm": a Kubernetes
    # cluster's DCGM exporter
    source: str = "lease"


def order_telemetry(order: Order, *, since: dt.datetime, now: dt.datetime) -> Telemetry | None:
    """GPU telemetry of the machine running ``order`` since ``since``, from the lease agent on it, on every
    provider kind; for an independent machine whose lease sent none, from its host agent. None with no
    instance, or a cloud order placed before leases existed.

    Only heartbeats from the instance's ready report to its termination count: those after belong to whoever
    rented the machine next."""
    instance = order.instance
    if instance is None:
        return None
    start = max(since, instance.ready_at or instance.running_at or instance.launched_at)
    end = instance.terminated_at or now
    lease = Lease.objects.filter(attempt_id=instance.attempt_id).first()
    tdp = order.gpu_model.tdp_w
    beats: QuerySet[Any]
    if lease is not None and lease.heartbeats.exists():
        beats = LeaseHeartbeat.objects.filter(lease=lease, at__gte=start, at__lte=end)
        name, gpus, source = f"{instance.instance_type} {instance.provider_instance_id}", order.gpu_count, "lease"
        # A cluster's DCGM exporter measures the GPUs the pod holds, where the workload cannot write: its
        # figures are charted when it sent any (marketplace/orders/cluster_telemetry.py).
        measured = beats.filter(source="dcgm")
        beats, source = (measured, "dcgm") if measured.exists() else (beats.filter(source="agent"), source)
    elif instance.account.kind == ProviderKind.COMMUNITY:
        # One machine is one zone of its account (providers/community/adapter.py).
        machine = Machine.objects.filter(account_id=instance.account_id, name=instance.zone).first()
        if machine is None:
            return None
        beats = MachineHeartbeat.objects.filter(machine=machine, at__gte=start, at__lte=end)
        name, gpus, source = machine.name, machine.gpu_count, "host"
    elif lease is not None:
        beats = LeaseHeartbeat.objects.none()
        name, gpus, source = f"{instance.instance_type} {instance.provider_instance_id}", order.gpu_count, "lease"
    else:
        return None
    # A host's beat no GPU of the listed model could send is shown as the latest claim, flagged, but never charted
    # as fact (providers/community/plausibility.py).
    charted = beats.filter(unverified_reason="") if source == "host" else beats
    minutes = [
        (r["minute"], _tenth(r["util"]), _tenth(r["temp"]), _tenth(r["power"]))
        for r in charted.annotate(minute=TruncMinute("at"))
        .values("minute")
        .annotate(util=Avg("utilization_pct"), temp=Max("temperature_c"), power=Avg("power_w"))
        .order_by("minute")
    ]
    return Telemetry(
        machine=name,
        minutes=minutes,
        latest=beats.order_by("-at").first(),
        tdp_w=tdp * gpus if tdp else None,
        source=source,
    )


def _tenth(value: object) -> Decimal:
    return Decimal(str(value)).quantize(Decimal("0.1"))


# The most lines of the workload's output one read returns, and the default.
MAX_LOG_LINES = 1000
DEFAULT_LOG_LINES = 100


@dataclass(frozen=True)
class WorkloadLog:
    """The workload's recent output, as the lease agent's latest heartbeat carried it (``at``; None when no
    agent has sent any: an agent older than issue 36, or a machine not yet ready)."""

    lines: list[str]
    at: dt.datetime | None
    source: str  # what produced it: the host's container (docker logs) or the machine's lease agent


def order_workload_log(order: Order, *, lines: int = DEFAULT_LOG_LINES) -> WorkloadLog:
    """The last ``lines`` (1 to ``MAX_LOG_LINES``) lines of the workload's output on the order's machine, from
    the lease of its latest instance. The caller has already checked that the order is the caller's."""
    lines = max(1, min(int(lines), MAX_LOG_LINES))
    instance = order.instance
    lease = None if instance is None else Lease.objects.filter(attempt_id=instance.attempt_id).first()
    if lease is None or lease.workload_log_at is None:
        return WorkloadLog(lines=[], at=None, source="")
    community = instance is not None and instance.account.kind == ProviderKind.COMMUNITY
    source = "the lease's container on the host" if community else "the lease agent on the machine"
    return WorkloadLog(lines=lease.workload_log.splitlines()[-lines:], at=lease.workload_log_at, source=source)
