"""Credits paid, not promised (issue 38, part 4): an order below its SLA over a period earns its buyer the
credit its offer states, posted to the book from the seller's payable in the transaction that records the
judgment, with a ledger entry carrying every measurement it was computed from.

A period is a calendar month (UTC), or the part of it up to the order's end: ``sla_credit_settle`` runs when
the order ends (``reactions.sla_credit_at_end``, after its charge) and, for every order that ran in a month,
once that month is over (``sla_month_close``). Each (order, period start) is judged once, a unique constraint:
the second judge, concurrent or later, gets the first one's row and posts nothing.

The credit is the tier's percent of what the period's compute costs the buyer (metered seconds at the locked
price, the stopped machine's storage left out), rounded once by the book's rule (``marketplace.money``), and
moves from the seller's provider payable (the house's for capacity the broker sells itself, the account the
charge paid) to the buyer's credit. The clouds' own SLA credits are the seller's to claim from its cloud.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.billing.book import Line, book_account, book_post
from marketplace.billing.credit import CURRENCY, minor, order_seller
from marketplace.models import BookAccountKind, Order, OrderState, Organization, Outage, SlaCredit
from marketplace.orders.selectors import order_usage_between
from marketplace.sla.availability import Measured, availability
from marketplace.sla.published import Tier, credit_tier, tiers_from_json
from marketplace.taskkit import enqueue

log = logging.getLogger(__name__)

SLA_CREDIT = "sla.credit"  # the book entry's kind (invoices read it as a credit line)


@dataclass(frozen=True)
class Judged:
    """An order's SLA over a window, before any money moves."""

    committed_pct: Decimal
    tiers: tuple[Tier, ...]
    window_start: dt.datetime
    window_end: dt.datetime
    measured: Measured
    outages: list[Outage]


def month_start(at: dt.datetime) -> dt.datetime:
    """The UTC start of ``at``'s month."""
    at = at.astimezone(dt.UTC)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(start: dt.datetime) -> dt.datetime:
    return (start + dt.timedelta(days=32)).replace(day=1)


def order_ended_at(order: Order) -> dt.datetime | None:
    return order.state_changed_at if order.state in Order.FINAL_STATES else None


def sla_judge(
    order: Order, *, period_start: dt.datetime, period_end: dt.datetime, require_sla: bool = True
) -> Judged | None:
    """Measure the order's availability over [period_start, period_end): its service window runs from its first
    machine's ready report to its end, inside the period. None when its offer states no SLA (spot; unless
    ``require_sla`` is False, for reliability) or nothing ran in the period."""
    offer = order.offer
    if offer.sla_availability is None and require_sla:
        return None
    readies = [i.ready_at for i in order.instances.all() if i.ready_at is not None]
    first_ready = min(readies) if readies else None
    if first_ready is None:
        return None
    start = max(period_start, first_ready)
    ended = order_ended_at(order)
    end = min(period_end, ended) if ended is not None else period_end
    if end <= start:
        return None
    # Read through the relation so a caller measuring many orders prefetches them once.
    outages = sorted(
        (o for o in order.outages.all() if o.started_at < end and (o.ended_at is None or o.ended_at > start)),
        key=lambda o: (o.started_at, o.pk),
    )
    stopped = [(p.started_at, p.ended_at) for p in order.stopped_periods.all()]
    measured = availability(
        window_start=start,
        window_end=end,
        outages=[(o.started_at, o.ended_at) for o in outages],
        stopped=stopped,
    )
    committed = offer.sla_availability if offer.sla_availability is not None else Decimal(0)
    return Judged(committed, tiers_from_json(offer.sla_credits), start, end, measured, outages)


def _period_key(order: Order, period_start: dt.datetime) -> str:
    return f"order:{order.pk}:sla:{period_start.astimezone(dt.UTC):%Y%m%dT%H%M%S}"


def sla_credit_settle(
    *, order: Order, period_start: dt.datetime, period_end: dt.datetime, now: dt.datetime
) -> SlaCredit | None:
    """Judge the order's SLA over [period_start, period_end) and pay the credit owed, once per (order, period
    start). Returns the period's record (the earlier one when it was judged before), or None when there is
    nothing to judge (no SLA, nothing ran). Below the SLA, in one transaction: the record, the ``sla.credit``
    book entry (seller's payable to the buyer's credit) and the ``sla.credited`` ledger entry with the
    measurements. At or above it, only the record (amount 0): judged, nothing owed."""
    order = (
        Order.objects.select_related("offer")
        .prefetch_related("instances", "stopped_periods", "outages")
        .get(pk=order.pk)
    )
    existing = SlaCredit.objects.filter(order=order, period_start=period_start).first()
    if existing is not None:
        return existing
    judged = sla_judge(order, period_start=period_start, period_end=period_end)
    if judged is None:
        return None
    measured_pct = judged.measured.availability_pct
    tier = credit_tier(judged.tiers, measured_pct)
    usage = order_usage_between(order, start=period_start, end=min(period_end, now))
    compute_usd = usage.amount_usd - usage.stopped_usd
    charge = minor(compute_usd)
    amount = minor(compute_usd * tier.credit_pct / 100) if tier is not None else 0
    try:
        with transaction.atomic():
            record = SlaCredit.objects.create(
                order=order,
                period_start=period_start,
                period_end=judged.window_end,
                committed_pct=judged.committed_pct,
                measured_pct=measured_pct,
                measured_seconds=judged.measured.measured_seconds,
                down_seconds=judged.measured.down_seconds,
                # At the column's scale, so the ledgered figure reads as the stored one.
                tier_pct=(tier.credit_pct if tier is not None else Decimal(0)).quantize(Decimal("0.01")),
                charge_minor=charge,
                amount_minor=amount,
                currency=CURRENCY,
                created_at=now,
            )
            if amount > 0:
                record.entry = _credit_post(order, record, now=now)
                record.save(update_fields=["entry"])
                ledger_append(
                    kind="sla.credited",
                    subject=f"order:{order.public_id}",
                    payload=_receipt(order, record, judged),
                )
    except IntegrityError:  # judged meanwhile by another run: its record stands, nothing more is posted
        return SlaCredit.objects.get(order=order, period_start=period_start)
    return record


