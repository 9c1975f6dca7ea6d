"""Failover that learns: one order's capacity error keeps the next orders away from that zone for a while."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from ledger.services import ledger_verify
from marketplace.catalog.selectors import offer_book
from marketplace.matching import Demand, rank
from marketplace.models import Attempt, Offer, OrderState
from marketplace.orders.blocks import provider_blocks
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


def _order(acme, alice, offer, capture, sandbox):
    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("0.01")
            ),
        ).order
    return boot_if_launched(order, sandbox)


@pytest.fixture
def t4_offer(aws_account):
    # The cheapest on-demand g4dn.xlarge; other zones of the same region sell it at the same price.
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
        "price_usd", "zone"
    )[0]
    assert Offer.objects.filter(
        account=aws_account, instance_type=offer.instance_type, region=offer.region, price_usd=offer.price_usd
    ).exclude(zone=offer.zone)
    return offer


def test_the_next_order_skips_a_zone_another_order_found_sold_out(
    acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks
):
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)

    first = _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    assert first.state == OrderState.RUNNING, first.state_reason
    assert next((a.offer.zone, a.error_class) for a in first.attempts.all()) == (t4_offer.zone, "capacity")

    second = _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    assert second.state == OrderState.RUNNING, second.state_reason
    attempts = list(second.attempts.all())
    # Straight to another zone: no second capacity error on the sold-out one.
    assert len(attempts) == 1 and attempts[0].outcome == "launched"
    assert attempts[0].offer.zone != t4_offer.zone
    assert ledger_verify().ok


def test_a_quote_leaves_out_a_blocked_zone(acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks):
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)
    _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    now = timezone.now()
    blocks = provider_blocks(now=now)
    assert blocks.zone_types == {(t4_offer.account_id, t4_offer.zone, t4_offer.instance_type)}

    demand = Demand(gpu_models=frozenset({"T4"}), pricing_models=frozenset({"on_demand"}))
    ranking = rank(demand, offer_book(now=now), now=now, exclusion=blocks, limit=500)
    assert t4_offer.pk not in {q.offer.offer_id for q in ranking.quotes}
    assert ranking.rejected["excluded"] >= 1


def test_a_block_ends_with_its_window(acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks, settings):
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)
    _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    # The zone has stock again, and the capacity error is older than the window.
    aws_sandbox.faults.clear()
    Attempt.objects.filter(error_class="capacity").update(
        finished_at=timezone.now() - dt.timedelta(seconds=settings.BLOCK_CAPACITY_S + 1)
    )
    assert provider_blocks(now=timezone.now()).zone_types == frozenset()

    again = _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    assert again.state == OrderState.RUNNING, again.state_reason
    assert [(a.offer_id, a.outcome) for a in again.attempts.all()] == [(t4_offer.pk, "launched")]


def test_a_zero_window_turns_sharing_off(
    acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks, settings
):
    settings.BLOCK_CAPACITY_S = 0
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)
    _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    second = _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    assert next((a.offer.zone, a.error_class) for a in second.attempts.all()) == (t4_offer.zone, "capacity")
