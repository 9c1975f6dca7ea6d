"""Monthly invoices (issue 22): drafted from the book (charges with their tax, refunds as credit notes, top-ups
as payments), issued once per organisation and month with a gap-free number per year and a ledgered hash, as a
PDF and a CSV, on the storefront for the organisation's members and in the API for its tokens."""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import json
import threading
import time
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.api.tokens import api_token_create
from marketplace.billing.book import Line, book_account, book_post
from marketplace.billing.invoices import (
    invoice_csv,
    invoice_draft,
    invoice_hash,
    invoice_issue,
    invoice_pdf,
    invoices_issue_due,
)
from marketplace.billing.tax import tax_memo, tax_minor, tax_rate_for
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.models import (
    BillingProfile,
    BookAccount,
    BookAccountKind,
    GpuModel,
    Invoice,
    InvoiceLine,
    Offer,
    Order,
    OrderState,
    Organization,
)
from marketplace.tasks import invoices_issue_due_task
from tests.factories import OrganizationFactory, ProviderAccountFactory

pytestmark = pytest.mark.django_db

OCTOBER = "2026-10"
IN_OCTOBER = dt.datetime(2026, 10, 14, 9, 30, tzinfo=dt.UTC)
AFTER_OCTOBER = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.UTC)
_keys = itertools.count(1)


def _offer() -> Offer:
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    now = timezone.now()
    offer, _ = Offer.objects.get_or_create(
        account=ProviderAccountFactory(), region="eu-west-1", zone="eu-west-1a", instance_type="g5.xlarge",
        pricing_model="on_demand",
        defaults=dict(
            gpu_model=GpuModel.objects.get(key="A10G"), gpu_count=1, gpu_memory_gb=24, vcpus=4, memory_gib=16,
            price=Decimal("1.006"), currency="USD", price_usd=Decimal("1.006"), price_per_gpu_usd=1.006,
            usd_per_tflop_hour=0.01, first_seen_at=now, last_seen_at=now,
        ),
    )  # fmt: skip
    return offer


def _ended_order(organization: Organization, user, *, seconds: int, at: dt.datetime) -> tuple[Order, InvoiceLine]:
    """An order that ran ``seconds`` and ended at ``at``, with its invoice line (as the order's end writes it)."""
    offer = _offer()
    order = Order.objects.create(
        organization=organization, created_by=user, offer=offer, gpu_model=offer.gpu_model, gpu_count=1,
        pricing_model="on_demand", max_price_per_hour=offer.price_usd, price_per_hour=offer.price_usd,
        state=OrderState.TERMINATED, state_changed_at=at,
    )  # fmt: skip
    line = InvoiceLine.objects.create(
        organization=organization, order=order, description="1x A10G g5.xlarge eu-west-1", seconds=seconds,
        price_per_hour=offer.price_usd, amount_usd=(offer.price_usd * seconds / 3600).quantize(Decimal("0.000001")),
        ended_at=at,
    )  # fmt: skip
    return order, line


