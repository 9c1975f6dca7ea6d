"""Failover beyond one zone: asynchronous launch failures, and from one cloud to another."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ledger.services import ledger_verify
from marketplace.catalog.services import offers_sync
from marketplace.models import Instance, Offer, OfferStatus, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from providers.services import adapter_for_account, provider_account_connect
from tests.conftest import AWS_TEST_CREDENTIALS
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


def test_a_whole_gpu_order_never_fails_over_to_a_slice_of_one(
    acme, alice, aws_sandbox, django_capture_on_commit_callbacks
):
    # Frankfurt sells whole L4s (g6.8xlarge) and g6f slices of one, which are also "1 L4", and far cheaper.
    frankfurt = provider_account_connect(provider_name="Petra Cloud Resale", kind="aws", name="aws-frankfurt",
                                         credentials=AWS_TEST_CREDENTIALS, regions=["eu-central-1"],
                                         endpoint_url=aws_sandbox.url)  # fmt: skip
    assert offers_sync(account_id=frankfurt.pk).ok
    whole_l4 = Offer.objects.filter(account=frankfurt, gpu_model__key="L4", pricing_model="on_demand").exclude(
        instance_type__startswith="g6f."
    )
    assert Offer.objects.filter(account=frankfurt, instance_type__startswith="g6f.", status="available").exists()
    for instance_type in set(whole_l4.values_list("instance_type", flat=True)):
        aws_sandbox.faults.inject("capacity", instance_type=instance_type)  # every whole L4 sold out

    order = _place(acme, alice, whole_l4.order_by("price_usd")[0], django_capture_on_commit_callbacks, Decimal(100))

    tried = [a.offer.instance_type for a in order.attempts.order_by("number")]
    # Each zone's whole L4 was tried, and no slice: the order goes on waiting for a whole card.
    assert tried == ["g6.8xlarge"] * 3 and order.state != OrderState.RUNNING
