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

An independent provider's machine is held GPU by GPU instead: the reservation locks the machine's row, takes
the lowest GPU indexes nobody holds (one ``GpuHold`` each, unique per machine and index, so even code that
skipped the lock could not hand a GPU out twice), and sets every offer of the machine's ``reserved`` to the
leases of its size that no longer fit in the GPUs left. The attempt's ``reserved`` then counts GPUs. Release
deletes the holds under the same lock and recomputes the offers. Lock order: attempt, machine, offers by id.

When too few GPUs are free, an order may outbid running interruptible orders on the machine
(marketplace/orders/bids.py): lowest bid first, only when that frees enough. Their holds pass to the attempt at
once (it waits to launch until their notice is over); holds beyond what it needs stay with the outbid order
until it leaves the machine. An outbid attempt's ``reserved`` is left as it was (its row is not locked here,
which keeps the lock order): releasing it later finds fewer or no holds and gives back only those.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marketplace.models import Attempt, GpuHold, Offer, Order
from marketplace.orders.bids import Outbid, outbid_candidates, preemption_notice
from providers.models import Machine


def units_for(offer: Offer, order: Order) -> int:
    """What one order takes of ``offer.capacity`` on a listing that is not a machine's GPUs: one instance."""
    return 1


class _ListingFull(Exception):
    pass


def _listing_offers(offer: Offer) -> Any:
    return _listing_offers_of(offer.account_id, offer.zone)


def _listing_offers_of(account_id: int, zone: str) -> Any:
    return Offer.objects.filter(account_id=account_id, zone=zone, capacity__isnull=False)


def _machine_id(offer: Offer) -> int | None:
    """The independent machine an offer sells (its zone names it within the account), or None."""
    return Machine.objects.filter(account_id=offer.account_id, name=offer.zone).values_list("pk", flat=True).first()


def _machine_offers_recount(machine: Machine, free: int) -> None:
    """Each of the machine's finite offers reserves what ``free`` GPUs leave out of its capacity."""
    offers = list(_listing_offers_of(machine.account_id, machine.name).select_for_update(no_key=True).order_by("id"))
    for offer in offers:
        assert offer.capacity is not None  # the queryset keeps finite offers only
        left = min(offer.capacity, free // offer.gpu_count)
        if offer.reserved != offer.capacity - left:
            Offer.objects.filter(pk=offer.pk).update(reserved=offer.capacity - left)


def _gpus_take(attempt: Attempt, machine_id: int) -> bool:
    with transaction.atomic():
        # The machine's row lock serialises every hold and release on it: the free indexes read here stay
        # free until this transaction ends.
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        held = set(GpuHold.objects.filter(machine=machine).values_list("gpu_index", flat=True))
        free = [index for index in range(machine.gpu_count) if index not in held]
        wanted = attempt.offer.gpu_count
        outbid: list[Outbid] = []
        if len(free) < wanted:
            outbid = _outbid_enough(machine, attempt, wanted - len(free))
            if not outbid:
                return False
        mine = free[:wanted]
        GpuHold.objects.bulk_create(GpuHold(machine=machine, gpu_index=i, attempt=attempt) for i in mine)
        now = timezone.now()
        for loser in outbid:
            passed = loser.gpu_indexes[: wanted - len(mine)]
            GpuHold.objects.filter(machine=machine, gpu_index__in=passed).update(attempt=attempt)
            mine.extend(passed)
            preemption_notice(outbid=loser.order, attempt=attempt, now=now)
        _machine_offers_recount(machine, len(free) - min(len(free), wanted))
    Attempt.objects.filter(pk=attempt.pk).update(reserved=wanted)
    attempt.reserved = wanted
    return True


def _outbid_enough(machine: Machine, attempt: Attempt, short: int) -> list[Outbid]:
    """The fewest lowest bids on the machine whose GPUs make up ``short``; empty when all of them cannot."""
    chosen: list[Outbid] = []
    freed = 0
    for candidate in outbid_candidates(machine=machine, newcomer=attempt.order):
        if freed >= short:
            break
        chosen.append(candidate)
        freed += len(candidate.gpu_indexes)
    return chosen if freed >= short else []


def _gpus_release(attempt: Attempt) -> None:
    machine_id = GpuHold.objects.filter(attempt=attempt).values_list("machine_id", flat=True).first()
    if machine_id is None:
        return
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    GpuHold.objects.filter(attempt=attempt).delete()
    held = GpuHold.objects.filter(machine=machine).count()
    _machine_offers_recount(machine, machine.gpu_count - held)


def gpu_indexes_held(*, attempt_id: int) -> tuple[int, ...]:
    """The GPU indexes the attempt holds on an independent machine, lowest first (empty elsewhere)."""
    return tuple(
        GpuHold.objects.filter(attempt_id=attempt_id).order_by("gpu_index").values_list("gpu_index", flat=True)
    )


def reservation_take(*, attempt: Attempt) -> bool:
    """Hold the attempt's units on its listing: on an independent machine, its offer's GPU count in GPU
    indexes. True when held (or the offer is unlimited), False when the listing has too few units (GPUs)
    left, with nothing held. Call inside the transaction that opens the attempt."""
    offer = attempt.offer
    if offer.capacity is None:
        return True
    machine_id = _machine_id(offer)
    if machine_id is not None:
        return _gpus_take(attempt, machine_id)
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
        if GpuHold.objects.filter(attempt=attempt).exists():
            _gpus_release(attempt)
            return units
        machine_id = _machine_id(attempt.offer)
        if machine_id is not None:
            # Outbid: every GPU it held passed to the attempt that outbid it. The offers are recounted from the
            # holds all the same, which also settles a reservation counted before GPUs were held one by one.
            machine = Machine.objects.select_for_update().get(pk=machine_id)
            _machine_offers_recount(machine, machine.gpu_count - GpuHold.objects.filter(machine=machine).count())
            return units
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
