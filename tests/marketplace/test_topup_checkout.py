"""Top-ups paid on Stripe's hosted Checkout page (issue 35): the Billing page and the API open the page, the buyer
pays on the Stripe sandbox's page (driven here as a browser would, form posts and 303s), comes back, and is
credited once, whichever of the return and the webhook comes first.

Stripe behaviour relied on: the session and its PaymentIntent (https://docs.stripe.com/api/checkout/sessions/object),
``payment_intent_data.metadata`` copied to the PaymentIntent and ``{CHECKOUT_SESSION_ID}`` in ``success_url``
(https://docs.stripe.com/api/checkout/sessions/create, https://docs.stripe.com/payments/checkout/custom-success-page),
the hosted page taking another card after a decline (https://docs.stripe.com/payments/checkout), test cards
(https://docs.stripe.com/testing).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import requests
from django.test import Client
from django.utils import timezone

from marketplace.billing.book import credit_available
from marketplace.billing.payments import topups_settle_stale
from marketplace.models import BookEntry
from marketplace.models.billing import BillingProfile, TopUp, TopUpState

pytestmark = pytest.mark.django_db
GOOD = {"number": "4242 4242 4242 4242", "expiry": "12 / 39", "cvc": "123", "name": "Alice Buyer"}


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def _open_page(browser: Client, amount: str = "50.00", nonce: str = "n1", **extra: str) -> tuple[TopUp, str]:
    """Alice asks the Billing page for a top-up; she is sent (303) to the hosted page."""
    sent = browser.post("/billing/", {"action": "checkout", "amount": amount, "nonce": nonce, **extra})
    topup = TopUp.objects.get(idempotency_key=f"web:{nonce}")
    assert sent.status_code == 303 and sent["Location"] == topup.next_action_url
    assert topup.state == TopUpState.REQUIRES_ACTION and topup.checkout_session.startswith("cs_test_")
    return topup, sent["Location"]


def _pay(page_url: str, **card: str) -> requests.Response:
    return requests.post(page_url, data={**GOOD, **card}, allow_redirects=False, timeout=5)


def _come_back(browser: Client, location: str) -> str:
    """Follow Stripe's redirect to the broker and read the message the Billing page shows."""
    assert location.startswith("http://testserver/billing/topups/checkout-return?session_id=cs_test_")
    landed = browser.get(location.removeprefix("http://testserver"))
    assert landed.status_code == 302 and landed["Location"] == "/billing/"
    return browser.get("/billing/").content.decode()


def _deliver(browser: Client, sandbox: Any) -> list[str]:
    return [
        browser.post(
            "/api/v1/stripe/webhook",
            data=event["payload"],
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE=event["signature"],
        ).json()["outcome"]
        for event in sandbox.pending_events()
    ]


def test_the_billing_page_sends_the_buyer_to_checkout_and_the_return_credits_once(
    browser, ready_to_pay, stripe_sandbox
):
    page = browser.get("/billing/")
    assert "Top up with a card" in page.content.decode()
    # The form's answer may lead to the hosted page's origin (the sandbox's here), and to no other site.
    assert f"form-action 'self' {stripe_sandbox.url}" in page["Content-Security-Policy"]
    topup, page_url = _open_page(browser)
    session = stripe_sandbox.get(topup.checkout_session)
    assert session["metadata"] == {"topup": str(topup.public_id), "organization": str(ready_to_pay.pk)}
    assert session["amount_total"] == 5000 and session["expires_at"] == int(topup.created_at.timestamp()) + 3600

    paid = _pay(page_url)
    shown = _come_back(browser, paid.headers["Location"])

    assert "Added 50.00 USD to your credit." in shown
    topup.refresh_from_db()
    assert (topup.state, topup.next_action_url) == (TopUpState.SUCCEEDED, "")
    assert topup.payment_intent == stripe_sandbox.get(topup.checkout_session)["payment_intent"]
    assert credit_available(ready_to_pay) == 5000
    # Stripe's events arrive after: the PaymentIntent's is the same payment, credited already.
    outcomes = _deliver(browser, stripe_sandbox)
    assert outcomes == [
        f"top-up {topup.public_id}: succeeded",
        "ignored: the broker does not handle checkout.session.completed events",
    ]
    assert BookEntry.objects.filter(kind="topup").count() == 1 and credit_available(ready_to_pay) == 5000
    # Coming back twice (a reload) credits nothing more.
    _come_back(browser, paid.headers["Location"])
    assert BookEntry.objects.filter(kind="topup").count() == 1
    assert BillingProfile.objects.get(organization=ready_to_pay).payment_method == ""


