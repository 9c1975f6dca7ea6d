"""Prepaid credit and orders: holds before launch, holds that follow a running order, the charge at its end.

A prepaid organisation's order holds credit before anything launches: its next hour at the locked price with
tax, or what is left of its spend cap or duration when that is less. The minute sweep keeps every running
order's hold an hour ahead of its usage while credit lasts; when it cannot, the buyer is warned
(``order.credit_low``), and an order whose usage reaches its hold is stopped, so nothing runs unpaid.

When an order ends (in the transaction of its final transition) its hold is released and its metered cost is
charged: the buyer's credit pays the provider's payable, the marketplace's commission and the tax. Invoiced
organisations are charged the same way, without holds; their credit may go negative, which is what they owe.

Book accounts: BUYER_CREDIT (credit-normal: what the buyer has is its negation), ORDER_HOLD (the buyer's credit
set aside for running orders; entries name their order), COMMISSION, PROVIDER_PAYABLE (the provider
organisation's, or the house's for capacity no provider organisation sells), TAX_PAYABLE.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from marketplace.billing.book import Line, book_account, book_post, credit_available
from marketplace.billing.tax import TaxRate, tax_memo, tax_minor, tax_rate_for
from marketplace.models import (
    BookAccountKind,
    BookLine,
    InvoiceLine,
    Order,
    OrderState,
    Organization,
    PaymentTerms,
)
from marketplace.models.billing import BillingProfile
from marketplace.orders.services import OrderError

log = logging.getLogger(__name__)

CURRENCY = "USD"  # orders are priced in US dollars
_CENT = Decimal("0.01")


class PaymentRequired(OrderError):
    """The organisation's prepaid credit does not cover the hold an order needs (HTTP 402)."""

    code = "payment_required"

    def __init__(self, message: str, *, needed_minor: int, available_minor: int):
        super().__init__(message)
        self.needed_minor = needed_minor
        self.available_minor = available_minor

    @property
    def shortfall_minor(self) -> int:
        return self.needed_minor - self.available_minor


def minor(amount_usd: Decimal) -> int:
    """US dollars to cents, half up."""
    return int(amount_usd.quantize(_CENT, ROUND_HALF_UP) * 100)


def money(amount_minor: int) -> str:
    """Cents as the storefront writes money: "$12.34 USD"."""
    sign = "-" if amount_minor < 0 else ""
    return f"{sign}${abs(amount_minor) / 100:,.2f} {CURRENCY}"


def tax_rate_of(organization_id: int, on: dt.date) -> TaxRate | None:
    """The tax the organisation's billing country charges on ``on``; None without a country (or a rate)."""
    country = BillingProfile.objects.filter(organization_id=organization_id).values_list("country", flat=True).first()
    return tax_rate_for(country, on=on) if country else None


def _with_tax(amount_minor: int, rate: TaxRate | None) -> int:
    return amount_minor + tax_minor(amount_minor, rate)


def _ceil_minor(amount_usd: Decimal) -> int:
    return int((amount_usd * 100).to_integral_value(ROUND_CEILING))


def order_total_cap_minor(order: Order) -> int | None:
    """The most the order can cost before tax: its spend cap, or its duration at its price (the lesser)."""
    caps = []
    if order.spend_cap_usd is not None:
        caps.append(_ceil_minor(order.spend_cap_usd))
    if order.duration_hours is not None:
        caps.append(_ceil_minor(order.price_per_hour * order.duration_hours))
    return min(caps) if caps else None


def hold_target_minor(order: Order, *, used_minor: int, rate: TaxRate | None) -> int:
    """What the order should hold with ``used_minor`` (before tax) run up: usage plus the next hour, no more
    than its cap, with tax at ``rate``."""
    target = used_minor + _ceil_minor(order.price_per_hour)
    cap = order_total_cap_minor(order)
    if cap is not None:
        target = min(target, max(cap, used_minor))
    return _with_tax(target, rate)


def order_held_minor(order: Order) -> int:
    """The credit the order holds now (the ORDER_HOLD lines of its entries, negated)."""
    total = BookLine.objects.filter(entry__order=order, account__kind=BookAccountKind.ORDER_HOLD).aggregate(
        total=Sum("amount_minor")
    )["total"]
    return -int(total or 0)


