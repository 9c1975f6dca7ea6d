"""Credits paid, not promised (issue 38, part 4): an outage staged on a real running order (the AWS sandbox,
PostgreSQL) produces exactly the tier's credit in the book, a ledger entry with the measurements and a credit
line on the invoice; nothing at or above the SLA or on spot; once per order and period, however often or
concurrently it is judged; one bad order never stops the month's close.

Time is injected: the month judged is November 2026 and its close runs at 00:00 on 1 December."""

from __future__ import annotations

import datetime as dt
import json
import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from marketplace.billing.book import book_account_balance
from marketplace.billing.credit import order_seller
from marketplace.billing.invoices import invoice_csv, invoice_draft, invoice_issue, invoice_pdf
from marketplace.models import (
    BookAccountKind,
    BookEntry,
    Instance,
    Lease,
    Order,
    OrderState,
    Outage,
    OutageCause,
    SilentPeriod,
    SlaCredit,
)
from marketplace.orders.losses import instance_lost
from marketplace.orders.outages import outage_close, outage_open
from marketplace.orders.services import order_terminate
from marketplace.orders.silence import order_silence_degrade
from marketplace.sla.credits import month_start, sla_credit_settle, sla_month_close
from marketplace.sla.published import CLOUD_SLAS
from marketplace.sla.selectors import credits_posted, open_outages_by_cause, orders_below_sla
from marketplace.tasks import order_provision_task
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db

NOV = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DEC = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)
DAY5 = "2026-11-05"
PRICE = Decimal("0.5")  # USD per hour: 720 hours of November cost 360.00 USD


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _offer(account, pricing: str = "on_demand"):
    return account.offers.filter(instance_type="g4dn.xlarge", pricing_model=pricing).order_by("price_usd", "pk")[0]


def _running_since_november(api, aws_account, aws_sandbox, capture) -> Order:
    """A running on-demand order, booted by its agent, whose machine has been ready since 1 November, at 0.50
    USD an hour."""
    with capture(execute=True):
        api.post("/api/v1/orders", data=json.dumps({"offer": _offer(aws_account).pk}), content_type="application/json")
    order = Order.objects.latest("id")
    with capture(execute=True):
        boot_if_launched(order, aws_sandbox)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING, order.state_reason
    Order.objects.filter(pk=order.pk).update(price_per_hour=PRICE)
    Instance.objects.filter(order=order).update(ready_at=NOV)
    return Order.objects.get(pk=order.pk)


def _stage(order: Order, cause: str, start: dt.datetime, end: dt.datetime) -> None:
    outage_open(order_id=order.pk, cause=cause, at=start)
    outage_close(order_id=order.pk, cause=cause, at=end)


