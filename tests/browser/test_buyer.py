"""A buyer in the browser: order a GPU, see it run, and check its ledger receipt in the page."""

from __future__ import annotations

import pytest

from ledger.checkpoints import ledger_checkpoint_and_anchor
from marketplace.models import Order, OrderState
from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_order_run_and_verify_the_receipt(page, live_server, alice, aws_account):
    sign_in(page, live_server.url, alice)

    page.goto(f"{live_server.url}/?gpu=T4&pricing=on_demand")
    shoot(page, "buyer-offers")
    page.locator("tbody tr").first.locator("button:has-text('Order')").click()
    page.wait_for_url(f"{live_server.url}/orders/")
    order = Order.objects.get()
    assert order.state == OrderState.RUNNING, order.state_reason
    assert page.locator("tbody tr").first.locator(".state").inner_text() == "running"
    shoot(page, "buyer-orders")

    ledger_checkpoint_and_anchor()
    page.locator("a:has-text('Receipt')").first.click()
    verdict = page.locator("#verdict")
    verdict.locator("text=Verified in this page").wait_for()
    assert page.locator("#signature-check").inner_text().startswith("valid Ed25519 signature")
    assert page.locator("td.proof-check.check-ok").count() == page.locator("td.proof-check").count() >= 4
    shoot(page, "buyer-receipt")
