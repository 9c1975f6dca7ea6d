"""Reads of orders, always scoped to the caller's organisation."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from ledger.selectors import latest_hashes
from marketplace.models import Membership, Order, Organization, OrganizationKind


def buyer_organization(user: AbstractBaseUser | AnonymousUser) -> Organization | None:
    """The buyer organisation the user acts for (the first one they belong to)."""
    if not user.is_authenticated:
        return None
    membership = (
        Membership.objects.select_related("organization")
        .filter(user=user, organization__kind=OrganizationKind.BUYER)
        .order_by("pk")
        .first()
    )
    return None if membership is None else membership.organization


def order_list(*, organization: Organization) -> QuerySet[Order]:
    return (
        Order.objects.filter(organization=organization)
        .select_related("gpu_model", "offer")
        .prefetch_related("attempts__offer", "instances")
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
    """What an order has used: seconds its instances ran, and what that costs at the order's locked price."""

    seconds: int
    amount_usd: Decimal


def order_usage(order: Order, *, now: dt.datetime) -> Usage:
    """Per-second metering from each instance's running to its termination (or ``now`` while it runs).

    An instance that failed before running costs nothing; the price is the one locked on the order.
    """
    seconds = 0
    for instance in order.instances.all():
        if instance.running_at is None:
            continue
        end = instance.terminated_at or (now if instance.active else instance.running_at)
        seconds += max(0, int((end - instance.running_at).total_seconds()))
    amount = (order.price_per_hour * seconds / 3600).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
    return Usage(seconds=seconds, amount_usd=amount)
