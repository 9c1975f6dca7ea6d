"""Quota pre-checks: a launch the account's published quota cannot hold is refused by the broker before any
launch call, blocks the region for every order, and the order fails over elsewhere."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from ledger.services import ledger_verify
from marketplace.models import OrderState
from marketplace.orders.blocks import provider_blocks
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


def _place(acme, alice, offer, capture, cap, sandbox=None):
    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=cap),
        ).order
    if sandbox is not None:
        boot_if_launched(order, sandbox)
    order.refresh_from_db()
    return order


def _inserts(sandbox, region: str) -> int:
    return sum(1 for c in sandbox.calls("compute.instances.insert") if (c.zone or "").startswith(region))


def test_a_full_gpu_quota_sends_the_order_to_another_region_without_a_launch_call(
    acme, alice, gcp_account, gcp_sandbox, django_capture_on_commit_callbacks
):
    t4 = gcp_account.offers.filter(gpu_model__key="T4", pricing_model="on_demand").order_by("price_usd", "zone")[0]
    assert t4.region == "us-central1"
    cap = Decimal("1.00")  # admits europe-west4's T4 too
    gcp_sandbox.set_quota("NVIDIA_T4_GPUS", 1)  # one T4 per region for this project

    first = _place(acme, alice, t4, django_capture_on_commit_callbacks, cap, gcp_sandbox)
    assert first.state == OrderState.RUNNING, first.state_reason
    gcp_sandbox.clear_calls()

    second = _place(acme, alice, t4, django_capture_on_commit_callbacks, cap, gcp_sandbox)
    assert second.state == OrderState.RUNNING, second.state_reason
    refused, launched = second.attempts.order_by("number")
    assert (refused.offer.region, refused.error_class, refused.provider_code) == ("us-central1", "quota", "precheck")
    assert "NVIDIA_T4_GPUS" in refused.provider_message and "1 of 1 in use" in refused.provider_message
    assert launched.offer.region == "europe-west4" and launched.outcome == "launched"
    # The refused region never saw an insert: the broker read the quota and stayed away.
    assert _inserts(gcp_sandbox, "us-central1") == 0
    assert _inserts(gcp_sandbox, "europe-west4") == 1
    assert (gcp_account.pk, "us-central1") in provider_blocks(now=timezone.now()).account_regions
    assert ledger_verify().ok


def test_without_failover_the_precheck_fails_the_order_with_the_quota_named(
    acme, alice, gcp_account, gcp_sandbox, django_capture_on_commit_callbacks
):
    t4 = gcp_account.offers.filter(gpu_model__key="T4", pricing_model="on_demand").order_by("price_usd", "zone")[0]
    gcp_sandbox.set_quota("NVIDIA_T4_GPUS", 0)
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(launch=LAUNCH, offer_id=t4.pk, max_price_per_hour=t4.price_usd, allow_failover=False),
        ).order
    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert "quota (precheck)" in order.state_reason
    assert gcp_sandbox.calls("compute.instances.insert") == []
