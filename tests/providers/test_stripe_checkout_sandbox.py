"""The Stripe sandbox's Checkout: sessions through the official SDK, and its hosted page driven as a browser would
(form posts, 303 redirects).

Stripe behaviour relied on:
- The session object (id cs_test_..., object "checkout.session", url, status open/complete/expired, payment_status
  unpaid/paid, payment_intent, amount_total, expires_at): https://docs.stripe.com/api/checkout/sessions/object
- Create (mode, line_items[].price_data, customer, success_url, cancel_url, payment_intent_data.metadata and
  setup_future_usage, expires_at 30 minutes to 24 hours ahead): https://docs.stripe.com/api/checkout/sessions/create
- Expire (only an open session): https://docs.stripe.com/api/checkout/sessions/expire
- success_url's {CHECKOUT_SESSION_ID}: https://docs.stripe.com/payments/checkout/custom-success-page
- The hosted page takes another card after a decline, and runs 3-D Secure: https://docs.stripe.com/payments/checkout
- Test cards 4242 4242 4242 4242, 4000 0000 0000 0002 (decline), 4000 0027 6000 3184 (3-D Secure):
  https://docs.stripe.com/testing
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import stripe

from sandboxes.stripe.app import DEFAULT_SECRET_KEY, StripeSandbox
from tests.providers.test_stripe_sandbox import start_sandbox

SUCCESS = "https://broker.example/billing/return?session_id={CHECKOUT_SESSION_ID}"
CANCEL = "https://broker.example/billing/?checkout=cancelled"
GOOD = {"number": "4242 4242 4242 4242", "expiry": "12 / 39", "cvc": "123", "name": "Alice Buyer"}


@pytest.fixture(scope="module")
def server() -> Iterator[StripeSandbox]:
    sandbox = start_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(server: StripeSandbox) -> Iterator[StripeSandbox]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture
def client(sandbox: StripeSandbox) -> stripe.StripeClient:
    return stripe.StripeClient(DEFAULT_SECRET_KEY, base_addresses={"api": sandbox.url})


def _session(client: stripe.StripeClient, **extra: Any) -> Any:
    customer = client.v1.customers.create({"email": "alice@buyer.example"})
    params: Any = {
        "mode": "payment",
        "customer": customer.id,
        "line_items": [
            {"quantity": 1, "price_data": {"currency": "usd", "unit_amount": 5000, "product_data": {"name": "Credit"}}}
        ],
        "success_url": SUCCESS,
        "cancel_url": CANCEL,
        "metadata": {"topup": "t-1"},
        "payment_intent_data": {"metadata": {"topup": "t-1"}},
        **extra,
    }
    return client.v1.checkout.sessions.create(params)


def _pay(url: str, **card: str) -> requests.Response:
    return requests.post(url, data={**GOOD, **card}, allow_redirects=False, timeout=5)


def test_a_session_is_created_open_unpaid_with_its_page_on_the_sandbox(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    before = int(time.time())
    session = _session(client)

    assert session.id.startswith("cs_test_") and session.object == "checkout.session"
    assert (session.status, session.payment_status, session.mode) == ("open", "unpaid", "payment")
    assert (session.amount_total, session.currency, session.payment_intent) == (5000, "usd", None)
    assert (session.success_url, session.cancel_url, session.metadata.to_dict()) == (SUCCESS, CANCEL, {"topup": "t-1"})
    assert session.url == f"{sandbox.url}/_sandbox/stripe/checkout/{session.id}"
    assert before + 24 * 3600 <= session.expires_at <= int(time.time()) + 24 * 3600
    assert client.v1.checkout.sessions.retrieve(session.id).to_dict() == session.to_dict()
    assert [s.id for s in client.v1.checkout.sessions.list({"customer": session.customer}).data] == [session.id]
    page = requests.get(session.url, timeout=5)
    assert page.status_code == 200 and "Pay $50.00" in page.text
    for field in ("number", "expiry", "cvc", "name"):
        assert f'<label for="{field}">' in page.text and f'id="{field}"' in page.text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"shipping_options": "x"}, "Received unknown parameter: shipping_options"),
        ({"payment_intent_data": {"capture_method": "manual"}}, "payment_intent_data[capture_method]"),
        ({"mode": "subscription"}, "Invalid mode"),
        (
            {
                "line_items": [
                    {"quantity": 1, "price_data": {"currency": "usd", "unit_amount": 10, "product_data": {"name": "x"}}}
                ]
            },
            "at least 0.50 usd",
        ),
        ({"expires_at": int(time.time()) + 60}, "between 30 minutes and 24 hours"),
        ({"success_url": "javascript:alert(1)"}, "Not a valid URL"),
    ],
)
def test_create_is_as_strict_as_stripe(client: stripe.StripeClient, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(stripe.InvalidRequestError) as refused:
        _session(client, **extra)

    assert message in str(refused.value.user_message)
    assert client.v1.checkout.sessions.list().data == []


def test_paying_completes_the_session_and_sends_the_buyer_to_success_url(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    session = _session(client, payment_intent_data={"metadata": {"topup": "t-1"}, "setup_future_usage": "off_session"})

    answer = _pay(session.url)

    assert answer.status_code == 303
    assert answer.headers["Location"] == SUCCESS.replace("{CHECKOUT_SESSION_ID}", session.id)
    done = client.v1.checkout.sessions.retrieve(session.id)
    assert (done.status, done.payment_status, done.url) == ("complete", "paid", None)
    assert done.customer_details.name == "Alice Buyer"
    intent = client.v1.payment_intents.retrieve(done.payment_intent)
    assert (intent.status, intent.amount, intent.customer) == ("succeeded", 5000, session.customer)
    assert (intent.metadata.to_dict(), intent.setup_future_usage) == ({"topup": "t-1"}, "off_session")
    assert intent.payment_method.startswith("pm_")
    events = sandbox.pending_events()
    assert [e["type"] for e in events] == ["payment_intent.succeeded", "checkout.session.completed"]
    # The card the page made can be charged again later, off-session, as a saved card is.
    again = client.v1.payment_intents.create(
        {
            "amount": 900,
            "currency": "usd",
            "payment_method": intent.payment_method,
            "confirm": True,
            "off_session": True,
        }
    )
    assert again.status == "succeeded"
    # A paid session's page sends the buyer on instead of taking a second card.
    assert requests.get(session.url, allow_redirects=False, timeout=5).status_code == 303
    assert _pay(session.url).status_code == 303 and len(client.v1.payment_intents.list().data) == 2


@pytest.mark.parametrize(
    ("card", "field", "message"),
    [
        ({"number": "4242 4242 4242 4241"}, "number", "Your card number is invalid."),
        ({"number": "4242 4242"}, "number", "Your card number is incomplete."),
        ({"expiry": "01 / 20"}, "expiry", "Your card&#x27;s expiration date is in the past."),
        ({"expiry": "13 / 39"}, "expiry", "Your card&#x27;s expiration month is invalid."),
        ({"cvc": "12"}, "cvc", "Your card&#x27;s security code is incomplete."),
        ({"name": "  "}, "name", "Enter the name on the card."),
    ],
)
def test_the_page_refuses_a_malformed_card_before_any_charge(
    client: stripe.StripeClient, sandbox: StripeSandbox, card: dict[str, str], field: str, message: str
) -> None:
    session = _session(client)

    answer = _pay(session.url, **card)

    assert answer.status_code == 400
    assert message in answer.text and f'aria-describedby="{field}-error"' in answer.text
    assert client.v1.checkout.sessions.retrieve(session.id).payment_intent is None
    assert sandbox.pending_events() == []


def test_a_decline_shows_on_the_page_and_another_card_pays(client: stripe.StripeClient, sandbox: StripeSandbox) -> None:
    session = _session(client)

    declined = _pay(session.url, number="4000 0000 0000 0002")

    assert (
        declined.status_code == 402 and "Your card was declined." in declined.text and 'role="alert"' in declined.text
    )
    after_decline = client.v1.checkout.sessions.retrieve(session.id)
    assert (after_decline.status, after_decline.payment_status) == ("open", "unpaid")
    assert client.v1.payment_intents.retrieve(after_decline.payment_intent).status == "requires_payment_method"
    assert _pay(session.url).status_code == 303
    done = client.v1.checkout.sessions.retrieve(session.id)
    assert (done.status, done.payment_intent) == ("complete", after_decline.payment_intent)
    types = [e["type"] for e in sandbox.pending_events()]
    assert types == ["payment_intent.payment_failed", "payment_intent.succeeded", "checkout.session.completed"]


def test_3d_secure_then_back_to_the_page_which_sends_the_buyer_on(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    session = _session(client)

    challenge = _pay(session.url, number="4000 0027 6000 3184")
    assert challenge.status_code == 303 and "/_sandbox/stripe/authenticate/pi_" in challenge.headers["Location"]
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"
    back = requests.post(challenge.headers["Location"], data={"outcome": "approve"}, allow_redirects=False, timeout=5)
    onward = requests.get(back.headers["Location"], allow_redirects=False, timeout=5)

    assert onward.status_code == 303
    assert onward.headers["Location"] == SUCCESS.replace("{CHECKOUT_SESSION_ID}", session.id)
    assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "paid"


def test_failed_3d_secure_shows_why_and_the_session_stays_open(client: stripe.StripeClient) -> None:
    session = _session(client)
    challenge = _pay(session.url, number="4000 0027 6000 3184")

    back = requests.post(challenge.headers["Location"], data={"outcome": "fail"}, allow_redirects=False, timeout=5)
    page = requests.get(back.headers["Location"], allow_redirects=False, timeout=5)

    assert page.status_code == 402 and "failed authentication" in page.text
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"


def test_an_expired_session_takes_no_card(client: stripe.StripeClient, sandbox: StripeSandbox) -> None:
    session = _session(client)

    expired = client.v1.checkout.sessions.expire(session.id)

    assert (expired.status, expired.url) == ("expired", None)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.checkout.sessions.expire(session.id)
    page = _pay(session.url)
    assert page.status_code == 200 and "This Checkout Session has expired." in page.text
    assert client.v1.payment_intents.list().data == []
    assert [e["type"] for e in sandbox.pending_events()] == ["checkout.session.expired"]


def test_an_oversized_page_form_is_refused_unread(client: stripe.StripeClient) -> None:
    session = _session(client)

    answer = requests.post(session.url, data={**GOOD, "name": "x" * 20_000}, timeout=5)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    chunked = requests.post(session.url, data=iter([b"name=", b"x" * 20_000]), headers=form, timeout=5)

    assert answer.status_code == 413
    # A chunked body is read at most to the bound (413), or not at all by a server without chunked input (400).
    assert chunked.status_code in (400, 413)
    assert client.v1.checkout.sessions.retrieve(session.id).payment_intent is None
