"""Stripe's webhook never fails on a foreign event (issue 35, point 4): an event of a type the broker does not handle,
about an object it does not have, or from a connected account is answered 2xx and recorded as ignored with the
reason; Connect events are read back on their account.

From Stripe's documentation: an endpoint that does not answer 2xx is retried for up to three days
(https://docs.stripe.com/webhooks#retries); Connect events carry the connected account's id in ``account``
(https://docs.stripe.com/connect/webhooks), and its objects are read with the ``Stripe-Account`` header
(https://docs.stripe.com/connect/authentication); ``Stripe-Signature`` is ``t=<unix>,v1=<HMAC-SHA256 of
"<t>.<payload>">`` (https://docs.stripe.com/webhooks#verify-manually), which is how the hand-made events here are
signed.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import stripe
from django.test import Client

from marketplace.billing.book import credit_available
from marketplace.billing.payments import TopUpRequest, topup_start
from marketplace.models.billing import StripeEvent, TopUp, TopUpState
from sandboxes.stripe.wire import sign

pytestmark = pytest.mark.django_db

SECRET = "whsec_test_broker"  # what the stripe_sandbox fixture signs with (tests/conftest.py)


def _post(payload: str, signature: str):
    return Client().post(
        "/api/v1/stripe/webhook", data=payload, content_type="application/json", HTTP_STRIPE_SIGNATURE=signature
    )


def _deliver_all(sandbox) -> list:
    return [_post(item["payload"], item["signature"]) for item in sandbox.pending_events()]


def _signed_event(type_: str, obj: dict, account: str | None = None) -> tuple[str, str]:
    """An event as Stripe sends one (https://docs.stripe.com/api/events/object), signed with the endpoint secret."""
    event = {
        "id": f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "api_version": "2026-10-28.endive",
        "created": int(time.time()),
        "data": {"object": obj},
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": type_,
    }
    if account:
        event["account"] = account
    payload = json.dumps(event)
    return payload, sign(payload, SECRET)


def _connected_account(sdk: stripe.StripeClient, sandbox) -> str:
    account = sdk.v1.accounts.create({"type": "express", "capabilities": {"transfers": {"requested": True}}})
    sandbox.verify_account(account.id)
    return account.id


def test_a_payment_on_a_connected_account_is_answered_and_recorded_as_ignored(ready_to_pay, stripe_sandbox, sdk):
    account = _connected_account(sdk, stripe_sandbox)
    stripe_sandbox.pending_events()  # the account.updated of onboarding: not this test's
    sdk.v1.payment_intents.create(
        {
            "amount": 2000,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "return_url": "https://x.example/",
        },
        {"stripe_account": account},
    )

    answers = _deliver_all(stripe_sandbox)

    # This answered 500 before: the PaymentIntent was read back on the platform, where Stripe has no such object.
    assert [a.status_code for a in answers] == [200]
    record = StripeEvent.objects.get(type="payment_intent.succeeded")
    assert record.account == account and record.ignored
    assert record.outcome.startswith("ignored: PaymentIntent pi_") and "no top-up of ours" in record.outcome
    assert credit_available(ready_to_pay) == 0


def test_a_top_up_payment_on_a_connected_account_is_not_credited(ready_to_pay, stripe_sandbox, sdk, alice):
    topup = topup_start(
        organization=ready_to_pay,
        user=alice,
        request=TopUpRequest(
            amount_minor=3000, payment_method="pm_card_authenticationRequired", return_url="", idempotency_key="t"
        ),
    )
    account = _connected_account(sdk, stripe_sandbox)
    stripe_sandbox.pending_events()
    # Someone's connected account charges with our top-up's id in its metadata: not money paid to the platform.
    sdk.v1.payment_intents.create(
        {
            "amount": 3000,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "metadata": {"topup": str(topup.public_id)},
        },
        {"stripe_account": account},
    )

    answers = _deliver_all(stripe_sandbox)

    assert [a.status_code for a in answers] == [200]
    record = StripeEvent.objects.get(type="payment_intent.succeeded")
    assert record.ignored and f"on connected account {account}" in record.outcome
    topup.refresh_from_db()
    assert topup.state == TopUpState.REQUIRES_ACTION and credit_available(ready_to_pay) == 0


def test_an_event_for_a_payment_stripe_does_not_have_is_ignored_with_the_reason(ready_to_pay, stripe_sandbox, alice):
    topup = topup_start(
        organization=ready_to_pay,
        user=alice,
        request=TopUpRequest(amount_minor=3000, payment_method="pm_card_visa", return_url="", idempotency_key="t"),
    )
    stripe_sandbox.pending_events()
    payload, signature = _signed_event(
        "payment_intent.succeeded",
        {"id": "pi_nobodyhasthis", "object": "payment_intent", "metadata": {"topup": str(topup.public_id)}},
    )

    first, again = _post(payload, signature), _post(payload, signature)

    # This answered 500 before, on every retry.
    assert (
        first.status_code == 200
        and "could not be read back from the platform (resource_missing)" in first.json()["outcome"]
    )
    assert again.status_code == 200 and again.json()["outcome"].startswith("duplicate")
    record = StripeEvent.objects.get()
    assert record.ignored and record.outcome == first.json()["outcome"]
    assert credit_available(ready_to_pay) == 3000  # the top-up's own payment, once


def test_an_event_of_a_type_the_broker_does_not_handle_is_ignored(stripe_sandbox):
    payload, signature = _signed_event("charge.dispute.created", {"id": "dp_1", "object": "dispute", "amount": 500})

    answer = _post(payload, signature)

    assert answer.status_code == 200
    record = StripeEvent.objects.get()
    assert record.ignored and record.outcome == "ignored: the broker does not handle charge.dispute.created events"


def test_a_payment_event_whose_amount_is_not_the_top_ups_is_ignored_not_raised(ready_to_pay, stripe_sandbox, sdk):
    topup = TopUp.objects.create(organization=ready_to_pay, amount_minor=5000, currency="USD", idempotency_key="x")
    # A PaymentIntent on the platform naming our top-up but for another amount: applying it would credit wrongly.
    sdk.v1.payment_intents.create(
        {
            "amount": 9000,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "metadata": {"topup": str(topup.public_id)},
        }
    )

    answers = _deliver_all(stripe_sandbox)

    assert [a.status_code for a in answers] == [200]
    record = StripeEvent.objects.get(type="payment_intent.succeeded")
    assert record.ignored and "does not match top-up" in record.outcome
    assert credit_available(ready_to_pay) == 0


def test_a_connected_accounts_payout_event_is_read_back_on_its_account(stripe_sandbox, sdk):
    account = _connected_account(sdk, stripe_sandbox)
    sdk.v1.transfers.create({"amount": 5000, "currency": "usd", "destination": account})
    payout = sdk.v1.payouts.create({"amount": 5000, "currency": "usd"}, {"stripe_account": account})
    stripe_sandbox.settle_payout(payout.id, "paid")
    stripe_sandbox.pending_events()
    stripe_sandbox.clear_calls()
    missing, missing_signature = _signed_event(
        "payout.paid", {"id": "po_notonthisaccount", "object": "payout", "amount": 5000}, account=account
    )

    answered = _post(missing, missing_signature)

    assert answered.status_code == 200
    assert f"could not be read back from connected account {account} (resource_missing)" in answered.json()["outcome"]
    assert [(c.action, c.account) for c in stripe_sandbox.calls()] == [("payouts.retrieve", account)]


def test_a_known_connected_payout_event_reads_back_with_its_account(stripe_sandbox, sdk):
    account = _connected_account(sdk, stripe_sandbox)
    sdk.v1.transfers.create({"amount": 5000, "currency": "usd", "destination": account})
    payout = sdk.v1.payouts.create({"amount": 5000, "currency": "usd"}, {"stripe_account": account})
    stripe_sandbox.pending_events()
    stripe_sandbox.settle_payout(payout.id, "paid")
    stripe_sandbox.clear_calls()

    answers = _deliver_all(stripe_sandbox)

    # Stripe has the payout on that account (read back with Stripe-Account); the broker has no such payout.
    assert [a.status_code for a in answers] == [200]
    assert [(c.action, c.account) for c in stripe_sandbox.calls()] == [("payouts.retrieve", account)]
    record = StripeEvent.objects.get(type="payout.paid")
    assert record.ignored and record.outcome == f"payout.paid: unknown payout {payout.id}, ignored"


def test_stripe_unreachable_during_the_read_back_is_503_and_the_retry_applies_it(ready_to_pay, stripe_sandbox, alice):
    topup = topup_start(
        organization=ready_to_pay,
        user=alice,
        request=TopUpRequest(
            amount_minor=3000, payment_method="pm_card_authenticationRequired", return_url="", idempotency_key="t"
        ),
    )
    stripe_sandbox.authenticate(topup.payment_intent, "approve")
    event = next(e for e in stripe_sandbox.pending_events() if e["type"] == "payment_intent.succeeded")
    stripe_sandbox.faults.inject("capacity", action="payment_intents.retrieve", times=1)

    failed = _post(event["payload"], event["signature"])
    assert failed.status_code == 503 and not StripeEvent.objects.exists()  # nothing recorded: Stripe sends it again
    retried = _post(event["payload"], event["signature"])

    assert retried.status_code == 200 and "succeeded" in retried.json()["outcome"]
    assert credit_available(ready_to_pay) == 3000
    assert not StripeEvent.objects.get().ignored
