"""Providers get paid (issue 22): Stripe Connect onboarding, payouts of the payable, Stripe's payout events, the
daily sweep and the portal's Payouts page. The real stripe SDK talks to the Stripe sandbox; the book is real.

Wire shapes the sandbox follows, from Stripe's reference: the Account object and its ``requirements.currently_due``
(https://docs.stripe.com/api/accounts/object), the Payout object with ``failure_code`` and ``failure_message``
(https://docs.stripe.com/api/payouts/object), payout failure codes (https://docs.stripe.com/api/payouts/failures),
the Event object with ``account`` for Connect events (https://docs.stripe.com/api/events/object) and idempotent
requests (https://docs.stripe.com/api/idempotent_requests).

Petra (owner of Petra GPU Cloud), victor (its viewer) and quentin (another provider) come from tests/portal/conftest.py;
alice (a buyer) and charlie (a stranger) from tests/conftest.py.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from marketplace.billing.book import Line, book_account, book_account_balance, book_post
from marketplace.billing.payouts import (
    PayoutRefused,
    connect_onboard,
    payable_minor,
    payout_event_handle,
    payout_run,
    payouts_due,
)
from marketplace.billing.stripe_gateway import EventView, stripe_gateway
from marketplace.models import BookAccountKind, BookEntry, ConnectAccount, Organization, Payout, PayoutState
from marketplace.portal.services import BusinessDetails, provider_details_update
from marketplace.tasks import payouts_due_task
from tests.portal.conftest import client_for

EARNED = 8800  # 100.00 USD paid by a buyer, less 12 % commission: 88.00 USD owed to the provider


@pytest.fixture(autouse=True)
def _minimum(settings):
    """Payouts from 10.00 USD. The sandbox (``stripe_sandbox``) and the book's balance check after each test
    come from tests/conftest.py."""
    settings.PAYOUT_MINIMUM_MINOR = 1000


def _details(org: Organization, country: str = "DE") -> None:
    provider_details_update(
        organization=org,
        details=BusinessDetails(
            legal_name=f"{org.name} Ltd",
            country=country,
            registered_address="1 Main Street",
            tax_id="DE123456789",
            contact_email="ops@provider.example",
        ),
    )


def _earn(org: Organization, net: int = EARNED, gross: int = 10000, key: str = "order-1") -> None:
    """An order that ended on the provider's capacity, posted as the order service posts it."""
    book_post(
        kind="order.settled",
        key=f"test:{org.pk}:{key}",
        lines=[
            Line(book_account(kind=BookAccountKind.REVENUE, currency="USD"), gross),
            Line(book_account(kind=BookAccountKind.COMMISSION, currency="USD"), -(gross - net)),
            Line(book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD", organization=org), -net),
        ],
    )


def _onboard(org: Organization) -> str:
    connect_onboard(
        organization=org,
        email="ops@provider.example",
        country="DE",
        refresh_url="https://broker.example/provider/payouts?onboarding=expired",
        return_url="https://broker.example/provider/payouts/connect/return",
    )
    return ConnectAccount.objects.get(organization=org).stripe_account


def _verified(org: Organization, sandbox) -> str:
    """Onboarding finished at Stripe, and its account.updated event taken in."""
    account = _onboard(org)
    sandbox.verify_account(account)
    for event in _events(sandbox, "account.updated"):
        payout_event_handle(event)
    return account


def _events(sandbox, kind: str) -> list[EventView]:
    """The sandbox's undelivered events of ``kind``, signature checked as the webhook receiver checks them."""
    gateway = stripe_gateway()
    views = [gateway.event_verify(item["payload"].encode(), item["signature"]) for item in sandbox.pending_events()]
    return [view for view in views if view.type == kind]


def _cash() -> int:
    return book_account_balance(kind=BookAccountKind.CASH, currency="USD")


def _in_payouts() -> int:
    return book_account_balance(kind=BookAccountKind.PAYOUTS, currency="USD")


# --- Onboarding ----------------------------------------------------------------------------------------------


def test_onboarding_makes_one_account_even_when_called_twice(petra_org, stripe_sandbox):
    first = connect_onboard(
        organization=petra_org, email="ops@petra.example", country="DE",
        refresh_url="https://broker.example/r", return_url="https://broker.example/back",
    )  # fmt: skip
    second = connect_onboard(
        organization=petra_org, email="ops@petra.example", country="DE",
        refresh_url="https://broker.example/r", return_url="https://broker.example/back",
    )  # fmt: skip

    connect = ConnectAccount.objects.get(organization=petra_org)
    # The page sends the person back to return_url when they are done (the account link carries it).
    onboarding = f"{stripe_sandbox.url}/_sandbox/stripe/onboarding/{connect.stripe_account}?return_url="
    assert first == second == onboarding + "https%3A%2F%2Fbroker.example%2Fback"
    assert len(stripe_sandbox.calls("accounts.create")) == 1
    assert len(stripe_sandbox.calls("account_links.create")) == 2
    assert (connect.country, connect.payouts_enabled, connect.details_submitted) == ("DE", False, False)
    assert "external_account" in connect.requirements_due


def test_account_updated_event_enables_payouts(petra_org, stripe_sandbox):
    account = _onboard(petra_org)

    stripe_sandbox.verify_account(account)
    [event] = _events(stripe_sandbox, "account.updated")
    outcome = payout_event_handle(event)

    connect = ConnectAccount.objects.get(organization=petra_org)
    assert outcome == f"account {account}: payouts enabled"
    assert (connect.payouts_enabled, connect.details_submitted, connect.requirements_due) == (True, True, [])


# --- Refusals ------------------------------------------------------------------------------------------------


def test_payout_without_a_connect_account_is_refused(petra_org, stripe_sandbox):
    _earn(petra_org)

    with pytest.raises(PayoutRefused, match="start the payout onboarding"):
        payout_run(organization=petra_org)

    assert Payout.objects.count() == 0
    assert payable_minor(petra_org) == EARNED
    assert stripe_sandbox.calls() == []


def test_payout_to_an_unverified_account_is_refused_and_nothing_moves(petra_org, stripe_sandbox):
    _onboard(petra_org)
    _earn(petra_org)
    entries = BookEntry.objects.count()

    with pytest.raises(PayoutRefused) as refused:
        payout_run(organization=petra_org)

    assert "not enabled" in refused.value.reason and "external_account" in refused.value.reason
    assert "external_account" in refused.value.requirements
    assert Payout.objects.count() == 0
    assert BookEntry.objects.count() == entries
    assert payable_minor(petra_org) == EARNED
    assert stripe_sandbox.calls("transfers.create") == [] and stripe_sandbox.calls("payouts.create") == []


def test_a_payable_below_the_minimum_is_not_paid_out(petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org, net=999, gross=1200)

    assert payout_run(organization=petra_org) is None

    assert Payout.objects.count() == 0
    assert payable_minor(petra_org) == 999
    assert stripe_sandbox.calls("transfers.create") == []


# --- Paying out ----------------------------------------------------------------------------------------------


def test_a_verified_payout_goes_in_transit_then_paid(petra_org, stripe_sandbox):
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)

    payout = payout_run(organization=petra_org)

    assert payout is not None
    assert (payout.state, payout.amount_minor, payout.currency) == (PayoutState.IN_TRANSIT, EARNED, "USD")
    assert payout.stripe_transfer.startswith("tr_") and payout.stripe_payout.startswith("po_")
    assert payable_minor(petra_org) == 0
    assert _in_payouts() == -EARNED
    transfer = stripe_sandbox.get(payout.stripe_transfer)
    assert (transfer["destination"], transfer["amount"], transfer["currency"]) == (account, EARNED, "usd")
    assert stripe_sandbox.get(payout.stripe_payout)["metadata"]["payout"] == str(payout.public_id)

    stripe_sandbox.settle_payout(payout.stripe_payout, "paid")
    [event] = _events(stripe_sandbox, "payout.paid")
    outcome = payout_event_handle(event)

    payout.refresh_from_db()
    assert outcome == f"payout {payout.public_id} paid"
    assert payout.state == PayoutState.PAID
    assert _cash() == -EARNED
    assert _in_payouts() == 0
    assert payable_minor(petra_org) == 0