def _charge(organization: Organization, user, *, seconds: int, at: dt.datetime, country: str = "") -> int:
    """The lead's order.charge entry for an order that ran ``seconds`` and ended at ``at``; returns C."""
    order, line = _ended_order(organization, user, seconds=seconds, at=at)
    net = int((line.amount_usd * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    rate = tax_rate_for(country, on=at.date()) if country else None
    tax = tax_minor(net, rate)
    commission = net * 12 // 100
    lines = [
        Line(book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=organization), net + tax),
        Line(book_account(kind=BookAccountKind.COMMISSION, currency="USD"), -commission),
        Line(book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD"), -(net - commission)),
    ]
    if tax:
        lines.append(Line(book_account(kind=BookAccountKind.TAX_PAYABLE, currency="USD"), -tax))
    book_post(
        kind="order.charge", key=f"order:{order.pk}:charge", lines=lines, memo=tax_memo(rate), order=order, now=at
    )
    return net


def _credit(organization: Organization) -> BookAccount:
    return book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=organization)


def _refund(organization: Organization, order: Order, cents: int, at: dt.datetime) -> None:
    book_post(
        kind="order.refund", key=f"order:{order.pk}:refund:{next(_keys)}", order=order, now=at,
        lines=[Line(book_account(kind=BookAccountKind.REFUNDS, currency="USD"), cents),
               Line(_credit(organization), -cents)],
    )  # fmt: skip


def _topup(organization: Organization, cents: int, at: dt.datetime) -> None:
    book_post(
        kind="topup", key=f"pi_test_{next(_keys)}", now=at,
        lines=[Line(book_account(kind=BookAccountKind.CASH, currency="USD"), cents),
               Line(_credit(organization), -cents)],
    )  # fmt: skip


@pytest.fixture
def october(acme, alice):
    """Acme (billed in Great Britain): two orders charged in October with VAT, one refunded in part, a top-up;
    an order of November's first second, which is not October's."""
    BillingProfile.objects.create(organization=acme, country="GB", tax_id="GB123456789")
    first = _charge(acme, alice, seconds=7200, at=IN_OCTOBER, country="GB")  # 2 h at $1.006/h = $2.012 -> 201
    second = _charge(acme, alice, seconds=5400, at=IN_OCTOBER + dt.timedelta(days=3), country="GB")  # 151 (150.9)
    _refund(acme, Order.objects.order_by("pk").first(), 50, IN_OCTOBER + dt.timedelta(days=5))
    _topup(acme, 10_000, IN_OCTOBER - dt.timedelta(days=1))
    _charge(acme, alice, seconds=3600, at=AFTER_OCTOBER.replace(hour=0), country="GB")
    return first, second


def test_the_draft_lists_charges_with_tax_credit_notes_and_payments_of_the_month_only(october, acme):
    first, second = october

    draft = invoice_draft(acme, OCTOBER)

    assert (first, second) == (201, 151)
    assert [(line.type, line.net_minor, line.tax_minor) for line in draft.lines] == [
        ("charge", 201, 40), ("charge", 151, 30), ("credit", -50, 0),
    ]  # fmt: skip
    assert [(line.tax_country, line.tax_name, line.tax_rate) for line in draft.lines[:2]] == [
        ("GB", "VAT", Decimal("0.20"))
    ] * 2
    assert draft.lines[0].hours == Decimal("2.00") and draft.lines[1].hours == Decimal("1.50")
    assert draft.lines[0].description == "1x A10G g5.xlarge eu-west-1"
    assert (draft.subtotal_minor, draft.tax_minor, draft.total_minor) == (302, 70, 372)
    assert [(t.name, t.rate, t.net_minor, t.tax_minor) for t in draft.tax_lines] == [("VAT", Decimal("0.20"), 352, 70)]
    assert [p.amount_minor for p in draft.payments] == [10_000] and draft.payments_minor == 10_000
    assert draft.buyer == {"name": "Acme Research", "country": "GB", "tax_id": "GB123456789"}
    assert draft.tax_note == ""


def test_a_buyer_without_a_billing_country_is_told_no_tax_applied(acme, alice):
    _charge(acme, alice, seconds=3600, at=IN_OCTOBER)

    draft = invoice_draft(acme, OCTOBER)

    assert [(line.net_minor, line.tax_minor, line.tax_name) for line in draft.lines] == [(101, 0, "")]
    assert draft.total_minor == 101 and draft.buyer["country"] == ""
    assert "No tax charged on 1 line(s)" in draft.tax_note and "no billing country" in draft.tax_note
    assert [(t.name, t.rate, t.net_minor) for t in draft.tax_lines] == [("", None, 101)]


def test_issuing_keeps_the_lines_ledgers_the_hash_and_issuing_again_returns_the_same(october, acme, settings):
    settings.BROKER_LEGAL_NAME = "GPU Broker Ltd"

    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    again = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER + dt.timedelta(days=3))

    assert again.pk == invoice.pk and Invoice.objects.count() == 1
    assert invoice.number == "INV-2026-000001"
    assert (invoice.subtotal_minor, invoice.tax_minor, invoice.total_minor) == (302, 70, 372)
    assert invoice.lines["seller"]["name"] == "GPU Broker Ltd"
    assert [item["net_minor"] for item in invoice.lines["items"]] == [201, 151, -50]
    assert invoice.tax_lines == [{"country": "GB", "name": "VAT", "rate": "0.20", "net_minor": 352, "tax_minor": 70}]
    stored = Invoice.objects.get(pk=invoice.pk)
    assert invoice_hash(stored) == stored.sha256 == invoice.sha256
    entries = LedgerEntry.objects.filter(kind="invoice.issued", subject="invoice:INV-2026-000001")
    assert entries.count() == 1
    assert json.loads(entries.get().payload) == {
        "number": "INV-2026-000001", "month": OCTOBER, "currency": "USD", "organization": acme.pk,
        "sha256": invoice.sha256, "subtotal_minor": 302, "tax_minor": 70, "total_minor": 372,
    }  # fmt: skip
    assert ledger_verify().ok


