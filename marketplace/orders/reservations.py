"""Finite listings: an attempt holds units of its offer's ``capacity`` from before the launch until the order
ends, so concurrent orders for the last units never oversell.

A cloud's offer has no capacity (None): the cloud keeps its own stock and answers a launch with a capacity
error. A listing with a capacity (an independent provider's machines) is reserved with one conditional
``UPDATE ... SET reserved = reserved + n WHERE reserved + n <= capacity``: PostgreSQL re-checks the condition
on the row's newest version after waiting for a concurrent writer, so two transactions can never both take
the last unit. The ``offer_reserved_within_capacity`` check constraint backs that up in the schema.

One listing can be sold several ways (an independent machine on demand and interruptible): its offers in
the same zone of the same account share the units, so a reservation takes them on every such offer, locked
in id order so two reservations never wait on each other, or on none. The locks are FOR NO KEY UPDATE, like
the UPDATE's own: an order or attempt row being inserted with a foreign key to the offer does not wait.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from marketplace.models import Attempt, Offer, Order


def units_for(offer: Offer, order: Order) -> int:
    """What one order takes of ``offer.capacity``: one instance. (A listing sold per GPU will count GPUs.)"""
    return 1


class _ListingFull(Exception):
    pass


def _listing_offers(offer: Offer) -> Any:
    return Offer.objects.filter(account_id=offer.account_id, zone=offer.zone, capacity__isnull=False)


def reservation_take(*, attempt: Attempt) -> bool:
    """Hold the attempt's units on its listing. True when held (or the offer is unlimited), False when the
    listing has too few units left. Call inside the transaction that opens the attempt."""
    offer = attempt.offer
    if offer.capacity is None:
        return True
    units = units_for(offer, attempt.order)
    try:
        with transaction.atomic():
            siblings = list(
                _listing_offers(offer).select_for_update(no_key=True).order_by("id").values_list("id", flat=True)
            )
            taken = Offer.objects.filter(pk__in=siblings, reserved__lte=F("capacity") - units).update(
                reserved=F("reserved") + units
            )
            if taken != len(siblings):
                raise _ListingFull
    except _ListingFull:
        return False
    Attempt.objects.filter(pk=attempt.pk).update(reserved=units)
    attempt.reserved = units
    return True


def reservation_release(*, attempt_id: int) -> int:
    """Give the attempt's units back to its offer; returns how many. Idempotent: the attempt's own counter is
    cleared under a row lock in the same transaction, so a second call (a redelivered task) releases nothing."""
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().filter(pk=attempt_id, reserved__gt=0).first()
        if attempt is None:
            return 0
        units = attempt.reserved
        Attempt.objects.filter(pk=attempt.pk).update(reserved=0)
        offer = Offer.objects.get(pk=attempt.offer_id)
        siblings = list(
            _listing_offers(offer).select_for_update(no_key=True).order_by("id").values_list("id", flat=True)
        )
        # An offer listed after the reservation never held these units: leave it at zero.
        Offer.objects.filter(pk__in=siblings, reserved__gte=units).update(reserved=F("reserved") - units)
        return units


def reservations_release_for_order(*, order_id: int) -> int:
    """Release every unit the order's attempts still hold (the order reached a final state)."""
    held = Attempt.objects.filter(order_id=order_id, reserved__gt=0).values_list("pk", flat=True)
    return sum(reservation_release(attempt_id=pk) for pk in list(held))