def order_hold_place(order: Order, organization: Organization, *, now: dt.datetime) -> int:
    """Hold the new order's first stretch against the organisation's credit, or raise ``PaymentRequired``
    saying how much to add. The caller holds the organisation's row lock and rolls the order back on error."""
    needed = hold_target_minor(order, used_minor=0, rate=tax_rate_of(organization.pk, now.date()))
    available = credit_available(organization, CURRENCY)
    if needed > available:
        raise PaymentRequired(
            f"your prepaid credit is {money(available)}; this order holds {money(needed)} before it launches "
            f"(its first hour with tax, or its cap): add at least {money(needed - available)} "
            "(POST /api/v1/billing/topups, or Billing in the storefront)",
            needed_minor=needed,
            available_minor=available,
        )
    _hold_move(order, organization, needed, key=f"order:{order.pk}:hold:0", now=now)
    return needed


def _hold_move(order: Order, organization: Organization, amount: int, *, key: str, now: dt.datetime) -> None:
    """Move ``amount`` from the buyer's credit to the order's hold (negative: back)."""
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency=CURRENCY, organization=organization)
    hold = book_account(kind=BookAccountKind.ORDER_HOLD, currency=CURRENCY, organization=organization)
    book_post(
        kind="order.hold" if amount > 0 else "order.release",
        key=key,
        lines=[Line(credit, amount), Line(hold, -amount)],
        memo=f"order {order.public_id}",
        order=order,
        now=now,
    )


def order_settle(order: Order, line: InvoiceLine | None, *, now: dt.datetime) -> None:
    """At the order's end: release its hold and charge its invoice line (cost, commission, tax). Runs in the
    final transition's transaction; keyed by the order, so it happens once."""
    organization = Organization.objects.get(pk=order.organization_id)
    held = order_held_minor(order)
    if held:
        _hold_move(order, organization, -held, key=f"order:{order.pk}:release", now=now)
    if line is None:
        return
    gross = minor(line.amount_usd)
    if gross == 0:
        return
    share = Decimal(str(settings.COMMISSION_SHARE))
    commission = minor(Decimal(gross) / 100 * share)
    rate = tax_rate_of(organization.pk, now.date())
    tax = tax_minor(gross, rate)
    seller = _seller(order)
    lines = [
        Line(book_account(kind=BookAccountKind.BUYER_CREDIT, currency=CURRENCY, organization=organization), gross + tax)
    ]
    if commission:
        lines.append(Line(book_account(kind=BookAccountKind.COMMISSION, currency=CURRENCY), -commission))
    if gross - commission:
        lines.append(
            Line(
                book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency=CURRENCY, organization=seller),
                -(gross - commission),
            )
        )
    if tax:
        lines.append(Line(book_account(kind=BookAccountKind.TAX_PAYABLE, currency=CURRENCY), -tax))
    book_post(
        kind="order.charge", key=f"order:{order.pk}:charge", lines=lines, memo=tax_memo(rate), order=order, now=now
    )


def _seller(order: Order) -> Organization | None:
    """The provider organisation that sold the capacity the order ended on; None: the house's own capacity."""
    if order.offer_id is None:
        return None
    return Organization.objects.filter(provider__accounts__offers=order.offer_id).first()


def credit_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Keep every running prepaid order's hold an hour ahead of its usage; warn when credit cannot, and stop
    an order whose usage has reached its hold. One order's failure is logged and the sweep goes on."""
    from marketplace.orders.selectors import order_spent_usd

    now = now or timezone.now()
    counts = {"extended": 0, "warned": 0, "stopped": 0}
    running = Order.objects.filter(state=OrderState.RUNNING, organization__payment_terms=PaymentTerms.PREPAID)
    for order in running:
        try:
            outcome = _order_credit_keep(order, used_minor=_ceil_minor(order_spent_usd(order, now=now)), now=now)
        except Exception:
            log.exception("keeping order %s's credit hold failed", order.public_id)
            continue
        if outcome:
            counts[outcome] += 1
    return counts


def _order_credit_keep(order: Order, *, used_minor: int, now: dt.datetime) -> str:
    from django.db import transaction

    from marketplace.orders.services import TransitionRefused, order_terminate

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
            _hold_move(order, organization, more, key=f"order:{order.pk}:hold:{now.isoformat()}", now=now)
            held += more
    used_with_tax = _with_tax(used_minor, rate)
    # Two sweeps' worth of running at the price: stop while the hold still covers what the sweep cannot see.
    margin = _with_tax(_ceil_minor(order.price_per_hour * 2 / 60), rate)
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
    from django.db import transaction

    from ledger.models import LedgerEntry
    from ledger.services import ledger_append
    from marketplace.webhooks.services import webhook_event_emit

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
    import smtplib

    from django.core.mail import send_mail

    from marketplace.models.billing import EmailVerification

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
