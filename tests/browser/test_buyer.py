"""A buyer in the browser: order a GPU, see it run, and check its ledger receipt in the page."""

from __future__ import annotations

import re

import pytest

from marketplace.models import Order, OrderState
from tests.browser.conftest import shoot, sign_in
from tests.leases import boot

pytestmark = pytest.mark.django_db(transaction=True)


def test_order_run_and_verify_the_receipt(page, live_server, alice, aws_account, aws_sandbox):
    sign_in(page, live_server.url, alice)

    page.goto(f"{live_server.url}/?gpu=T4&pricing=on_demand")
    shoot(page, "buyer-offers")
    page.locator("tbody tr").first.locator("a:has-text('Order')").click()
    page.fill("#id_duration_hours", "1")
    page.click("#launch-form button[type=submit]")
    page.click("#confirm-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/orders/[0-9a-f-]{36}/$"))
    order = Order.objects.get()
    # The sandbox holds the machine's agent; the test boots it (claim, checks, ready).
    assert boot(order, aws_sandbox) == "running"
    assert order.state == OrderState.RUNNING, order.state_reason
    page.goto(f"{live_server.url}/orders/")
    assert page.locator("tbody tr").first.locator(".state").inner_text() == "running"
    shoot(page, "buyer-orders")

    # No checkpoint yet: the page says pending (not failed), the broker signs one, and the page looks again.
    page.locator("a:has-text('Receipt')").first.click()
    verdict = page.locator("#verdict")
    verdict.locator("text=wait for the next signed checkpoint").wait_for()
    assert "failed" not in verdict.inner_text()
    shoot(page, "buyer-receipt-pending")
    verdict.locator("text=Verified in this page").wait_for(timeout=30_000)
    assert "wait for the next" not in verdict.inner_text()
    assert page.locator("#signature-check").inner_text().startswith("valid Ed25519 signature")
    assert page.locator("td.proof-check.check-ok").count() == page.locator("td.proof-check").count() >= 4
    shoot(page, "buyer-receipt")