def test_a_month_not_yet_ended_is_refused_and_nothing_is_issued(october, acme):
    with pytest.raises(ValueError, match="the month 2026-10 has not ended yet"):
        invoice_issue(acme, OCTOBER, now=IN_OCTOBER + dt.timedelta(days=10))
    with pytest.raises(ValueError, match="not a month"):
        invoice_issue(acme, "October", now=AFTER_OCTOBER)

    assert not Invoice.objects.exists()
    assert not LedgerEntry.objects.filter(kind="invoice.issued").exists()


def test_numbers_follow_each_other_within_a_year_and_start_again_the_next(acme, alice, charlie):
    others = charlie.memberships.get().organization
    _charge(acme, alice, seconds=3600, at=IN_OCTOBER)
    _charge(others, charlie, seconds=3600, at=IN_OCTOBER)
    _charge(acme, alice, seconds=3600, at=dt.datetime(2026, 12, 20, tzinfo=dt.UTC))

    first = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    second = invoice_issue(others, OCTOBER, now=AFTER_OCTOBER)
    next_year = invoice_issue(acme, "2026-12", now=dt.datetime(2027, 1, 1, 2, tzinfo=dt.UTC))

    assert [first.number, second.number, next_year.number] == ["INV-2026-000001", "INV-2026-000002", "INV-2027-000001"]


def test_the_monthly_run_issues_last_months_invoice_of_every_organisation_that_moved_money(acme, alice, charlie):
    others = charlie.memberships.get().organization
    idle = OrganizationFactory(name="Idle Inc")
    _charge(acme, alice, seconds=3600, at=IN_OCTOBER)
    _topup(others, 5000, IN_OCTOBER)

    issued = invoices_issue_due(AFTER_OCTOBER)
    again = invoices_issue_due(AFTER_OCTOBER + dt.timedelta(hours=1))

    assert sorted(invoice.organization_id for invoice in issued) == sorted([acme.pk, others.pk])
    assert [invoice.pk for invoice in again] == [invoice.pk for invoice in issued]
    assert not Invoice.objects.filter(organization=idle).exists()
    assert Invoice.objects.get(organization=others).total_minor == 0
    assert LedgerEntry.objects.filter(kind="invoice.issued").count() == 2


def test_the_beat_runs_the_task_on_the_first_at_two_and_it_issues_last_months_invoices(acme, alice, settings):
    entry = settings.CELERY_BEAT_SCHEDULE["invoices-issue-due"]
    schedule = entry["schedule"]
    assert entry["task"] == "marketplace.invoices_issue_due"
    assert (schedule.day_of_month, schedule.hour, schedule.minute) == ({1}, {2}, {0})
    last_month = timezone.now().replace(day=1, hour=12) - dt.timedelta(days=1)
    _charge(acme, alice, seconds=3600, at=last_month)

    assert invoices_issue_due_task.delay().get() == 1
    assert Invoice.objects.get(organization=acme).month == last_month.strftime("%Y-%m")


