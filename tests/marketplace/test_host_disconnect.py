"""An independent host whose agent disconnects mid-lease (issue 19): once the machine is silent past
``BROKER_AGENT_SILENCE_S`` its lease is lost, ledgered and announced, its GPUs released, and the order moves to
another host or fails; the buyer pays only until the host's last report; one unanswered call ends nothing; and a
host that comes back with the lease still running has it stopped.

Driven on real simulated host agents (``tests.hosts``): a host is disconnected by stopping its agent's HTTP
server, and time passes by setting its last heartbeat back, never by sleeping."""

from __future__ import annotations

import datetime as dt
import json
import socket
from decimal import Decimal

import pytest
from django.conf import settings
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import (
    Attempt,
    GpuHold,
    Instance,
    InvoiceLine,
    Lease,
    Offer,
    Order,
    OrderState,
    WebhookDelivery,
    WebhookEventType,
)
from marketplace.orders.ending import instance_end_settle
from marketplace.orders.launching import Step
from marketplace.orders.reconcile import order_reconcile
from marketplace.orders.running import order_check_running
from marketplace.orders.selectors import order_usage
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.tasks import orders_sweep_task
from marketplace.webhooks.services import webhook_endpoint_create
from providers.community.agent import Agent
from providers.community.services import machine_heartbeat
from providers.errors import TransientProviderError
from providers.models import Machine
from tests.leases import LAUNCH, boot, boot_if_launched

pytestmark = pytest.mark.django_db

SILENT = dt.timedelta(seconds=settings.AGENT_SILENCE_S + 60)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _running(acme, alice, hosts, capture, *, allow_failover: bool) -> Order:
    """An order running on fra-h100-1 for an hour, with a webhook endpoint listening for its events."""
    webhook_endpoint_create(organization=acme, user=alice, url=f"http://127.0.0.1:{_closed_port()}/hook")
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=Decimal("16"), allow_failover=allow_failover
            ),
        ).order
    with capture(execute=True):
        boot(order, hosts)
    assert order.state == OrderState.RUNNING, order.state_reason
    assert GpuHold.objects.filter(attempt__order=order).count() == 8
    # It has been running a while: the host's last report comes after it was ready.
    Instance.objects.filter(order=order).update(ready_at=timezone.now() - dt.timedelta(hours=1))
    return order


def _machine(name: str) -> Machine:
    return Machine.objects.get(name=name)


def _disconnect(agent: Agent) -> None:
    """The host drops off the network: its agent answers nothing (connections are refused)."""
    assert agent._server is not None
    agent._server.shutdown()
    agent._server.server_close()


def _fall_silent(name: str, *, last_heard: dt.datetime | None = None) -> dt.datetime:
    """The machine's last heartbeat (and its lease agent's) is further back than the silence threshold."""
    last_heard = last_heard or timezone.now() - SILENT
    Machine.objects.filter(name=name).update(last_heartbeat_at=last_heard)
    Lease.objects.filter(attempt__offer__zone=name).update(last_heartbeat_at=None)
    return last_heard


def _reconnect(agent: Agent, name: str) -> None:
    """The host is back, on the same address, with whatever it still runs, and heartbeats again."""
    machine = _machine(name)
    agent.serve("127.0.0.1", int(machine.agent_url.rsplit(":", 1)[1]), report=False)
    machine_heartbeat(machine=machine, gpus=agent.telemetry(), instances=len(agent.instances))


def _lost_entries(order: Order) -> list[dict]:
    rows = LedgerEntry.objects.filter(kind="order.instance_lost", subject=f"order:{order.public_id}")
    return [json.loads(e.payload) for e in rows.order_by("id")]


def _agent_states(agent: Agent) -> list[str]:
    return [i.state for i in agent.instances.values()]


def test_a_silent_host_mid_lease_loses_the_lease_and_the_order_moves_to_the_other_host(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=True)
    first = order.instances.get()
    _disconnect(held_hosts[0])
    last_heard = _fall_silent("fra-h100-1")

    with django_capture_on_commit_callbacks(execute=True):
        assert orders_sweep_task.apply().get() >= 1
    boot_if_launched(order, held_hosts)

    assert order.state == OrderState.RUNNING, order.state_reason
    assert order.instance.zone == "fra-h100-2"
    first.refresh_from_db()
    assert (first.active, first.state, first.terminated_at) == (False, "unknown", last_heard)
    # The lost lease's GPUs are free again; the new one holds the other machine's.
    assert GpuHold.objects.filter(attempt=first.attempt).count() == 0
    assert set(GpuHold.objects.filter(attempt__order=order).values_list("machine__name", flat=True)) == {"fra-h100-2"}
    attempt = Attempt.objects.get(pk=first.attempt_id)
    assert (attempt.outcome, attempt.error_class, attempt.provider_code) == ("failed", "capacity", "host_silent")
    said = last_heard.isoformat(timespec="seconds")
    assert _lost_entries(order) == [
        {
            "order": str(order.public_id),
            "instance": first.provider_instance_id,
            "state": "unknown",
            "spot": False,
            "code": "host_silent",
            "billed_until": said,
        }
    ]
    reasons = list(
        LedgerEntry.objects.filter(kind="order.provisioning", subject=f"order:{order.public_id}")
        .order_by("id")
        .values_list("payload", flat=True)
    )
    assert json.loads(reasons[-1])["reason"] == (
        f"host fra-h100-1 went silent under instance {first.provider_instance_id}: no report for more than "
        f"{settings.AGENT_SILENCE_S:g} s; billed until {said}, the last report from the host; provisioning again"
    )
    lost = WebhookDelivery.objects.get(event_type=WebhookEventType.INSTANCE_LOST)
    instance_seen = lost.payload["instance"]
    assert (instance_seen["provider_instance_id"], instance_seen["state"], lost.payload["billed_until"]) == (
        first.provider_instance_id,
        "unknown",
        said,
    )
    assert ledger_verify().ok


