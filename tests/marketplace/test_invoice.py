"""Invoice lines: an ended order's seconds at its locked price, written with its final transition."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Instance, InvoiceLine, Order, OrderState
from marketplace.money import minor_text, minor_units
from marketplace.orders.services import order_terminate

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def t4(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


def _run(api, t4, capture) -> Order:
    with capture(execute=True):
        api.post("/api/v1/orders", data=json.dumps({"offer": t4.pk}), content_type="application/json")
    return Order.objects.latest("id")


def test_an_ended_order_gets_one_line_at_its_locked_price(api, t4, django_capture_on_commit_callbacks):
    order = _run(api, t4, django_capture_on_commit_callbacks)
    # It has been running for two hours.
    Instance.objects.filter(order=order).update(ready_at=timezone.now() - dt.timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    line = InvoiceLine.objects.get(order=order)
    assert 7200 <= line.seconds <= 7260
    assert line.amount_usd == (order.price_per_hour * line.seconds / 3600).quantize(Decimal("0.000001"))
    assert line.price_per_hour == order.price_per_hour
    terminated = LedgerEntry.objects.get(kind="order.terminated", subject=f"order:{order.public_id}")
    assert json.loads(terminated.payload)["invoiced_seconds"] == line.seconds
    assert ledger_verify().ok

    body = api.get("/api/v1/invoice").json()
    assert [row["order"] for row in body["lines"]] == [str(order.public_id)]
    # The line is rounded once to the cent, as the book charges it, and the total is the sum of the lines.
    cents = minor_units(line.amount_usd, "USD")
    assert [(row["amount_minor"], row["amount_usd"]) for row in body["lines"]] == [(cents, minor_text(cents, "USD"))]
    assert (body["currency"], body["total_minor"], body["total_usd"]) == ("USD", cents, minor_text(cents, "USD"))
    assert api.get("/api/v1/invoice", {"month": "2020-01"}).json()["lines"] == []
    bad = api.get("/api/v1/invoice", {"month": "December"})
    assert bad.status_code == 400 and "month" in bad.json()["error"]["fields"]


def test_an_order_that_never_ran_is_not_invoiced(api, t4, django_capture_on_commit_callbacks):
    # Placed, then cancelled before any machine ran.
    api.post("/api/v1/orders", data=json.dumps({"offer": t4.pk}), content_type="application/json")
    order = Order.objects.get()
    order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.CANCELLED
    assert not InvoiceLine.objects.exists()


def test_a_stranger_sees_no_lines(api, charlie, t4, django_capture_on_commit_callbacks):
    order = _run(api, t4, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    stranger = APIClient()
    stranger.force_authenticate(charlie)
    assert stranger.get("/api/v1/invoice").json()["lines"] == []