def _balances(order: Order) -> tuple[int, int]:
    seller = order_seller(order)
    return (
        book_account_balance(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=order.organization),
        book_account_balance(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD", organization=seller),
    )


def test_an_outage_below_the_sla_pays_the_tiers_credit_from_the_sellers_payable(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    # Ten hours lost on 5 November, and the agent silent for two hours across its end: eleven hours down.
    _stage(order, OutageCause.PROVIDER_STATE, NOV + 96 * H, NOV + 106 * H)
    _stage(order, OutageCause.AGENT_SILENT, NOV + 105 * H, NOV + 107 * H)
    buyer_before, seller_before = _balances(order)

    record = sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC)

    # 709 of 720 hours up: 98.4722 %, under AWS's 99.0 % step, so 30 % of 360.00 USD.
    assert record is not None
    assert (record.committed_pct, record.measured_pct, record.tier_pct) == (
        Decimal("99.500"),
        Decimal("98.4722"),
        Decimal("30"),
    )
    assert (record.measured_seconds, record.down_seconds) == (720 * 3600, 11 * 3600)
    assert (record.charge_minor, record.amount_minor, record.period_end) == (36000, 10800, DEC)
    assert _balances(order) == (buyer_before - 10800, seller_before + 10800)
    entry = BookEntry.objects.get(kind="sla.credit")
    assert (entry.order_id, entry.created_at, record.entry_id) == (order.pk, DEC, entry.pk)
    assert entry.memo == "SLA credit 30%: measured 98.4722% against 99.5% committed"

    (ledgered,) = LedgerEntry.objects.filter(kind="sla.credited", subject=f"order:{order.public_id}")
    assert json.loads(ledgered.payload) == {
        "order": str(order.public_id),
        "organization": order.organization_id,
        "period_start": "2026-11-01T00:00:00+00:00",
        "window": ["2026-11-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00"],
        "committed_pct": "99.500",
        "measured_pct": "98.4722",
        "measured_seconds": 2592000,
        "down_seconds": 39600,
        "outages": [
            {"cause": "provider_state", "started_at": f"{DAY5}T00:00:00+00:00", "ended_at": f"{DAY5}T10:00:00+00:00"},
            {"cause": "agent_silent", "started_at": f"{DAY5}T09:00:00+00:00", "ended_at": f"{DAY5}T11:00:00+00:00"},
        ],
        "tier_pct": "30.00",
        "charge_minor": 36000,
        "amount_minor": 10800,
        "currency": "USD",
    }  # fmt: skip

    draft = invoice_draft(order.organization, "2026-12")
    credits = [line for line in draft.lines if line.type == "credit"]
    assert [(c.order, c.net_minor, c.tax_minor) for c in credits] == [(str(order.public_id), -10800, 0)]
    assert credits[0].description.startswith("SLA credit 30%: measured 98.4722% against 99.5% committed (")
    assert draft.total_minor == -10800
    # The issued document, its CSV and its PDF carry the same line.
    issued = invoice_issue(order.organization, "2026-12", now=dt.datetime(2027, 1, 1, 2, tzinfo=dt.UTC))
    assert [(i["type"], i["net_minor"]) for i in issued.lines["items"]] == [("credit", -10800)]
    row = invoice_csv(issued).splitlines()[1].split(",")
    assert (row[1], row[2], row[3], row[6]) == ("credit", "2026-12-01", str(order.public_id), "-108.00")
    assert invoice_pdf(issued, compress=False).count(b"SLA credit 30%") == 1


def test_at_or_above_the_sla_the_period_is_judged_and_nothing_is_paid(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    # 3.6 hours of 720 is exactly 0.5 %: 99.5 % measured is the SLA met, not missed.
    _stage(order, OutageCause.SSH_UNREACHABLE, NOV + 10 * H, NOV + 10 * H + dt.timedelta(minutes=216))
    before = _balances(order)

    record = sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC)

    assert record is not None
    assert (record.measured_pct, record.tier_pct, record.amount_minor, record.entry_id) == (
        Decimal("99.5000"),
        Decimal(0),
        0,
        None,
    )
    assert _balances(order) == before
    assert not BookEntry.objects.filter(kind="sla.credit").exists()
    assert not LedgerEntry.objects.filter(kind="sla.credited").exists()


def test_a_spot_order_has_no_sla_to_judge(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    Order.objects.filter(pk=order.pk).update(offer=_offer(aws_account, "spot"))
    _stage(order, OutageCause.PROVIDER_STATE, NOV, NOV + 300 * H)

    assert sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC) is None
    assert not SlaCredit.objects.exists()
    assert not BookEntry.objects.filter(kind="sla.credit").exists()


def test_judging_a_period_twice_pays_once(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    _stage(order, OutageCause.PROVIDER_STATE, NOV, NOV + 40 * H)
    first = sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC)
    # More downtime recorded later does not reopen a judged month.
    _stage(order, OutageCause.AGENT_SILENT, NOV + 100 * H, NOV + 200 * H)
    again = sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC + H)

    assert first is not None and again is not None
    assert (again.pk, again.amount_minor) == (first.pk, first.amount_minor)
    # 680 of 720 hours: 94.4444 %, under 95 %: the whole month back.
    assert first.amount_minor == 36000
    assert BookEntry.objects.filter(kind="sla.credit").count() == 1
    assert LedgerEntry.objects.filter(kind="sla.credited").count() == 1


