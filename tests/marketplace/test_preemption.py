"""A running order whose machine the provider takes away: noticed, ledgered, provisioned again or failed."""

from __future__ import annotations

import json

import pytest

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Instance, Order, OrderState
from marketplace.orders.launching import Step
from marketplace.orders.running import order_check_running
from marketplace.tasks import orders_sweep_task
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.leases import boot_if_launched, running_order

pytestmark = pytest.mark.django_db


def _running(acme, alice, offer, capture, sandbox, *, allow_failover: bool) -> Order:
    return running_order(acme, alice, offer, capture, sandbox, allow_failover=allow_failover)


def _take_away(account, order) -> str:
    """What a spot preemption looks like from the broker: the machine is gone at the provider."""
    instance = order.instance
    adapter_for_account(account).terminate(instance.region, instance.provider_instance_id)
    return instance.provider_instance_id


def test_a_preempted_spot_order_is_provisioned_again(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    spot = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="spot").order_by("price_usd")[0]
    order = _running(acme, alice, spot, django_capture_on_commit_callbacks, aws_sandbox, allow_failover=True)
    lost = _take_away(aws_account, order)

    with django_capture_on_commit_callbacks(execute=True):
        assert orders_sweep_task.apply().get() >= 1

    # A new machine, booted by its own agent like the first.
    boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    assert order.instance.provider_instance_id != lost
    assert Instance.objects.get(provider_instance_id=lost).active is False
    live = [h for h in adapter_for_account(aws_account).find_by_order(order.ref) if h.state != InstanceState.TERMINATED]
    assert [h.instance_id for h in live] == [order.instance.provider_instance_id]
    payload = json.loads(LedgerEntry.objects.get(kind="order.instance_lost").payload)
    assert (payload["instance"], payload["spot"], payload["state"]) == (lost, True, "terminated")
    states = [e.kind for e in LedgerEntry.objects.filter(subject=f"order:{order.public_id}").order_by("id")]
    assert states.count("order.running") == 2 and "order.provisioning" in states[states.index("order.instance_lost") :]
    assert ledger_verify().ok


def test_a_lost_machine_fails_the_order_when_failover_was_not_allowed(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    order = _running(acme, alice, offer, django_capture_on_commit_callbacks, aws_sandbox, allow_failover=False)
    lost = _take_away(aws_account, order)

    assert order_check_running(order_id=order.pk) == Step.DONE

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.state_reason == (
        f"instance {lost} terminated by the provider; failover was not allowed, so no other machine was tried"
    )
    assert order.attempts.count() == 1
    assert ledger_verify().ok


def test_a_healthy_machine_is_left_alone(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    order = _running(acme, alice, offer, django_capture_on_commit_callbacks, aws_sandbox, allow_failover=True)
    entries = LedgerEntry.objects.count()
    assert order_check_running(order_id=order.pk) == Step.DONE
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING and LedgerEntry.objects.count() == entries
