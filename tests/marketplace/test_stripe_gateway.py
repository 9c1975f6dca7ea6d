"""``StripeGateway`` against the Stripe sandbox: the real stripe SDK over HTTP, Stripe's answers checked into DTOs
and its errors turned into ``PaymentError`` / ``PaymentUnavailable`` / ``WebhookRejected``.

Stripe behaviour relied on (the sandbox's tests cite each wire detail): test PaymentMethods
(https://docs.stripe.com/testing), errors (https://docs.stripe.com/api/errors), idempotency
(https://docs.stripe.com/api/idempotent_requests), webhook signatures and the 300 s tolerance
(https://docs.stripe.com/webhooks#verify-manually), Connect payouts (https://docs.stripe.com/api/payouts/object).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import stripe

from marketplace.billing.stripe_gateway import (
    AccountView,
    CheckoutSessionView,
    PaymentError,
    PaymentIntentView,
    PaymentUnavailable,
    PayoutView,
    RefundView,
    StripeGateway,
    TransferView,
    WebhookRejected,
    stripe_gateway,
)
from sandboxes.stripe.app import DEFAULT_SECRET_KEY, StripeSandbox
from tests.providers.test_stripe_sandbox import start_sandbox

WEBHOOK_SECRET = "whsec_gateway_tests"
RETURN_URL = "https://broker.example/pay/return"


@pytest.fixture(scope="module")
def server() -> Iterator[StripeSandbox]:
    sandbox = start_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(server: StripeSandbox, settings: Any) -> Iterator[StripeSandbox]:
    server.reset()
    server.set_webhook_endpoint(secret=WEBHOOK_SECRET)
    settings.STRIPE_API_BASE = server.url
    settings.STRIPE_API_KEY = DEFAULT_SECRET_KEY
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_TIMEOUT_SECONDS = 5.0
    yield server
    server.reset()


@pytest.fixture
def gateway(sandbox: StripeSandbox) -> StripeGateway:
    return stripe_gateway()


def _pay(gateway: StripeGateway, method: str, key: str, **extra: Any) -> PaymentIntentView:
    customer = gateway.customer_create(email="alice@buyer.example", name="Alice", idempotency_key=f"cus-{key}")
    return gateway.payment_intent_create(
        customer=customer.id,
        amount_minor=extra.pop("amount_minor", 2500),
        currency="USD",
        payment_method=method,
        return_url=RETURN_URL,
        idempotency_key=key,
        metadata={"order": "o-1"},
        **extra,
    )


def _seller(gateway: StripeGateway, sandbox: StripeSandbox, funds: int = 0) -> str:
    account = gateway.account_create(
        email="petra@provider.example", country="US", idempotency_key="acct-petra", metadata={"org": "9"}
    )
    sandbox.verify_account(account.id)
    if funds:
        gateway.transfer_create(
            destination=account.id, amount_minor=funds, currency="USD", idempotency_key="tr-fund", metadata={}
        )
    return account.id


# ------------------------------------------------------------------------------------------- payments


def test_a_card_that_succeeds_answers_a_succeeded_intent(gateway: StripeGateway) -> None:
    view = _pay(gateway, "pm_card_visa", "order-1")

    assert view == PaymentIntentView(
        id=view.id,
        status="succeeded",
        amount_minor=2500,
        currency="USD",
        customer=view.customer,
        next_action_url=None,
        error_code=None,
        error_message=None,
        metadata={"order": "o-1"},
        payment_method="pm_card_visa",
        setup_future_usage=None,
    )
    assert view.id.startswith("pi_") and view.customer is not None and view.customer.startswith("cus_")
    assert gateway.payment_intent_retrieve(view.id) == view


@pytest.mark.parametrize(
    ("method", "decline_code"),
    [("pm_card_chargeDeclined", "generic_decline"), ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds")],
)
def test_a_decline_raises_a_final_payment_error(
    gateway: StripeGateway, sandbox: StripeSandbox, method: str, decline_code: str
) -> None:
    with pytest.raises(PaymentError) as caught:
        _pay(gateway, method, "order-2")

    error = caught.value
    assert type(error) is PaymentError
    assert (error.code, error.decline_code, error.http_status, error.retryable) == (
        "card_declined",
        decline_code,
        402,
        False,
    )
    assert error.message and error.payment_intent is not None
    after = gateway.payment_intent_retrieve(error.payment_intent)
    assert (after.status, after.error_code) == ("requires_payment_method", "card_declined")


@pytest.mark.parametrize(
    ("outcome", "status", "error_code"),
    [("approve", "succeeded", None), ("fail", "requires_payment_method", "payment_intent_authentication_failure")],
)
def test_3d_secure_waits_for_the_buyer(
    gateway: StripeGateway, sandbox: StripeSandbox, outcome: str, status: str, error_code: str | None
) -> None:
    pending = _pay(gateway, "pm_card_authenticationRequired", "order-3ds")
    assert pending.status == "requires_action"
    assert pending.next_action_url is not None and pending.next_action_url.startswith(sandbox.url)

    sandbox.authenticate(pending.id, outcome)

    after = gateway.payment_intent_retrieve(pending.id)
    assert (after.status, after.error_code, after.next_action_url) == (status, error_code, None)


def test_off_session_3d_secure_is_a_decline(gateway: StripeGateway) -> None:
    with pytest.raises(PaymentError) as caught:
        _pay(gateway, "pm_card_authenticationRequired", "order-off", off_session=True)

    assert (caught.value.code, caught.value.decline_code) == ("authentication_required", "authentication_required")


def test_the_same_key_replays_and_other_parameters_are_refused(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    first = _pay(gateway, "pm_card_visa", "order-4")
    again = _pay(gateway, "pm_card_visa", "order-4")

    with pytest.raises(PaymentError) as caught:
        _pay(gateway, "pm_card_visa", "order-4", amount_minor=9999)

    assert again == first
    assert (caught.value.code, caught.value.http_status, caught.value.retryable) == ("idempotency_error", 400, False)
    assert [p["id"] for p in sandbox.get_objects("payment_intent")] == [first.id]


def test_a_partial_refund_then_one_beyond_the_rest_is_refused(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    paid = _pay(gateway, "pm_card_visa", "order-5")

    refund = gateway.refund_create(payment_intent=paid.id, amount_minor=1000, idempotency_key="re-1", metadata={})
    with pytest.raises(PaymentError) as caught:
        gateway.refund_create(payment_intent=paid.id, amount_minor=1501, idempotency_key="re-2", metadata={})

    assert refund == RefundView(
        id=refund.id, amount_minor=1000, currency="USD", payment_intent=paid.id, status="succeeded"
    )
    assert (caught.value.code, caught.value.retryable) == ("amount_too_large", False)
    assert [r["id"] for r in sandbox.get_objects("refund")] == [refund.id]


def test_invalid_amounts_and_currencies_never_reach_stripe(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    customer = gateway.customer_create(email="alice@buyer.example", name="Alice", idempotency_key="cus-x")
    calls_before = len(sandbox.calls())
    for amount, currency in [(0, "USD"), (100_000_000, "USD"), (True, "USD"), (100, "US"), (100, "U$D")]:
        with pytest.raises(ValueError):
            gateway.payment_intent_create(
                customer=customer.id,
                amount_minor=amount,
                currency=currency,
                payment_method="pm_card_visa",
                return_url=RETURN_URL,
                idempotency_key="k",
                metadata={},
            )

    assert len(sandbox.calls()) == calls_before


# -------------------------------------------------------------------------------------------- connect


def test_connect_onboarding_transfer_and_payouts(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    account = gateway.account_create(
        email="petra@provider.example", country="us", idempotency_key="acct-1", metadata={"org": "9"}
    )
    assert (account.payouts_enabled, account.charges_enabled, account.details_submitted) == (False, False, False)
    assert account.requirements_due != ()
    link = gateway.account_link_create(account=account.id, refresh_url=RETURN_URL, return_url=RETURN_URL)
    assert link.url.startswith(sandbox.url)

    with pytest.raises(PaymentError) as refused:
        gateway.transfer_create(
            destination=account.id, amount_minor=5000, currency="USD", idempotency_key="tr-1", metadata={}
        )
    assert (refused.value.code, refused.value.retryable) == ("insufficient_capabilities_for_transfer", False)

    sandbox.verify_account(account.id)
    assert gateway.account_retrieve(account.id) == AccountView(
        id=account.id, payouts_enabled=True, charges_enabled=True, details_submitted=True, requirements_due=()
    )
    transfer = gateway.transfer_create(
        destination=account.id, amount_minor=5000, currency="USD", idempotency_key="tr-2", metadata={"lease": "l-1"}
    )
    assert transfer == TransferView(id=transfer.id, amount_minor=5000, currency="USD", destination=account.id)

    paid = gateway.payout_create(
        account=account.id, amount_minor=2000, currency="USD", idempotency_key="po-1", metadata={}
    )
    bounced = gateway.payout_create(
        account=account.id, amount_minor=1000, currency="USD", idempotency_key="po-2", metadata={}
    )
    assert paid == PayoutView(
        id=paid.id,
        account=account.id,
        amount_minor=2000,
        currency="USD",
        status="pending",
        failure_code=None,
        failure_message=None,
        created=paid.created,
    )
    assert paid.created > 0
    assert sandbox.balance(account.id) == {"usd": 2000}

    sandbox.settle_payout(paid.id, "paid")
    sandbox.settle_payout(bounced.id, "failed", "account_closed")

    assert sandbox.get(paid.id)["status"] == "paid"
    assert (sandbox.get(bounced.id)["status"], sandbox.get(bounced.id)["failure_code"]) == ("failed", "account_closed")
    assert sandbox.balance(account.id) == {"usd": 3000}
    events = [gateway.event_verify(e["payload"].encode(), e["signature"]) for e in sandbox.pending_events()]
    payout_events = [(e.type, e.account, e.object["id"]) for e in events if e.object_type == "payout"]
    assert payout_events == [("payout.paid", account.id, paid.id), ("payout.failed", account.id, bounced.id)]
    assert events[-1].object["failure_code"] == "account_closed"


def test_a_payout_beyond_the_balance_is_refused(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    account = _seller(gateway, sandbox, funds=700)

    with pytest.raises(PaymentError) as caught:
        gateway.payout_create(account=account, amount_minor=701, currency="USD", idempotency_key="po-x", metadata={})

    assert (caught.value.code, caught.value.retryable) == ("balance_insufficient", False)
    assert sandbox.get_objects("payout") == []


# -------------------------------------------------------------------------------------------- webhooks


def test_pending_events_verify_and_tampering_is_rejected(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    paid = _pay(gateway, "pm_card_visa", "order-6")
    [delivery] = sandbox.pending_events()
    payload, signature = delivery["payload"].encode(), delivery["signature"]

    event = gateway.event_verify(payload, signature)

    assert (event.type, event.account, event.object_type, event.object["id"]) == (
        "payment_intent.succeeded",
        None,
        "payment_intent",
        paid.id,
    )
    assert event.id.startswith("evt_") and isinstance(event.created, int)
    tampered = payload.replace(b'"amount": 2500', b'"amount": 1')
    assert tampered != payload
    old = int(time.time()) - 301
    old_header = stripe.WebhookSignature.generate_signature_header(delivery["payload"], WEBHOOK_SECRET, old)
    wrong_secret = stripe.WebhookSignature.generate_signature_header(delivery["payload"], "whsec_someone_else")
    not_json = b"{not json"
    not_json_header = stripe.WebhookSignature.generate_signature_header(not_json.decode(), WEBHOOK_SECRET)
    not_event = json.dumps({"object": "charge", "id": "ch_1"}).encode()
    not_event_header = stripe.WebhookSignature.generate_signature_header(not_event.decode(), WEBHOOK_SECRET)
    for bad_payload, bad_header in [
        (tampered, signature),
        (payload, wrong_secret),
        (payload, old_header),
        (payload, ""),
        (payload, "garbage"),
        (b"x" * (256 * 1024 + 1), signature),
        (not_json, not_json_header),
        (not_event, not_event_header),
    ]:
        with pytest.raises(WebhookRejected):
            gateway.event_verify(bad_payload, bad_header)


def test_without_a_webhook_secret_every_delivery_is_rejected(sandbox: StripeSandbox, settings: Any) -> None:
    settings.STRIPE_WEBHOOK_SECRET = ""
    gateway = stripe_gateway()
    _pay(gateway, "pm_card_visa", "order-7")
    [delivery] = sandbox.pending_events()

    with pytest.raises(WebhookRejected):
        gateway.event_verify(delivery["payload"].encode(), delivery["signature"])


# ---------------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("kind", "code", "http_status"),
    [("throttle", None, 429), ("capacity", None, 500), ("capacity", "connection_drop", None)],
)
def test_faults_are_payment_unavailable_and_nothing_was_charged(
    gateway: StripeGateway, sandbox: StripeSandbox, kind: str, code: str | None, http_status: int | None
) -> None:
    sandbox.faults.inject(kind, code=code, times=1)

    with pytest.raises(PaymentUnavailable) as caught:
        _pay(gateway, "pm_card_visa", "order-8")

    assert (caught.value.retryable, caught.value.http_status) == (True, http_status)
    assert sandbox.get_objects("payment_intent") == []
    assert _pay(gateway, "pm_card_visa", "order-8").status == "succeeded"  # the retry, same key


def test_a_lost_answer_is_retried_on_the_same_key_without_a_second_charge(
    gateway: StripeGateway, sandbox: StripeSandbox
) -> None:
    sandbox.faults.inject("capacity", code="connection_drop_after", times=1)

    with pytest.raises(PaymentUnavailable):
        _pay(gateway, "pm_card_visa", "order-9")
    retried = _pay(gateway, "pm_card_visa", "order-9")

    assert [p["id"] for p in sandbox.get_objects("payment_intent")] == [retried.id]
    assert len(sandbox.get_objects("charge")) == 1


def test_a_slow_stripe_times_out_as_unavailable(sandbox: StripeSandbox, settings: Any) -> None:
    settings.STRIPE_TIMEOUT_SECONDS = 0.3
    gateway = stripe_gateway()
    sandbox.faults.inject("slow", action="payment_intents.retrieve", seconds=30, times=1)

    with pytest.raises(PaymentUnavailable):
        gateway.payment_intent_retrieve("pi_whatever")
    sandbox.faults.clear()  # wakes the sleeping request


def test_a_wrong_api_key_is_a_final_error(sandbox: StripeSandbox, settings: Any) -> None:
    settings.STRIPE_API_KEY = "sk_test_wrong"

    with pytest.raises(PaymentError) as caught:
        stripe_gateway().customer_create(email="charlie@stranger.example", name="Charlie", idempotency_key="c-1")

    assert type(caught.value) is PaymentError
    assert (caught.value.code, caught.value.http_status, caught.value.retryable) == ("authentication_error", 401, False)
    assert sandbox.get_objects("customer") == []


# ------------------------------------------------------------------------------------------- Checkout


def _checkout(gateway: StripeGateway, key: str = "topup-1:checkout", **extra: Any) -> CheckoutSessionView:
    customer = gateway.customer_create(email="alice@buyer.example", name="Alice", idempotency_key="cus-co")
    params: dict[str, Any] = {
        "customer": customer.id,
        "amount_minor": 5000,
        "currency": "USD",
        "product_name": "Prepaid credit",
        "success_url": "https://broker.example/billing/return?session_id={CHECKOUT_SESSION_ID}",
        "cancel_url": "https://broker.example/billing/",
        "metadata": {"topup": "t-1"},
        "save_card": False,
        "expires_at": int(time.time()) + 3600,
        "idempotency_key": key,
        **extra,
    }
    return gateway.checkout_session_create(**params)


def test_a_checkout_session_is_made_once_per_key_and_read_back(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    session = _checkout(gateway, save_card=True)

    assert session == CheckoutSessionView(
        id=session.id,
        url=f"{sandbox.url}/_sandbox/stripe/checkout/{session.id}",
        status="open",
        payment_status="unpaid",
        payment_intent=None,
        customer=session.customer,
        amount_minor=5000,
        currency="USD",
        metadata={"topup": "t-1"},
        expires_at=session.expires_at,
    )
    assert _checkout(gateway, save_card=True) == session  # the same key answers the same session
    assert gateway.checkout_session_retrieve(session.id) == session
    assert len(sandbox.get_objects("checkout.session")) == 1
    created = [c for c in sandbox.calls() if c.action == "checkout.sessions.create"]
    assert {c.idempotency_key for c in created} == {"topup-1:checkout"}


def test_a_paid_session_names_its_payment_intent_which_carries_the_metadata(
    gateway: StripeGateway, sandbox: StripeSandbox
) -> None:
    session = _checkout(gateway, save_card=True)
    assert session.url is not None

    requests.post(
        session.url,
        data={"number": "4242424242424242", "expiry": "12/39", "cvc": "123", "name": "A"},
        allow_redirects=False,
        timeout=5,
    )

    paid = gateway.checkout_session_retrieve(session.id)
    assert (paid.status, paid.payment_status, paid.url) == ("complete", "paid", None)
    assert paid.payment_intent is not None
    intent = gateway.payment_intent_retrieve(paid.payment_intent)
    assert (intent.status, intent.metadata, intent.setup_future_usage) == ("succeeded", {"topup": "t-1"}, "off_session")
    assert intent.payment_method is not None and intent.payment_method.startswith("pm_")


def test_bad_checkout_arguments_never_reach_stripe(gateway: StripeGateway, sandbox: StripeSandbox) -> None:
    with pytest.raises(ValueError, match="success_url"):
        _checkout(gateway, success_url="javascript:alert(1)")
    with pytest.raises(ValueError, match="Checkout Session id"):
        gateway.checkout_session_retrieve("../v1/balance")
    with pytest.raises(PaymentError) as refused:
        _checkout(gateway, key="k2", expires_at=int(time.time()) + 60)

    assert refused.value.http_status == 400 and not refused.value.retryable
    assert [c.action for c in sandbox.calls() if c.action.startswith("checkout.")] == ["checkout.sessions.create"]