def test_the_csv_parses_back_to_the_invoices_lines_and_totals(october, acme):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)

    rows = list(csv.DictReader(io.StringIO(invoice_csv(invoice))))

    items = [row for row in rows if row["row"] in {"charge", "credit"}]
    assert [(row["row"], row["net"], row["tax"], row["hours"]) for row in items] == [
        ("charge", "2.01", "0.40", "2.00"), ("charge", "1.51", "0.30", "1.50"), ("credit", "-0.50", "0.00", "0.00"),
    ]  # fmt: skip
    assert {row["currency"] for row in rows} == {"USD"} and {row["invoice"] for row in rows} == {invoice.number}
    by_kind = {row["row"]: row for row in rows if row["row"] not in {"charge", "credit"}}
    assert (by_kind["tax"]["tax_name"], by_kind["tax"]["tax_rate"], by_kind["tax"]["tax"]) == ("GB VAT", "0.20", "0.70")
    assert by_kind["subtotal"]["net"] == "3.02" and by_kind["tax_total"]["tax"] == "0.70"
    assert Decimal(by_kind["total"]["net"]) == sum(Decimal(row["net"]) + Decimal(row["tax"]) for row in items)
    assert Decimal(by_kind["total"]["net"]) * 100 == invoice.total_minor


def test_the_pdf_is_a_pdf_naming_the_number_the_total_and_its_currency(october, acme):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)

    plain = invoice_pdf(invoice, compress=False)

    assert plain.startswith(b"%PDF-")
    assert b"Invoice INV-2026-000001" in plain
    assert b"3.72 USD" in plain and b"GB VAT 20 %" in plain and b"Acme Research" in plain
    assert invoice_pdf(invoice).startswith(b"%PDF-")  # compressed, as served


# --- Concurrency (PostgreSQL) ----------------------------------------------------------------------------------


def _blocked_on_a_lock(deadline_s: float = 20.0) -> bool:
    """Whether another session of this database waits on a lock, asked again until it does or time is up."""
    with connections["default"].cursor() as cursor:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return True
    return False


