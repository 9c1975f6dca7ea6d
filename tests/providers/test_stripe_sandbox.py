"""The Stripe sandbox itself, driven by the official ``stripe`` SDK (stripe-python), raw HTTP and its control API.

Wire details, from Stripe's documentation:
- Authentication with a secret key as a Bearer token, 401 otherwise: https://docs.stripe.com/api/authentication
- Errors ``{"error": {"type", "code", "decline_code", "message", "param", "payment_intent"}}`` and their HTTP
  statuses (402 card errors, 400 invalid requests, 401, 404, 429, 5xx): https://docs.stripe.com/api/errors
- Error codes (card_declined, amount_too_large, charge_already_refunded, balance_insufficient,
  payment_intent_authentication_failure, insufficient_capabilities_for_transfer): https://docs.stripe.com/error-codes
- Decline codes (generic_decline, insufficient_funds, authentication_required): https://docs.stripe.com/declines/codes
- Test PaymentMethods pm_card_visa, pm_card_chargeDeclined, pm_card_chargeDeclinedInsufficientFunds,
  pm_card_authenticationRequired: https://docs.stripe.com/testing
- PaymentIntent create/confirm, statuses, next_action.redirect_to_url {url, return_url}, latest_charge:
  https://docs.stripe.com/api/payment_intents/create and https://docs.stripe.com/api/payment_intents/object
- Idempotency-Key replay and the idempotency_error on other parameters: https://docs.stripe.com/api/idempotent_requests
- Refunds: https://docs.stripe.com/api/refunds/create
- Connect accounts (charges_enabled, payouts_enabled, details_submitted, requirements.currently_due, capabilities):
  https://docs.stripe.com/api/accounts/object; account links: https://docs.stripe.com/api/account_links/create
- Transfers: https://docs.stripe.com/api/transfers/create; balance: https://docs.stripe.com/api/balance/balance_object
- Payouts (status pending/paid/failed, failure_code, failure_message): https://docs.stripe.com/api/payouts/object
- Stripe-Account header for calls on a connected account: https://docs.stripe.com/connect/authentication
- Events (id evt_, object "event", type, data.object, account, request {id, idempotency_key}):
  https://docs.stripe.com/api/events/object
- Webhook signatures ``Stripe-Signature: t=<unix>,v1=<HMAC-SHA256 hex of "<t>.<payload>">``, 300 s tolerance:
  https://docs.stripe.com/webhooks#verify-manually
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import stripe

from sandboxes.stripe.app import DEFAULT_SECRET_KEY, DEFAULT_WEBHOOK_SECRET, StripeSandbox

RETURN_URL = "https://broker.example/pay/return"


def start_sandbox() -> StripeSandbox:
    """A Stripe sandbox served on a free local port (the caller stops it)."""
    sandbox = StripeSandbox()
    sandbox.start()
    return sandbox


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


def _client(sandbox: StripeSandbox, key: str = DEFAULT_SECRET_KEY) -> stripe.StripeClient:
    return stripe.StripeClient(key, base_addresses={"api": sandbox.url}, max_network_retries=0)


def _control(sandbox: StripeSandbox, method: str, route: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"{sandbox.url}/_sandbox/stripe/{route}", json=body, timeout=10)


def _pay(client: stripe.StripeClient, method: str, **extra: Any) -> Any:
    params = {"amount": 2500, "currency": "usd", "payment_method": method, "confirm": True, **extra}
    return client.v1.payment_intents.create(params)


def _account(client: stripe.StripeClient) -> Any:
    params: Any = {"type": "express", "country": "US", "email": "petra@provider.example"}
    params["capabilities"] = {"transfers": {"requested": True}}
    return client.v1.accounts.create(params)


class _Receiver:
    """A webhook endpoint on a free port that keeps what it was sent; ``on_receive`` runs for each delivery."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str]] = []  # (body, Stripe-Signature)
        self.on_receive = lambda: None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                receiver.received.append((self.rfile.read(length).decode(), self.headers["Stripe-Signature"]))
                receiver.on_receive()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/stripe/webhook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    endpoint = _Receiver()
    yield endpoint
    endpoint.close()


# ------------------------------------------------------------------------------------ customers, auth


