"""The buyer's comparison, spending and order pages in the browser: tick offers and compare them, set budgets
and read the month's invoice, and watch an order on an independent machine with its GPU telemetry until the
page sees it terminated without a reload."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time

import pytest
from django.utils import timezone

from marketplace.models import Instance, InvoiceLine, OrderState
from marketplace.money import minor_units, money_text
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.community.services import machine_heartbeat
from providers.models import Machine
from tests.browser.conftest import shoot, sign_in
from tests.leases import LAUNCH
from tests.marketplace.test_storefront_instance import beats_over_the_last_hour, farm, order_on_machine

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["farm"]  # the fixture, imported to be used here


def _on_commit(*, execute: bool) -> contextlib.AbstractContextManager[None]:
    # Outside a test transaction on-commit callbacks already run at each commit: nothing to capture.
    return contextlib.nullcontext()


def test_compare_spending_and_an_order_with_telemetry(page, live_server, alice, acme, aws_account, farm):
    base = live_server.url
    # An order that ran two hours on the AWS sandbox and ended this month, for the invoice.
    t4 = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    ended = order_place(organization=acme, user=alice, request=PlaceRequest(offer_id=t4.pk, launch=LAUNCH)).order
    Instance.objects.filter(order=ended).update(ready_at=timezone.now() - dt.timedelta(hours=2))
    order_terminate(order=ended)
    line = InvoiceLine.objects.get(order=ended)
    # One running for 40 minutes on Helga's machine, its agent reporting all along.
    order = order_on_machine(farm, acme, alice, _on_commit)
    started = timezone.now() - dt.timedelta(minutes=40)
    order.instances.update(ready_at=started, launched_at=started - dt.timedelta(seconds=30))
    load = [5, 20, 45, 70, 88, 93, 95, 91, 94, 96, 92, 90, 93, 97, 95, 94, 92, 96, 95, 93]
    beats_over_the_last_hour(Machine.objects.get(name="fra-h100-1"), since=started, values=load)

    sign_in(page, base, alice)

    # Compare: tick three H100 offers on the offers page, a cloud's and an independent machine's two.
    page.goto(f"{base}/?gpu=H100-SXM5")
    button = page.locator("#compare-button")
    assert button.is_disabled()  # the script enables it from two ticked offers
    cloud = aws_account.offers.filter(gpu_model__key="H100-SXM5").order_by("price_usd", "id")[0]
    machine = farm.offers.filter(zone="fra-h100-2")
    for offer in (cloud, machine.get(pricing_model="on_demand"), machine.get(pricing_model="spot")):
        page.check(f"input[name=ids][value='{offer.pk}']")
    assert button.inner_text() == "Compare selected (3)"
    shoot(page, "storefront-offers-ticked")
    button.click()
    page.wait_for_url(f"{base}/compare?ids=*")
    assert page.locator("table.compare thead th").count() == 4  # the labels' column and three offers
    assert page.locator("table.compare td.best").count() >= 3
    assert "Price per FP16 TFLOP-hour" in page.inner_text("table.compare")
    assert page.locator("table.compare tfoot a:has-text('Order')").count() == 3
    shoot(page, "storefront-compare")
    page.goto(f"{base}/compare?ids=1")
    assert "choose at least 2 offers to compare (1 chosen)" in page.inner_text("#compare-error")

    # Spending: the month's line, and budgets set by the owner.
    page.click("nav a:has-text('Spending')")
    page.wait_for_url(f"{base}/spending")
    assert line.description in page.inner_text("#invoice-lines")
    assert page.inner_text("#month-total") == money_text(minor_units(line.amount_usd, "USD"), "USD")
    assert str(order.public_id)[:8] in page.inner_text("#live-orders")
    page.fill("input[name=budget_per_hour]", "40")
    page.fill("input[name=budget_monthly]", "5000")
    page.click("#budgets button[type=submit]")
    page.locator("text=Budgets saved.").wait_for()
    assert "of 40.00 USD/h budget" in page.inner_text("#hourly")
    shoot(page, "storefront-spending")

    # The order on the independent machine: telemetry, then terminated while the page is open.
    page.goto(f"{base}/orders/")
    page.click(f"a[href='/orders/{order.public_id}/']")
    page.wait_for_url(f"{base}/orders/{order.public_id}/")
    assert page.inner_text("#order-state") == "running"
    assert page.inner_text("#latest-utilization") == "93.0 %"
    assert page.locator("#telemetry svg.chart[role=img]").count() == 3
    page.locator("#live-note >> text=live · updated").wait_for()  # the script polled the API
    # The live cost follows the money rule as the server's text does: "1.23 USD", not "$1.23".
    assert re.fullmatch(r"\d{1,3}(,\d{3})*\.\d\d USD", page.inner_text("#order-cost"))
    shoot(page, "storefront-order-telemetry")
    # A heartbeat arrives while the page is open: the charts and latest values follow without a reload.
    gpus = [{"index": g, "utilization_pct": 7, "temperature_c": 41, "power_w": 120} for g in range(8)]
    for _ in range(10):  # this minute's mean far below the 90s, within the 12 heartbeats a minute allowed
        machine_heartbeat(machine=Machine.objects.get(name="fra-h100-1"), gpus=gpus, instances=1)
    deadline = time.monotonic() + 25  # the page redraws its charts every 10 s
    while page.inner_text("#latest-utilization") == "93.0 %" and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert float(page.inner_text("#latest-utilization").removesuffix(" %")) < 20
    shoot(page, "storefront-order-telemetry-refreshed")

    order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED, order.state
    page.locator("#order-state >> text=terminated").wait_for()
    assert page.locator("#terminate-form").count() == 0
    shoot(page, "storefront-order-terminated")

    page.goto(f"{base}/orders/{ended.public_id}/")
    assert "reported no GPU telemetry for this order" in page.inner_text("#telemetry")
    shoot(page, "storefront-order-cloud")
