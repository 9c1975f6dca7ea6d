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
the lowest GPU indexes nobody holds (one ``GpuHold`` each, unique per machine and index, with its 8 memory
slices as ``GpuSlot`` rows, so even code that skipped the lock could not hand a GPU out twice), and sets every
offer of the machine's ``reserved`` to the leases of its size that no longer fit in the GPUs left. The
attempt's ``reserved`` then counts GPUs. Release deletes the holds under the same lock and recomputes the
offers. Lock order: attempt, machine, offers by id.

A MIG slice's offer (``extra[MIG_PROFILE]``, providers/community/mig.py) is held as one slice of one GPU: a
``GpuHold`` naming the profile, at the lowest of NVIDIA's placements for it whose memory slices are free, on
the fullest GPU already partly sliced where it fits, else on the lowest GPU nothing is held on (slices pack,
so whole GPUs stay free for whole leases). Every hold writes the memory slices it covers as ``GpuSlot`` rows,
unique per GPU: a whole GPU's hold covers all eight, so a whole lease never gets a sliced GPU nor a slice a
GPU held whole, and two slices never overlap, even past the lock. The attempt's ``reserved`` is then 1, and
the machine's slice offers reserve what their profile can no longer fit.

A Kubernetes seller's node is a pool of the same kind (``providers.ClusterNode``): per extended resource
(whole GPUs, each MIG profile of the mixed strategy, time-sliced shares), the units the last sync saw free of
pods the broker did not place. A reservation locks the node's row, counts the units its ``NodeHold`` rows already
hold, takes the offer's units only when they fit, and sets every offer of the node's ``reserved`` to the leases
of its size the units left can no longer hold. The device plugin picks the GPU, so holds count units.

When too few GPUs are free, an order may outbid running interruptible orders on the machine
(marketplace/orders/bids.py): lowest bid first, only when that frees enough. Their holds pass to the attempt at
once (it waits to launch until their notice is over); holds beyond what it needs stay with the outbid order
until it leaves the machine. An outbid attempt's ``reserved`` is left as it was (its row is not locked here,
which keeps the lock order): releasing it later finds fewer or no holds and gives back only those. Slices are
never outbid, nor outbid others: only whole GPUs change hands (marketplace/orders/bids.py).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marketplace.models import Attempt, GpuHold, GpuSlot, NodeHold, Offer, Order
from marketplace.orders.bids import Outbid, outbid_candidates, preemption_notice
from providers.community.mig import MIG_PROFILE, MigProfile, mig_place, mig_profile
from providers.models import ClusterNode, Machine, ProviderKind
from providers.types import NODE_RESOURCE, NODE_UNITS_FREE, OfferQuote


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


def _occupancy(machine: Machine) -> dict[int, set[int]]:
    """GPU index -> the memory slices held on it (all of them for a GPU held whole), from the machine's holds."""
    taken: dict[int, set[int]] = {}
    rows = GpuHold.objects.filter(machine=machine).values_list("gpu_index", "slot", "memory_slices")
    for index, slot, size in rows:
        taken.setdefault(index, set()).update(range(slot, slot + size))
    return taken


def _slice_profile(machine: Machine, offer: Offer) -> tuple[bool, MigProfile | None]:
    """(is the offer a MIG slice, its profile on the machine's GPUs: None when they have no such profile)."""
    name = (offer.extra or {}).get(MIG_PROFILE)
    if not name:
        return False, None
    return True, mig_profile(machine.gpu_model, str(name))


def _machine_offers_recount(machine: Machine) -> None:
    """Each of the machine's finite offers reserves what the holds leave out of its capacity: a whole-GPU
    offer, the leases of its size that no longer fit in the GPUs nothing is held on; a slice offer, the
    slices of its profile that no longer fit beside the slices held (none fit on a GPU held whole)."""
    taken = _occupancy(machine)
    gpus = range(machine.gpu_count)
    free = sum(1 for index in gpus if not taken.get(index))
    offers = list(_listing_offers_of(machine.account_id, machine.name).select_for_update(no_key=True).order_by("id"))
    for offer in offers:
        assert offer.capacity is not None  # the queryset keeps finite offers only
        is_slice, profile = _slice_profile(machine, offer)
        if not is_slice:
            fit = free // offer.gpu_count
        else:
            fit = 0 if profile is None else sum(profile.fits(taken.get(index, set())) for index in gpus)
        left = min(offer.capacity, fit)
        if offer.reserved != offer.capacity - left:
            Offer.objects.filter(pk=offer.pk).update(reserved=offer.capacity - left)