@pytest.mark.django_db(transaction=True)
def test_two_issuers_taking_the_same_number_get_consecutive_ones(acme, alice, charlie):
    """A has inserted number 1 and not committed; B picks 1 too and waits on its unique index. When A commits,
    B's insert fails and B takes number 2: no duplicate, no gap."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    from django.db import transaction

    others = charlie.memberships.get().organization
    _charge(acme, alice, seconds=3600, at=IN_OCTOBER)
    _charge(others, charlie, seconds=3600, at=IN_OCTOBER)
    a_inserted, a_may_commit = threading.Event(), threading.Event()
    numbers: dict[str, str] = {}
    errors: list[BaseException] = []

    def issuer_a() -> None:
        try:
            with transaction.atomic():
                numbers["a"] = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER).number
                a_inserted.set()
                a_may_commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            a_inserted.set()
            connection.close()

    def issuer_b() -> None:
        try:
            a_inserted.wait(30)
            numbers["b"] = invoice_issue(others, OCTOBER, now=AFTER_OCTOBER).number
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=issuer_a), threading.Thread(target=issuer_b)]
    for thread in threads:
        thread.start()
    blocked = _blocked_on_a_lock()
    a_may_commit.set()
    for thread in threads:
        thread.join()

    assert errors == [] and blocked
    assert numbers == {"a": "INV-2026-000001", "b": "INV-2026-000002"}
    assert sorted(Invoice.objects.values_list("number", flat=True)) == ["INV-2026-000001", "INV-2026-000002"]
    assert LedgerEntry.objects.filter(kind="invoice.issued").count() == 2
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_two_issuers_of_the_same_month_at_once_issue_one_invoice(acme, alice):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    _charge(acme, alice, seconds=3600, at=IN_OCTOBER)
    barrier = threading.Barrier(2)
    answers: list[int] = []
    errors: list[BaseException] = []

    def issue() -> None:
        try:
            barrier.wait()
            answers.append(invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER).pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(answers) == 2 and len(set(answers)) == 1
    assert Invoice.objects.count() == 1 and LedgerEntry.objects.filter(kind="invoice.issued").count() == 1


# --- Storefront and API ----------------------------------------------------------------------------------------


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_members_see_their_invoices_and_this_months_draft(october, acme, alice, bob):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    _charge(acme, alice, seconds=3600, at=timezone.now())

    listing = _client(bob).get("/billing/invoices/")
    detail = _client(alice).get(f"/billing/invoices/{invoice.number}/")

    assert listing.status_code == 200 and detail.status_code == 200
    page = listing.content.decode()
    assert invoice.number in page and "3.72 USD" in page
    assert 'id="draft-subtotal">1.01 USD<' in page
    body = detail.content.decode()
    assert 'id="total"><strong>3.72 USD</strong>' in body and "GB123456789" in body
    assert f"/billing/invoices/{invoice.number}.pdf" in body and f"/billing/invoices/{invoice.number}.csv" in body


def test_the_downloads_are_attachments_of_their_types(october, acme, alice):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    client = _client(alice)

    pdf = client.get(f"/billing/invoices/{invoice.number}.pdf")
    sheet = client.get(f"/billing/invoices/{invoice.number}.csv")

    assert (pdf.status_code, pdf["Content-Type"]) == (200, "application/pdf")
    assert pdf["Content-Disposition"] == f'attachment; filename="invoice-{invoice.number}.pdf"'
    assert pdf.content.startswith(b"%PDF-")
    assert (sheet.status_code, sheet["Content-Type"]) == (200, "text/csv; charset=utf-8")
    assert sheet["Content-Disposition"] == f'attachment; filename="invoice-{invoice.number}.csv"'
    assert sheet.content.decode() == invoice_csv(invoice)


def test_a_stranger_gets_404_for_another_organisations_invoice(october, acme, alice, charlie):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    client = _client(charlie)

    for suffix in ["/", ".pdf", ".csv"]:
        assert client.get(f"/billing/invoices/{invoice.number}{suffix}").status_code == 404
    listing = client.get("/billing/invoices/")
    assert listing.status_code == 200 and invoice.number not in listing.content.decode()
    assert Client().get("/billing/invoices/").status_code == 302  # signed out: to the login page
    for junk in ["%00", "INV-2026-000001%00", "x" * 300, "INV_2026"]:
        assert _client(alice).get(f"/billing/invoices/{junk}/").status_code == 404


def _api(organization, user, scopes=("orders:place",)) -> APIClient:
    client = APIClient()
    raw = api_token_create(organization=organization, user=user, name="invoices", scopes=list(scopes)).raw
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_the_api_lists_and_serves_the_invoice_as_json_pdf_and_csv(october, acme, alice):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    api = _api(acme, alice)

    listing = api.get("/api/v1/invoices")
    detail = api.get(f"/api/v1/invoices/{invoice.number}")
    pdf = api.get(f"/api/v1/invoices/{invoice.number}.pdf", HTTP_ACCEPT="application/pdf")
    sheet = api.get(f"/api/v1/invoices/{invoice.number}.csv")

    assert listing.status_code == 200
    assert [(row["number"], row["total_minor"], row["currency"]) for row in listing.json()["results"]] == [
        (invoice.number, 372, "USD")
    ]
    assert detail.status_code == 200
    body = detail.json()
    assert body["sha256"] == invoice.sha256 and body["invoice"]["number"] == invoice.number
    assert body["invoice"]["tax_lines"] == invoice.tax_lines
    assert (pdf.status_code, pdf["Content-Type"]) == (200, "application/pdf") and pdf.content.startswith(b"%PDF-")
    assert (sheet.status_code, sheet["Content-Type"]) == (200, "text/csv; charset=utf-8")
    assert sheet.content.decode() == invoice_csv(invoice)


def test_the_api_hides_other_organisations_invoices_and_needs_the_scope(october, acme, alice, charlie):
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    stranger = _api(charlie.memberships.get().organization, charlie)

    assert stranger.get("/api/v1/invoices").json()["results"] == []
    for suffix, accept in [("", "application/json"), (".pdf", "application/pdf"), (".csv", "text/csv")]:
        answer = stranger.get(f"/api/v1/invoices/{invoice.number}{suffix}", HTTP_ACCEPT=accept)
        # The downloads answer their errors in the one JSON error shape, whatever the client accepts.
        assert (answer.status_code, answer["Content-Type"]) == (404, "application/json")
        assert answer.json()["error"]["code"]
    owner = _api(acme, alice)
    assert owner.get("/api/v1/invoices/INV-2026-000001%00.pdf").status_code == 404
    reader = _api(acme, alice, scopes=("offers:read",))
    assert reader.get(f"/api/v1/invoices/{invoice.number}").status_code == 403
