"""A buyer's whole journey in the browser: search, quote a workload, order at the quoted price, watch it run,
terminate it, and verify its receipt in the page."""

from __future__ import annotations

import re

import pytest

from ledger.checkpoints import ledger_checkpoint_and_anchor
from marketplace.models import Order, OrderState
from tests.browser.conftest import shoot, sign_in
from tests.leases import boot

pytestmark = pytest.mark.django_db(transaction=True)


def test_search_quote_order_run_terminate_and_verify(page, live_server, alice, aws_account, aws_sandbox):
    base = live_server.url
    sign_in(page, base, alice)

    # Search: a wrong term is pointed at, the right one filters.
    page.goto(f"{base}/")
    page.fill("input[name=q]", "gpu=T4 cuont>=1")
    page.click("form.search button[type=submit]")
    assert "unknown field 'cuont'" in page.inner_text("#query-error")
    page.fill("input[name=q]", "gpu=T4 count=1 pricing=on_demand")
    page.click("form.search button[type=submit]")
    rows = page.locator("table.grid tbody tr")
    assert rows.count() > 0 and all("T4" in text for text in rows.all_inner_texts())
    shoot(page, "journey-1-search")

    # Quote the workload: inference on one GPU for 8 hours.
    page.goto(f"{base}/workload/")
    page.select_option("select[name=profile]", "inference")
    page.fill("input[name=gpu_count]", "1")
    page.click("#workload-form button[type=submit]")
    page.locator("a[aria-label^='Order at this price']").first.wait_for()
    shoot(page, "journey-2-quotes")
    page.locator("a[aria-label^='Order at this price']").first.click()
    # The configure step has the quote's 8 hours; the confirmation its locked price.
    assert page.input_value("#id_duration_hours") == "8.00"
    page.click("#launch-form button[type=submit]")
    page.locator("#quote-expiry").wait_for()
    page.click("#confirm-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/orders/[0-9a-f-]{36}/$"))
    order = Order.objects.get()
    assert boot(order, aws_sandbox) == "running"
    assert order.state == OrderState.RUNNING and order.quote_id is not None, order.state_reason
    page.goto(f"{base}/orders/")
    shoot(page, "journey-3-running")

    # Terminate it from the orders page, after its confirmation.
    page.locator("summary:has-text('Terminate')").first.click()
    page.locator("button:has-text('Yes, terminate')").first.click()
    page.wait_for_url(f"{base}/orders/")
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED, order.state
    assert "terminated" in page.locator("tbody tr").first.inner_text()

    ledger_checkpoint_and_anchor()
    page.locator("a:has-text('Receipt')").first.click()
    page.locator("#verdict >> text=Verified in this page").wait_for()
    kinds = page.locator("table.receipt tbody tr strong").all_inner_texts()
    assert kinds[0] == "order.placed" and "order.terminated" in kinds
    shoot(page, "journey-4-receipt")