def machine_offers_recount(*, account_id: int) -> None:
    """Recount every independent machine's finite offers of the account from its holds, each under its
    machine's row lock: an offer first listed while GPUs were held (a new lease size, a new MIG profile) starts
    with them counted, not with all its capacity free."""
    for machine_id in Machine.objects.filter(account_id=account_id).order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            _machine_offers_recount(Machine.objects.select_for_update().get(pk=machine_id))


def _slots_write(holds: list[GpuHold]) -> None:
    """The memory slices each hold covers, as rows the database keeps unique per GPU."""
    GpuSlot.objects.bulk_create(
        GpuSlot(hold=hold, machine_id=hold.machine_id, gpu_index=hold.gpu_index, slot=slot)
        for hold in holds
        for slot in range(hold.slot, hold.slot + hold.memory_slices)
    )


def _slice_take(attempt: Attempt, machine: Machine, name: str) -> bool:
    """Hold one ``name`` slice for the attempt under the machine's lock; False when none fits (a slice never
    outbids: only whole GPUs change hands)."""
    profile = mig_profile(machine.gpu_model, name)
    if profile is None:
        return False  # the listing no longer offers it (or another GPU model): its offer goes at the next sync
    placed = mig_place(_occupancy(machine), profile, machine.gpu_count)
    if placed is None:
        return False
    index, start = placed
    hold = GpuHold.objects.create(
        machine=machine, gpu_index=index, attempt=attempt, mig_profile=profile.name, slot=start,
        memory_slices=profile.memory_slices, compute_slices=profile.compute_slices,
    )  # fmt: skip
    _slots_write([hold])
    return True


def _gpus_take(attempt: Attempt, machine_id: int) -> bool:
    with transaction.atomic():
        # The machine's row lock serialises every hold and release on it: the free indexes read here stay
        # free until this transaction ends.
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        name = (attempt.offer.extra or {}).get(MIG_PROFILE)
        if name:
            if not _slice_take(attempt, machine, str(name)):
                return False
            wanted = 1
        else:
            taken = _occupancy(machine)
            free = [index for index in range(machine.gpu_count) if not taken.get(index)]
            wanted = attempt.offer.gpu_count
            outbid: list[Outbid] = []
            if len(free) < wanted:
                outbid = _outbid_enough(machine, attempt, wanted - len(free))
                if not outbid:
                    return False
            mine = free[:wanted]
            _slots_write(
                GpuHold.objects.bulk_create(GpuHold(machine=machine, gpu_index=i, attempt=attempt) for i in mine)
            )
            now = timezone.now()
            for loser in outbid:
                passed = loser.gpu_indexes[: wanted - len(mine)]
                # Whole GPUs only, with their memory slices (which follow the hold).
                GpuHold.objects.filter(machine=machine, gpu_index__in=passed, mig_profile="").update(attempt=attempt)
                mine.extend(passed)
                preemption_notice(outbid=loser.order, attempt=attempt, now=now)
        _machine_offers_recount(machine)
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
    GpuHold.objects.filter(attempt=attempt).delete()  # and, with them, their memory slices
    _machine_offers_recount(machine)


def _node_id(offer: Offer) -> int | None:
    """The Kubernetes node an offer sells units of (its zone names it within the account), or None."""
    if not (offer.extra or {}).get(NODE_RESOURCE):
        return None
    return ClusterNode.objects.filter(account_id=offer.account_id, name=offer.zone).values_list("pk", flat=True).first()


def _node_held(node: ClusterNode) -> dict[str, int]:
    held: dict[str, int] = {}
    for resource, units in NodeHold.objects.filter(node=node).values_list("resource", "units"):
        held[resource] = held.get(resource, 0) + units
    return held


