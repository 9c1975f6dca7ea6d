"""The Stripe sandbox is as strict as Stripe, driven by the official ``stripe`` SDK (stripe-python).

Rules, from Stripe's documentation:
- An unknown parameter is 400 ``parameter_unknown`` naming it ("Received unknown parameter: foo"):
  https://docs.stripe.com/error-codes/parameter-unknown
- The smallest charge per currency (usd 50 cents, gbp 30 pence, jpy ¥50, ...) is refused below with
  ``amount_too_small``: https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts; zero-decimal
  currencies (jpy) count whole units: https://docs.stripe.com/currencies#zero-decimal; three-decimal ones end in 0:
  https://docs.stripe.com/currencies#three-decimal; a currency Stripe does not support is refused (param currency):
  https://docs.stripe.com/currencies#presentment-currencies
- Test PaymentMethods and card numbers and what each does: https://docs.stripe.com/testing (declines and their codes:
  https://docs.stripe.com/declines/codes)
- Lists: ``limit`` 1 to 100 (10 by default), ``starting_after``/``ending_before``, newest first,
  ``{"object": "list", "data", "has_more", "url"}``: https://docs.stripe.com/api/pagination; the SDK's
  ``auto_paging_iter`` walks them: https://docs.stripe.com/api/pagination/auto
- Balance transactions (type, amount, fee, net, source, reporting_category):
  https://docs.stripe.com/api/balance_transactions/object; the card fee is Stripe's standard US 2.9% + 30¢:
  https://stripe.com/pricing
- ``expand`` and its refusal ("This property cannot be expanded (x)."): https://docs.stripe.com/api/expanding_objects
- Refund and transfer retrieve: https://docs.stripe.com/api/refunds/retrieve,
  https://docs.stripe.com/api/transfers/retrieve; PaymentIntent cancel (statuses, cancellation_reason, canceled_at,
  payment_intent.canceled): https://docs.stripe.com/api/payment_intents/cancel
- Each object's fields, always present (nullable ones as null), from its reference page named in
  ``sandboxes/stripe/shapes.py`` (e.g. Transfer.reversals https://docs.stripe.com/api/transfers/object,
  Payout.reconciliation_status https://docs.stripe.com/api/payouts/object, Charge.disputed
  https://docs.stripe.com/api/charges/object).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import stripe

from sandboxes.stripe import state
from sandboxes.stripe.app import DEFAULT_SECRET_KEY, StripeSandbox
from sandboxes.stripe.shapes import OPTIONAL, SHAPES
from sandboxes.stripe.state import AUTHENTICATION_REQUIRED, DECLINES, SUCCEEDS, TEST_METHODS

RETURN_URL = "https://broker.example/pay/return"


@pytest.fixture(scope="module")
def server() -> Iterator[StripeSandbox]:
    sandbox = StripeSandbox()
    sandbox.start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(server: StripeSandbox) -> Iterator[StripeSandbox]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture
def client(sandbox: StripeSandbox) -> stripe.StripeClient:
    return stripe.StripeClient(DEFAULT_SECRET_KEY, base_addresses={"api": sandbox.url}, max_network_retries=0)


def _pay(client: stripe.StripeClient, method: str = "pm_card_visa", amount: int = 2500, **extra: Any) -> Any:
    params = {"amount": amount, "currency": "usd", "payment_method": method, "confirm": True, **extra}
    return client.v1.payment_intents.create(params)


def _verified_account(client: stripe.StripeClient, sandbox: StripeSandbox) -> Any:
    params: Any = {"type": "express", "country": "US", "email": "petra@provider.example"}
    params["capabilities"] = {"transfers": {"requested": True}}
    account = client.v1.accounts.create(params)
    sandbox.verify_account(account.id)
    return account


def _raw(sandbox: StripeSandbox, method: str, path: str, **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {DEFAULT_SECRET_KEY}", **kwargs.pop("headers", {})}
    return requests.request(method, f"{sandbox.url}{path}", headers=headers, timeout=10, **kwargs)


# ------------------------------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: c.v1.payment_intents.create({"amount": 2500, "currency": "usd", "foo": "1"}), "foo"),
        (lambda c: c.v1.customers.create({"emial": "alice@buyer.example"}), "emial"),
        # Documented by Stripe but not emulated: refused rather than silently ignored.
        (
            lambda c: c.v1.refunds.create({"payment_intent": "pi_x", "amount": 100, "reverse_transfer": True}),
            "reverse_transfer",
        ),
        (lambda c: c.v1.transfers.create({"amount": 100, "currency": "usd", "destinaton": "acct_x"}), "destinaton"),
        (lambda c: c.v1.payment_intents.list({"limt": 3}), "limt"),
    ],
)
def test_an_unknown_parameter_is_refused_by_name(
    client: stripe.StripeClient, sandbox: StripeSandbox, call: Any, param: str
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        call(client)

    assert (caught.value.http_status, caught.value.code, caught.value.param) == (400, "parameter_unknown", param)
    assert caught.value.user_message == f"Received unknown parameter: {param}"
    assert [sandbox.get_objects(k) for k in ("payment_intent", "customer", "refund", "transfer")] == [[], [], [], []]


@pytest.mark.parametrize(
    ("currency", "floor"), [("usd", 50), ("eur", 50), ("gbp", 30), ("jpy", 50), ("hkd", 400), ("mxn", 1000)]
)
def test_a_charge_below_the_currencys_minimum_is_refused(
    client: stripe.StripeClient, sandbox: StripeSandbox, currency: str, floor: int
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        client.v1.payment_intents.create({"amount": floor - 1, "currency": currency})
    at_floor = client.v1.payment_intents.create({"amount": floor, "currency": currency})

    assert (caught.value.http_status, caught.value.code, caught.value.param) == (400, "amount_too_small", "amount")
    assert [p["id"] for p in sandbox.get_objects("payment_intent")] == [at_floor.id]


def test_a_ten_cent_usd_charge_an_unknown_currency_and_a_three_decimal_odd_amount_are_refused(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as ten_cents:
        _pay(client, amount=10)
    with pytest.raises(stripe.InvalidRequestError) as xyz:
        client.v1.payment_intents.create({"amount": 2500, "currency": "xyz"})
    with pytest.raises(stripe.InvalidRequestError) as kwd:
        client.v1.payment_intents.create({"amount": 1005, "currency": "kwd"})

    assert (ten_cents.value.code, ten_cents.value.user_message) == (
        "amount_too_small",
        "Amount must be at least 0.50 usd",
    )
    assert (xyz.value.error.type, xyz.value.param) == ("invalid_request_error", "currency")
    assert kwd.value.param == "amount"
    assert sandbox.get_objects("payment_intent") == []


# ---------------------------------------------------------------------------------- test payment methods


@pytest.mark.parametrize(
    ("method", "code", "decline_code"),
    [
        ("pm_card_visa_chargeDeclined", "card_declined", "generic_decline"),
        ("pm_card_visa_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds"),
        ("pm_card_visa_chargeDeclinedLostCard", "card_declined", "lost_card"),
        ("pm_card_visa_chargeDeclinedStolenCard", "card_declined", "stolen_card"),
        ("pm_card_chargeDeclinedExpiredCard", "expired_card", "expired_card"),
        ("pm_card_chargeDeclinedIncorrectCvc", "incorrect_cvc", "incorrect_cvc"),
        ("pm_card_chargeDeclinedProcessingError", "processing_error", "processing_error"),
    ],
)
def test_each_declining_test_method_declines_with_its_codes(
    client: stripe.StripeClient, method: str, code: str, decline_code: str
) -> None:
    with pytest.raises(stripe.CardError) as caught:
        _pay(client, method)

    assert (caught.value.http_status, caught.value.code, caught.value.error.decline_code) == (402, code, decline_code)
    charge = client.v1.payment_intents.retrieve(caught.value.error.payment_intent.id, {"expand": ["latest_charge"]})
    assert (charge.latest_charge.status, charge.latest_charge.failure_code) == ("failed", code)
    assert charge.latest_charge.balance_transaction is None


def test_three_d_secure_2_required_asks_for_authentication_and_debit_cards_succeed(
    client: stripe.StripeClient,
) -> None:
    challenged = _pay(client, "pm_card_threeDSecure2Required", return_url=RETURN_URL)
    debit = _pay(client, "pm_card_visa_debit")

    assert (challenged.status, challenged.next_action.type) == ("requires_action", "redirect_to_url")
    assert debit.status == "succeeded"


def test_test_card_numbers_map_to_the_same_behaviours_as_the_methods() -> None:
    assert state.test_card_behaviour("4242 4242 4242 4242") == SUCCEEDS == TEST_METHODS["pm_card_visa"]
    assert state.test_card_behaviour("4000-0025-0000-3155") == AUTHENTICATION_REQUIRED
    assert state.test_card_behaviour("4000000000003220") == TEST_METHODS["pm_card_threeDSecure2Required"]
    assert (
        state.test_card_behaviour("4000000000000002")
        == TEST_METHODS["pm_card_visa_chargeDeclined"]
        == "generic_decline"
    )
    assert state.test_card_behaviour("4000000000009995") == "insufficient_funds"
    assert state.test_card_behaviour("4000000000000069") == "expired_card"
    assert state.test_card_behaviour("4242424242424241") == "incorrect_number"  # fails the Luhn check
    assert state.test_card_behaviour("4111111111111111") == "test_mode_live_card"  # a well-formed card not on the list
    assert state.test_card_behaviour("abc") == "incorrect_number"
    assert set(TEST_METHODS.values()) <= {SUCCEEDS, AUTHENTICATION_REQUIRED, *DECLINES}


# ---------------------------------------------------------------------------------------------- lists


def test_auto_paging_walks_every_page_newest_first(client: stripe.StripeClient) -> None:
    made = [client.v1.payment_intents.create({"amount": 100 + n, "currency": "usd"}).id for n in range(23)]

    first = client.v1.payment_intents.list({"limit": 10})
    walked = [pi.id for pi in first.auto_paging_iter()]
    default = client.v1.payment_intents.list()

    assert (first.object, first.url, first.has_more, len(first.data)) == ("list", "/v1/payment_intents", True, 10)
    assert walked == made[::-1]
    assert len(default.data) == 10


def test_cursors_page_both_ways_and_a_bad_limit_or_cursor_is_refused(client: stripe.StripeClient) -> None:
    made = [client.v1.payment_intents.create({"amount": 100 + n, "currency": "usd"}).id for n in range(5)]
    newest_first = made[::-1]

    after = client.v1.payment_intents.list({"limit": 2, "starting_after": newest_first[1]})
    before = client.v1.payment_intents.list({"limit": 2, "ending_before": newest_first[4]})
    last = client.v1.payment_intents.list({"limit": 2, "starting_after": newest_first[2]})

    assert ([p.id for p in after.data], after.has_more) == (newest_first[2:4], True)
    assert ([p.id for p in before.data], before.has_more) == (newest_first[2:4], True)
    assert ([p.id for p in last.data], last.has_more) == (newest_first[3:5], False)
    for limit in (0, 101):
        with pytest.raises(stripe.InvalidRequestError) as caught:
            client.v1.payment_intents.list({"limit": limit})
        assert caught.value.param == "limit"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.payment_intents.list({"starting_after": "pi_nosuchintent"})
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")


def test_lists_filter_by_their_fields_and_by_created(client: stripe.StripeClient, sandbox: StripeSandbox) -> None:
    alice = client.v1.customers.create({"email": "alice@buyer.example"})
    mine = _pay(client, customer=alice.id)
    _pay(client)
    refund = client.v1.refunds.create({"payment_intent": mine.id, "amount": 500})
    created = sandbox.get(mine.id)["created"]

    assert [p.id for p in client.v1.payment_intents.list({"customer": alice.id}).data] == [mine.id]
    assert [r.id for r in client.v1.refunds.list({"payment_intent": mine.id}).data] == [refund.id]
    assert len(client.v1.payment_intents.list({"created": {"gte": created}}).data) == 2
    assert client.v1.payment_intents.list({"created": {"lt": created}}).data == []
    events = client.v1.events.list({"type": "payment_intent.*"})
    assert [e.type for e in events.data] == ["payment_intent.succeeded"] * 2
    assert [e.type for e in client.v1.events.list({"types": ["refund.created"]}).data] == ["refund.created"]


# ---------------------------------------------------------------------------------- balance transactions


def test_money_movements_leave_retrievable_balance_transactions(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    paid = _pay(client, amount=10_000, description="top-up")
    refund = client.v1.refunds.create({"payment_intent": paid.id, "amount": 2_500})
    account = _verified_account(client, sandbox)
    transfer = client.v1.transfers.create({"amount": 6_000, "currency": "usd", "destination": account.id})
    on_account: Any = {"stripe_account": account.id}
    payout = client.v1.payouts.create({"amount": 4_000, "currency": "usd"}, on_account)
    sandbox.settle_payout(payout.id, "failed", "account_closed")

    charge = client.v1.payment_intents.retrieve(
        paid.id, {"expand": ["latest_charge.balance_transaction"]}
    ).latest_charge
    txn = charge.balance_transaction
    assert (txn.type, txn.amount, txn.fee, txn.net, txn.source) == ("charge", 10_000, 320, 9_680, charge.id)
    assert txn.fee_details[0].type == "stripe_fee"
    platform = client.v1.balance_transactions.list()
    assert [(t.type, t.amount, t.source) for t in platform.data] == [
        ("transfer", -6_000, transfer.id),
        ("refund", -2_500, refund.id),
        ("charge", 10_000, charge.id),
    ]
    connected = client.v1.balance_transactions.list(options=on_account)
    failed = client.v1.payouts.retrieve(payout.id, options=on_account)
    assert [(t.type, t.amount, t.source) for t in connected.data] == [
        ("payout_failure", 4_000, payout.id),
        ("payout", -4_000, payout.id),
        ("payment", 6_000, transfer.destination_payment),
    ]
    assert failed.failure_balance_transaction == connected.data[0].id
    for owner, txn_id in [
        (None, refund.balance_transaction),
        (None, transfer.balance_transaction),
        (account.id, payout.balance_transaction),
    ]:
        options: Any = {"stripe_account": owner} if owner else {}
        assert client.v1.balance_transactions.retrieve(txn_id, options=options).id == txn_id
    only_refunds = client.v1.balance_transactions.list({"type": "refund", "expand": ["data.source"]})
    assert [(t.source.object, t.source.id) for t in only_refunds.data] == [("refund", refund.id)]
    with pytest.raises(stripe.InvalidRequestError) as elsewhere:
        client.v1.balance_transactions.retrieve(payout.balance_transaction)  # on the connected account, not ours
    assert elsewhere.value.code == "resource_missing"


def test_balance_transactions_page_with_the_sdk(client: stripe.StripeClient) -> None:
    for n in range(12):
        _pay(client, amount=1_000 + n)

    walked = list(client.v1.balance_transactions.list({"limit": 5, "type": "charge"}).auto_paging_iter())

    assert [t.amount for t in walked] == [1_000 + n for n in range(12)][::-1]


# ------------------------------------------------------------------------------------------------ expand


def test_expand_replaces_ids_with_objects_in_answers_and_lists(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    alice = client.v1.customers.create({"email": "alice@buyer.example"})
    paid = _pay(client, customer=alice.id, expand=["customer", "latest_charge"])
    refund = client.v1.refunds.retrieve(
        client.v1.refunds.create({"payment_intent": paid.id, "amount": 100}).id, {"expand": ["charge"]}
    )
    account = _verified_account(client, sandbox)
    transfer = client.v1.transfers.create(
        {"amount": 900, "currency": "usd", "destination": account.id, "expand": ["destination", "destination_payment"]}
    )
    listed = client.v1.payment_intents.list({"expand": ["data.latest_charge.balance_transaction"]})

    assert (paid.customer.object, paid.customer.id, paid.latest_charge.object) == ("customer", alice.id, "charge")
    assert (refund.charge.id, refund.charge.amount_refunded) == (paid.latest_charge.id, 100)
    assert (transfer.destination.object, transfer.destination_payment.source_transfer) == ("account", transfer.id)
    assert listed.data[0].latest_charge.balance_transaction.object == "balance_transaction"


@pytest.mark.parametrize("path", ["description", "latest_charge.nosuchfield", "data.customer", "latest_charge.x.y.z.w"])
def test_an_unexpandable_path_is_refused_before_anything_happens(
    client: stripe.StripeClient, sandbox: StripeSandbox, path: str
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        _pay(client, expand=[path])

    assert caught.value.param == "expand"
    assert caught.value.user_message in (f"This property cannot be expanded ({path}).",)
    assert sandbox.get_objects("payment_intent") == []


# ------------------------------------------------------------------------------------ retrieve and cancel


def test_refunds_and_transfers_are_retrieved_on_their_account(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    paid = _pay(client)
    refund = client.v1.refunds.create({"payment_intent": paid.id, "amount": 700, "reason": "requested_by_customer"})
    account = _verified_account(client, sandbox)
    transfer = client.v1.transfers.create({"amount": 800, "currency": "usd", "destination": account.id})

    assert client.v1.refunds.retrieve(refund.id).to_dict() == refund.to_dict()
    assert client.v1.transfers.retrieve(transfer.id).to_dict() == transfer.to_dict()
    with pytest.raises(stripe.InvalidRequestError) as caught:
        client.v1.transfers.retrieve(transfer.id, options={"stripe_account": account.id})
    assert caught.value.code == "resource_missing"


def test_a_payment_intent_is_cancelled_only_from_a_cancellable_status(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    open_intent = client.v1.payment_intents.create({"amount": 2500, "currency": "usd"})
    paid = _pay(client)

    with pytest.raises(stripe.InvalidRequestError) as bad_reason:
        client.v1.payment_intents.cancel(open_intent.id, {"cancellation_reason": "bored"})
    cancelled = client.v1.payment_intents.cancel(open_intent.id, {"cancellation_reason": "abandoned"})
    with pytest.raises(stripe.InvalidRequestError) as too_late:
        client.v1.payment_intents.cancel(paid.id)
    with pytest.raises(stripe.InvalidRequestError) as twice:
        client.v1.payment_intents.cancel(open_intent.id)

    assert bad_reason.value.param == "cancellation_reason"
    assert (cancelled.status, cancelled.cancellation_reason) == ("canceled", "abandoned")
    assert isinstance(cancelled.canceled_at, int)
    assert (too_late.value.code, twice.value.code) == ("payment_intent_unexpected_state",) * 2
    assert client.v1.payment_intents.retrieve(paid.id).status == "succeeded"
    assert [e["type"] for e in sandbox.pending_events()] == ["payment_intent.succeeded", "payment_intent.canceled"]


# -------------------------------------------------------------------------------------------- object shapes


def _assert_shape(obj: dict[str, Any]) -> None:
    kind = obj["object"]
    url, fields = SHAPES[kind]
    extra = set(obj) - set(fields) - OPTIONAL.get(kind, frozenset())
    assert set(fields) <= set(obj) and not extra, f"{kind} ({url}): missing {set(fields) - set(obj)}, extra {extra}"


def test_every_object_carries_the_fields_its_reference_page_lists(
    client: stripe.StripeClient, sandbox: StripeSandbox
) -> None:
    alice = client.v1.customers.create({"email": "alice@buyer.example"})
    paid = _pay(client, customer=alice.id)
    with pytest.raises(stripe.CardError):
        _pay(client, "pm_card_chargeDeclined")
    client.v1.refunds.create({"payment_intent": paid.id, "amount": 100})
    account = _verified_account(client, sandbox)
    link = client.v1.account_links.create(
        {"account": account.id, "refresh_url": RETURN_URL, "return_url": RETURN_URL, "type": "account_onboarding"}
    )
    transfer = client.v1.transfers.create({"amount": 900, "currency": "usd", "destination": account.id})
    on_account: Any = {"stripe_account": account.id}
    payout = client.v1.payouts.create({"amount": 900, "currency": "usd"}, on_account)
    sandbox.settle_payout(payout.id, "paid")
    line: Any = {"quantity": 1, "price_data": {"currency": "usd", "unit_amount": 900, "product_data": {"name": "x"}}}
    session = client.v1.checkout.sessions.create({"mode": "payment", "line_items": [line]})

    answers = [
        client.v1.customers.retrieve(alice.id),
        client.v1.accounts.retrieve(account.id),
        link,
        client.v1.transfers.retrieve(transfer.id),
        client.v1.payouts.retrieve(payout.id, options=on_account),
        *client.v1.payment_intents.list({"expand": ["data.latest_charge"]}).data,
        *[pi.latest_charge for pi in client.v1.payment_intents.list({"expand": ["data.latest_charge"]}).data],
        *client.v1.refunds.list().data,
        *client.v1.balance_transactions.list().data,
        *client.v1.balance_transactions.list(options=on_account).data,
        *client.v1.events.list().data,
        client.v1.checkout.sessions.retrieve(session.id),
    ]
    objects = [a.to_dict() for a in answers]

    assert {o["object"] for o in objects} == set(SHAPES)
    for obj in objects:
        _assert_shape(obj)
    assert objects[3]["reversals"]["url"] == f"/v1/transfers/{transfer.id}/reversals"
    assert objects[4]["reconciliation_status"] == "not_applicable"
