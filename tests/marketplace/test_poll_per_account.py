"""Polling running orders grows with the accounts, not with the orders (issue 23, point 4): the minute sweep asks
each account once per region for all its running instances (``ProviderAdapter.describe_many``), a machine the
provider took away is still noticed and provisioned again as before, and one account that cannot be asked keeps
none of the others' orders unchecked. Requests are counted where they arrive, at the sandboxes."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.conf import settings
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.catalog.services import offers_ingest
from marketplace.models import Instance, Lease, Offer, Order, OrderState
from marketplace.orders.running import NOT_LISTED, orders_check_running
from marketplace.tasks import orders_sweep_task
from providers.models import Machine, ProviderAccount
from providers.services import adapter_for_account, provider_account_connect
from providers.types import InstanceState
from sandboxes.aws.keys import CONTRACT
from tests.conftest import TEST_AWS_REGIONS
from tests.leases import boot_if_launched, running_order

pytestmark = pytest.mark.django_db

PER_ACCOUNT = 15


@pytest.fixture
def other_aws_account(aws_account, aws_sandbox, _aws_quotes) -> ProviderAccount:
    """A second seller's AWS account on the same sandbox, with the same catalogue."""
    account = provider_account_connect(
        provider_name="Quentin GPU Resale",
        kind="aws",
        name="aws-quentin",
        credentials=CONTRACT.credentials(),
        regions=TEST_AWS_REGIONS,
        endpoint_url=aws_sandbox.url,
    )
    offers_ingest(account=account, quotes=_aws_quotes, now=timezone.now())
    return ProviderAccount.objects.get(pk=account.pk)


def _offer(account: ProviderAccount, pricing_model: str = "on_demand") -> Offer:
    return account.offers.filter(instance_type="g4dn.xlarge", pricing_model=pricing_model, region="us-east-1").order_by(
        "price_usd", "zone"
    )[0]


def _running(acme, alice, offer, capture, sandbox, *, allow_failover: bool = True) -> Order:
    return running_order(acme, alice, offer, capture, sandbox, allow_failover=allow_failover)


def _take_away(order: Order) -> str:
    """What a spot preemption looks like from the broker: the machine is gone at the provider."""
    instance = order.instance
    adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
    return instance.provider_instance_id


def _reads_naming(sandbox, instance_ids: set[str]) -> list[set[str]]:
    """The ids each DescribeInstances the AWS sandbox received named, of those asked about."""
    named = (set(c.instance_ids) & instance_ids for c in sandbox.calls("DescribeInstances"))
    return [ids for ids in named if ids]