def _node_offers_recount(node: ClusterNode) -> None:
    """Each of the node's finite offers reserves the leases of its size that the units left of its resource
    can no longer hold."""
    held = _node_held(node)
    offers = list(_listing_offers_of(node.account_id, node.name).select_for_update(no_key=True).order_by("id"))
    for offer in offers:
        assert offer.capacity is not None  # the queryset keeps finite offers only
        resource = str((offer.extra or {}).get(NODE_RESOURCE, ""))
        left = max(0, int(node.units.get(resource, 0)) - held.get(resource, 0))
        fit = min(offer.capacity, left // max(1, offer.gpu_count))
        if offer.reserved != offer.capacity - fit:
            Offer.objects.filter(pk=offer.pk).update(reserved=offer.capacity - fit)


def _node_take(attempt: Attempt, node_id: int) -> bool:
    resource = str((attempt.offer.extra or {}).get(NODE_RESOURCE, ""))
    wanted = attempt.offer.gpu_count
    with transaction.atomic():
        # The node's row lock serialises every hold and release on it: what is free here stays free until
        # this transaction ends.
        node = ClusterNode.objects.select_for_update().get(pk=node_id)
        if int(node.units.get(resource, 0)) - _node_held(node).get(resource, 0) < wanted:
            return False
        NodeHold.objects.create(node=node, attempt=attempt, resource=resource, units=wanted)
        _node_offers_recount(node)
    Attempt.objects.filter(pk=attempt.pk).update(reserved=wanted)
    attempt.reserved = wanted
    return True


def _node_release(attempt: Attempt) -> bool:
    """Delete the attempt's hold on a Kubernetes node under the node's lock; False when it holds none."""
    node_id = NodeHold.objects.filter(attempt=attempt).values_list("node_id", flat=True).first()
    if node_id is None:
        return False
    node = ClusterNode.objects.select_for_update().get(pk=node_id)
    NodeHold.objects.filter(attempt=attempt).delete()
    _node_offers_recount(node)
    return True


def cluster_nodes_refresh(*, account_id: int, quotes: list[OfferQuote], now: Any) -> None:
    """Record what a Kubernetes account's sync saw free on each node (the quotes' ``NODE_UNITS_FREE`` per
    ``NODE_RESOURCE``) and recount each node's offers from its holds, each node under its own row lock. A node
    absent from the sync (cordoned, NotReady, removed) keeps its row with no units: its holds stay, nothing
    more is placed there."""
    seen: dict[str, dict[str, int]] = {}
    for quote in quotes:
        resource, free = quote.extra.get(NODE_RESOURCE), quote.extra.get(NODE_UNITS_FREE)
        if isinstance(resource, str) and isinstance(free, int) and not isinstance(free, bool) and free >= 0:
            seen.setdefault(quote.zone, {})[resource] = free
    known = set(ClusterNode.objects.filter(account_id=account_id).values_list("name", flat=True))
    ClusterNode.objects.bulk_create(
        [ClusterNode(account_id=account_id, name=name) for name in sorted(seen.keys() - known)],
        ignore_conflicts=True,
    )
    for node_id in ClusterNode.objects.filter(account_id=account_id).order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            node = ClusterNode.objects.select_for_update().get(pk=node_id)
            node.units = seen.get(node.name, {})
            node.synced_at = now
            node.save(update_fields=["units", "synced_at"])
            _node_offers_recount(node)


def gpu_indexes_held(*, attempt_id: int) -> tuple[int, ...]:
    """The GPU indexes the attempt holds on an independent machine, lowest first (empty elsewhere); for a MIG
    slice, the one GPU it is a slice of."""
    return tuple(
        GpuHold.objects.filter(attempt_id=attempt_id).order_by("gpu_index").values_list("gpu_index", flat=True)
    )


def reservation_take(*, attempt: Attempt) -> bool:
    """Hold the attempt's units on its listing: on an independent machine, its offer's GPU count in GPU
    indexes, or for a MIG slice's offer one slice of one GPU. True when held (or the offer is unlimited),
    False when the listing has too few units (GPUs, or room for the slice) left, with nothing held. Call
    inside the transaction that opens the attempt."""
    offer = attempt.offer
    if offer.capacity is None:
        return True
    if offer.account.kind == ProviderKind.KUBERNETES:
        node_id = _node_id(offer)
        # A node the broker has no pool for (its sync has not recorded it yet) has nothing to place on.
        return node_id is not None and _node_take(attempt, node_id)
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
        if _node_release(attempt):
            return units
        machine_id = _machine_id(attempt.offer)
        if machine_id is not None:
            # Outbid: every GPU it held passed to the attempt that outbid it. The offers are recounted from the
            # holds all the same, which also settles a reservation counted before GPUs were held one by one.
            machine = Machine.objects.select_for_update().get(pk=machine_id)
            _machine_offers_recount(machine)
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
