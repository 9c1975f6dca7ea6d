"""The offer list a renter scans (issue 36): every column a renter compares, no sideways scroll on a 1366 px
laptop with every Order button in view, and on a 390 px phone one card per offer under a menu that leaves
most of the first screen to the offers. Screenshots of both widths go to test-artifacts/; with
BROKER_UPDATE_SCREENSHOTS=1 they also replace docs/screenshots/offers-1366.png and offers-390.png, which the
docs show (a plain run leaves the tracked files alone)."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)

LAPTOP, PHONE = (1366, 900), (390, 844)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
COLUMNS = ["Free GPUs", "GPU mem", "vCPU", "RAM", "Disk", "Net", "Reliability", "USD/h", "FP16 TFLOPS per USD/h"]


@pytest.fixture
def machines(fleet, gpu_models):
    """Two of Helga's machines on sale beside the AWS sandbox's offers: one whole, one in leases of four."""
    from marketplace.catalog.services import offers_sync
    from tests.hosts import LISTING, start_hosts, stop_hosts

    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False)
    agents += start_hosts(
        fleet, ["fra-h100-2"], lease_threads=False,
        listing={**LISTING, "min_gpus_per_lease": 4, "min_bid_per_gpu_hour": Decimal("0.9000")},
    )  # fmt: skip
    assert offers_sync(account_id=fleet.pk).ok
    yield
    stop_hosts(agents)


def _keep(page, name: str) -> None:
    """The window as a person first sees it, for the docs, when asked to update them."""
    if os.environ.get("BROKER_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS / f"{name}.png"))


def _serious(page) -> list[str]:
    violations = Axe().run(page).response["violations"]
    return [f"{v['id']}: {v['help']}" for v in violations if v.get("impact") in {"serious", "critical"}]


def test_at_1366_every_column_fits_with_no_sideways_scroll(page, live_server, alice, aws_account, machines):
    sign_in(page, live_server.url, alice)
    page.set_viewport_size({"width": LAPTOP[0], "height": LAPTOP[1]})
    # Sorted by what a TFLOP-hour costs, so the machines' rows (seller, free GPUs, disk) come first.
    page.goto(f"{live_server.url}/?q=count>=1&sort=tflops")

    rows = page.locator("#offers-table tbody tr")
    assert rows.count() >= 30
    head = page.inner_text("#offers-table thead")
    assert all(column in head for column in COLUMNS), head
    assert "Helga's GPU Farm" in page.inner_text("#offers-table tbody")
    width, client = page.evaluate("[document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]")
    assert width <= client
    table = page.locator("#offers-table").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert table[0] <= table[1]
    # Every row's Order button lies wholly inside the window's width.
    edges = page.eval_on_selector_all(
        "#offers-table td.order .button",
        "els => els.map(e => [e.getBoundingClientRect().left, e.getBoundingClientRect().right])",
    )
    assert len(edges) == rows.count() and all(0 <= left and right <= LAPTOP[0] for left, right in edges)
    assert _serious(page) == []
    _keep(page, "offers-1366")
    shoot(page, "offers-list-1366")


def test_on_a_390_phone_offers_are_cards_under_a_short_menu(page, live_server, alice, aws_account, machines):
    sign_in(page, live_server.url, alice)
    page.set_viewport_size({"width": PHONE[0], "height": PHONE[1]})
    page.goto(f"{live_server.url}/?q=count>=1&sort=tflops")

    width, client = page.evaluate("[document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]")
    assert width <= client
    # The site's menu takes at most a sixth of the first screen (a third is the most the issue allows).
    menu = page.locator("header.top").bounding_box()
    assert menu["height"] <= PHONE[1] / 6, menu
    # Each offer is a card: its cells stacked in a block as wide as the screen, each labelled, none scrolling.
    first = page.locator("#offers-table tbody tr").first
    assert first.evaluate("e => getComputedStyle(e).display") != "table-row"
    box = first.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE[0]
    assert page.locator("#offers-table thead").evaluate("e => e.getBoundingClientRect().height") <= 1
    labels = first.locator("td[data-label]").evaluate_all(
        "els => els.map(e => getComputedStyle(e, '::before').content)"
    )
    assert '"Free GPUs"' in labels and '"USD/h"' in labels
    scrolls = page.eval_on_selector_all(
        "#offers-table, #offers-table table, #offers-table tbody, #offers-table tr",
        "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).length",
    )
    assert scrolls == 0
    order = first.locator("td.order .button").bounding_box()
    assert order["x"] >= 0 and order["x"] + order["width"] <= PHONE[0]
    assert _serious(page) == []
    _keep(page, "offers-390")
    shoot(page, "offers-list-390")
