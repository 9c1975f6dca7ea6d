"""The minute sweep of prepaid orders: it keeps every running order's credit hold an hour ahead of its usage,
warns the buyer once when credit cannot (``order.credit_low``: ledger, webhook, email), and stops an order whose
usage reached its hold, so nothing runs unpaid. Above ``billing.credit`` (the holds) and ``orders.services`` (the
stop), which know nothing of it."""

from __future__ import annotations

import datetime as dt
import logging
import smtplib
from decimal import Decimal

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_append
from marketplace.billing.book import credit_available
from marketplace.billing.credit import (
    CURRENCY,
    ceil_minor,
    hold_move,
    hold_target_minor,
    money,
    order_held_minor,
    tax_rate_of,
    with_tax,
)
from marketplace.models import Order, OrderState, Organization, PaymentTerms
from marketplace.models.billing import EmailVerification
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.selectors import order_spent_usd
from marketplace.orders.services import order_terminate
from marketplace.webhooks.services import webhook_event_emit

log = logging.getLogger(__name__)


def credit_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Keep every running prepaid order's hold an hour ahead of its usage; warn when credit cannot, and stop
    an order whose usage has reached its hold. One order's failure is logged and the sweep goes on."""
    now = now or timezone.now()
    counts = {"extended": 0, "warned": 0, "stopped": 0}
    # Running, restarting, or stopped where the provider still bills the machine (an independent host keeps its
    # GPUs held for it): each of these runs up a charge its hold must follow. A stopped cloud machine costs
    # nothing, and stopping it for want of credit would only lose its disk.
    billed_stopped = Q(
        state__in=[OrderState.STOPPING, OrderState.STOPPED],
        stopped_periods__ended_at__isnull=True,
        stopped_periods__usd_per_hour__gt=0,
    )
    running = (
        Order.objects.filter(organization__payment_terms=PaymentTerms.PREPAID)
        .filter(Q(state__in=[OrderState.RUNNING, OrderState.STARTING]) | billed_stopped)
        .distinct()
    )
    for order in running:
        try:
            outcome = _order_credit_keep(order, used_minor=ceil_minor(order_spent_usd(order, now=now)), now=now)
        except Exception:
            log.exception("keeping order %s's credit hold failed", order.public_id)
            continue
        if outcome:
            counts[outcome] += 1
    return counts


def _order_credit_keep(order: Order, *, used_minor: int, now: dt.datetime) -> str:
    rate = tax_rate_of(order.organization_id, now.date())  # once per order and sweep
    with transaction.atomic():
        organization = Organization.objects.select_for_update().get(pk=order.organization_id)
        held = order_held_minor(order)
        target = hold_target_minor(order, used_minor=used_minor, rate=rate)
        if held >= target:
            return ""
        available = credit_available(organization, CURRENCY)
        more = min(target - held, max(available, 0))
        if more > 0:
            hold_move(order, organization, more, key=f"order:{order.pk}:hold:{now.isoformat()}", now=now)
            held += more
    used_with_tax = with_tax(used_minor, rate)
    # Two sweeps' worth of running at the price: stop while the hold still covers what the sweep cannot see.
    margin = with_tax(ceil_minor(order.price_per_hour * 2 / 60), rate)
    if held - used_with_tax <= margin:
        try:
            order_terminate(
                order=order,
                reason=f"prepaid credit exhausted: the order used the {money(held)} it could hold; top up to order "
                "again",
            )
        except TransitionRefused:
            return ""
        return "stopped"
    if held >= target:
        return "extended"
    _credit_low_warn(order, held=held, used=used_with_tax, now=now)
    return "warned"


def _credit_low_warn(order: Order, *, held: int, used: int, now: dt.datetime) -> None:
    """Tell the buyer, once per order, that it stops when its hold is used: on the order's record (the page
    shows it) and as an ``order.credit_low`` webhook event."""
    subject = f"order:{order.public_id}"
    minutes = int(Decimal(held - used) / 100 / order.price_per_hour * 60) if order.price_per_hour else 0
    message = (
        f"prepaid credit is running out: about {minutes} min of the {money(held)} held remain; top up, or the "
        "order stops when its hold is used"
    )
    with transaction.atomic():
        Order.objects.select_for_update().filter(pk=order.pk).first()  # one warning even from two sweeps
        if LedgerEntry.objects.filter(subject=subject, kind="order.credit_low").exists():
            return
        ledger_append(
            kind="order.credit_low",
            subject=subject,
            # The reason is what the order page's history shows.
            payload={
                "order": str(order.public_id),
                "organization": order.organization_id,
                "held_minor": held,
                "reason": message,
            },
        )
        webhook_event_emit(
            organization_id=order.organization_id,
            event_type="order.credit_low",
            data={
                "order": str(order.public_id),
                "held": money(held),
                "minutes_left": minutes,
                "message": message,
                "at": now,
            },
            now=now,
        )
        transaction.on_commit(lambda: _credit_low_email(order, message))


def _credit_low_email(order: Order, message: str) -> None:
    """The warning by email to the organisation's owners with a verified address (best effort: the webhook
    event and the order page say it too)."""
    owners = EmailVerification.objects.filter(
        user__memberships__organization_id=order.organization_id, user__memberships__role="owner"
    ).values_list("email", flat=True)
    to = sorted(set(owners))
    if not to:
        return
    try:
        send_mail(
            f"Order {order.public_id} stops soon: prepaid credit is running out",
            f"{message}.\n\nTop up in Billing to keep it running.",
            settings.DEFAULT_FROM_EMAIL,
            to,
        )
    except (smtplib.SMTPException, OSError) as exc:
        log.warning("order %s: the low-credit email was not sent: %s", order.public_id, exc)