def test_the_webhook_first_then_the_return_credits_once_and_saves_the_card(browser, ready_to_pay, stripe_sandbox):
    topup, page_url = _open_page(browser, save_card="on")
    paid = _pay(page_url)

    _deliver(browser, stripe_sandbox)
    topup.refresh_from_db()
    assert topup.state == TopUpState.SUCCEEDED and credit_available(ready_to_pay) == 5000
    shown = _come_back(browser, paid.headers["Location"])

    assert "Added 50.00 USD to your credit." in shown
    assert BookEntry.objects.filter(kind="topup").count() == 1
    intent = stripe_sandbox.get(topup.payment_intent)
    assert intent["setup_future_usage"] == "off_session"
    assert BillingProfile.objects.get(organization=ready_to_pay).payment_method == intent["payment_method"]


def test_a_decline_leaves_the_top_up_waiting_and_another_card_pays(browser, ready_to_pay, stripe_sandbox):
    topup, page_url = _open_page(browser)

    declined = _pay(page_url, number="4000 0000 0000 0002")
    assert declined.status_code == 402 and "Your card was declined." in declined.text
    _deliver(browser, stripe_sandbox)  # payment_intent.payment_failed: the page still takes another card
    topup.refresh_from_db()
    assert (topup.state, topup.next_action_url) == (TopUpState.REQUIRES_ACTION, page_url)
    assert not BookEntry.objects.filter(kind="topup").exists()
    shown = _come_back(browser, _pay(page_url).headers["Location"])

    assert "Added 50.00 USD to your credit." in shown
    assert credit_available(ready_to_pay) == 5000


def test_3d_secure_on_the_page_then_the_return_credits(browser, ready_to_pay, stripe_sandbox):
    _, page_url = _open_page(browser, amount="25.00")

    challenge = _pay(page_url, number="4000 0027 6000 3184")
    back = requests.post(challenge.headers["Location"], data={"outcome": "approve"}, allow_redirects=False, timeout=5)
    onward = requests.get(back.headers["Location"], allow_redirects=False, timeout=5)

    assert "Added 25.00 USD to your credit." in _come_back(browser, onward.headers["Location"])
    assert credit_available(ready_to_pay) == 2500


def test_cancel_says_nothing_was_charged_and_the_expired_session_fails_the_top_up(
    browser, ready_to_pay, stripe_sandbox
):
    topup, _ = _open_page(browser)
    cancel_url = stripe_sandbox.get(topup.checkout_session)["cancel_url"]
    assert cancel_url == "http://testserver/billing/?checkout=cancelled"

    shown = browser.get(cancel_url.removeprefix("http://testserver")).content.decode()

    assert "Payment not completed: you left the card page, and nothing was charged." in shown
    assert "Finish paying on the card page" in shown  # until the session ends, the page still takes a card
    requests.post(
        f"{stripe_sandbox.url}/v1/checkout/sessions/{topup.checkout_session}/expire",
        auth=("sk_test_sandbox", ""),
        timeout=5,
    ).raise_for_status()
    counts = topups_settle_stale(now=timezone.now() + dt.timedelta(minutes=3))
    topup.refresh_from_db()
    assert counts == {"refreshed": 1, "expired": 0}
    assert (topup.state, topup.failure) == (TopUpState.FAILED, "the card page expired before a payment was made")
    assert not BookEntry.objects.filter(kind="topup").exists()


def test_the_api_answers_the_checkout_url_once_per_key(alice, ready_to_pay, stripe_sandbox):
    api = Client()
    api.force_login(alice)

    def post(body: dict[str, Any], key: str = "api-1") -> Any:
        return api.post(
            "/api/v1/billing/topups", data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
        )

    created = post({"amount": "40.00", "checkout": True})
    replayed = post({"amount": "40.00", "checkout": True})
    both = post({"amount": "40.00", "checkout": True, "payment_method": "pm_card_visa"}, key="api-2")

    assert created.status_code == 201 and replayed.status_code == 200
    body = created.json()
    assert body["state"] == "requires_action" and body["amount"] == "40.00"
    assert body["checkout_url"].startswith(f"{stripe_sandbox.url}/_sandbox/stripe/checkout/cs_test_")
    assert replayed.json()["checkout_url"] == body["checkout_url"] and replayed["Idempotent-Replayed"] == "true"
    assert both.status_code == 400
    assert TopUp.objects.count() == 1 and len(stripe_sandbox.get_objects("checkout.session")) == 1
    paid = _pay(body["checkout_url"])
    assert paid.status_code == 303
    _deliver(api, stripe_sandbox)
    detail = api.get(f"/api/v1/billing/topups/{body['id']}").json()
    assert (detail["state"], detail["checkout_url"]) == ("succeeded", None)


def test_a_stranger_cannot_land_on_someone_elses_return(browser, charlie, ready_to_pay, stripe_sandbox):
    topup, page_url = _open_page(browser)
    location = _pay(page_url).headers["Location"].removeprefix("http://testserver")
    stranger = Client()
    stranger.force_login(charlie)

    assert stranger.get(location).status_code == 404
    assert stranger.get("/billing/topups/checkout-return?session_id=../../v1").status_code == 404
    topup.refresh_from_db()
    assert topup.state == TopUpState.REQUIRES_ACTION and not BookEntry.objects.filter(kind="topup").exists()
