"""States that drift (issue 18, item 8): an ended order's machine shows what its provider says, the order page
says why each attempt failed, and only an order whose buyer allowed failover speaks of failing over.

What the clouds answer to a terminate, which the sandboxes reproduce:

- AWS "TerminateInstances" (https://docs.aws.amazon.com/goto/WebAPI/ec2-2016-11-15/TerminateInstances):
  the answer's ``CurrentState`` is ``shutting-down``; the instance is described as ``terminated`` once it
  is, and "terminated instances remain visible after termination (for approximately one hour)", after which
  EC2 no longer knows the id.
- Compute Engine "Method: instances.delete" (https://cloud.google.com/compute/docs/reference/beta/instances/delete):
  the answer is an Operation (asynchronous); once it is done the instance no longer exists, so a get of it
  answers 404.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import boto3
import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import LedgerEntry
from marketplace.models import Instance, Order, OrderState
from marketplace.orders.ending import ENDING_CHECK_WINDOW, STOPPED_GRACE
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.tasks import orders_sweep_task
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.conftest import AWS_TEST_CREDENTIALS
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


def _place(acme, alice, offer, capture, *, allow_failover: bool = True, cap: Decimal | None = None) -> Order:
    with capture(execute=True):
        return order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH,
                offer_id=offer.pk,
                max_price_per_hour=cap if cap is not None else offer.price_usd + Decimal("1"),
                allow_failover=allow_failover,
            ),
        ).order


def _running(acme, alice, offer, capture, sandbox, *, allow_failover: bool = True) -> Order:
    order = boot_if_launched(_place(acme, alice, offer, capture, allow_failover=allow_failover), sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def _browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _order_page(user, order) -> str:
    response = _browser(user).get(f"/orders/{order.public_id}/")
    assert response.status_code == 200
    return response.content.decode()


def _terminate_as_buyer(user, order, capture) -> Instance:
    with capture(execute=True):
        assert _browser(user).post(f"/orders/{order.public_id}/terminate").status_code == 302
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    return order.instances.get()


def _t4(account):
    return account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


# ------------------------------------------------------------------ (a) the ended machine's state converges


def test_a_terminated_aws_orders_instance_reads_terminated_after_the_next_sweep(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, _t4(aws_account), django_capture_on_commit_callbacks, aws_sandbox)
    instance = _terminate_as_buyer(alice, order, django_capture_on_commit_callbacks)
    # What TerminateInstances answered: shutting down, recorded as stopping.
    assert (instance.state, instance.active) == (InstanceState.STOPPING, False)
    described = adapter_for_account(aws_account).describe(instance.region, instance.provider_instance_id)
    assert described.state == InstanceState.TERMINATED

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    instance.refresh_from_db()
    assert (instance.state, instance.active) == (InstanceState.TERMINATED, False)
    api = _browser(alice).get(f"/api/v1/orders/{order.public_id}").json()
    assert (api["state"], api["instance"]["state"]) == ("terminated", "terminated")
    assert 'id="instance-state">terminated<' in _order_page(alice, order)
    listing = _browser(alice).get("/orders/").content.decode()
    assert f'<code>{instance.provider_instance_id}</code><br><span class="muted">terminated' in listing
    assert "stopping" not in listing


def test_a_deleted_gcp_instance_the_provider_forgot_reads_terminated(
    acme, alice, gcp_account, gcp_sandbox, django_capture_on_commit_callbacks
):
    offer = gcp_account.offers.filter(pricing_model="on_demand", status="available").order_by("price_usd")[0]
    order = _running(acme, alice, offer, django_capture_on_commit_callbacks, gcp_sandbox)
    instance = _terminate_as_buyer(alice, order, django_capture_on_commit_callbacks)
    assert instance.state == InstanceState.STOPPING  # the delete operation was still running

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    instance.refresh_from_db()
    # Gone from the project: a vanished instance counts as terminated.
    assert adapter_for_account(gcp_account).find_by_order(order.ref) == []
    assert instance.state == InstanceState.TERMINATED
    api = _browser(alice).get(f"/api/v1/orders/{order.public_id}").json()
    assert api["instance"]["state"] == "terminated"
    assert 'id="instance-state">terminated<' in _order_page(alice, order)


def test_an_instance_that_ended_long_ago_is_no_longer_asked_about(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, _t4(aws_account), django_capture_on_commit_callbacks, aws_sandbox)
    instance = _terminate_as_buyer(alice, order, django_capture_on_commit_callbacks)
    long_ago = timezone.now() - ENDING_CHECK_WINDOW - dt.timedelta(minutes=1)
    Instance.objects.filter(pk=instance.pk).update(terminated_at=long_ago)

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    instance.refresh_from_db()
    # The provider says terminated, but nobody asked it: past the window the reconciler has the instance.
    assert (instance.state, instance.terminated_at) == (InstanceState.STOPPING, long_ago)


def test_a_running_orders_machine_is_not_touched_by_the_ended_instances_check(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, _t4(aws_account), django_capture_on_commit_callbacks, aws_sandbox)

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    order.refresh_from_db()
    instance = order.instances.get()
    assert (order.state, instance.state, instance.active, instance.terminated_at) == (
        OrderState.RUNNING,
        InstanceState.RUNNING,
        True,
        None,
    )


def _ec2(sandbox, region: str):
    key_id, secret = AWS_TEST_CREDENTIALS["access_key_id"], AWS_TEST_CREDENTIALS["secret_access_key"]
    return boto3.client(
        "ec2", region_name=region, endpoint_url=sandbox.url, aws_access_key_id=key_id, aws_secret_access_key=secret
    )


def _sweep(capture) -> None:
    with capture(execute=True):
        orders_sweep_task.apply().get()


def test_a_machine_the_provider_stopped_for_an_ended_order_is_terminated_not_left_billing_its_disks(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    """EC2 "StopInstances" (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html):
    a stopped instance keeps its EBS volumes, billed, until it is terminated; nobody starts it again for an
    order that failed over or failed, so the broker must terminate it."""
    order = _running(acme, alice, _t4(aws_account), django_capture_on_commit_callbacks, aws_sandbox,
                     allow_failover=False)  # fmt: skip
    instance = order.instances.get()
    ec2 = _ec2(aws_sandbox, instance.region)
    ec2.stop_instances(InstanceIds=[instance.provider_instance_id])

    _sweep(django_capture_on_commit_callbacks)  # the loss is seen; within the grace nothing is terminated yet
    order.refresh_from_db()
    instance.refresh_from_db()
    assert (order.state, instance.active, instance.state) == (OrderState.FAILED, False, InstanceState.STOPPED)
    described = ec2.describe_instances(InstanceIds=[instance.provider_instance_id])
    assert described["Reservations"][0]["Instances"][0]["State"]["Name"] == "stopped"

    Instance.objects.filter(pk=instance.pk).update(
        terminated_at=timezone.now() - STOPPED_GRACE - dt.timedelta(minutes=1)
    )
    _sweep(django_capture_on_commit_callbacks)  # past the grace: terminated at the provider
    _sweep(django_capture_on_commit_callbacks)  # and recorded as the provider then says

    described = ec2.describe_instances(InstanceIds=[instance.provider_instance_id])
    assert described["Reservations"][0]["Instances"][0]["State"]["Name"] == "terminated"
    instance.refresh_from_db()
    assert instance.state == InstanceState.TERMINATED


# ------------------------------------------------------------------ (b) the order page says why attempts failed


def test_the_order_page_lists_each_failed_attempt_with_provider_place_and_reason(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _t4(aws_account)
    aws_sandbox.faults.inject("capacity", instance_type=offer.instance_type, zone=offer.zone)
    order = boot_if_launched(_place(acme, alice, offer, django_capture_on_commit_callbacks), aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    failed = order.attempts.get(number=1)
    assert (failed.outcome, failed.error_class, failed.provider_code) == (
        "failed",
        "capacity",
        "InsufficientInstanceCapacity",
    )

    page = _order_page(alice, order)

    card = page[page.index('id="failed-attempts"') : page.index("</section>", page.index('id="failed-attempts"'))]
    assert "Petra Cloud Resale" in card and "Amazon Web Services" in card
    assert f"{offer.region} <span" in card and offer.zone in card
    assert "<strong>capacity</strong>" in card and "InsufficientInstanceCapacity" in card
    assert failed.provider_message and failed.provider_message[:40] in card
    history = page[page.index('id="history"') :]
    assert f"attempt 1 in {offer.zone} failed: capacity (InsufficientInstanceCapacity)" in history
    assert f"attempt 2 in {order.instance.zone} launched {order.instance.provider_instance_id}" in history


# ------------------------------------------------------------------ (c) failover wording only where it applies


def test_an_order_without_failover_that_failed_says_so_plainly(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _t4(aws_account)
    aws_sandbox.faults.inject("capacity", instance_type=offer.instance_type)

    order = _place(acme, alice, offer, django_capture_on_commit_callbacks, allow_failover=False)

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.attempts.count() == 1
    assert order.state_reason == (
        f"failed on the chosen offer: g4dn.xlarge in {offer.zone}: capacity (InsufficientInstanceCapacity); "
        "failover was not allowed, so no other offer was tried"
    )
    ledgered = json.loads(LedgerEntry.objects.get(kind="order.failed", subject=f"order:{order.public_id}").payload)
    assert ledgered["reason"] == order.state_reason
    api = _browser(alice).get(f"/api/v1/orders/{order.public_id}").json()
    assert (api["allow_failover"], api["state_reason"]) == (False, order.state_reason)
    page = _order_page(alice, order)
    assert "no failover: only this offer is tried" in page
    assert "Failover was not allowed for this order, so no other offer was tried." in page
    for wording in ("may fail over", "on failover", "Fails over", "no offer left", "like offer"):
        assert wording not in page, wording


def test_an_order_with_failover_that_ran_out_of_offers_says_it_tried_them(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _t4(aws_account)
    aws_sandbox.faults.inject("capacity", instance_type=offer.instance_type)

    order = _place(acme, alice, offer, django_capture_on_commit_callbacks, allow_failover=True, cap=offer.price_usd)

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.attempts.count() >= 2
    assert order.state_reason.startswith(f"no offer left within the price cap after g4dn.xlarge in {offer.zone}: ")
    page = _order_page(alice, order)
    assert "may fail over to a like offer" in page
    assert f"At most {offer.price_usd:.4f} USD/h on failover." in page
    assert "not allowed" not in page and "only this offer" not in page


def test_the_boot_deadline_speaks_of_failover_only_when_the_buyer_allowed_it(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _t4(aws_account)
    with_failover = _place(acme, alice, offer, django_capture_on_commit_callbacks, allow_failover=True)
    without = _place(acme, alice, offer, django_capture_on_commit_callbacks, allow_failover=False)
    with_failover.refresh_from_db()
    without.refresh_from_db()
    # Both machines run at the provider; their agents have not reported yet.
    assert {with_failover.state, without.state} == {OrderState.PROVISIONING}

    allowed, refused = _order_page(alice, with_failover), _order_page(alice, without)

    assert "Fails over to another machine if not ready by" in allowed
    assert "Fails if not ready by" in refused
    assert "Fails over" not in refused and "on failover" not in refused and "may fail over" not in refused


def test_a_lost_machine_of_an_order_without_failover_fails_it_saying_nothing_else_was_tried(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(
        acme, alice, _t4(aws_account), django_capture_on_commit_callbacks, aws_sandbox, allow_failover=False
    )
    instance = order.instance
    adapter_for_account(aws_account).terminate(instance.region, instance.provider_instance_id)

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.state_reason == (
        f"instance {instance.provider_instance_id} terminated by the provider; "
        "failover was not allowed, so no other machine was tried"
    )
    assert order.attempts.count() == 1
