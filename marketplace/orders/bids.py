"""Interruptible rentals with bids (issue 19): an interruptible ("spot") order on an independent machine bids
per GPU-hour, at or above the machine's minimum, and pays its bid. When an order finds too few free GPUs on a
machine, it may take GPUs from running interruptible orders there that bid less than it does (an on-demand
order outranks every bid): lowest bid first, and only if that frees enough (marketplace/orders/reservations.py,
under the machine's row lock).

An outbid order is not stopped at once: it gets a notice (``preempt_at``, ``BROKER_PREEMPTION_NOTICE_S`` from
now), ledgered as ``order.preemption_notice`` and announced by the webhook of the same name. The GPUs it gives
up pass to the outbidding attempt at once, so nobody else can take them meanwhile, but that attempt launches
only once every order it outbid has left the machine (``Step.WAIT`` in provisioning): at ``preempt_at`` a
task booked with the notice (``marketplace.order_preempt``, its ETA the notice's end) stops the outbid order's
instance on its host and settles it as lost (``order_preempt``), which provisions it elsewhere when the buyer
allowed failover and fails it otherwise, then wakes the waiting order. The minute sweep does the same for any
notice whose task was lost, so a notice is late by at most a minute, never forgotten.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db.models import Max

from ledger.services import ledger_append
from marketplace.models import Attempt, GpuHold, Instance, Offer, Order, OrderState, WebhookEventType
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import instance_event_emit
from providers.community.mig import MIG_PROFILE
from providers.models import Machine
from providers.types import PricingModel

# The task that ends an outbid order's lease at its notice's end (marketplace/orders/tasks.py).
PREEMPT_TASK = "marketplace.order_preempt"


class BidBelowMinimum(Exception):
    """A bid under the machine's minimum; the message names the minimum."""


def machine_of(offer: Offer) -> Machine | None:
    """The independent machine an offer sells (its zone names it within the account), or None."""
    return Machine.objects.filter(account_id=offer.account_id, name=offer.zone).first()


def bid_resolve(*, offer: Offer, bid_per_gpu_hour: Decimal | None) -> Decimal | None:
    """The bid an order for ``offer`` carries: None unless the offer is an independent machine's interruptible
    one; else the bid asked, or the machine's minimum when none was. Raises ``BidBelowMinimum`` (naming the
    minimum) for a bid below it, and for a bid on an offer that takes none."""
    machine = machine_of(offer) if offer.pricing_model == PricingModel.SPOT else None
    if machine is None or machine.min_bid_per_gpu_hour is None:
        if bid_per_gpu_hour is not None:
            raise BidBelowMinimum(f"offer {offer.pk} is not an independent machine's interruptible offer: no bid")
        return None
    minimum = machine.min_bid_per_gpu_hour
    if bid_per_gpu_hour is None:
        return minimum
    if bid_per_gpu_hour < minimum:
        raise BidBelowMinimum(
            f"a bid of {bid_per_gpu_hour} USD per GPU-hour is below machine {machine.name}'s minimum of "
            f"{minimum} USD per GPU-hour"
        )
    return bid_per_gpu_hour


def order_bid(order: Order) -> Decimal | None:
    """The order's rank for a machine's GPUs: its bid per GPU-hour, or None for an order that is not
    interruptible (it outranks every bid). An interruptible order placed without a bid ranks at its price."""
    if order.pricing_model != PricingModel.SPOT:
        return None
    if order.bid_per_gpu_hour is not None:
        return order.bid_per_gpu_hour
    return order.price_per_hour / order.gpu_count


@dataclass(frozen=True)
class Outbid:
    order: Order
    attempt_id: int
    gpu_indexes: tuple[int, ...]  # what it holds on the machine, lowest first


def outbid_candidates(*, machine: Machine, newcomer: Order, lock: bool = True) -> list[Outbid]:
    """The running interruptible orders on ``machine`` that ``newcomer`` outranks (a strictly lower bid), not
    already under notice, lowest bid first (then oldest). With ``lock``, their rows are locked, and one that
    another transaction is moving (the buyer ending it) is skipped rather than waited for, since the machine's
    lock is held here and that transaction takes the machine's after its order's: call it then under the
    machine's row lock. Without, a plain read (a guess the reservation settles)."""
    rank = order_bid(newcomer)
    holds: dict[int, list[tuple[int, int]]] = {}
    # Whole GPUs only: a MIG slice is never outbid (it would free part of a GPU, which no whole lease can use).
    rows = GpuHold.objects.filter(machine=machine, mig_profile="").order_by("gpu_index")
    for attempt_id, order_id, index in rows.values_list("attempt_id", "attempt__order_id", "gpu_index"):
        holds.setdefault(order_id, []).append((attempt_id, index))
    orders = Order.objects.filter(
        pk__in=holds, state=OrderState.RUNNING, pricing_model=PricingModel.SPOT, preempt_at__isnull=True
    )
    if lock:
        orders = orders.select_for_update(no_key=True, skip_locked=True)
    orders = orders.exclude(pk=newcomer.pk).order_by("pk")
    found = []
    for order in orders:
        bid = order_bid(order)
        if rank is not None and (bid is None or bid >= rank):
            continue
        held = holds[order.pk]
        found.append(Outbid(order=order, attempt_id=held[0][0], gpu_indexes=tuple(i for _, i in held)))
    return sorted(found, key=lambda o: (order_bid(o.order) or Decimal(0), o.order.pk))