def test_the_months_close_judges_every_order_and_one_bad_order_stops_none(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks, caplog
):
    bad = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    good = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    for order in (bad, good):
        _stage(order, OutageCause.PROVIDER_STATE, NOV, NOV + 40 * H)
    # The bad order's offer holds a corrupted schedule: its judgment fails loudly, for it alone.
    bad.offer.__class__.objects.filter(pk=bad.offer_id).update(sla_credits=[["ninety", "10"]])
    Order.objects.filter(pk=good.pk).update(offer=_offer(aws_account).__class__.objects.exclude(pk=bad.offer_id)
        .filter(account=aws_account, pricing_model="on_demand").order_by("pk")[0])  # fmt: skip

    closed = sla_month_close(now=DEC)

    assert (closed.queued, closed.failed) == ([good.pk], [bad.pk])
    assert list(SlaCredit.objects.values_list("order_id", "amount_minor")) == [(good.pk, 36000)]
    assert "SLA month close: order" in caplog.text
    # A rerun judges only what is left: the good order's month is not paid twice.
    again = sla_month_close(now=DEC)
    assert (again.queued, again.failed) == ([], [bad.pk])
    assert BookEntry.objects.filter(kind="sla.credit").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_judges_of_one_month_pay_once(
    alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    client = APIClient()
    client.force_authenticate(alice)
    order = _running_since_november(client, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    _stage(order, OutageCause.PROVIDER_STATE, NOV, NOV + 40 * H)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def judge() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC).pk)
        except Exception as exc:  # reported below, not lost in the thread
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=judge) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 2 and results[0] == results[1], results
    assert SlaCredit.objects.count() == 1
    assert BookEntry.objects.filter(kind="sla.credit").count() == 1