def test_the_sweep_asks_each_account_once_for_all_its_running_instances_and_notices_a_preemption(
    acme, alice, aws_account, other_aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    spot = _offer(other_aws_account, "spot")
    preempted = _running(acme, alice, spot, django_capture_on_commit_callbacks, aws_sandbox)
    others = [
        _running(acme, alice, _offer(account), django_capture_on_commit_callbacks, aws_sandbox)
        for account in (aws_account, other_aws_account)
        for _ in range(PER_ACCOUNT if account == aws_account else PER_ACCOUNT - 1)
    ]
    running = {o.instance.provider_instance_id for o in [preempted, *others]}
    assert len(running) == 2 * PER_ACCOUNT
    lost = _take_away(preempted)
    aws_sandbox.clear_calls()

    with django_capture_on_commit_callbacks(execute=True):
        assert orders_sweep_task.apply().get() >= 1

    # Two reads, one per account (all its instances are in us-east-1), where there were thirty describes.
    reads = _reads_naming(aws_sandbox, running)
    assert sorted(len(r) for r in reads) == [PER_ACCOUNT, PER_ACCOUNT]
    assert set().union(*reads) == running
    # The preempted order was noticed and provisioned again, exactly as one describe per order did.
    boot_if_launched(preempted, aws_sandbox)
    assert preempted.state == OrderState.RUNNING, preempted.state_reason
    assert preempted.instance.provider_instance_id not in running
    assert Instance.objects.get(provider_instance_id=lost).active is False
    payload = json.loads(LedgerEntry.objects.get(kind="order.instance_lost").payload)
    assert (payload["instance"], payload["spot"], payload["state"]) == (lost, True, "terminated")
    assert {o.state for o in Order.objects.filter(pk__in=[o.pk for o in others])} == {OrderState.RUNNING}
    assert ledger_verify().ok


def test_an_instance_the_provider_no_longer_lists_is_lost(
    acme, alice, tencent_account, tencent_sandbox, django_capture_on_commit_callbacks
):
    # CVM forgets a destroyed instance once it leaves the recycle bin: the batched read leaves it out.
    offer = tencent_account.offers.filter(pricing_model="on_demand").order_by("price_usd", "id").first()
    kept = _running(acme, alice, offer, django_capture_on_commit_callbacks, tencent_sandbox)
    gone = _running(acme, alice, offer, django_capture_on_commit_callbacks, tencent_sandbox, allow_failover=False)
    Instance.objects.filter(order=gone).update(provider_instance_id="ins-00000000")

    checked = orders_check_running(order_ids=[kept.pk, gone.pk])

    assert (checked.provision, checked.failed, checked.reads) == ([], [], 1)
    gone.refresh_from_db()
    assert gone.state == OrderState.FAILED
    assert gone.state_reason.startswith("instance ins-00000000 terminated by the provider")
    payload = json.loads(LedgerEntry.objects.get(kind="order.instance_lost").payload)
    assert (payload["instance"], payload["code"]) == ("ins-00000000", NOT_LISTED)
    assert Order.objects.get(pk=kept.pk).state == OrderState.RUNNING


def test_one_account_that_cannot_be_asked_keeps_none_of_the_others_orders_unchecked(
    acme,
    alice,
    aws_account,
    aws_sandbox,
    tencent_account,
    tencent_sandbox,
    django_capture_on_commit_callbacks,
    caplog,
):
    stuck = [
        _running(acme, alice, _offer(aws_account), django_capture_on_commit_callbacks, aws_sandbox) for _ in range(3)
    ]
    tencent_offer = tencent_account.offers.filter(pricing_model="on_demand").order_by("price_usd", "id").first()
    healthy = _running(acme, alice, tencent_offer, django_capture_on_commit_callbacks, tencent_sandbox)
    taken = _running(
        acme, alice, tencent_offer, django_capture_on_commit_callbacks, tencent_sandbox, allow_failover=False
    )
    lost = _take_away(taken)
    ProviderAccount.objects.filter(pk=aws_account.pk).update(options={"max_attempts": "1"})
    aws_sandbox.faults.inject("throttle", action="DescribeInstances")  # EC2 throttles every describe
    aws_sandbox.clear_calls()
    tencent_sandbox.clear_calls()

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    taken.refresh_from_db()
    assert taken.state == OrderState.FAILED
    assert taken.state_reason.startswith(f"instance {lost} terminated by the provider")
    assert Order.objects.get(pk=healthy.pk).state == OrderState.RUNNING
    assert {o.state for o in Order.objects.filter(pk__in=[o.pk for o in stuck])} == {OrderState.RUNNING}
    assert f"could not be checked: {sorted(o.pk for o in stuck)}" in caplog.text
    # One throttled read for the AWS account, not one per order after it; one read for Tencent's two.
    assert len(aws_sandbox.calls("DescribeInstances")) == 1
    assert len(tencent_sandbox.calls("DescribeInstances")) == 1


# --- Independent hosts: each machine is its own endpoint, and the silent-host rule holds per machine -----------


SILENT = dt.timedelta(seconds=settings.AGENT_SILENCE_S + 60)


def _on_host(acme, alice, zone: str, hosts, capture) -> Order:
    offer = Offer.objects.get(zone=zone, pricing_model="on_demand")
    order = _running(acme, alice, offer, capture, hosts, allow_failover=False)
    Instance.objects.filter(order=order).update(ready_at=timezone.now() - dt.timedelta(hours=1))
    return order


def _disconnect(agent) -> None:
    """The host drops off the network: its agent answers nothing (connections are refused)."""
    agent._server.shutdown()
    agent._server.server_close()


def test_a_silent_host_loses_its_lease_while_the_other_machine_is_still_checked(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    silent = _on_host(acme, alice, "fra-h100-1", held_hosts, django_capture_on_commit_callbacks)
    taken = _on_host(acme, alice, "fra-h100-2", held_hosts, django_capture_on_commit_callbacks)
    _disconnect(held_hosts[0])
    last_heard = timezone.now() - SILENT
    Machine.objects.filter(name="fra-h100-1").update(last_heartbeat_at=last_heard)
    Lease.objects.filter(order=silent).update(last_heartbeat_at=None)
    lost = _take_away(taken)

    checked = orders_check_running(order_ids=[silent.pk, taken.pk])

    assert (checked.provision, checked.failed, checked.reads) == ([], [], 2)  # one read per machine
    silent.refresh_from_db()
    taken.refresh_from_db()
    assert silent.state == taken.state == OrderState.FAILED
    assert silent.state_reason.startswith("host fra-h100-1 went silent")
    assert taken.state_reason.startswith(f"instance {lost} terminated by the provider")
    assert silent.instances.get().state == InstanceState.UNKNOWN.value
    assert ledger_verify().ok


def test_an_unreachable_host_that_is_not_silent_yet_keeps_only_its_own_order_unchecked(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    unreachable = _on_host(acme, alice, "fra-h100-1", held_hosts, django_capture_on_commit_callbacks)
    taken = _on_host(acme, alice, "fra-h100-2", held_hosts, django_capture_on_commit_callbacks)
    _disconnect(held_hosts[0])  # it heartbeated just now: a blip, asked again by the next sweep
    _take_away(taken)

    checked = orders_check_running(order_ids=[unreachable.pk, taken.pk])

    assert (checked.provision, checked.failed) == ([], [unreachable.pk])
    assert Order.objects.get(pk=unreachable.pk).state == OrderState.RUNNING
    assert Order.objects.get(pk=taken.pk).state == OrderState.FAILED
