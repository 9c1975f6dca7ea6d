"""A seller sets a machine's price falls in the browser (issue 39): from the machines table to the machine's
page, a refusal on the field at fault, then the rule saved and read back as an example in the machine's prices;
no serious accessibility violation at a desktop's or a phone's width."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe

from marketplace.models import Organization
from marketplace.portal.services import machine_listing_create, provider_signup
from providers.community.pricing import PriceFallRule
from providers.models import Machine
from tests.browser.conftest import shoot, sign_in
from tests.hosts import LISTING

pytestmark = pytest.mark.django_db(transaction=True)


def _severe(page) -> list[str]:
    violations = Axe().run(page).response["violations"]
    return [f"{v['id']}: {v['help']}" for v in violations if v.get("impact") in {"serious", "critical"}]


@pytest.mark.parametrize(("width", "height"), [(1366, 900), (390, 844)])
def test_a_seller_sets_a_machines_price_falls_and_reads_what_they_do(browser, live_server, gpu_models, width, height):
    petra = provider_signup(username="petra", email="petra@petra.example", password="x",
                            organization_name="Petra GPU Cloud")  # fmt: skip
    organization = Organization.objects.get(name="Petra GPU Cloud")
    machine = machine_listing_create(
        organization=organization, name="ber-h100-1", listing={**LISTING, "min_gpus_per_lease": 1}
    ).machine
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        base = live_server.url
        sign_in(page, base, petra)
        page.goto(f"{base}/provider/machines")
        page.click("a.price-falls")
        page.wait_for_url(f"{base}/provider/machines/{machine.pk}/prices")
        assert "every GPU sells at $1.90, leased or idle" in page.inner_text("#falls-example")

        page.fill("[name=fragment_discount_pct]", "20")
        page.fill("[name=idle_after_hours]", "2")
        page.fill("[name=idle_step_pct]", "10")
        page.fill("[name=floor_pct]", "150")
        page.click("button[type=submit]")
        assert "floor_pct must be a percentage from 0 to 100" in page.inner_text("label.invalid")
        shoot(page, f"price-falls-{width}-refused")
        assert Machine.objects.get(pk=machine.pk).price_fall == PriceFallRule()

        page.fill("[name=floor_pct]", "50")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/provider/machines/{machine.pk}/prices")
        example = page.inner_text("#falls-example")
        assert "8 \u00d7 $1.90: a 3-GPU fragment sells at $1.52; after 2 h idle, \u221210 %/h to $0.95" in example
        assert "8 of 8 GPUs free" in page.inner_text("#falls-now")
        shoot(page, f"price-falls-{width}-saved")
        assert _severe(page) == []
        assert Machine.objects.get(pk=machine.pk).floor_pct == 50
    finally:
        context.close()
