"""Nothing runs forgotten: an order stops at the end of its requested duration; usage is metered per second."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Instance, Order, OrderState
from marketplace.money import minor_text, minor_units
from marketplace.orders.selectors import order_usage
from marketplace.orders.services import orders_end_scheduled
from providers.services import adapter_for_account
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _post(client: APIClient, path: str, body: object):
    return client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def t4(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


def test_an_order_stops_at_the_end_of_its_duration(
    api, t4, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(api, "/api/v1/orders", {"offer": t4.pk, "duration_hours": "2"})
    assert response.status_code == 201, response.content
    order = boot_if_launched(Order.objects.get(), aws_sandbox)
    instance = order.instance
    assert order.state == OrderState.RUNNING
    # The duration counts from when the machine was ready, as the metering does.
    assert order.run_until == instance.ready_at + dt.timedelta(hours=2)
    assert response.json()["duration_hours"] == "2.00"

    assert orders_end_scheduled(now=order.run_until - dt.timedelta(seconds=1)) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert orders_end_scheduled(now=order.run_until + dt.timedelta(seconds=1)) == 1
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert order.state_reason == "scheduled end: ran the requested 2.00 h"
    assert adapter_for_account(aws_account).describe(instance.region, instance.provider_instance_id).state.value in {
        "terminated",
        "shutting-down",
    }
    kinds = list(LedgerEntry.objects.order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == ["order.terminating", "order.terminated"]
    assert ledger_verify().ok
    # A second sweep finds nothing more to stop.
    assert orders_end_scheduled(now=order.run_until + dt.timedelta(hours=1)) == 0


def test_an_order_without_a_duration_runs_until_terminated(api, t4, aws_sandbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _post(api, "/api/v1/orders", {"offer": t4.pk})
    order = boot_if_launched(Order.objects.get(), aws_sandbox)
    assert order.state == OrderState.RUNNING and order.run_until is None
    assert orders_end_scheduled(now=order.state_changed_at + dt.timedelta(days=365)) == 0


def test_an_order_from_a_quote_takes_the_quotes_duration(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    quote = _post(api, "/api/v1/quotes", {"profile": "inference", "duration_hours": 3, "limit": 1}).json()
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(api, "/api/v1/orders", {"quote": quote["quotes"][0]["id"]})
    order = boot_if_launched(Order.objects.get(public_id=response.json()["id"]), aws_sandbox)
    assert order.duration_hours == Decimal("3.00")
    assert order.run_until == order.instance.ready_at + dt.timedelta(hours=3)


@pytest.mark.parametrize("bad", ["0", "-1", "9000", "soon"])
def test_a_bad_duration_is_refused(api, t4, bad):
    response = _post(api, "/api/v1/orders", {"offer": t4.pk, "duration_hours": bad})
    assert response.status_code == 400
    assert "duration_hours" in response.json()["error"]["fields"]
    assert not Order.objects.exists()


def test_usage_is_metered_per_second_at_the_locked_price(api, t4, aws_sandbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _post(api, "/api/v1/orders", {"offer": t4.pk})
    order = boot_if_launched(Order.objects.get(), aws_sandbox)
    started = order.instance.ready_at
    Instance.objects.filter(pk=order.instance.pk).update(terminated_at=started + dt.timedelta(minutes=90, seconds=1))
    order = Order.objects.prefetch_related("instances").get()
    usage = order_usage(order, now=started + dt.timedelta(days=1))
    assert usage.seconds == 5401
    assert usage.amount_usd == (order.price_per_hour * 5401 / 3600).quantize(Decimal("0.000001"))
    # While it runs, usage grows with the clock.
    Instance.objects.filter(pk=order.instance.pk).update(terminated_at=None)
    order = Order.objects.prefetch_related("instances").get()
    assert order_usage(order, now=started + dt.timedelta(seconds=60)).seconds == 60
    body = api.get(f"/api/v1/orders/{order.public_id}").json()
    assert set(body["usage"]) == {"seconds", "amount_minor", "amount_usd"}
    cents = minor_units(order_usage(order, now=timezone.now()).amount_usd, "USD")
    assert body["usage"]["amount_usd"] == minor_text(body["usage"]["amount_minor"], "USD")
    assert cents - 1 <= body["usage"]["amount_minor"] <= cents + 1  # a second or so of running apart
