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
from decimal import Decimal

from django.conf import settings
from django.db.models import Sum

from marketplace.billing.book import Line, book_account, book_post, credit_available
from marketplace.billing.tax import TaxRate, reverse_charge_rate, tax_memo, tax_minor, tax_rate_for
from marketplace.billing.vat_ids import reverse_charge_applies
from marketplace.models import (
    BookAccountKind,
    BookLine,
    InvoiceLine,
    Order,
    Organization,
)
from marketplace.models.billing import BillingProfile
from marketplace.money import from_minor, minor_units, minor_units_covering, money_text
from marketplace.orders.errors import OrderError

log = logging.getLogger(__name__)

CURRENCY = "USD"  # orders are priced in US dollars


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
    """US dollars to cents by the one rounding rule (``marketplace.money.minor_units``)."""
    return minor_units(amount_usd, CURRENCY)


def money(amount_minor: int) -> str:
    """Cents as the storefront writes money: "12.34 USD" (``marketplace.money.money_text``)."""
    return money_text(amount_minor, CURRENCY)


def tax_rate_of(organization_id: int, on: dt.date) -> TaxRate | None:
    """The tax the organisation's billing country charges on ``on``; None without a country (or a rate); the
    reverse charge (rate 0) for a business in another EU member state than the broker's with a valid VAT id."""
    found = BillingProfile.objects.filter(organization_id=organization_id).values_list("country", "tax_id").first()
    if not found or not found[0]:
        return None
    country, tax_id = found
    supplier = str(getattr(settings, "BROKER_COUNTRY", "") or "")
    if reverse_charge_applies(buyer_country=country, buyer_vat_id=tax_id, supplier_country=supplier):
        return reverse_charge_rate(country)
    return tax_rate_for(country, on=on)


def with_tax(amount_minor: int, rate: TaxRate | None) -> int:
    return amount_minor + tax_minor(amount_minor, rate)


def ceil_minor(amount_usd: Decimal) -> int:
    return minor_units_covering(amount_usd, CURRENCY)


def order_total_cap_minor(order: Order) -> int | None:
    """The most the order can cost before tax: its spend cap, or its duration at its price (the lesser)."""
    caps = []
    if order.spend_cap_usd is not None:
        caps.append(ceil_minor(order.spend_cap_usd))
    if order.duration_hours is not None:
        caps.append(ceil_minor(order.price_per_hour * order.duration_hours))
    return min(caps) if caps else None


def hold_target_minor(order: Order, *, used_minor: int, rate: TaxRate | None) -> int:
    """What the order should hold with ``used_minor`` (before tax) run up: usage plus the next hour, no more
    than its cap, with tax at ``rate``."""
    target = used_minor + ceil_minor(order.price_per_hour)
    cap = order_total_cap_minor(order)
    if cap is not None:
        target = min(target, max(cap, used_minor))
    return with_tax(target, rate)


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
    hold_move(order, organization, needed, key=f"order:{order.pk}:hold:0", now=now)
    return needed


def hold_move(order: Order, organization: Organization, amount: int, *, key: str, now: dt.datetime) -> None:
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
        hold_move(order, organization, -held, key=f"order:{order.pk}:release", now=now)
    if line is None:
        return
    gross = minor(line.amount_usd)
    if gross == 0:
        return
    share = Decimal(str(settings.COMMISSION_SHARE))
    commission = minor(from_minor(gross, CURRENCY) * share)
    rate = tax_rate_of(organization.pk, now.date())
    tax = tax_minor(gross, rate)
    seller = order_seller(order)
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


def order_seller(order: Order) -> Organization | None:
    """The provider organisation that sold the capacity the order ended on; None: the house's own capacity."""
    if order.offer_id is None:
        return None
    return Organization.objects.filter(provider__accounts__offers=order.offer_id).first()