def test_a_customer_is_created_and_retrieved_in_stripes_shape(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)

    created = client.v1.customers.create({"email": "alice@buyer.example", "name": "Alice", "metadata": {"org": "7"}})
    fetched = client.v1.customers.retrieve(created.id)

    assert created.id.startswith("cus_")
    assert (fetched.object, fetched.email, fetched.name, fetched.livemode) == (
        "customer",
        "alice@buyer.example",
        "Alice",
        False,
    )
    assert fetched.metadata.to_dict() == {"org": "7"}
    assert isinstance(fetched.created, int)


def test_a_wrong_or_missing_key_is_answered_401(sandbox: StripeSandbox) -> None:
    with pytest.raises(stripe.AuthenticationError) as caught:
        _client(sandbox, "sk_test_wrong").v1.customers.create({"email": "charlie@stranger.example"})
    raw = requests.post(f"{sandbox.url}/v1/customers", data={"email": "x@y.example"}, timeout=10)

    assert caught.value.http_status == 401
    assert raw.status_code == 401
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert sandbox.get_objects("customer") == []


def test_the_key_is_also_accepted_as_the_basic_auth_user_name(sandbox: StripeSandbox) -> None:
    # Stripe's curl examples authenticate with -u <key>: (https://docs.stripe.com/api/authentication).
    answer = requests.post(
        f"{sandbox.url}/v1/customers", data={"email": "bob@buyer.example"}, auth=(DEFAULT_SECRET_KEY, ""), timeout=10
    )

    assert answer.status_code == 200
    assert [c["email"] for c in sandbox.get_objects("customer")] == ["bob@buyer.example"]


def test_an_unknown_object_is_404_resource_missing(sandbox: StripeSandbox) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        _client(sandbox).v1.payment_intents.retrieve("pi_doesnotexist")

    assert (caught.value.http_status, caught.value.code) == (404, "resource_missing")


# ------------------------------------------------------------------------------------------- payments