def test_a_silent_host_fails_the_order_without_failover_and_says_so(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=False)
    instance = order.instances.get()
    _disconnect(held_hosts[0])
    said = _fall_silent("fra-h100-1").isoformat(timespec="seconds")

    assert order_check_running(order_id=order.pk) == Step.DONE

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.state_reason == (
        f"host fra-h100-1 went silent under instance {instance.provider_instance_id}: no report for more than "
        f"{settings.AGENT_SILENCE_S:g} s; billed until {said}, the last report from the host; failover was not "
        "allowed, so no other machine was tried"
    )
    assert order.attempts.count() == 1
    assert GpuHold.objects.count() == 0
    assert [e["code"] for e in _lost_entries(order)] == ["host_silent"]
    assert WebhookDelivery.objects.filter(event_type=WebhookEventType.INSTANCE_LOST).count() == 1
    assert ledger_verify().ok


def test_the_buyer_pays_only_until_the_hosts_last_heartbeat(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=False)
    now = timezone.now()
    # Ready an hour ago; the host last reported half an hour ago; the broker notices now.
    Instance.objects.filter(order=order).update(ready_at=now - dt.timedelta(hours=1))
    _disconnect(held_hosts[0])
    _fall_silent("fra-h100-1", last_heard=now - dt.timedelta(minutes=30))

    assert order_check_running(order_id=order.pk, now=now) == Step.DONE

    order = Order.objects.prefetch_related("instances").get(pk=order.pk)
    assert order_usage(order, now=now + dt.timedelta(hours=1)).seconds == 1800
    line = InvoiceLine.objects.get(order=order)
    assert (line.seconds, line.amount_usd) == (1800, (order.price_per_hour / 2).quantize(Decimal("0.000001")))
    failed = json.loads(LedgerEntry.objects.get(kind="order.failed", subject=f"order:{order.public_id}").payload)
    assert failed["invoiced_seconds"] == 1800


def test_one_unanswered_call_does_not_end_the_lease_but_silence_does(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=True)
    entries = LedgerEntry.objects.count()
    _disconnect(held_hosts[0])

    # The host heartbeated just now: an unreachable agent is a blip, asked again by the next sweep.
    with pytest.raises(TransientProviderError):
        order_check_running(order_id=order.pk)
    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()
    # Its lease agent's heartbeats keep it alive too, whatever the host agent's last heartbeat.
    _fall_silent("fra-h100-1")
    Lease.objects.filter(order=order).update(last_heartbeat_at=timezone.now())
    with pytest.raises(TransientProviderError):
        order_check_running(order_id=order.pk)

    order.refresh_from_db()
    assert order.state == OrderState.RUNNING
    assert order.instances.get().active is True
    assert GpuHold.objects.filter(attempt__order=order).count() == 8
    assert LedgerEntry.objects.count() == entries
    assert not WebhookDelivery.objects.filter(event_type=WebhookEventType.INSTANCE_LOST).exists()

    # Past the threshold with no report from either, the lease is lost.
    _fall_silent("fra-h100-1")
    assert order_check_running(order_id=order.pk) == Step.PROVISION
    assert [e["code"] for e in _lost_entries(order)] == ["host_silent"]


def test_a_host_back_with_the_lost_lease_has_it_stopped_by_the_sweep(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=False)
    instance = order.instances.get()
    _disconnect(held_hosts[0])
    _fall_silent("fra-h100-1")
    assert order_check_running(order_id=order.pk) == Step.DONE
    # Still silent: nothing to ask.
    assert instance_end_settle(instance_id=instance.pk) == "unknown"

    _reconnect(held_hosts[0], "fra-h100-1")
    assert _agent_states(held_hosts[0]) == ["running"]
    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    assert _agent_states(held_hosts[0]) == ["terminated"]
    instance.refresh_from_db()
    assert (instance.active, instance.state) == (False, "terminated")
    order.refresh_from_db()
    assert order.state == OrderState.FAILED


def test_a_host_back_with_the_lost_lease_has_it_stopped_by_the_reconciler(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, held_hosts, django_capture_on_commit_callbacks, allow_failover=False)
    instance = order.instances.get()
    _disconnect(held_hosts[0])
    last_heard = _fall_silent("fra-h100-1")
    assert order_check_running(order_id=order.pk) == Step.DONE
    _reconnect(held_hosts[0], "fra-h100-1")

    report = order_reconcile(order_id=order.pk)

    assert (report.terminated, report.errors) == ([instance.provider_instance_id], [])
    assert _agent_states(held_hosts[0]) == ["terminated"]
    instance.refresh_from_db()
    # Stopping it now does not bill the buyer for the time it ran unpaid.
    assert (instance.state, instance.terminated_at) == ("terminated", last_heard)
    orphan = json.loads(LedgerEntry.objects.get(kind="order.orphan_terminated").payload)
    assert (orphan["instance"], orphan["reason"]) == (instance.provider_instance_id, "order is failed")
    assert ledger_verify().ok
