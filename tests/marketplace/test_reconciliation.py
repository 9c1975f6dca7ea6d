"""Daily reconciliation of Stripe against the book (issue 35, point 3): every kind of disagreement staged, each
flagged (a mismatch row, the alert metric, the staff page) and none silently fixed.

Stripe's side is read with the official SDK from the Stripe sandbox: balance transactions with ``type``,
``amount``, ``fee``, ``net`` and ``source`` (https://docs.stripe.com/api/balance_transactions/object), listed by
``created[gte]``/``created[lt]`` with cursor pagination (https://docs.stripe.com/api/pagination), the charge's
PaymentIntent through ``expand[]=data.source`` (https://docs.stripe.com/api/expanding_objects), and each connected
account's payouts (https://docs.stripe.com/api/payouts/list, ``Stripe-Account``).
"""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from marketplace.billing.book import Line, book_account, book_post
from marketplace.billing.payments import TopUpRequest, topup_refund, topup_start
from marketplace.billing.payouts import payout_run
from marketplace.billing.reconciliation import reconcile_day, reconcile_days
from marketplace.billing.stripe_gateway import PaymentUnavailable, stripe_gateway
from marketplace.models import (
    BookAccountKind,
    ConnectAccount,
    MismatchKind,
    Organization,
    PayoutState,
    ReconciliationMismatch,
    ReconciliationRun,
)
from tests.factories import OrganizationFactory

pytestmark = pytest.mark.django_db


def _topup(organization, user, amount: int, key: str) -> None:
    request = TopUpRequest(amount_minor=amount, payment_method="pm_card_visa", return_url="", idempotency_key=key)
    topup_start(organization=organization, user=user, request=request)


def _provider_paid_out(sdk, sandbox, settings) -> tuple[Organization, str]:
    """A provider with a verified Connect account, owed 50.00 USD and paid out (in transit at Stripe)."""
    settings.PAYOUT_MINIMUM_MINOR = 1000
    provider = OrganizationFactory(name="Petra GPU Cloud")
    account = sdk.v1.accounts.create({"type": "express", "capabilities": {"transfers": {"requested": True}}}).id
    sandbox.verify_account(account)
    ConnectAccount.objects.create(organization=provider, stripe_account=account, country="DE", payouts_enabled=True)
    book_post(
        kind="order.settled",
        key=f"test:{provider.pk}:earned",
        lines=[
            Line(book_account(kind=BookAccountKind.REVENUE, currency="USD"), 5000),
            Line(book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD", organization=provider), -5000),
        ],
    )
    payout = payout_run(organization=provider)
    assert payout is not None and payout.state == PayoutState.IN_TRANSIT
    return provider, account


def _found() -> list[tuple[str, str]]:
    return sorted((m.kind, m.detail) for m in ReconciliationMismatch.objects.all())


def test_a_day_of_top_ups_refunds_and_payouts_matches_with_nothing_flagged(
    ready_to_pay, alice, stripe_sandbox, sdk, settings
):
    _topup(ready_to_pay, alice, 5000, "a")
    _topup(ready_to_pay, alice, 2500, "b")
    topup_refund(topup=ready_to_pay.topups.get(idempotency_key="a"), amount_minor=1000, by=alice)
    _provider_paid_out(sdk, stripe_sandbox, settings)

    run = reconcile_day(timezone.now().date())

    assert (run.mismatches, run.error) == (0, "") and _found() == []
    # 2 charges, 1 refund, 1 transfer on the platform and the provider's payout at Stripe; all matched.
    assert run.stripe_items == 5 and run.matched >= 5 and run.finished_at is not None


def test_each_kind_of_mismatch_is_flagged_and_nothing_is_fixed(ready_to_pay, alice, stripe_sandbox, sdk, settings):
    _topup(ready_to_pay, alice, 5000, "a")  # matched
    # At Stripe, not in the book: a charge the broker never booked.
    stray = sdk.v1.payment_intents.create(
        {
            "amount": 1200,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "return_url": "https://x.example",
        }
    )
    # At Stripe for 3000, in the book for 2000.
    short = sdk.v1.payment_intents.create(
        {
            "amount": 3000,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "return_url": "https://x.example",
        }
    )
    cash = book_account(kind=BookAccountKind.CASH, currency="USD")
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=ready_to_pay)
    book_post(kind="topup", key=f"stripe:{short.id}:succeeded", lines=[Line(cash, 2000), Line(credit, -2000)])
    # In the book, not at Stripe.
    book_post(kind="topup", key="stripe:pi_neverstripes:succeeded", lines=[Line(cash, 700), Line(credit, -700)])
    # A payout Stripe paid whose payout.paid event never arrived: ours is still in transit.
    provider, account = _provider_paid_out(sdk, stripe_sandbox, settings)
    payout = provider.payouts.get()
    stripe_sandbox.settle_payout(payout.stripe_payout, "paid")
    book_lines_before = list(cash.lines.values_list("amount_minor", flat=True).order_by("pk"))

    run = reconcile_day(timezone.now().date())

    found = {m.kind: m for m in ReconciliationMismatch.objects.filter(run=run)}
    assert run.mismatches == 4 and set(found) == set(MismatchKind.values)
    assert found["missing_in_book"].stripe_minor == 1200 and stray.latest_charge in found["missing_in_book"].detail
    assert (found["amount_differs"].stripe_minor, found["amount_differs"].book_minor) == (3000, 2000)
    assert found["amount_differs"].book_key == f"stripe:{short.id}:succeeded"
    assert found["missing_at_stripe"].book_key == "stripe:pi_neverstripes:succeeded"
    assert found["status_differs"].detail == f"Stripe payout {payout.stripe_payout} is paid, ours in_transit"
    assert found["status_differs"].account == account
    # Flagged only: the book and the payout are as they were.
    assert list(cash.lines.values_list("amount_minor", flat=True).order_by("pk")) == book_lines_before
    payout.refresh_from_db()
    assert payout.state == PayoutState.IN_TRANSIT

    # The alert metric and the staff page show them.
    metrics = Client().get("/metrics").content.decode()
    assert 'broker_reconciliation_mismatches{kind="amount_differs"} 1.0' in metrics
    assert "broker_reconciliation_age_seconds" in metrics
    staff = get_user_model().objects.create_superuser("ops", "ops@broker.example", "pw-ops-123456")
    admin = Client()
    admin.force_login(staff)
    page = admin.get("/admin/marketplace/reconciliationmismatch/?reviewed_at__isnull=True")
    assert page.status_code == 200 and "pi_neverstripes" in page.content.decode()