def _credit_post(order: Order, record: SlaCredit, *, now: dt.datetime) -> object:
    buyer = Organization.objects.get(pk=order.organization_id)
    seller = order_seller(order)
    payable = book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency=CURRENCY, organization=seller)
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency=CURRENCY, organization=buyer)
    return book_post(
        kind=SLA_CREDIT,
        key=_period_key(order, record.period_start),
        lines=[Line(payable, record.amount_minor), Line(credit, -record.amount_minor)],
        memo=(
            f"SLA credit {record.tier_pct.normalize():f}%: measured {record.measured_pct}% "
            f"against {record.committed_pct.normalize():f}% committed"
        ),
        order=order,
        now=now,
    )


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.astimezone(dt.UTC).isoformat(timespec="seconds")


def _receipt(order: Order, record: SlaCredit, judged: Judged) -> dict[str, object]:
    """The ledger entry's payload: everything the credit was computed from, so a receipt proves it."""
    return {
        "order": str(order.public_id),
        "organization": order.organization_id,
        "period_start": _iso(record.period_start),
        "window": [_iso(judged.window_start), _iso(judged.window_end)],
        "committed_pct": format(record.committed_pct, "f"),
        "measured_pct": format(record.measured_pct, "f"),
        "measured_seconds": record.measured_seconds,
        "down_seconds": record.down_seconds,
        "outages": [
            {"cause": o.cause, "started_at": _iso(o.started_at), "ended_at": _iso(o.ended_at)} for o in judged.outages
        ],
        "tier_pct": format(record.tier_pct, "f"),
        "charge_minor": record.charge_minor,
        "amount_minor": record.amount_minor,
        "currency": record.currency,
    }


def sla_credit_at_order_end(*, order: Order, now: dt.datetime) -> SlaCredit | None:
    """The order ended at ``now``: judge the month so far (from the month's start, or its first machine)."""
    return sla_credit_settle(order=order, period_start=month_start(now), period_end=now, now=now)


def orders_to_judge(*, period_start: dt.datetime, period_end: dt.datetime) -> list[int]:
    """Orders with an SLA that ran during the period: a machine ready before its end, and not ended before its
    start; those judged already are left out."""
    return list(
        Order.objects.filter(offer__sla_availability__isnull=False, instances__ready_at__lt=period_end)
        .exclude(state__in=Order.FINAL_STATES, state_changed_at__lt=period_start)
        .exclude(sla_credits__period_start=period_start)
        .exclude(state__in=[OrderState.PLACED])
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )


@dataclass
class MonthClosed:
    """What one ``sla_month_close`` run queued, by order id; ``failed`` ones were logged and left for a rerun."""

    queued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def sla_month_close(*, now: dt.datetime | None = None, before_each: Callable[[], None] | None = None) -> MonthClosed:
    """Queue the judgment of last month for every order that ran in it (``marketplace.sla_credit_settle``,
    one task per order). One order's failure to queue (or, where tasks run in process, to be judged) is logged
    and never stops the others; a rerun queues only those not judged yet."""
    now = now or timezone.now()
    end = month_start(now)
    start = month_start(end - dt.timedelta(days=1))
    closed = MonthClosed()
    for order_id in orders_to_judge(period_start=start, period_end=end):
        if before_each is not None:
            before_each()
        try:
            enqueue("marketplace.sla_credit_settle", order_id, start.isoformat())
            closed.queued.append(order_id)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # one order's surprise must not leave every other order's month unjudged
            log.exception("SLA month close: order %s failed", order_id)
            closed.failed.append(order_id)
    return closed


def sla_credit_settle_month(*, order_id: int, period_start: dt.datetime, now: dt.datetime | None = None) -> None:
    """The per-order task's body: judge the month starting ``period_start`` (to the order's end within it)."""
    now = now or timezone.now()
    order = Order.objects.get(pk=order_id)
    sla_credit_settle(order=order, period_start=period_start, period_end=min(next_month(period_start), now), now=now)
