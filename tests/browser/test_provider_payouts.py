"""A provider sets up payouts in one step in the browser: one button on the Payouts page goes straight to Stripe's
onboarding (the Stripe sandbox's page), which sends the provider back verified. The site's content security policy
lets that form's answer lead to Stripe and nowhere else; Chromium enforces form-action on the redirect too
(https://developer.mozilla.org/en-US/docs/Web/HTTP/Reference/Headers/Content-Security-Policy/form-action)."""

from __future__ import annotations

import re

import pytest

from marketplace.billing.book import Line, book_account, book_post
from marketplace.models import BookAccountKind, ConnectAccount
from marketplace.portal.services import BusinessDetails, provider_details_update, provider_signup
from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_provider_sets_up_payouts_with_one_button_and_comes_back_verified(page, live_server, stripe_sandbox):
    petra = provider_signup(
        username="petra", email="petra@petra.example", password="x-Unused-9f3", organization_name="Petra GPU Cloud"
    )
    org = petra.memberships.get().organization
    provider_details_update(
        organization=org,
        details=BusinessDetails(
            legal_name="Petra GPU Cloud Ltd", country="DE", registered_address="1 Main Street",
            tax_id="DE136695976", contact_email="ops@petra.example",
        ),
    )  # fmt: skip
    book_post(
        kind="order.settled",
        key="test:petra:earned",
        lines=[
            Line(book_account(kind=BookAccountKind.REVENUE, currency="USD"), 500),
            Line(book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD", organization=org), -500),
        ],
    )
    sign_in(page, live_server.url, petra)
    page.goto(f"{live_server.url}/provider/payouts")
    assert "The minimum payout is 10.00 USD: 5.00 USD more to go." in page.locator("#minimum").inner_text()
    assert page.get_by_role("button", name="Pay out now").is_disabled()
    shoot(page, "payouts-before-onboarding")

    page.get_by_role("button", name="Set up payouts with Stripe").click()

    page.wait_for_url(re.compile(rf"^{re.escape(stripe_sandbox.url)}/_sandbox/stripe/onboarding/acct_\w+"))
    page.get_by_role("button", name="Submit and verify").click()
    page.wait_for_url(f"{live_server.url}/provider/payouts")
    assert "payouts are enabled" in page.locator("body").inner_text()
    assert ConnectAccount.objects.get(organization=org).payouts_enabled
    shoot(page, "payouts-verified")