def outbid_possible(*, offer: Offer, order: Order) -> bool:
    """Would the GPUs free on the offer's machine, with those of the bids ``order`` outranks there, fit the
    offer? Lets the buyer's pick of a full machine go to its reservation, which outbids or refuses. A MIG
    slice's offer never outbids: False."""
    machine = None if (offer.extra or {}).get(MIG_PROFILE) else machine_of(offer)
    if machine is None:
        return False
    outranked = outbid_candidates(machine=machine, newcomer=order, lock=False)
    if not outranked:
        return False
    free = machine.gpu_count - GpuHold.objects.filter(machine=machine).values("gpu_index").distinct().count()
    return free + sum(len(o.gpu_indexes) for o in outranked) >= offer.gpu_count


def preemption_notice(*, outbid: Order, attempt: Attempt, now: dt.datetime) -> dt.datetime:
    """Give ``outbid`` its notice: ``preempt_at`` is ``BROKER_PREEMPTION_NOTICE_S`` from ``now``, when its machine
    is taken for ``attempt``; ledgered, announced, and the preemption booked for that moment once the
    reservation commits. Call inside the reservation's transaction."""
    preempt_at = now + dt.timedelta(seconds=settings.PREEMPTION_NOTICE_S)
    Order.objects.filter(pk=outbid.pk).update(preempt_at=preempt_at, preempted_for=attempt)
    enqueue_on_commit(PREEMPT_TASK, outbid.pk, eta=preempt_at)
    by = "an on-demand order" if attempt.order.pricing_model != PricingModel.SPOT else "a higher bid"
    fields = {"preempt_at": preempt_at.isoformat(), "outbid_by": by, "bid_per_gpu_hour": order_bid(outbid)}
    ledger_append(
        kind="order.preemption_notice",
        subject=f"order:{outbid.public_id}",
        payload={"order": str(outbid.public_id), "by_order": str(attempt.order.public_id), **fields},
    )
    instance = Instance.objects.filter(order=outbid, active=True).values_list("pk", flat=True).first()
    if instance is not None:
        instance_event_emit(instance_id=instance, event_type=WebhookEventType.ORDER_PREEMPTION_NOTICE, **fields)
    return preempt_at


def preemption_pending(*, attempt_id: int) -> bool:
    """Does an order this attempt outbid still run on the GPUs passed to it? Then the attempt may not launch."""
    return Instance.objects.filter(active=True, order__preempted_for_id=attempt_id).exists()


def orders_preemption_due(*, now: dt.datetime) -> list[int]:
    """Running orders whose notice is over, oldest notice first."""
    due = Order.objects.filter(state=OrderState.RUNNING, preempt_at__lte=now).order_by("preempt_at", "pk")
    return list(due.values_list("pk", flat=True))


def winning_bids(*, machine_names: list[str], account_ids: list[int]) -> dict[tuple[int, str], Decimal]:
    """The highest bid per GPU-hour among running interruptible orders on each machine, keyed by (account,
    machine name); a machine with none is absent."""
    rows = (
        Instance.objects.filter(
            active=True,
            account_id__in=account_ids,
            zone__in=machine_names,
            order__state=OrderState.RUNNING,
            order__pricing_model=PricingModel.SPOT,
            order__preempt_at__isnull=True,
            order__bid_per_gpu_hour__isnull=False,
        )
        .order_by()
        .values_list("account_id", "zone")
        .annotate(top=Max("order__bid_per_gpu_hour"))
    )
    return {(account_id, zone): top for account_id, zone, top in rows}


def offers_winning_bids(offers: list[Offer]) -> dict[int, Decimal]:
    """For each interruptible offer among ``offers`` on a machine with a running bid: that machine's winning
    bid per GPU-hour, keyed by offer id (one query for the page)."""
    spot = [o for o in offers if o.pricing_model == PricingModel.SPOT]
    if not spot:
        return {}
    top = winning_bids(machine_names=sorted({o.zone for o in spot}), account_ids=sorted({o.account_id for o in spot}))
    return {o.pk: top[(o.account_id, o.zone)] for o in spot if (o.account_id, o.zone) in top}


def offer_bidding(offer: Offer) -> dict[str, object] | None:
    """For an independent machine's interruptible offer: the winning bid per GPU-hour on its machine (None when
    nobody bids), the machine's minimum and the notice an outbid lease gets; None for any other offer."""
    machine = machine_of(offer) if offer.pricing_model == PricingModel.SPOT else None
    if machine is None or machine.min_bid_per_gpu_hour is None:
        return None
    top = winning_bids(machine_names=[machine.name], account_ids=[offer.account_id])
    return {"winning": top.get((offer.account_id, machine.name)), "minimum": machine.min_bid_per_gpu_hour,
            "machine": machine.name, "currency": "USD", "notice": settings.PREEMPTION_NOTICE_S}  # fmt: skip
