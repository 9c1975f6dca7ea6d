"""The server-drawn charts in Chromium, under the site's Content-Security-Policy: the price history and an order's
telemetry fill their boxes on a desktop and on a phone without widening the page, and pointing at a price shows
what it was and since when."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.models import Offer, PricePoint
from tests.browser.conftest import shoot, sign_in
from tests.marketplace.test_storefront_instance import farm, running

__all__ = ["farm", "running"]  # the fixtures, imported to be used here

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(("width", "variant"), [(1366, "wide"), (390, "narrow")])
def test_the_price_chart_fits_the_screen_and_names_a_price_under_the_pointer(
    browser, live_server, aws_account, width, variant
):
    spot = aws_account.offers.filter(instance_type="g4dn.xlarge", region="us-east-1", pricing_model="spot").first()
    now = timezone.now()
    changed = now - dt.timedelta(days=3)
    PricePoint.objects.create(offer=spot, observed_at=now - dt.timedelta(days=6), price=Decimal("0.3100"),
                              currency="USD", price_usd=Decimal("0.3100"))  # fmt: skip
    Offer.objects.filter(pk=spot.pk).update(price_since=changed)
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    csp_reports: list[str] = []
    page.on("console", lambda message: csp_reports.append(message.text) if "Content Security" in message.text else None)

    page.goto(f"{live_server.url}/offers/{spot.pk}/prices?days=7")

    shown = page.locator(f"svg.chart.{variant}")
    box = shown.bounding_box()
    card = page.locator("#price-chart").bounding_box()
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows sideways
    assert box["width"] >= card["width"] - 1 and box["height"] > 200
    assert page.locator("svg.chart").evaluate_all("s => s.filter(e => e.getBoundingClientRect().width > 0).length") == 1
    # The band over the price in force since the change, from its middle: what the pointer lands on carries the tip.
    tip = f"{spot.zone} spot: ${spot.price_usd:.4f}/h from {changed:%Y-%m-%d %H:%M} UTC"
    band = shown.locator("g.hover rect", has=page.locator(f"title:text-is('{tip}')"))
    middle = band.bounding_box()
    under = page.evaluate(
        "([x, y]) => { const e = document.elementFromPoint(x, y); return e && e.querySelector('title')?.textContent; }",
        [middle["x"] + middle["width"] / 2, middle["y"] + middle["height"] / 2],
    )
    assert under == tip
    assert csp_reports == []
    shoot(page, f"storefront-prices-{width}")
    context.close()


@pytest.mark.parametrize("width", [1366, 390])
def test_the_order_telemetry_charts_share_the_row_and_stack_on_a_phone(
    browser, live_server, gpu_models, running, alice, width
):
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    sign_in(page, live_server.url, alice)

    page.goto(f"{live_server.url}/orders/{running.public_id}/")

    boxes = page.locator("#telemetry svg.chart").evaluate_all(
        "s => s.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.right, r.top]; })"
    )
    section = page.locator("#telemetry").bounding_box()
    # (The order page's wide tables may scroll sideways on a phone; the charts stay inside the screen.)
    assert len(boxes) == 3 and all(right <= width for _, right, _ in boxes)
    assert all(section["x"] <= left and right <= section["x"] + section["width"] for left, right, _ in boxes)
    tops = {round(top) for _, _, top in boxes}
    assert len(tops) == (1 if width > 1000 else 3)  # one row of three, or one above the other
    texts = page.locator("#telemetry svg.chart").evaluate_all("s => s.map(e => e.textContent)")
    assert "Utilization (%)" in texts[0] and "Temperature (°C)" in texts[1] and "Power (W)" in texts[2]
    assert "rated 5600 W" in texts[2] and "Time (UTC)" in texts[0]
    page.locator("#telemetry").screenshot(path=str(shoot(page, f"storefront-order-telemetry-{width}")))
    context.close()
