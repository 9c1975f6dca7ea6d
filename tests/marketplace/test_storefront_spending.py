"""The spending page: budgets and where the organisation stands, a month's invoice lines and total, live orders'
running cost, a CSV of the month, and budgets set by owners only, for the caller's organisation only."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import LedgerEntry
from marketplace.models import Instance, InvoiceLine, Order, OrderState, Organization
from marketplace.money import minor_text, minor_units, money_text
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from tests.leases import LAUNCH, boot

pytestmark = pytest.mark.django_db


@pytest.fixture
def t4(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


def _run(t4, user, capture, sandbox, *, hours: float) -> Order:
    """An order of ``user``'s organisation on the sandbox, booted, and running for ``hours`` already."""
    organization = user.memberships.get().organization
    with capture(execute=True):
        order = order_place(
            organization=organization, user=user, request=PlaceRequest(offer_id=t4.pk, launch=LAUNCH)
        ).order
    with capture(execute=True):
        boot(order, sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    Instance.objects.filter(order=order).update(ready_at=timezone.now() - dt.timedelta(hours=hours))
    return order


def _end(order: Order, capture) -> InvoiceLine:
    with capture(execute=True):
        order_terminate(order=order)
    return InvoiceLine.objects.get(order=order)


@pytest.fixture
def month_of_orders(t4, alice, charlie, aws_sandbox, django_capture_on_commit_callbacks):
    """Alice's organisation: one order that ran two hours and ended, one still running for an hour. Charlie's:
    one that ran three hours and ended."""
    capture = django_capture_on_commit_callbacks
    ended = _end(_run(t4, alice, capture, aws_sandbox, hours=2), capture)
    live = _run(t4, alice, capture, aws_sandbox, hours=1)
    strangers = _end(_run(t4, charlie, capture, aws_sandbox, hours=3), capture)
    return ended, live, strangers


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_spending_page_needs_a_login(db):
    response = Client().get("/spending")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_page_shows_the_months_lines_total_and_live_orders_of_my_organisation_only(month_of_orders, alice):
    ended, live, strangers = month_of_orders

    page = _client(alice).get("/spending").content.decode()

    assert str(ended.order.public_id)[:8] in page
    assert ended.description in page
    assert f'id="month-total">{money_text(minor_units(ended.amount_usd, "USD"), "USD")}<' in page
    # The running order is not invoiced yet; its hour so far shows under live orders.
    assert str(live.public_id)[:8] in page
    live_total = Decimal(re.search(r'id="live-total">([0-9.]+) USD<', page).group(1))
    assert live.price_per_hour - Decimal("0.005") <= live_total <= live.price_per_hour + Decimal("0.01")  # an hour
    assert str(strangers.order.public_id)[:8] not in page
    assert "Charlie Labs" not in page
    assert 'href="/spending"' in page  # the navigation's link


def test_another_month_shows_its_own_lines(month_of_orders, alice):
    ended, _, _ = month_of_orders
    InvoiceLine.objects.filter(pk=ended.pk).update(ended_at=dt.datetime(2025, 3, 14, 12, tzinfo=dt.UTC))
    client = _client(alice)

    march = client.get("/spending", {"month": "2025-03"}).content.decode()
    this_month = client.get("/spending").content.decode()

    assert "Invoice for March 2025" in march and ended.description in march
    assert 'href="?month=2025-02"' in march and 'href="?month=2025-04"' in march
    assert ended.description not in this_month
    assert 'id="month-total">0.00 USD<' in this_month


@pytest.mark.parametrize(
    ("month", "message"),
    [
        ("December", "“December” is not a month: give it as YYYY-MM"),
        ("2025-13", "“2025-13” is not a month"),
        ("2025-1", "“2025-1” is not a month"),
        ("2999-01", "2999-01 has not started yet"),
    ],
)
def test_a_bad_month_is_explained(db, alice, month, message):
    response = _client(alice).get("/spending", {"month": month})

    assert response.status_code == 400
    assert message in response.content.decode()


def test_the_csv_has_the_months_lines_of_my_organisation_only(month_of_orders, alice):
    ended, _, strangers = month_of_orders
    month = timezone.now().strftime("%Y-%m")

    response = _client(alice).get("/spending.csv", {"month": month})

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="spending-{month}.csv"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [
        ["order", "description", "ended_at", "seconds", "price_per_hour_usd", "amount_usd"],
        [str(ended.order.public_id), ended.description, ended.ended_at.isoformat(), str(ended.seconds),
         format(ended.price_per_hour, "f"), minor_text(minor_units(ended.amount_usd, "USD"), "USD")],
    ]  # fmt: skip
    assert str(strangers.order.public_id) not in response.content.decode()


def test_the_csv_refuses_a_bad_month(db, alice):
    response = _client(alice).get("/spending.csv", {"month": "13/2025"})

    assert response.status_code == 400
    assert "is not a month" in response.content.decode()


def test_an_owner_sets_the_budgets_on_the_record(db, alice, acme):
    client = _client(alice)

    response = client.post("/spending", {"budget_per_hour": "40", "budget_monthly": "12000.5"})

    assert response.status_code == 302
    acme.refresh_from_db()
    assert (acme.budget_per_hour, acme.budget_monthly) == (Decimal("40.00"), Decimal("12000.50"))
    entry = LedgerEntry.objects.get(kind="organization.budget")
    assert entry.subject == f"organization:{acme.pk}"
    page = client.get(response["Location"]).content.decode()
    assert "Budgets saved." in page
    assert "of 40.00 USD/h budget" in page and "of 12,000.50 USD budget" in page


def test_an_owner_clears_a_budget_with_an_empty_field(db, alice, acme):
    Organization.objects.filter(pk=acme.pk).update(budget_per_hour=Decimal("5"), budget_monthly=Decimal("100"))

    _client(alice).post("/spending", {"budget_per_hour": "", "budget_monthly": "100"})

    acme.refresh_from_db()
    assert (acme.budget_per_hour, acme.budget_monthly) == (None, Decimal("100.00"))


def test_a_bad_budget_is_refused_with_nothing_written(db, alice, acme):
    response = _client(alice).post("/spending", {"budget_per_hour": "-1", "budget_monthly": "abc"})

    assert response.status_code == 400
    page = response.content.decode()
    assert "Ensure this value is greater than or equal to 0.01." in page
    assert "Enter a number." in page
    acme.refresh_from_db()
    assert (acme.budget_per_hour, acme.budget_monthly) == (None, None)
    assert not LedgerEntry.objects.filter(kind="organization.budget").exists()


def test_a_member_sees_the_budgets_read_only_and_cannot_set_them(db, alice, bob, acme):
    Organization.objects.filter(pk=acme.pk).update(budget_per_hour=Decimal("5"))
    client = _client(bob)

    page = client.get("/spending").content.decode()
    refused = client.post("/spending", {"budget_per_hour": "999", "budget_monthly": ""})

    assert "Only an owner of Acme Research can change the budgets." in page
    assert 'name="budget_per_hour"' not in page
    assert refused.status_code == 403
    acme.refresh_from_db()
    assert acme.budget_per_hour == Decimal("5.00")
    assert not LedgerEntry.objects.filter(kind="organization.budget").exists()


def test_the_budget_form_needs_its_csrf_token(db, alice, acme):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    response = client.post("/spending", {"budget_per_hour": "1", "budget_monthly": ""})

    assert response.status_code == 403
    acme.refresh_from_db()
    assert acme.budget_per_hour is None
    assert 'name="csrfmiddlewaretoken"' in client.get("/spending").content.decode()


def test_a_stranger_sees_only_their_own_organisation(month_of_orders, charlie, alice):
    ended, live, strangers = month_of_orders
    Organization.objects.filter(memberships__user=alice).update(budget_monthly=Decimal("777"))

    page = _client(charlie).get("/spending").content.decode()

    assert "Charlie Labs" in page and "Acme Research" not in page
    assert strangers.description in page
    assert ended.description not in page and str(live.public_id)[:8] not in page
    assert "777" not in page
