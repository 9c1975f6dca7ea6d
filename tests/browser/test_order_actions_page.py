"""The order page's Stop, Start and Restart buttons and its workload logs (issue 36), in the browser: each
button shown only when the order allows it, each asking first (saying what a stopped machine costs), and the
logs panel the agent's last lines, refreshed by a plain link (the page's CSP allows no inline script)."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from marketplace.models import Offer, OrderState
from tests.browser.conftest import shoot, sign_in
from tests.leases import ClientTransport, held_agent, running_order

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_buyer_stops_and_starts_a_host_lease_from_its_page_and_reads_its_logs(
    page, live_server, gpu_models, acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand", gpu_count=8)
    order = running_order(acme, alice, offer, django_capture_on_commit_callbacks, held_hosts, allow_failover=False)
    agent = held_agent(order, held_hosts)
    (agent.executor.plan.work_dir / "workload.log").write_text("epoch 1 loss 0.93\nepoch 2 loss 0.71\n")
    agent.transport = ClientTransport()
    assert agent.heartbeat() == "running"
    sign_in(page, live_server.url, alice)

    page.goto(f"{live_server.url}/orders/{order.public_id}/")
    expect(page.locator("#logs-text")).to_contain_text("epoch 2 loss 0.71")
    expect(page.locator("#start-form")).to_have_count(0)  # running: nothing to start
    page.locator("#stop-form summary").click()
    expect(page.locator("#stop-form")).to_contain_text("stay reserved to the lease")
    shoot(page, "order-actions-stop-confirm")
    page.click("#stop-confirm")

    expect(page.locator("#order-state")).to_have_text("stopped")
    expect(page.locator("#order-stopped-billing")).to_contain_text("costs its whole price while stopped")
    # No ssh line to a machine that does not answer; it comes back once the agent reports after the start.
    expect(page.locator("#connection")).to_contain_text("nothing answers on its SSH port")
    expect(page.locator("#ssh-command")).to_have_count(0)
    expect(page.locator("#stop-form")).to_have_count(0)
    expect(page.locator("#restart-form")).to_have_count(0)
    page.locator("#start-form summary").click()
    # axe-core (as tests/browser/test_every_page.py runs it): no serious or critical violation, a panel open.
    severe = [v["id"] for v in Axe().run(page).response["violations"] if v.get("impact") in {"serious", "critical"}]
    assert severe == []
    shoot(page, "order-actions-stopped")

    page.click("#start-confirm")
    expect(page.locator("#order-state")).to_have_text("starting")
    assert agent.heartbeat() == "running"  # the agent reports after the start: running again
    page.locator("#logs-refresh").click()
    expect(page.locator("#order-state")).to_have_text("running")
    page.reload()
    expect(page.locator("#ssh-command")).to_have_count(1)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING
    shoot(page, "order-actions-running-again")
