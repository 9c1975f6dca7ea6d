"""Reads of fleets: the organisation's fleets, one by id, the fleet a metrics token opens, its decisions, its
replicas over time and what it has cost. The API, the storefront page and the CLI read through these."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import QuerySet

from marketplace.models import Fleet, FleetDecision, Order, OrderState, Organization
from marketplace.orders.selectors import order_usage

# Replicas that are there but not (yet) serving: ordered and not running yet.
STARTING_STATES = (OrderState.PLACED, OrderState.PROVISIONING)
# Replicas that hold their place: running, or stopped by the buyer by hand (the fleet leaves those alone).
HELD_STATES = (OrderState.RUNNING, OrderState.STOPPING, OrderState.STOPPED, OrderState.STARTING)
LIVE_STATES = STARTING_STATES + HELD_STATES


def fleet_list(*, organization: Organization) -> QuerySet[Fleet]:
    return Fleet.objects.filter(organization=organization).select_related("launch_config")


def fleet_get(*, organization: Organization, public_id: str) -> Fleet | None:
    """The fleet if it is ``organization``'s; None otherwise (a stranger learns nothing)."""
    try:
        uuid.UUID(str(public_id))
    except ValueError:
        return None
    return fleet_list(organization=organization).filter(public_id=public_id).first()


def fleet_for_metrics_token(*, public_id: str, raw_token: str) -> Fleet | None:
    """The fleet ``raw_token`` is the metrics token of, if it is the fleet ``public_id``; None otherwise, so a
    token opens its own fleet's /metrics and nothing else."""
    try:
        uuid.UUID(str(public_id))
    except ValueError:
        return None
    fleet = Fleet.objects.filter(public_id=public_id).first()
    if fleet is None:
        return None
    digest = hashlib.sha256(raw_token.encode()).hexdigest()
    return fleet if hmac.compare_digest(digest, fleet.metrics_token_hash) else None


def fleet_decisions(*, fleet: Fleet) -> QuerySet[FleetDecision]:
    """The fleet's decisions, newest first: each with its action, reason, the orders placed and ended."""
    return FleetDecision.objects.filter(fleet=fleet).order_by("-at", "-id")


def fleet_replicas(*, fleet: Fleet, live: bool = False) -> QuerySet[Order]:
    """Every order the fleet placed (``live``: only those not ended), newest first."""
    orders = Order.objects.filter(fleet=fleet).select_related("gpu_model", "offer__account")
    if live:
        orders = orders.filter(state__in=LIVE_STATES)
    return orders.order_by("-created_at", "-id")


def fleet_price_per_hour(fleet: Fleet) -> Decimal:
    """What the fleet's live replicas cost per hour together (USD)."""
    prices = Order.objects.filter(fleet=fleet, state__in=LIVE_STATES).values_list("price_per_hour", flat=True)
    return sum(prices, Decimal(0))


@dataclass(frozen=True)
class FleetCost:
    """What the fleet has cost and costs now, in USD; ``budget_left`` None when it has no budget."""

    spent_usd: Decimal
    price_per_hour: Decimal
    budget_usd: Decimal | None
    budget_left: Decimal | None


def fleets_spent_usd(*, fleet_ids: Iterable[int], now: dt.datetime) -> dict[int, Decimal]:
    """What every replica each fleet ever had has cost so far (USD, at their locked prices), in three queries
    whatever the number of fleets and replicas; a fleet without replicas is absent."""
    ids = list(fleet_ids)
    spent: dict[int, Decimal] = {}
    if not ids:
        return spent
    for order in Order.objects.filter(fleet_id__in=ids).prefetch_related("instances", "stopped_periods"):
        assert order.fleet_id is not None
        spent[order.fleet_id] = spent.get(order.fleet_id, Decimal(0)) + order_usage(order, now=now).amount_usd
    return spent


def fleet_spent_usd(*, fleet: Fleet, now: dt.datetime) -> Decimal:
    """What every replica the fleet ever had has cost so far (USD, at their locked prices)."""
    return fleets_spent_usd(fleet_ids=[fleet.pk], now=now).get(fleet.pk, Decimal(0))


def fleet_cost(*, fleet: Fleet, now: dt.datetime) -> FleetCost:
    spent = fleet_spent_usd(fleet=fleet, now=now)
    left = None if fleet.budget_usd is None else fleet.budget_usd - spent
    return FleetCost(
        spent_usd=spent, price_per_hour=fleet_price_per_hour(fleet), budget_usd=fleet.budget_usd, budget_left=left
    )


@dataclass(frozen=True)
class SeriesPoint:
    """From ``at`` on, ``replicas`` orders of the fleet were live, and the fleet wanted ``desired``."""

    at: dt.datetime
    replicas: int
    desired: int


def fleet_replica_series(*, fleet: Fleet, now: dt.datetime) -> list[SeriesPoint]:
    """The fleet's replicas over time, a step series from its creation to ``now``: a point wherever a replica
    was placed or ended or a decision changed what the fleet wanted. A replica counts from its placement to its
    final state (terminated, failed, cancelled)."""
    changes: list[tuple[dt.datetime, int, int | None]] = [(fleet.created_at, 0, None)]
    for created, state, changed in Order.objects.filter(fleet=fleet).values_list(
        "created_at", "state", "state_changed_at"
    ):
        changes.append((created, +1, None))
        if state in Order.FINAL_STATES:
            changes.append((max(changed, created), -1, None))
    for at, desired in FleetDecision.objects.filter(fleet=fleet).values_list("at", "desired"):
        changes.append((at, 0, desired))
    changes.sort(key=lambda c: c[0])
    points: list[SeriesPoint] = []
    replicas = desired = 0
    for at, delta, wanted in changes:
        if at > now:
            break
        replicas += delta
        desired = desired if wanted is None else wanted
        if points and points[-1].at == at:
            points[-1] = SeriesPoint(at=at, replicas=replicas, desired=desired)
        else:
            points.append(SeriesPoint(at=at, replicas=replicas, desired=desired))
    return points
