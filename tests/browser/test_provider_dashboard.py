"""The provider dashboard in the browser: charts of GPUs rented and idle, revenue by day, leases with their GPU
indexes, the minimum bids and the month's payouts, screenshotted for a person to look at."""

from __future__ import annotations

import pytest
from django.utils import timezone

from marketplace.models import Organization
from marketplace.portal.services import provider_signup
from tests.browser.conftest import shoot, sign_in
from tests.portal.test_dashboard import build_business

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_provider_sees_its_business_on_the_dashboard(page, live_server, gpu_models, acme, alice):
    petra = provider_signup(
        username="petra", email="petra@petra.example", password="unused-9-horse", organization_name="Petra GPU Cloud"
    )
    provider_signup(
        username="quentin", email="quentin@q.example", password="unused-9-horse", organization_name="Q Compute"
    )
    business = build_business(
        Organization.objects.get(name="Petra GPU Cloud"), Organization.objects.get(name="Q Compute"),
        acme, alice, timezone.now(),
    )  # fmt: skip
    sign_in(page, live_server.url, petra)

    page.goto(f"{live_server.url}/provider/dashboard")

    assert page.locator("nav.subnav a.active").inner_text() == "Dashboard"
    # Over 24 hours and 7 days, each drawn wide and narrow: only the wide one shows on a desktop screen.
    assert page.locator("#gpus svg.chart").count() == 4
    assert page.locator("#gpus svg.chart.wide").evaluate_all(
        "s => s.map(e => e.getBoundingClientRect().width > 500)"
    ) == [True, True]
    assert page.locator("#gpus svg.chart.narrow").evaluate_all("s => s.map(e => e.getBoundingClientRect().width)") == [
        0,
        0,
    ]
    assert "GPUs" in page.locator("#gpus svg.chart.wide").first.text_content()
    running = page.locator(f'tr[data-order="{str(business["running"].public_id)[:8]}"] td.gpus')
    assert running.inner_text() == "GPU 2, GPU 3, GPU 4, GPU 5"
    assert str(business["q_busy"].public_id)[:8] not in page.content()
    shoot(page, "provider-dashboard")
