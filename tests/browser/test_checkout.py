"""A buyer tops up in the browser: from the Billing page to the Stripe sandbox's hosted Checkout page, where she
types a card (Stripe's test numbers, https://docs.stripe.com/testing), and back to Billing, credited."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from marketplace.billing.book import credit_available
from marketplace.models.billing import TopUp, TopUpState
from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)
NEXT_YEAR = f"{(dt.date.today().year + 1) % 100:02d}"


def _to_the_card_page(page, live_server, alice, stripe_sandbox, amount: str) -> None:
    sign_in(page, live_server.url, alice)
    page.goto(f"{live_server.url}/billing/")
    page.fill("#checkout-form input[name=amount]", amount)
    page.get_by_role("button", name="Top up with a card").click()
    page.wait_for_url(re.compile(rf"^{re.escape(stripe_sandbox.url)}/_sandbox/stripe/checkout/cs_test_\w+$"))


def _type_card(page, number: str, expiry: str) -> None:
    """Type as a person does, key by key, into the fields found by their labels."""
    typed = [("Card number", number), ("Expiry (MM / YY)", expiry), ("CVC", "123"), ("Name on card", "Alice Buyer")]
    for label, text in typed:
        field = page.get_by_label(label)
        field.fill("")
        field.press_sequentially(text)


def test_a_buyer_types_a_card_on_the_hosted_page_and_comes_back_credited(
    page, live_server, alice, ready_to_pay, stripe_sandbox
):
    _to_the_card_page(page, live_server, alice, stripe_sandbox, "50.00")
    assert page.get_by_role("button", name="Pay $50.00").is_visible()
    _type_card(page, "4242 4242 4242 4242", f"12 / {NEXT_YEAR}")
    shoot(page, "checkout-hosted-page")

    page.get_by_role("button", name="Pay $50.00").click()

    page.wait_for_url(f"{live_server.url}/billing/")
    assert "Added 50.00 USD to your credit." in page.locator("body").inner_text()
    assert page.locator("#credit-available").inner_text() == "50.00 USD"
    shoot(page, "checkout-billing-credited")
    assert TopUp.objects.get().state == TopUpState.SUCCEEDED and credit_available(ready_to_pay) == 5000


def test_a_card_that_asks_for_3d_secure_is_credited_after_the_challenge(
    page, live_server, alice, ready_to_pay, stripe_sandbox
):
    _to_the_card_page(page, live_server, alice, stripe_sandbox, "25.00")
    # A past expiry is refused on the page, next to its field, before any charge.
    _type_card(page, "4000 0027 6000 3184", "01 / 20")
    page.get_by_role("button", name="Pay $25.00").click()
    assert page.locator("#expiry-error").inner_text() == "Your card's expiration date is in the past."
    shoot(page, "checkout-hosted-page-error")
    _type_card(page, "4000 0027 6000 3184", f"12 / {NEXT_YEAR}")

    page.get_by_role("button", name="Pay $25.00").click()
    page.get_by_role("button", name="Complete authentication").wait_for()
    shoot(page, "checkout-3d-secure")
    page.get_by_role("button", name="Complete authentication").click()

    page.wait_for_url(f"{live_server.url}/billing/")
    assert "Added 25.00 USD to your credit." in page.locator("body").inner_text()
    assert credit_available(ready_to_pay) == 2500