def test_a_failed_payout_is_payable_again_with_stripes_reason_on_the_page(petra, petra_org, stripe_sandbox):
    _details(petra_org)
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    payout = payout_run(organization=petra_org)

    stripe_sandbox.settle_payout(payout.stripe_payout, "failed", "account_closed")
    [event] = _events(stripe_sandbox, "payout.failed")
    outcome = payout_event_handle(event)

    payout.refresh_from_db()
    assert outcome == f"payout {payout.public_id} failed: account_closed"
    assert (payout.state, payout.failure_code) == (PayoutState.FAILED, "account_closed")
    assert payout.failure_message == "The bank account has been closed."
    assert payable_minor(petra_org) == EARNED
    assert _in_payouts() == 0 and _cash() == 0
    page = client_for(petra).get("/provider/payouts").content.decode()
    assert "account_closed" in page and "The bank account has been closed." in page
    assert '<strong id="payable">88.00 USD</strong>' in page
    history = page.split("Payout history", 1)[1]
    assert "Amount (USD)" in history and '<td class="num">88.00</td>' in history


def test_after_a_failed_payout_the_next_pays_out_the_stripe_balance_without_a_second_transfer(
    petra_org, stripe_sandbox
):
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    failed = payout_run(organization=petra_org)
    stripe_sandbox.settle_payout(failed.stripe_payout, "failed", "account_closed")
    for event in _events(stripe_sandbox, "payout.failed"):
        payout_event_handle(event)
    assert stripe_sandbox.balance(account) == {"usd": EARNED}  # Stripe returned it to the provider's balance
    _earn(petra_org, key="order-2")  # earned since: paid on the run after

    again = payout_run(organization=petra_org)

    assert (again.state, again.amount_minor) == (PayoutState.IN_TRANSIT, EARNED)
    assert again.stripe_transfer == failed.stripe_transfer
    assert len(stripe_sandbox.calls("transfers.create")) == 1
    assert stripe_sandbox.balance(account) == {"usd": 0}
    assert payable_minor(petra_org) == EARNED
    stripe_sandbox.settle_payout(again.stripe_payout, "paid")
    for event in _events(stripe_sandbox, "payout.paid"):
        payout_event_handle(event)

    rest = payout_run(organization=petra_org)

    assert (rest.state, rest.amount_minor) == (PayoutState.IN_TRANSIT, EARNED)
    assert rest.stripe_transfer not in ("", failed.stripe_transfer)
    assert len(stripe_sandbox.calls("transfers.create")) == 2
    assert payable_minor(petra_org) == 0
    assert _cash() == -EARNED
    assert _in_payouts() == -EARNED