def test_pm_card_visa_succeeds_with_a_charge(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    customer = client.v1.customers.create({"email": "alice@buyer.example"})

    pi = _pay(client, "pm_card_visa", customer=customer.id, return_url=RETURN_URL, metadata={"order": "o-1"})

    assert pi.id.startswith("pi_")
    assert (pi.object, pi.status, pi.amount, pi.amount_received, pi.currency) == (
        "payment_intent",
        "succeeded",
        2500,
        2500,
        "usd",
    )
    assert pi.latest_charge.startswith("ch_")
    assert pi.customer == customer.id
    assert pi.last_payment_error is None and pi.next_action is None


@pytest.mark.parametrize(
    ("method", "decline_code"),
    [("pm_card_chargeDeclined", "generic_decline"), ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds")],
)
def test_a_declined_card_is_402_card_error_and_the_intent_needs_a_new_method(
    sandbox: StripeSandbox, method: str, decline_code: str
) -> None:
    client = _client(sandbox)

    with pytest.raises(stripe.CardError) as caught:
        _pay(client, method)

    error = caught.value
    assert error.http_status == 402
    assert (error.code, error.error.type, error.error.decline_code) == ("card_declined", "card_error", decline_code)
    intent = error.error.payment_intent
    assert intent.status == "requires_payment_method"
    fetched = client.v1.payment_intents.retrieve(intent.id)
    assert fetched.status == "requires_payment_method"
    assert (fetched.last_payment_error.code, fetched.last_payment_error.decline_code) == ("card_declined", decline_code)
    assert fetched.amount_received == 0


@pytest.mark.parametrize(("outcome", "status"), [("approve", "succeeded"), ("fail", "requires_payment_method")])
def test_3d_secure_requires_action_until_the_buyer_authenticates(
    sandbox: StripeSandbox, outcome: str, status: str
) -> None:
    client = _client(sandbox)
    pi = _pay(client, "pm_card_authenticationRequired", return_url=RETURN_URL)

    assert pi.status == "requires_action"
    assert pi.next_action.type == "redirect_to_url"
    assert pi.next_action.redirect_to_url.return_url == RETURN_URL
    page = requests.get(pi.next_action.redirect_to_url.url, timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]

    answer = _control(sandbox, "POST", f"payment_intents/{pi.id}/authenticate", {"outcome": outcome})

    assert answer.status_code == 200
    fetched = client.v1.payment_intents.retrieve(pi.id)
    assert fetched.status == status
    if outcome == "fail":
        assert fetched.last_payment_error.code == "payment_intent_authentication_failure"
        assert fetched.latest_charge is None
    else:
        assert fetched.latest_charge.startswith("ch_") and fetched.amount_received == 2500
    assert _control(sandbox, "POST", f"payment_intents/{pi.id}/authenticate", {"outcome": outcome}).status_code == 409


def test_off_session_3d_secure_is_declined_authentication_required(sandbox: StripeSandbox) -> None:
    with pytest.raises(stripe.CardError) as caught:
        _pay(_client(sandbox), "pm_card_authenticationRequired", off_session=True)

    assert (caught.value.code, caught.value.error.decline_code) == (
        "authentication_required",
        "authentication_required",
    )
    assert caught.value.error.payment_intent.status == "requires_payment_method"


def test_a_replayed_key_answers_the_first_result_and_other_parameters_are_refused(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    first = client.v1.payment_intents.create(
        {"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True},
        {"idempotency_key": "order-1-attempt-1"},
    )

    again = client.v1.payment_intents.create(
        {"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True},
        {"idempotency_key": "order-1-attempt-1"},
    )
    with pytest.raises(stripe.IdempotencyError) as caught:
        client.v1.payment_intents.create(
            {"amount": 9999, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True},
            {"idempotency_key": "order-1-attempt-1"},
        )

    assert again.id == first.id
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert caught.value.http_status == 400 and caught.value.error.type == "idempotency_error"
    assert [p["id"] for p in sandbox.get_objects("payment_intent")] == [first.id]
    assert [p["id"] for p in sandbox.get_objects("charge")] == [first.latest_charge]


def test_a_replayed_decline_answers_the_same_402(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    ids = []
    for _ in range(2):
        with pytest.raises(stripe.CardError) as caught:
            client.v1.payment_intents.create(
                {"amount": 1000, "currency": "usd", "payment_method": "pm_card_chargeDeclined", "confirm": True},
                {"idempotency_key": "k-declined"},
            )
        ids.append(caught.value.error.payment_intent.id)

    assert ids[0] == ids[1]
    assert len(sandbox.get_objects("payment_intent")) == 1


def test_refunds_take_what_remains_and_no_more(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    pi = _pay(client, "pm_card_visa")

    partial = client.v1.refunds.create({"payment_intent": pi.id, "amount": 1000, "metadata": {"reason": "partial"}})
    with pytest.raises(stripe.InvalidRequestError) as too_much:
        client.v1.refunds.create({"payment_intent": pi.id, "amount": 1501})
    rest = client.v1.refunds.create({"payment_intent": pi.id})
    with pytest.raises(stripe.InvalidRequestError) as again:
        client.v1.refunds.create({"payment_intent": pi.id, "amount": 1})

    assert partial.id.startswith("re_")
    assert (partial.object, partial.status, partial.amount, partial.charge) == (
        "refund",
        "succeeded",
        1000,
        pi.latest_charge,
    )
    assert (too_much.value.http_status, too_much.value.code, too_much.value.param) == (
        400,
        "amount_too_large",
        "amount",
    )
    assert rest.amount == 1500
    assert again.value.code == "charge_already_refunded"
    charge = sandbox.get(pi.latest_charge)
    assert (charge["amount_refunded"], charge["refunded"]) == (2500, True)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"amount": 0, "currency": "usd"}, "amount"),
        ({"amount": 100_000_000, "currency": "usd"}, "amount"),
        ({"amount": "12.5", "currency": "usd"}, "amount"),
        ({"amount": 100, "currency": "dollars"}, "currency"),
        ({"amount": 100, "currency": "usd", "metadata": {f"k{i}": "v" for i in range(51)}}, "metadata"),
    ],
)
def test_hostile_amounts_currencies_and_metadata_are_refused(
    sandbox: StripeSandbox, params: dict[str, Any], param: str
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        _client(sandbox).v1.payment_intents.create(params)

    assert (caught.value.http_status, caught.value.param) == (400, param)
    assert sandbox.get_objects("payment_intent") == []


def test_oversized_and_deeply_nested_bodies_are_refused(sandbox: StripeSandbox) -> None:
    headers = {"Authorization": f"Bearer {DEFAULT_SECRET_KEY}"}
    big = requests.post(f"{sandbox.url}/v1/customers", data={"name": "x" * 70_000}, headers=headers, timeout=10)
    deep = requests.post(
        f"{sandbox.url}/v1/customers", data={"metadata[a][b][c][d][e]": "x"}, headers=headers, timeout=10
    )

    assert big.status_code == 413
    assert deep.status_code == 400 and deep.json()["error"]["type"] == "invalid_request_error"
    assert sandbox.get_objects("customer") == []


# -------------------------------------------------------------------------------------------- connect


def test_connect_onboarding_transfers_balance_and_payouts(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    acct = _account(client)
    assert acct.id.startswith("acct_")
    assert (acct.charges_enabled, acct.payouts_enabled, acct.details_submitted) == (False, False, False)
    assert acct.requirements.currently_due != []
    link = client.v1.account_links.create(
        {"account": acct.id, "refresh_url": RETURN_URL, "return_url": RETURN_URL, "type": "account_onboarding"}
    )
    assert requests.get(link.url, timeout=10).status_code == 200

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.transfers.create({"amount": 5000, "currency": "usd", "destination": acct.id})
    assert (refused.value.code, refused.value.param) == ("insufficient_capabilities_for_transfer", "destination")
    assert sandbox.balance(acct.id) == {}

    assert _control(sandbox, "POST", f"accounts/{acct.id}/verify").status_code == 200
    verified = client.v1.accounts.retrieve(acct.id)
    assert (verified.charges_enabled, verified.payouts_enabled, verified.details_submitted) == (True, True, True)
    assert verified.requirements.currently_due == []

    transfer = client.v1.transfers.create({"amount": 5000, "currency": "usd", "destination": acct.id})
    assert transfer.id.startswith("tr_") and (transfer.object, transfer.destination) == ("transfer", acct.id)
    balance = client.v1.balance.retrieve(options={"stripe_account": acct.id})
    assert [(b.amount, b.currency) for b in balance.available] == [(5000, "usd")]

    on_acct: Any = {"stripe_account": acct.id}
    paid = client.v1.payouts.create({"amount": 2000, "currency": "usd"}, on_acct)
    failed = client.v1.payouts.create({"amount": 1000, "currency": "usd"}, on_acct)
    assert paid.id.startswith("po_") and (paid.object, paid.status) == ("payout", "pending")
    assert sandbox.balance(acct.id) == {"usd": 2000}

    _control(sandbox, "POST", f"payouts/{paid.id}/settle", {"outcome": "paid"})
    answer = _control(
        sandbox, "POST", f"payouts/{failed.id}/settle", {"outcome": "failed", "failure_code": "account_closed"}
    )

    assert answer.status_code == 200
    assert client.v1.payouts.retrieve(paid.id, options=on_acct).status == "paid"
    bounced = client.v1.payouts.retrieve(failed.id, options=on_acct)
    assert (bounced.status, bounced.failure_code) == ("failed", "account_closed")
    assert bounced.failure_message
    assert sandbox.balance(acct.id) == {"usd": 3000}  # the failed payout's money is back


def test_a_payout_beyond_the_balance_is_refused(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    acct = _account(client)
    sandbox.verify_account(acct.id)
    client.v1.transfers.create({"amount": 500, "currency": "usd", "destination": acct.id})

    with pytest.raises(stripe.InvalidRequestError) as caught:
        client.v1.payouts.create({"amount": 501, "currency": "usd"}, {"stripe_account": acct.id})

    assert caught.value.code == "balance_insufficient"
    assert sandbox.get_objects("payout") == []
    assert sandbox.balance(acct.id) == {"usd": 500}


def test_an_unknown_stripe_account_header_is_refused(sandbox: StripeSandbox) -> None:
    with pytest.raises(stripe.PermissionError) as caught:
        _client(sandbox).v1.balance.retrieve(options={"stripe_account": "acct_nosuchaccount"})

    assert caught.value.http_status == 403


# --------------------------------------------------------------------------------------- events, webhooks


def test_pending_events_are_signed_as_stripe_signs_them(sandbox: StripeSandbox) -> None:
    secret = _control(sandbox, "POST", "webhook_endpoint", {"url": ""}).json()["secret"]
    client = _client(sandbox)
    pi = client.v1.payment_intents.create(
        {"amount": 700, "currency": "eur", "payment_method": "pm_card_visa", "confirm": True},
        {"idempotency_key": "k-events"},
    )

    pending = _control(sandbox, "GET", "events/pending").json()["events"]

    assert [e["type"] for e in pending] == ["payment_intent.succeeded"]
    event = stripe.Webhook.construct_event(pending[0]["payload"], pending[0]["signature"], secret)
    assert event.id.startswith("evt_") and event.object == "event" and event.livemode is False
    assert (event.type, event.data.object.id, event.data.object.status) == (
        "payment_intent.succeeded",
        pi.id,
        "succeeded",
    )
    assert event.request.idempotency_key == "k-events"
    assert client.v1.events.retrieve(event.id).type == "payment_intent.succeeded"
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(pending[0]["payload"], pending[0]["signature"], "whsec_other")
    assert _control(sandbox, "GET", "events/pending").json()["events"] == []  # taken


def test_events_are_signed_with_the_default_secret_until_one_is_set(sandbox: StripeSandbox) -> None:
    customer = _client(sandbox).v1.customers.create({"email": "alice@buyer.example"})
    _pay(_client(sandbox), "pm_card_visa", customer=customer.id)

    [delivery] = sandbox.pending_events()

    event = stripe.Webhook.construct_event(delivery["payload"], delivery["signature"], DEFAULT_WEBHOOK_SECRET)
    assert event.data.object.customer == customer.id


def test_connect_events_name_the_connected_account(sandbox: StripeSandbox) -> None:
    secret = sandbox.set_webhook_endpoint()
    client = _client(sandbox)
    acct = _account(client)
    sandbox.verify_account(acct.id)
    client.v1.transfers.create({"amount": 900, "currency": "usd", "destination": acct.id})
    payout = client.v1.payouts.create({"amount": 900, "currency": "usd"}, {"stripe_account": acct.id})
    sandbox.settle_payout(payout.id, "failed", "account_closed")

    events = [stripe.Webhook.construct_event(e["payload"], e["signature"], secret) for e in sandbox.pending_events()]

    assert [(e.type, e.to_dict().get("account")) for e in events] == [
        ("account.updated", acct.id),
        ("transfer.created", None),
        ("payout.failed", acct.id),
    ]
    assert events[0].data.previous_attributes.payouts_enabled is False
    assert events[2].data.object.failure_code == "account_closed"


def test_delivery_posts_signed_events_and_keeps_the_failed_ones(sandbox: StripeSandbox, receiver: _Receiver) -> None:
    secret = sandbox.set_webhook_endpoint(receiver.url, "whsec_test_receiver")
    client = _client(sandbox)
    _pay(client, "pm_card_visa")

    report = _control(sandbox, "POST", "events/deliver").json()

    assert len(report["delivered"]) == 1 and report["failed"] == []
    body, signature = receiver.received[0]
    assert stripe.Webhook.construct_event(body, signature, secret).type == "payment_intent.succeeded"

    sandbox.set_webhook_endpoint("http://127.0.0.1:9/unreachable", secret)
    with pytest.raises(stripe.CardError):
        _pay(client, "pm_card_chargeDeclined")
    failed = sandbox.deliver_events()
    assert failed["delivered"] == [] and len(failed["failed"]) == 1
    assert [e["type"] for e in sandbox.pending_events()] == ["payment_intent.payment_failed"]


def test_before_answer_delivery_arrives_before_the_call_returns(sandbox: StripeSandbox, receiver: _Receiver) -> None:
    answered = threading.Event()
    seen_before_answer: list[bool] = []
    receiver.on_receive = lambda: seen_before_answer.append(not answered.is_set())
    sandbox.set_webhook_endpoint(receiver.url, deliver="before_answer")

    pi = _pay(_client(sandbox), "pm_card_visa")
    answered.set()

    assert seen_before_answer == [True]
    assert json.loads(receiver.received[0][0])["data"]["object"]["id"] == pi.id
    assert sandbox.pending_events() == []


# ------------------------------------------------------------------------------------------------ faults


def test_faults_answer_429_500_or_drop_the_connection(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    sandbox.faults.inject("throttle", times=1)
    with pytest.raises(stripe.RateLimitError) as throttled:
        _pay(client, "pm_card_visa")
    sandbox.faults.inject("capacity", times=1)
    with pytest.raises(stripe.APIError) as failed:
        _pay(client, "pm_card_visa")
    sandbox.faults.inject("capacity", code="connection_drop", times=1)
    with pytest.raises(stripe.APIConnectionError):
        _pay(client, "pm_card_visa")

    assert throttled.value.http_status == 429
    assert failed.value.http_status == 500
    assert sandbox.get_objects("payment_intent") == []  # none of them reached the API


def test_a_connection_dropped_after_the_call_replays_it_on_the_same_key(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    sandbox.faults.inject("capacity", action="payouts.create", code="connection_drop_after", times=1)
    acct = _account(client)
    sandbox.verify_account(acct.id)
    client.v1.transfers.create({"amount": 800, "currency": "usd", "destination": acct.id})
    options: Any = {"stripe_account": acct.id, "idempotency_key": "payout-1"}

    with pytest.raises(stripe.APIConnectionError):
        client.v1.payouts.create({"amount": 800, "currency": "usd"}, options)
    retried = client.v1.payouts.create({"amount": 800, "currency": "usd"}, options)

    assert [p["id"] for p in sandbox.get_objects("payout")] == [retried.id]
    assert sandbox.balance(acct.id) == {"usd": 0}


# ------------------------------------------------------------------------------------ what a person sees


def test_auto_delivery_posts_each_event_signed_as_it_happens(sandbox: StripeSandbox, receiver: _Receiver) -> None:
    arrived = threading.Event()
    receiver.on_receive = arrived.set
    secret = sandbox.set_webhook_endpoint(url=receiver.url, deliver="auto")
    paid = _pay(_client(sandbox), "pm_card_visa")
    assert arrived.wait(timeout=30), "the courier delivered nothing"
    body, signature = receiver.received[0]
    event = stripe.Webhook.construct_event(body, signature, secret)
    assert event["type"] == "payment_intent.succeeded" and event["data"]["object"]["id"] == paid.id


def test_the_3d_secure_page_sends_the_card_holder_back_as_stripe_does(sandbox: StripeSandbox) -> None:
    # https://docs.stripe.com/payments/3d-secure#manual-redirect: back to return_url with payment_intent and
    # redirect_status in the query.
    intent = _pay(_client(sandbox), "pm_card_authenticationRequired", return_url=RETURN_URL)
    page_url = intent.next_action.redirect_to_url.url
    page = requests.get(page_url, timeout=10)
    assert page.status_code == 200 and 'value="approve"' in page.text and 'value="fail"' in page.text
    answer = requests.post(page_url, data={"outcome": "approve"}, allow_redirects=False, timeout=10)
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"{RETURN_URL}?payment_intent={intent.id}&redirect_status=succeeded"
    assert sandbox.get(intent.id)["status"] == "succeeded"


def test_the_onboarding_page_verifies_the_account_and_returns(sandbox: StripeSandbox) -> None:
    client = _client(sandbox)
    account = _account(client)
    link = client.v1.account_links.create(
        {"account": account.id, "refresh_url": RETURN_URL, "return_url": RETURN_URL, "type": "account_onboarding"}
    )
    form = requests.get(link.url, timeout=10)
    assert form.status_code == 200 and 'name="return_url"' in form.text
    answer = requests.post(
        link.url.split("?")[0], data={"outcome": "verify", "return_url": RETURN_URL}, allow_redirects=False, timeout=10
    )
    assert answer.status_code == 303 and answer.headers["Location"] == RETURN_URL
    assert sandbox.get(account.id)["payouts_enabled"] is True
