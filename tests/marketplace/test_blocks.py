"""Failover that learns: one order's capacity error keeps the next orders away from that zone for a while."""

from __future__ import annotations

import datetime as dt
import socket
from decimal import Decimal

import pytest
from django.utils import timezone

from ledger.services import ledger_verify
from marketplace.catalog.selectors import offer_book
from marketplace.matching import Demand, rank
from marketplace.models import Attempt, AttemptOutcome, Offer, OrderState
from marketplace.orders.blocks import SOLD_OUT, provider_blocks
from marketplace.orders.services import PlaceRequest, order_place
from providers.models import Machine
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


def test_each_kind_of_failure_blocks_for_its_own_window(
    acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks, settings
):
    settings.BLOCK_CAPACITY_S, settings.BLOCK_QUOTA_S = 60, 600
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone, times=1)
    aws_sandbox.faults.inject("quota", instance_type="g5.xlarge", times=1)
    _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    g5 = t4_offer.account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    _order(acme, alice, g5, django_capture_on_commit_callbacks, aws_sandbox)
    failed = Attempt.objects.filter(outcome=AttemptOutcome.FAILED)
    assert sorted(failed.values_list("error_class", flat=True)) == ["capacity", "quota"]
    # Both failed two minutes ago: past the capacity window, within the quota one.
    failed.update(finished_at=timezone.now() - dt.timedelta(seconds=120))

    blocks = provider_blocks(now=timezone.now())

    assert blocks.zone_types == frozenset()
    assert blocks.account_regions == frozenset({(g5.account_id, g5.region)})


def test_a_zero_window_turns_sharing_off(
    acme, alice, aws_sandbox, t4_offer, django_capture_on_commit_callbacks, settings
):
    settings.BLOCK_CAPACITY_S = 0
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)
    _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    second = _order(acme, alice, t4_offer, django_capture_on_commit_callbacks, aws_sandbox)
    assert next((a.offer.zone, a.error_class) for a in second.attempts.all()) == (t4_offer.zone, "capacity")


# --- Independent hosts: the count of free GPUs is exact (issue 39) -------------------------------------------------


def _whole(fleet, machine: str) -> Offer:
    return Offer.objects.get(account=fleet, zone=machine, gpu_count=8, pricing_model="on_demand")


def _host_order(acme, alice, offer, capture, hosts):
    with capture(execute=True):
        order = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, allow_failover=False)
        ).order
    return boot_if_launched(order, hosts)


def test_a_host_sold_out_by_the_count_blocks_nothing_but_one_that_does_not_answer_blocks_its_lease_size(
    acme, alice, fleet, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    # Given fra-h100-1 sold whole, and a second order for it let through by a count gone stale: the holds refuse it
    first = _host_order(acme, alice, _whole(fleet, "fra-h100-1"), capture, held_hosts)
    assert first.state == OrderState.RUNNING, first.state_reason
    Offer.objects.filter(pk=_whole(fleet, "fra-h100-1").pk).update(reserved=0)
    sold_out = _host_order(acme, alice, _whole(fleet, "fra-h100-1"), capture, held_hosts)
    # And fra-h100-2's agent no longer answering (its address now a closed port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    Machine.objects.filter(account=fleet, name="fra-h100-2").update(agent_url=f"http://127.0.0.1:{closed}")
    silent = _host_order(acme, alice, _whole(fleet, "fra-h100-2"), capture, held_hosts)

    failed = {
        o.attempts.get().offer.zone: (o.state, o.attempts.get().outcome, o.attempts.get().provider_code)
        for o in (sold_out, silent)
    }
    assert failed["fra-h100-1"] == (OrderState.FAILED, AttemptOutcome.FAILED, SOLD_OUT)
    assert failed["fra-h100-2"][:2] == (OrderState.FAILED, AttemptOutcome.FAILED)
    assert failed["fra-h100-2"][2] != SOLD_OUT

    # Then only the host that did not answer blocks its lease size, on the clock as a cloud's zone would
    whole = _whole(fleet, "fra-h100-2")
    assert provider_blocks(now=timezone.now()).zone_types == {(fleet.pk, "fra-h100-2", whole.instance_type)}
