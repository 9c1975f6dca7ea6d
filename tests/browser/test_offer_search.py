"""The offers page's one search in the browser: the controls write the query, the back button returns to the last
search, rows fold their zones, and on a 390 px phone each row is a card with money and GPU names whole."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)

# The widths the page must read well at: a common laptop and a common phone.
LAPTOP, PHONE = (1366, 900), (390, 844)


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def _wraps(page, selector: str) -> list[str]:
    """The texts of ``selector``'s elements whose text is laid out on more than one line."""
    return page.eval_on_selector_all(
        selector,
        """els => els.filter(e => {
             const range = document.createRange();
             range.selectNodeContents(e);
             const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.bottom)));
             return tops.size > 1;
           }).map(e => e.innerText)""",
    )


def test_the_controls_and_the_box_are_one_search_and_the_back_button_returns(page, live_server, alice, aws_account):
    base = live_server.url
    sign_in(page, base, alice)
    page.set_viewport_size({"width": LAPTOP[0], "height": LAPTOP[1]})

    # The controls write the query, which the address and the box then hold.
    page.goto(f"{base}/")
    page.select_option("select[name=gpu]", "T4")
    page.select_option("select[name=pricing]", "on_demand")
    page.click("#offer-search button[type=submit]")
    page.wait_for_url(f"{base}/?q=*")
    assert _query(page.url) == {"q": ["gpu=T4 pricing=on_demand"]}
    assert page.input_value("input[name=q]") == "gpu=T4 pricing=on_demand"
    rows = page.locator("#offers-table tbody tr")
    shoot(page, "offers-search-1366")
    assert rows.count() > 0 and all("T4" in text and "on-demand" in text for text in rows.all_inner_texts())
    assert page.locator("details.zones").count() > 0  # the sandbox lists T4s in several zones
    shoot(page, "offers-search-1366")

    # The box fills the controls it can; one it cannot express is held, not blanked.
    page.fill("input[name=q]", "gpu=T4 count=1 region=us-east-1")
    page.click("#offer-search button[type=submit]")
    page.wait_for_url(f"{base}/?q=gpu%3DT4+count%3D1*")
    assert page.input_value("select[name=gpu]") == "T4"
    assert page.input_value("input[name=region]") == "us-east-1"
    assert page.is_disabled("input[name=count]")
    assert "set in the search box: count=1" in page.inner_text("#offer-search")

    # Back returns to the controls' search, with its rows.
    page.go_back()
    page.wait_for_url(f"{base}/?q=gpu%3DT4+pricing%3Don_demand")
    assert page.input_value("input[name=q]") == "gpu=T4 pricing=on_demand"

    # A zone picker opens on the row and lists each zone's price.
    page.locator("details.zones summary").first.click()
    assert page.locator("details.zones[open] ul.zone-list li").count() >= 2

    # A refused term is pointed at, and no "no offers" claim is made.
    page.fill("input[name=q]", "gpu=T4 cuont>=1")
    page.click("#offer-search button[type=submit]")
    assert "unknown field 'cuont'" in page.inner_text("#query-error")
    assert page.locator("#no-results").count() == 0 and page.locator("#offers-table").count() == 0
    assert page.is_disabled("select[name=gpu]") and page.is_enabled("select[name=sort]")
    shoot(page, "offers-refused-1366")

    # An empty search names the terms to relax and links to each relaxed search.
    page.fill("input[name=q]", "gpu=T4 price<0.01")
    page.click("#offer-search button[type=submit]")
    assert "No offer for sale matches all of" in page.inner_text("#no-results")
    shoot(page, "offers-empty-1366")
    page.locator("#no-results a:has-text('search without')").first.click()
    page.locator("#offers-table tbody tr").first.wait_for()
    shoot(page, "offers-relaxed-1366")


def test_on_a_phone_offers_are_cards_and_nothing_wraps_mid_word(page, live_server, alice, aws_account):
    sign_in(page, live_server.url, alice)
    page.set_viewport_size({"width": PHONE[0], "height": PHONE[1]})

    page.goto(f"{live_server.url}/?q=count>=1")

    # Each row is a card as wide as the screen (tests/browser/test_offer_list.py checks the cards' layout): the
    # page does not scroll sideways, and money, GPU names and instance types stay whole.
    shoot(page, "offers-phone-390")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE[0] + 1
    for selector in ("#offers-table td.money", "#offers-table .gpu", "#offers-table code"):
        assert _wraps(page, selector) == [], selector
