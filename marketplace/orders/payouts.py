"""What sellers earn: a provider's payout statement for a month, with the marketplace's commission.

A statement lists the invoice lines of the orders that ran on the provider's capacity and ended in that
month (UTC): the buyer's amount at the locked price, the commission (``BROKER_COMMISSION_SHARE`` of it,
rounded to the cent per line) and the provider's net. An order is attributed to the provider whose offer
it ended on (after a failover, the one that ran it). Each line names the order, so its ledger receipt
proves what happened.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from marketplace.models import InvoiceLine, Order, OrderState
from marketplace.money import from_minor, lines_total, minor_units
from providers.models import Provider

_CENT = Decimal("0.01")
_USD = "USD"  # orders are priced in US dollars
_ZERO = from_minor(0, _USD)  # "0.00", so an empty statement shows cents like a full one


@dataclass(frozen=True)
class PayoutLine:
    order_id: str
    description: str
    ended_at: dt.datetime
    seconds: int
    gross_usd: Decimal
    commission_usd: Decimal
    net_usd: Decimal
    currency: str = "USD"

    @property
    def hours(self) -> Decimal:
        return (Decimal(self.seconds) / 3600).quantize(_CENT)


@dataclass(frozen=True)
class PayoutStatement:
    provider: str
    month: str
    commission_share: Decimal
    lines: list[PayoutLine]
    currency: str = "USD"  # every amount of the statement is in it (the buyer's locked price is in USD)

    @property
    def gross_usd(self) -> Decimal:
        return sum((line.gross_usd for line in self.lines), _ZERO)  # the sum of the rounded lines shown

    @property
    def commission_usd(self) -> Decimal:
        return sum((line.commission_usd for line in self.lines), _ZERO)  # the sum of the rounded lines shown

    @property
    def net_usd(self) -> Decimal:
        return sum((line.net_usd for line in self.lines), _ZERO)  # the sum of the rounded lines shown


def month_bounds(month: str) -> tuple[dt.datetime, dt.datetime]:
    """``YYYY-MM`` -> [start, end) in UTC; raises ``ValueError`` naming the expected form."""
    try:
        start = dt.datetime.strptime(month, "%Y-%m").replace(tzinfo=dt.UTC)
    except ValueError:
        raise ValueError(f"month: {month!r} is not YYYY-MM") from None
    end = (start + dt.timedelta(days=32)).replace(day=1)
    return start, end


def payout_statement(*, provider: Provider, month: str) -> PayoutStatement:
    start, end = month_bounds(month)
    share = Decimal(str(settings.COMMISSION_SHARE))
    lines = []
    rows = (
        InvoiceLine.objects.filter(order__offer__account__provider=provider, ended_at__gte=start, ended_at__lt=end)
        .select_related("order")
        .order_by("ended_at", "id")
    )
    for row in rows:
        # Rounded once per line by the money rule, as the book charged the buyer and credited the provider.
        gross = from_minor(minor_units(row.amount_usd, _USD), _USD)
        commission = from_minor(minor_units(gross * share, _USD), _USD)
        lines.append(
            PayoutLine(
                order_id=str(row.order.public_id),
                description=row.description,
                ended_at=row.ended_at,
                seconds=row.seconds,
                gross_usd=gross,
                commission_usd=commission,
                net_usd=gross - commission,
            )
        )
    return PayoutStatement(provider=provider.name, month=month, commission_share=share, lines=lines)


def provider_running_orders(*, provider: Provider) -> list[Order]:
    """Orders running on the provider's capacity now (any buyer's; the provider sees no buyer names)."""
    return list(
        Order.objects.filter(offer__account__provider=provider, state=OrderState.RUNNING)
        .select_related("offer", "gpu_model")
        .order_by("-state_changed_at")
    )


def provider_earnings_to_date(*, provider: Provider) -> dict[str, Decimal | int]:
    """All-time gross and order count of ended orders on the provider's capacity."""
    amounts = InvoiceLine.objects.filter(order__offer__account__provider=provider).values_list("amount_usd", flat=True)
    # The sum of the lines as each was charged, not a rounding of the unrounded sum (marketplace.money).
    gross = lines_total(minor_units(amount, _USD) for amount in amounts.iterator())
    return {"gross_usd": from_minor(gross, _USD), "orders": amounts.count()}