def test_the_same_event_twice_changes_nothing(petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    payout = payout_run(organization=petra_org)
    stripe_sandbox.settle_payout(payout.stripe_payout, "failed", "no_account")
    [event] = _events(stripe_sandbox, "payout.failed")
    payout_event_handle(event)
    entries = BookEntry.objects.count()

    again = payout_event_handle(event)

    assert again == f"payout {payout.public_id} already failed: unchanged"
    assert BookEntry.objects.count() == entries
    assert payable_minor(petra_org) == EARNED


def test_a_paid_event_after_a_failed_one_changes_nothing(petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    payout = payout_run(organization=petra_org)
    stripe_sandbox.settle_payout(payout.stripe_payout, "failed", "account_frozen")
    [failed] = _events(stripe_sandbox, "payout.failed")
    payout_event_handle(failed)
    paid = EventView(
        id="evt_forged_order", type="payout.paid", account=failed.account, object_type="payout",
        object={**failed.object, "status": "paid"}, created=failed.created,
    )  # fmt: skip

    assert payout_event_handle(paid) == f"payout {payout.public_id} already failed: unchanged"
    assert _cash() == 0
    assert payable_minor(petra_org) == EARNED


def test_an_event_before_our_calls_answer_finds_the_payout_by_its_metadata(petra_org, stripe_sandbox):
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    # Stripe makes the payout but its answer never reaches us (the connection drops after the call).
    stripe_sandbox.faults.inject("capacity", action="payouts.create", code="connection_drop_after")
    payout = payout_run(organization=petra_org)
    assert (payout.state, payout.stripe_payout) == (PayoutState.CREATED, None)
    stripe_sandbox.faults.clear()
    # Its Stripe id, asked again under the same idempotency key (Stripe answers with the first result).
    at_stripe = stripe_gateway().payout_create(
        account=account, amount_minor=EARNED, currency="USD", idempotency_key=f"payout:{payout.public_id}:payout",
        metadata={"payout": str(payout.public_id), "organization": str(petra_org.pk)},
    )  # fmt: skip

    stripe_sandbox.settle_payout(at_stripe.id, "failed", "could_not_process")
    [event] = _events(stripe_sandbox, "payout.failed")
    outcome = payout_event_handle(event)

    payout.refresh_from_db()
    assert outcome == f"payout {payout.public_id} failed: could_not_process"
    assert (payout.state, payout.stripe_payout) == (PayoutState.FAILED, at_stripe.id)
    assert payable_minor(petra_org) == EARNED
    assert len(stripe_sandbox.calls("transfers.create")) == 1


def test_an_event_for_an_unknown_payout_is_answered_not_raised(petra_org, stripe_sandbox):
    event = EventView(
        id="evt_1", type="payout.paid", account="acct_nobody", object_type="payout",
        object={"id": "po_nobody", "object": "payout", "amount": 100, "metadata": {"payout": "not-a-uuid"}},
        created=0,
    )  # fmt: skip

    assert payout_event_handle(event) == "payout.paid: unknown payout po_nobody, ignored"
    assert BookEntry.objects.count() == 0


def test_stripe_unavailable_at_the_transfer_retries_without_a_second_transfer(petra_org, stripe_sandbox):
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    # The transfer is made at Stripe, then the connection drops: we cannot know it was made.
    stripe_sandbox.faults.inject("capacity", action="transfers.create", code="connection_drop_after")

    first = payout_run(organization=petra_org)

    assert (first.state, first.stripe_transfer) == (PayoutState.CREATED, "")
    assert payable_minor(petra_org) == 0  # held by the payout, not payable twice
    stripe_sandbox.faults.clear()

    again = payout_run(organization=petra_org)

    assert again.pk == first.pk
    assert again.state == PayoutState.IN_TRANSIT
    assert Payout.objects.count() == 1
    keys = {call.idempotency_key for call in stripe_sandbox.calls("transfers.create")}
    assert keys == {f"payout:{first.public_id}:transfer"}
    # One transfer in, one payout out: a second transfer would have left its amount on the connected account.
    assert stripe_sandbox.balance(account) == {"usd": 0}
    assert _in_payouts() == -EARNED


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_make_one_payout_and_one_transfer(petra_org, stripe_sandbox):
    """The beat's sweep and the owner's button at the same moment: the organisation's row lock makes one
    payout; the other run finds it (or nothing left) and Stripe's idempotency keeps it to one transfer."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    barrier = threading.Barrier(2)
    answers: list[Payout | None] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            answers.append(payout_run(organization=Organization.objects.get(pk=petra_org.pk)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    payout = Payout.objects.get()
    assert payout.state == PayoutState.IN_TRANSIT
    assert {answer.pk for answer in answers if answer is not None} == {payout.pk}
    assert {call.idempotency_key for call in stripe_sandbox.calls("transfers.create")} == {
        f"payout:{payout.public_id}:transfer"
    }
    assert stripe_sandbox.balance(account) == {"usd": 0}
    assert payable_minor(petra_org) == 0


def test_a_transfer_stripe_refuses_is_reversed_and_payable_again(petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    stripe_sandbox.faults.inject("credentials", action="transfers.create")

    payout = payout_run(organization=petra_org)

    assert payout.state == PayoutState.FAILED
    assert payout.failure_message
    assert payable_minor(petra_org) == EARNED
    assert _in_payouts() == 0
    assert BookEntry.objects.filter(kind="payout.reversed", key=f"payout:{payout.public_id}:reversed").count() == 1
    assert stripe_sandbox.calls("payouts.create") == []


# --- The schedule --------------------------------------------------------------------------------------------


def test_the_sweep_goes_on_past_an_organisation_that_fails(petra_org, quentin, stripe_sandbox):
    quentin_org = Organization.objects.get(name="Q Compute")
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    _earn(quentin_org)
    # Q Compute's account is gone at Stripe: reading it fails.
    ConnectAccount.objects.create(
        organization=quentin_org, stripe_account="acct_gone", country="DE", payouts_enabled=True
    )

    totals = payouts_due()

    assert totals == {"organizations": 2, "sent": 1, "failed": 0, "waiting": 0, "refused": 1, "errors": 0}
    assert Payout.objects.get().organization == petra_org
    assert payable_minor(petra_org) == 0
    assert payable_minor(quentin_org) == EARNED


def test_the_daily_task_pays_out_whoever_is_owed(petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)

    totals = payouts_due_task()
    again = payouts_due_task()

    assert totals["sent"] == 1
    assert again == {"organizations": 0, "sent": 0, "failed": 0, "waiting": 0, "refused": 0, "errors": 0}
    assert Payout.objects.get().state == PayoutState.IN_TRANSIT


# --- The portal ----------------------------------------------------------------------------------------------


def test_the_payouts_page_shows_the_payable_and_onboarding_to_its_owner(petra, petra_org, stripe_sandbox):
    _details(petra_org)
    _earn(petra_org)

    page = client_for(petra).get("/provider/payouts").content.decode()

    assert '<strong id="payable">88.00 USD</strong>' in page
    assert "Set up payouts with Stripe" in page and "The minimum payout is <strong>10.00 USD</strong>" in page
    assert "/provider/earnings?month=" in page


def test_onboarding_from_the_page_goes_to_stripe_and_lists_whats_due(petra, petra_org, stripe_sandbox):
    _details(petra_org)
    client = client_for(petra)

    answer = client.post("/provider/payouts/onboard")

    connect = ConnectAccount.objects.get(organization=petra_org)
    # One step: straight on to Stripe's onboarding, which the site's CSP lets a form's answer lead to.
    link = (
        f"{stripe_sandbox.url}/_sandbox/stripe/onboarding/{connect.stripe_account}"
        "?return_url=http%3A%2F%2Ftestserver%2Fprovider%2Fpayouts%2Fconnect%2Freturn"
    )
    assert answer.status_code == 302 and answer["Location"] == link
    assert f"form-action 'self' {stripe_sandbox.url}" in answer["Content-Security-Policy"]
    page = client.get("/provider/payouts").content.decode()
    assert "Continue onboarding at Stripe" in page and "<code>external_account</code>" in page

    stripe_sandbox.verify_account(connect.stripe_account)
    back = client.get("/provider/payouts/connect/return", follow=True).content.decode()
    assert "payouts are enabled" in back and "verified" in back


def test_pay_out_now_on_the_page(petra, petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)

    page = client_for(petra).post("/provider/payouts/run", follow=True).content.decode()

    assert "88.00 USD is on its way to your bank." in page
    assert Payout.objects.get().state == PayoutState.IN_TRANSIT


def test_pay_out_now_to_an_unverified_account_says_why(petra, petra_org, stripe_sandbox):
    _onboard(petra_org)
    _earn(petra_org)

    page = client_for(petra).post("/provider/payouts/run", follow=True).content.decode()

    assert "Payout refused: payouts are not enabled" in page and "external_account" in page
    assert Payout.objects.count() == 0


def test_pay_out_now_needs_the_csrf_token(petra, petra_org, stripe_sandbox):
    _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    client = Client(enforce_csrf_checks=True)
    client.force_login(petra)

    assert client.post("/provider/payouts/run").status_code == 403
    assert Payout.objects.count() == 0


@pytest.mark.parametrize("path", ["/provider/payouts", "/provider/payouts/connect/return"])
def test_the_payouts_pages_are_refused_to_buyers_strangers_and_non_owners(alice, charlie, victor, path):
    assert client_for(alice).get(path).status_code == 404
    assert client_for(charlie).get(path).status_code == 404
    assert client_for(victor).get(path).status_code == 403


@pytest.mark.parametrize("path", ["/provider/payouts/run", "/provider/payouts/onboard"])
def test_the_payout_actions_are_refused_to_buyers_strangers_and_non_owners(alice, charlie, victor, path):
    assert client_for(alice).post(path).status_code == 404
    assert client_for(charlie).post(path).status_code == 404
    assert client_for(victor).post(path).status_code == 403
    assert Payout.objects.count() == 0 and ConnectAccount.objects.count() == 0


def test_the_statement_names_its_currency_on_every_amount(petra, petra_org):
    page = client_for(petra).get("/provider/earnings?month=2026-11").content.decode()

    assert "Gross (USD)" in page and "Net (USD)" in page
    assert 'Total</th><th class="num">0.00 USD</th>' in page
    assert '<a href="/provider/payouts">Payouts</a>' in page