def test_a_reviewed_mismatch_stays_reviewed_and_a_resolved_one_goes_when_run_again(
    ready_to_pay, alice, stripe_sandbox, sdk
):
    cash = book_account(kind=BookAccountKind.CASH, currency="USD")
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=ready_to_pay)
    book_post(kind="topup", key="stripe:pi_ghost:succeeded", lines=[Line(cash, 700), Line(credit, -700)])
    late = sdk.v1.payment_intents.create(
        {
            "amount": 900,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "return_url": "https://x.example",
        }
    )
    today = timezone.now().date()
    reconcile_day(today)
    ghost = ReconciliationMismatch.objects.get(book_key="stripe:pi_ghost:succeeded")
    ReconciliationMismatch.objects.filter(pk=ghost.pk).update(reviewed_at=timezone.now(), review_note="test entry")
    # The stray charge was a top-up whose entry came late (booked by hand now).
    book_post(kind="topup", key=f"stripe:{late.id}:succeeded", lines=[Line(cash, 900), Line(credit, -900)])

    run = reconcile_day(today)

    assert ReconciliationRun.objects.count() == 1 and run.mismatches == 1  # the ghost, still there
    assert list(ReconciliationMismatch.objects.values_list("pk", "review_note")) == [(ghost.pk, "test entry")]


def test_stripe_unavailable_records_the_error_and_the_other_days_still_run(ready_to_pay, alice, stripe_sandbox):
    _topup(ready_to_pay, alice, 5000, "a")
    today = timezone.now().date()
    stripe_sandbox.faults.inject("capacity", action="balance_transactions.list", times=1)

    with pytest.raises(PaymentUnavailable):
        reconcile_day(today)
    assert ReconciliationRun.objects.get(day=today).error.startswith("api_error")
    stripe_sandbox.faults.inject("capacity", action="balance_transactions.list", times=1)
    runs = reconcile_days([today - dt.timedelta(days=1), today])

    assert [(r.day, r.mismatches, r.error) for r in runs] == [(today, 0, "")]  # yesterday failed, today ran


def test_the_gateway_pages_through_every_balance_transaction(ready_to_pay, alice, stripe_sandbox):
    for n in range(5):
        _topup(ready_to_pay, alice, 1000 + n, f"k{n}")
    now = int(timezone.now().timestamp())

    listed = stripe_gateway().balance_transactions(created_from=now - 3600, created_before=now + 3600, page_size=2)

    assert sorted(bt.amount_minor for bt in listed) == [1000, 1001, 1002, 1003, 1004]
    assert all(bt.type == "charge" and bt.payment_intent and bt.fee_minor > 0 for bt in listed)
    assert len(stripe_sandbox.calls("balance_transactions.list")) == 3  # 2 + 2 + 1


def test_the_command_reconciles_a_day_and_names_a_bad_one(ready_to_pay, alice, stripe_sandbox, sdk):
    _topup(ready_to_pay, alice, 5000, "a")
    sdk.v1.payment_intents.create(
        {
            "amount": 800,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
            "return_url": "https://x.example",
        }
    )
    out = io.StringIO()

    call_command("reconcile", stdout=out)

    text = out.getvalue()
    assert "2 Stripe movement(s), 1 book entr(ies), 1 matched, 1 mismatch(es)" in text
    assert "missing_in_book: Stripe charge ch_" in text
    with pytest.raises(CommandError, match="expected YYYY-MM-DD"):
        call_command("reconcile", "--day", "yesterday")