def test_a_lost_machine_is_a_provider_outage_until_the_order_runs_again_and_its_end_pays_the_credit(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    now = timezone.now()
    first = order.instances.get(active=True)
    Instance.objects.filter(pk=first.pk).update(ready_at=now - 20 * MINUTE)
    # The provider took the machine ten minutes ago (as a spot reclaim or a host loss is recorded).
    with django_capture_on_commit_callbacks(execute=True):
        instance_lost(
            order, Instance.objects.get(pk=first.pk), state="terminated", ended_at=now - 10 * MINUTE,
            reason="the provider stopped the machine", code="test",
        )  # fmt: skip
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING
    outage = Outage.objects.get(order=order)
    assert (outage.cause, outage.started_at, outage.ended_at, outage.instance_id) == (
        OutageCause.PROVIDER_STATE,
        now - 10 * MINUTE,
        None,
        first.pk,
    )
    assert "the provider stopped the machine" in outage.detail

    # Failover launches the next machine, and its agent's ready report runs the order again.
    with django_capture_on_commit_callbacks(execute=True):
        order_provision_task.delay(order.pk)
    with django_capture_on_commit_callbacks(execute=True):
        boot_if_launched(order, aws_sandbox)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING, order.state_reason
    outage.refresh_from_db()
    assert outage.ended_at is not None and outage.ended_at >= now

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    record = SlaCredit.objects.get(order=order)
    window = (order.state_changed_at - max(now - 20 * MINUTE, month_start(order.state_changed_at))).total_seconds()
    down = (outage.ended_at - max(outage.started_at, month_start(order.state_changed_at))).total_seconds()
    assert (record.period_start, record.period_end) == (month_start(order.state_changed_at), order.state_changed_at)
    assert (record.measured_seconds, record.down_seconds) == (int(window), int(down))
    # About half the window down: under 95 %, the whole of the period's compute comes back.
    assert record.tier_pct == Decimal(100)
    assert record.amount_minor == record.charge_minor > 0
    entry = BookEntry.objects.get(kind="sla.credit", order=order)
    assert sorted(entry.lines.values_list("account__kind", "amount_minor")) == [
        (BookAccountKind.BUYER_CREDIT, -record.amount_minor),
        (BookAccountKind.PROVIDER_PAYABLE, record.amount_minor),
    ]
    month = order.state_changed_at.strftime("%Y-%m")
    kinds = [(line.type, line.order) for line in invoice_draft(order.organization, month).lines]
    assert kinds == [("charge", str(order.public_id)), ("credit", str(order.public_id))]


def test_the_order_page_and_api_show_the_sla_outages_and_credit(
    api, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    _stage(order, OutageCause.PROVIDER_STATE, NOV + 96 * H, NOV + 106 * H)
    _stage(order, OutageCause.AGENT_SILENT, NOV + 105 * H, NOV + 107 * H)
    sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC)

    body = api.get(f"/api/v1/orders/{order.public_id}").json()["sla"]
    assert (body["committed_pct"], body["source"]) == ("99.500", CLOUD_SLAS["aws"].source)
    assert body["credits_schedule"] == [["99.5", "10"], ["99.0", "30"], ["95.0", "100"]]
    assert [(o["cause"], o["started_at"], o["ended_at"]) for o in body["outages"]] == [
        ("provider_state", "2026-11-05T00:00:00Z", "2026-11-05T10:00:00Z"),
        ("agent_silent", "2026-11-05T09:00:00Z", "2026-11-05T11:00:00Z"),
    ]
    assert [(c["measured_pct"], c["tier_pct"], c["amount_minor"]) for c in body["credits"]] == [
        ("98.4722", "30.00", 10800)
    ]

    page = Client()
    page.force_login(alice)
    html = page.get(reverse("storefront:order-detail", args=[order.public_id])).content.decode()
    assert "Committed <strong>99.5 %</strong>" in html
    assert (
        '<td class="num">98.4722 %</td><td class="num money">108.00 USD <span class="muted small">(30 %)</span>' in html
    )
    assert "the provider took the machine" in html and "2026-11-05 10:00:00" in html


def test_the_metrics_selectors_count_open_outages_orders_below_their_sla_and_credits_paid(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    now = NOV + 20 * 24 * H
    outage_open(order_id=order.pk, cause=OutageCause.SSH_UNREACHABLE, at=NOV + 19 * 24 * H)
    assert open_outages_by_cause() == {"ssh_unreachable": 1}
    # One day down of twenty: 95 %, below 99.5 %.
    assert orders_below_sla(now=now) == {"aws": 1}
    assert credits_posted() == (0, 0)

    outage_close(order_id=order.pk, cause=OutageCause.SSH_UNREACHABLE, at=now)
    sla_credit_settle(order=order, period_start=NOV, period_end=DEC, now=DEC)
    assert open_outages_by_cause() == {}
    assert credits_posted() == (1, 10800)  # 24 of 720 hours down: 96.6667 %, under 99 %: 30 % of 360.00 USD


def test_an_agents_silence_is_an_outage_from_its_last_report_closed_with_its_silent_period(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks, settings
):
    order = _running_since_november(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    heard = timezone.now().replace(microsecond=0) - H
    Lease.objects.filter(attempt__instance__order=order).update(last_heartbeat_at=heard)

    assert order_silence_degrade(order_id=order.pk, now=heard + dt.timedelta(seconds=settings.LEASE_SILENCE_S + 1))
    outage = Outage.objects.get(order=order)
    period = SilentPeriod.objects.get(order=order)
    assert (outage.cause, outage.started_at, outage.ended_at) == (OutageCause.AGENT_SILENT, heard, None)
    assert outage.started_at == period.started_at

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    outage.refresh_from_db()
    period.refresh_from_db()
    assert outage.ended_at is not None and outage.ended_at == period.ended_at
