"""A provider's payout statement: what ran on its capacity, the commission, the net."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.models import InvoiceLine
from marketplace.orders.payouts import month_bounds, payout_statement, provider_running_orders
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


def test_a_statement_lists_ended_orders_with_the_commission(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, settings
):
    settings.COMMISSION_SHARE = 0.15
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH,
            offer_id=offer.pk, max_price_per_hour=offer.price_usd)).order  # fmt: skip
    boot_if_launched(order, aws_sandbox)
    assert [o.pk for o in provider_running_orders(provider=aws_account.provider)] == [order.pk]
    # Two hours of running, then the buyer stops it.
    order.instances.update(ready_at=timezone.now() - dt.timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    line = InvoiceLine.objects.get(order=order)

    statement = payout_statement(provider=aws_account.provider, month=timezone.now().strftime("%Y-%m"))

    (payout,) = statement.lines
    assert payout.order_id == str(order.public_id) and payout.seconds == line.seconds >= 7200
    assert payout.gross_usd == line.amount_usd.quantize(Decimal("0.01"))
    assert payout.commission_usd == (payout.gross_usd * Decimal("0.15")).quantize(Decimal("0.01"))
    assert statement.net_usd == statement.gross_usd - statement.commission_usd > 0
    last_month = (timezone.now().replace(day=1) - dt.timedelta(days=1)).strftime("%Y-%m")
    assert payout_statement(provider=aws_account.provider, month=last_month).lines == []
    assert provider_running_orders(provider=aws_account.provider) == []


def test_a_month_must_be_yyyy_mm():
    assert month_bounds("2026-12")[1] == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="not YYYY-MM"):
        month_bounds("December")
