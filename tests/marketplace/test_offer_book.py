"""What the engine is fed: jurisdictions of regions, offer views with specs, reliability from outcomes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.catalog.regions import jurisdiction_of
from marketplace.catalog.selectors import account_reliability, offer_book, offer_views
from marketplace.matching import Demand, Profile, rank
from marketplace.models import Attempt, AttemptOutcome, Offer, Order


@pytest.mark.parametrize(
    ("kind", "region", "code"),
    [
        ("aws", "us-east-1", "US"),
        ("aws", "eu-central-1", "EU"),
        ("aws", "eu-west-2", "UK"),
        ("aws", "ap-east-1", "APAC"),  # Hong Kong is not mainland China for residency
        ("gcp", "europe-west4", "EU"),
        ("gcp", "europe-west6", "CH"),
        ("gcp", "asia-northeast1", "APAC"),
        ("azure", "westeurope", "EU"),
        ("azure", "southcentralus", "US"),
        ("azure", "chinaeast2", "CN"),
        ("azure", "australiaeast", "APAC"),
        ("alibaba", "cn-shanghai", "CN"),
        ("alibaba", "cn-hongkong", "APAC"),
        ("tencent", "ap-guangzhou", "CN"),
        ("tencent", "ap-singapore", "APAC"),
        ("tencent", "na-siliconvalley", "US"),
        ("aws", "mars-north-1", ""),
    ],
)
def test_jurisdiction_of(kind: str, region: str, code: str) -> None:
    assert jurisdiction_of(kind, region) == code


def _attempt(order: Order, number: int, outcome: str, error_class: str = "") -> None:
    Attempt.objects.create(
        order=order,
        number=number,
        offer=order.offer,
        client_token=f"{order.pk}-{number}",
        outcome=outcome,
        error_class=error_class,
        started_at=timezone.now(),
    )


def test_offer_views_carry_spec_jurisdiction_and_reliability(aws_account, acme, alice) -> None:
    now = timezone.now()
    views = offer_views(now=now)
    assert views and all(v.spec is not None and v.spec.key == v.gpu_model for v in views)
    assert {v.jurisdiction for v in views} <= {"US", "EU", "UK", "APAC"}
    assert all((v.interruption_rate_per_hour > 0) == (v.pricing_model == "spot") for v in views)
    assert {v.reliability for v in views} == {19 / 20}  # no history yet: the prior

    offer = Offer.objects.filter(account=aws_account).first()
    order = Order.objects.create(
        organization=acme,
        created_by=alice,
        offer=offer,
        gpu_model=offer.gpu_model,
        gpu_count=offer.gpu_count,
        pricing_model=offer.pricing_model,
        max_price_per_hour=Decimal(100),
        price_per_hour=offer.price_usd,
        state_changed_at=timezone.now(),
    )
    _attempt(order, 1, AttemptOutcome.FAILED, "capacity")  # says nothing of reliability
    _attempt(order, 2, AttemptOutcome.FAILED, "transient")
    _attempt(order, 3, AttemptOutcome.LAUNCHED)
    assert account_reliability() == {aws_account.pk: pytest.approx((1 + 19) / (2 + 20))}


def test_offer_book_is_rebuilt_only_when_offers_change(aws_account) -> None:
    now = timezone.now()
    first = offer_book(now=now)
    assert offer_book(now=now) is first
    Offer.objects.filter(account=aws_account).update(last_seen_at=now + dt.timedelta(seconds=1))
    second = offer_book(now=now)
    assert second is not first and len(second) == len(first)
    ranking = rank(Demand(profile=Profile.INFERENCE), second, now=now, max_age=dt.timedelta(hours=1))
    assert ranking.quotes and all(q.offer.gpu_model in {"T4", "L4", "A10", "A10G"} for q in ranking.quotes)
