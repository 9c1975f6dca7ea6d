"""Failover beyond one zone: asynchronous launch failures, and from one cloud to another."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ledger.services import ledger_verify
from marketplace.models import Instance, Offer, OfferStatus, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from providers.services import adapter_for_account
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


def _place(acme, alice, offer, capture, cap=None):
    with capture(execute=True):
        return order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=cap),
        ).order


def test_a_launch_that_fails_after_it_was_accepted_fails_over(
    acme, alice, tencent_account, tencent_sandbox, django_capture_on_commit_callbacks
):
    offer = tencent_account.offers.filter(instance_type="GN7.2XLARGE32", status=OfferStatus.AVAILABLE).order_by("zone")[
        0
    ]
    assert (offer.currency, offer.gpu_model.key) == ("CNY", "T4")
    # Tencent accepts RunInstances and reports LAUNCH_FAILED later, as its real API does when a zone sells out.
    tencent_sandbox.faults.inject("capacity", action="RunInstances", instance_type=offer.instance_type, zone=offer.zone)

    order = _place(acme, alice, offer, django_capture_on_commit_callbacks, cap=offer.price_usd * 2)

    boot_if_launched(order, tencent_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    first, second = order.attempts.all()
    assert (first.outcome, first.error_class) == ("failed", "capacity")
    assert first.offer.zone == offer.zone
    assert second.outcome == "launched"
    assert second.offer.zone != offer.zone
    failed, live = sorted(order.instances.all(), key=lambda i: i.active)
    assert (failed.active, failed.state) == (False, "failed")
    assert (live.active, order.instance.pk) == (True, live.pk)
    assert ledger_verify().ok


def test_a_sold_out_cloud_fails_over_to_another_cloud(
    acme, alice, aws_account, aws_sandbox, tencent_account, tencent_sandbox, django_capture_on_commit_callbacks
):
    # A T4 on AWS (g4dn.xlarge) is the buyer's pick; every AWS zone is sold out of it.
    aws_t4 = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    aws_sandbox.faults.inject("capacity", instance_type="g4dn.xlarge")
    tencent_t4 = Offer.objects.filter(account=tencent_account, gpu_model__key="T4", gpu_count=1).order_by("price_usd")[
        0
    ]
    cap = max(aws_t4.price_usd, tencent_t4.price_usd) + Decimal("0.01")

    order = _place(acme, alice, aws_t4, django_capture_on_commit_callbacks, cap=cap)

    boot_if_launched(order, tencent_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    kinds = [a.offer.account.kind for a in order.attempts.all()]
    assert kinds[0] == "aws"
    assert kinds[-1] == "tencent"
    assert all(a.error_class == "capacity" for a in order.attempts.all()[: len(kinds) - 1])
    assert order.instance.account == tencent_account
    assert adapter_for_account(aws_account).find_by_order(order.ref) == []
    assert Instance.objects.filter(order=order, active=True).count() == 1
    assert order.price_per_hour == order.instance.attempt.offer.price_usd
