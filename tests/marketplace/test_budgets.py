"""Organisation budgets: an hourly cap on live orders, a monthly cap on usage, warnings near either."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Instance, Order, Organization
from marketplace.orders.budgets import BudgetExceeded, budget_set, budget_status
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH
from tests.races import race_same

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def t4(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


def test_the_hourly_budget_refuses_the_order_that_would_exceed_it(api, acme, alice, t4):
    budget_set(acme, per_hour=t4.price_usd * 2 + Decimal("0.10"), monthly=None, by=alice)
    first = _post(api, "/api/v1/orders", {"offer": t4.pk})
    assert first.status_code == 201 and first.json()["warnings"] == []
    second = _post(api, "/api/v1/orders", {"offer": t4.pk})
    assert second.status_code == 201
    assert "hourly budget" in second.json()["warnings"][0]  # past 80 % of it
    third = _post(api, "/api/v1/orders", {"offer": t4.pk})
    assert third.status_code == 402
    assert third.json()["error"]["code"] == "budget_exceeded"
    assert "above the hourly budget" in third.json()["error"]["message"]
    assert Order.objects.count() == 2
    assert ledger_verify().ok


def test_the_monthly_budget_counts_this_months_usage(api, acme, alice, t4, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _post(api, "/api/v1/orders", {"offer": t4.pk})
    order = Order.objects.get()
    now = timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    # It ran from before the month began until ten hours into it: only the ten hours count.
    Instance.objects.filter(order=order).update(
        ready_at=month_start - dt.timedelta(hours=5), terminated_at=month_start + dt.timedelta(hours=10)
    )
    status = budget_status(acme, now=now)
    assert status.month_to_date == (order.price_per_hour * 10).quantize(Decimal("0.01"))
    budget_set(acme, per_hour=None, monthly=status.month_to_date, by=alice)
    refused = _post(api, "/api/v1/orders", {"offer": t4.pk})
    assert refused.status_code == 402 and "monthly budget" in refused.json()["error"]["message"]
    budget_set(acme, per_hour=None, monthly=status.month_to_date + Decimal("1.00"), by=alice)
    placed = _post(api, "/api/v1/orders", {"offer": t4.pk})
    assert placed.status_code == 201 and "this month's usage" in placed.json()["warnings"][0]


def test_only_an_owner_sets_budgets_and_it_is_ledgered(api, bob, acme):
    response = api.put("/api/v1/budget", data=json.dumps({"budget_per_hour": "50", "budget_monthly": None}),
                       content_type="application/json")  # fmt: skip
    assert response.status_code == 200
    assert response.json()["budget_per_hour"] == "50.00" and response.json()["budget_monthly"] is None
    acme.refresh_from_db()
    assert acme.budget_per_hour == Decimal("50.00")
    assert LedgerEntry.objects.filter(kind="organization.budget").count() == 1
    member = APIClient()
    member.force_authenticate(bob)
    refused = member.put("/api/v1/budget", data=json.dumps({"budget_per_hour": "9999", "budget_monthly": None}),
                         content_type="application/json")  # fmt: skip
    assert refused.status_code == 403
    assert member.get("/api/v1/budget").json()["budget_per_hour"] == "50.00"
    bad = api.put("/api/v1/budget", data=json.dumps({"budget_per_hour": "-1"}), content_type="application/json")
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"budget_per_hour", "budget_monthly"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_orders_cannot_both_take_the_last_room(acme, alice, t4):
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL; SQLite serialises every write anyway")
    # Room for three orders at this price; eight buyers race for it.
    budget_set(acme, per_hour=t4.price_usd * 3, monthly=None, by=alice)
    placed, refused = race_same(
        8, lambda: order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=t4.pk))
    )
    assert len(placed) == 3 and len(refused) == 5
    assert all(isinstance(error, BudgetExceeded) for error in refused), refused
    assert Order.objects.filter(organization=acme).count() == 3
    assert sum(o.price_per_hour for o in Order.objects.all()) <= Organization.objects.get(pk=acme.pk).budget_per_hour
    assert ledger_verify().ok


def test_failover_to_a_dearer_offer_stays_within_the_hourly_budget(
    acme, alice, aws_account, aws_sandbox, tencent_account, django_capture_on_commit_callbacks
):
    from marketplace.models import Offer

    aws_t4 = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    tencent_t4 = Offer.objects.filter(account=tencent_account, gpu_model__key="T4", gpu_count=1).order_by("price_usd")[
        0
    ]
    assert tencent_t4.price_usd > aws_t4.price_usd
    aws_sandbox.faults.inject("capacity", instance_type="g4dn.xlarge")  # every AWS zone sold out
    # The buyer's cap admits Tencent's T4, the organisation's hourly budget does not.
    budget_set(acme, per_hour=aws_t4.price_usd + Decimal("0.01"), monthly=None, by=alice)
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=aws_t4.pk, max_price_per_hour=tencent_t4.price_usd + Decimal("0.01")
            ),
        ).order
    order.refresh_from_db()
    assert order.state == "failed"
    assert {a.offer.account_id for a in order.attempts.all()} == {aws_account.pk}
