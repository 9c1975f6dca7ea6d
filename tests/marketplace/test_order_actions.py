"""Stop, start and restart an order's machine (issue 36, point 3), through the order services and the real
adapters: an independent host's lease (its container, through the host agent's signed protocol) and every cloud
whose adapter can stop (a cloud's sandbox; a cloud whose adapter cannot stop yet is skipped, not passed)."""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Instance, Offer, Order, OrderState, StoppedPeriod
from marketplace.orders.actions import (
    DISK_AT_ZERO,
    order_actions,
    order_restart,
    order_running_again,
    order_start,
    order_stop,
)
from marketplace.orders.errors import ActionUnsupported, TransitionRefused
from marketplace.orders.selectors import order_usage
from marketplace.orders.services import order_terminate
from providers.services import adapter_for_account
from tests.leases import ClientTransport, held_agent, running_order

pytestmark = pytest.mark.django_db


def _kinds(order: Order) -> list[str]:
    return list(
        LedgerEntry.objects.filter(subject=f"order:{order.public_id}", kind__startswith="order.")
        .order_by("pk")
        .values_list("kind", flat=True)
    )


def _host_order(acme, alice, capture, hosts) -> Order:
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand", gpu_count=8)
    return running_order(acme, alice, offer, capture, hosts, allow_failover=False)


def _report(order: Order, source, client, capture) -> None:
    """The order's lease agent sends one heartbeat through the broker's real view."""
    agent = held_agent(order, source)
    agent.transport = ClientTransport(client)
    with capture(execute=True):
        # A cloud machine started again runs a fresh agent, which re-attaches with the key it kept at first boot.
        fresh = not agent.key_id and agent.kept_key() is not None
        assert (agent.reattach() if fresh else agent.heartbeat()) == "running"
    order.refresh_from_db()


def test_a_host_lease_stops_and_starts_again_and_runs_once_its_agent_reports(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, client
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    lease = held_agent(order, held_hosts)

    with capture(execute=True):
        order_stop(order=order)
    order.refresh_from_db()

    assert order.state == OrderState.STOPPED, order.state_reason
    # Its agent still reports (a host's lease agent outlives the container): it is told to carry on, and a report
    # while stopped starts nothing.
    _report(order, held_hosts, client, capture)
    assert order.state == OrderState.STOPPED
    _, _, agent_id = order.instance.provider_instance_id.partition("/")
    host_instance = held_hosts[0].instances[agent_id]
    assert host_instance.state == "stopped"
    assert host_instance.holds_gpus()  # the GPUs stay the lease's while stopped
    assert lease.executor.workload_state() == {"state": "stopped"}
    period = StoppedPeriod.objects.get(order=order)
    assert (period.ended_at, period.usd_per_hour) == (None, order.price_per_hour)
    assert Instance.objects.get(order=order).state == "stopped"

    with capture(execute=True):
        order_start(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.STARTING
    assert order.resumed_at is not None
    assert host_instance.state == "running"
    assert lease.executor.workload_state()["state"] != "stopped"

    _report(order, held_hosts, client, capture)

    assert order.state == OrderState.RUNNING, order.state_reason
    period.refresh_from_db()
    assert period.ended_at is not None
    assert _kinds(order)[-4:] == ["order.stopping", "order.stopped", "order.starting", "order.running"]
    assert ledger_verify().ok


def test_a_host_lease_restarts_in_place_and_is_starting_until_its_agent_reports(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, client
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)

    with capture(execute=True):
        order_restart(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.STARTING
    assert order.resumed_at is not None

    _report(order, held_hosts, client, capture)

    assert order.state == OrderState.RUNNING
    assert not StoppedPeriod.objects.filter(order=order).exists()  # billed throughout, as a running machine
    starting = LedgerEntry.objects.filter(subject=f"order:{order.public_id}", kind="order.starting").get()
    assert json.loads(starting.payload)["restart"] is True


def test_a_report_before_the_provider_accepted_the_start_does_not_make_it_running(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=True):
        order_stop(order=order)
    # The start is asked for, but its task has not run: the provider has not accepted anything yet.
    with capture(execute=False):
        order_start(order=order)
    order.refresh_from_db()

    assert order_running_again(order_id=order.pk, at=timezone.now()) is False
    order.refresh_from_db()
    assert order.state == OrderState.STARTING
    assert order.resumed_at is None


def test_stop_and_start_are_idempotent_and_refused_from_the_wrong_state(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)

    with capture(execute=True) as callbacks:
        assert order_start(order=order).state == OrderState.RUNNING  # it runs: nothing to start
    assert callbacks == []
    with capture(execute=True):
        order_stop(order=order)
        order_stop(order=order)
    with capture(execute=True) as callbacks:
        order_stop(order=order)
    assert callbacks == []  # a repeat queues nothing
    with pytest.raises(TransitionRefused):
        order_restart(order=order)  # stopped: start it, do not reboot it
    assert _kinds(order).count("order.stopping") == 1
    assert StoppedPeriod.objects.filter(order=order).count() == 1


def test_a_stopped_order_can_be_terminated_and_its_stopped_time_ends_with_it(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    Instance.objects.filter(order=order).update(ready_at=timezone.now() - HOUR)
    with capture(execute=True):
        order_stop(order=order)
    StoppedPeriod.objects.filter(order=order).update(started_at=timezone.now() - HOUR / 2, usd_per_hour=0)
    with capture(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()

    assert order.state == OrderState.TERMINATED
    period = StoppedPeriod.objects.get(order=order)
    assert period.ended_at == order.instances.get().terminated_at
    line = order.invoice_line
    # Half an hour running at the price, then half an hour stopped at 0, to the second.
    assert line.seconds == int((period.started_at - order.instances.get().ready_at).total_seconds())
    assert line.amount_usd == order_usage(order, now=line.ended_at).amount_usd


def test_two_concurrent_stops_make_one_transition(acme, alice, held_hosts, django_capture_on_commit_callbacks):
    """The row lock: the second request waits for the first and finds the order stopping (a thread of its own
    would need a transactional test; the lock is taken by ``select_for_update`` inside one transaction here)."""
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=False), transaction.atomic():
        first = order_stop(order=order)
        second = order_stop(order=Order.objects.get(pk=order.pk))
    assert (first.state, second.state) == (OrderState.STOPPING, OrderState.STOPPING)
    assert _kinds(order).count("order.stopping") == 1


# ------------------------------------------------------------------------------------------------ billing

HOUR = dt.timedelta(hours=1)


def _metered(order: Order, *, ready: dt.datetime, stops: list[tuple[dt.datetime, dt.datetime | None]], rate: str):
    instance = order.instances.get(active=True)
    Instance.objects.filter(pk=instance.pk).update(ready_at=ready)
    StoppedPeriod.objects.filter(order=order).delete()
    for start, end in stops:
        StoppedPeriod.objects.create(
            order=order, instance=instance, started_at=start, ended_at=end, usd_per_hour=Decimal(rate)
        )
    return Order.objects.prefetch_related("instances", "stopped_periods").get(pk=order.pk)


def test_a_stopped_hour_costs_what_the_providers_rule_says(acme, alice, held_hosts, django_capture_on_commit_callbacks):
    order = _host_order(acme, alice, django_capture_on_commit_callbacks, held_hosts)
    price = order.price_per_hour
    t0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)

    # Three hours: one running, one stopped on a cloud that bills only the disk (passed at 0), one running.
    cloud = _metered(order, ready=t0, stops=[(t0 + HOUR, t0 + 2 * HOUR)], rate="0")
    usage = order_usage(cloud, now=t0 + 3 * HOUR)
    assert (usage.seconds, usage.stopped_seconds, usage.amount_usd) == (7200, 3600, price * 2)

    # The same on a host, whose stopped lease keeps its GPUs: the stopped hour costs the price.
    host = _metered(order, ready=t0, stops=[(t0 + HOUR, t0 + 2 * HOUR)], rate=str(price))
    assert order_usage(host, now=t0 + 3 * HOUR).amount_usd == price * 3

    # Still stopped now: the open period runs to now, and no compute is charged for it.
    still = _metered(order, ready=t0, stops=[(t0 + HOUR, None)], rate="0")
    assert order_usage(still, now=t0 + 3 * HOUR).amount_usd == price


def test_the_rule_of_a_cloud_that_bills_only_disks_says_the_disk_is_passed_at_zero(aws_account):
    from marketplace.orders.actions import stopped_rate

    order = Order(price_per_hour=Decimal("3.5"))
    rate, rule = stopped_rate(order, adapter_for_account(aws_account))
    assert rate == Decimal(0)
    assert DISK_AT_ZERO in rule


# ------------------------------------------------------------------------------------------ every cloud

CLOUDS = ["aws_account", "azure_account", "gcp_account", "alibaba_account", "tencent_account"]


@pytest.mark.parametrize("account_fixture", CLOUDS)
def test_a_cloud_machine_stops_and_starts_again(
    account_fixture, request, acme, alice, django_capture_on_commit_callbacks, client
):
    account = request.getfixturevalue(account_fixture)
    adapter = adapter_for_account(account)
    sandbox = request.getfixturevalue(account_fixture.replace("_account", "_sandbox"))
    offer = account.offers.filter(pricing_model="on_demand").order_by("price_usd", "pk").first()
    capture = django_capture_on_commit_callbacks
    order = running_order(acme, alice, offer, capture, sandbox, allow_failover=False)
    if not adapter.stoppable:
        with pytest.raises(ActionUnsupported):
            order_stop(order=order)
        pytest.skip(f"the {account.kind} adapter cannot stop a machine yet")

    with capture(execute=True):
        order_stop(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.STOPPED, order.state_reason
    assert StoppedPeriod.objects.get(order=order).usd_per_hour == Decimal(0)

    with capture(execute=True):
        order_start(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.STARTING, order.state_reason
    _report(order, sandbox, client, capture)
    assert order.state == OrderState.RUNNING

    with capture(execute=True):
        order_restart(order=order)
    _report(order, sandbox, client, capture)
    assert order.state == OrderState.RUNNING
    assert ledger_verify().ok


def test_an_aws_spot_machine_offers_no_stop_since_ec2_cannot_stop_a_one_time_spot_instance(
    aws_account, aws_sandbox, acme, alice, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(pricing_model="spot").order_by("price_usd", "pk").first()
    order = running_order(acme, alice, offer, django_capture_on_commit_callbacks, aws_sandbox, allow_failover=False)

    actions = order_actions(order)
    assert (actions.stop, actions.restart) == (False, True)
    with pytest.raises(ActionUnsupported, match="aws cannot stop a spot machine and keep it: end it instead"):
        order_stop(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING


# ------------------------------------------------------------------------------------------------- API


def _api(user):
    from rest_framework.test import APIClient

    session = APIClient()
    session.force_authenticate(user)
    return session


def test_the_api_stops_starts_and_restarts_the_callers_own_order(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, client
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    buyer = _api(alice)

    with capture(execute=True):
        stopped = buyer.post(f"/api/v1/orders/{order.public_id}/stop")
    assert stopped.status_code == 202
    order.refresh_from_db()
    assert order.state == OrderState.STOPPED
    again = buyer.post(f"/api/v1/orders/{order.public_id}/restart")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invalid_state"

    with capture(execute=True):
        assert buyer.post(f"/api/v1/orders/{order.public_id}/start").status_code == 202
    _report(order, held_hosts, client, capture)
    assert buyer.get(f"/api/v1/orders/{order.public_id}").json()["state"] == "running"
    with capture(execute=True):
        assert buyer.post(f"/api/v1/orders/{order.public_id}/restart").json()["state"] == "starting"


def test_the_logs_are_the_agents_last_lines_bounded_and_another_org_gets_404(
    acme, alice, charlie, held_hosts, django_capture_on_commit_callbacks, client
):
    from marketplace.models import Lease

    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    buyer = _api(alice)
    assert buyer.get(f"/api/v1/orders/{order.public_id}/logs").json() == {"lines": [], "at": None, "source": ""}

    agent = held_agent(order, held_hosts)
    (agent.executor.plan.work_dir / "workload.log").write_text("".join(f"line {n}\n" for n in range(300)))
    _report(order, held_hosts, client, capture)

    body = buyer.get(f"/api/v1/orders/{order.public_id}/logs?lines=3").json()
    assert body["lines"] == ["line 297", "line 298", "line 299"]
    assert body["source"] == "the lease's container on the host"
    # The agent sends at most its last 200 lines; the broker keeps what it was sent.
    assert len(buyer.get(f"/api/v1/orders/{order.public_id}/logs?lines=1000").json()["lines"]) == 200
    assert buyer.get(f"/api/v1/orders/{order.public_id}/logs?lines=1001").status_code == 400
    assert buyer.get(f"/api/v1/orders/{order.public_id}/logs?lines=zero").status_code == 400
    assert _api(charlie).get(f"/api/v1/orders/{order.public_id}/logs").status_code == 404
    assert Lease.objects.get(order=order).workload_log.endswith("line 299")


def test_a_hostile_agent_cannot_store_more_log_than_the_bound_nor_a_nul(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, client
):
    from marketplace.launch.leases import MAX_WORKLOAD_LOG_CHARS, LeaseRefused, workload_log_parse

    assert workload_log_parse({"logs": "x" * (MAX_WORKLOAD_LOG_CHARS + 10) + "\x00end"}) == (
        "x" * (MAX_WORKLOAD_LOG_CHARS - 4) + "end"
    )
    assert workload_log_parse({"gpus": []}) is None
    with pytest.raises(LeaseRefused):
        workload_log_parse({"logs": ["not", "text"]})


# ------------------------------------------------------------------------------------------ faults


def _host_instance(order: Order, hosts):
    _, _, agent_id = order.instance.provider_instance_id.partition("/")
    return next(h.instances[agent_id] for h in hosts if agent_id in h.instances)


def test_a_stop_the_host_refuses_leaves_the_order_running_with_the_hosts_reason(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    _host_instance(order, held_hosts).ending = True  # the host is already cleaning the lease up

    with capture(execute=True):
        order_stop(order=order)
    order.refresh_from_db()

    assert order.state == OrderState.RUNNING
    assert order.state_reason.startswith("the provider refused the stop: ")
    assert "not_running" in order.state_reason
    assert not StoppedPeriod.objects.filter(order=order).exists()  # nothing billed as stopped
    assert _kinds(order)[-2:] == ["order.stopping", "order.running"]


def test_a_start_the_host_refuses_leaves_the_order_stopped_with_its_disk_and_the_reason(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=True):
        order_stop(order=order)
    _host_instance(order, held_hosts).ending = True

    with capture(execute=True):
        order_start(order=order)
    order.refresh_from_db()

    assert order.state == OrderState.STOPPED
    assert order.state_reason.startswith("the provider refused the start: ")
    assert order.state_reason.endswith("its disk is kept")
    assert StoppedPeriod.objects.get(order=order).ended_at is None  # still stopped, still at the stopped rate


def test_silence_and_the_sweeps_leave_a_stopped_order_alone(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, settings
):
    from marketplace.models import Lease, OrderHealth
    from marketplace.orders.reconcile import order_reconcile
    from marketplace.orders.silence import orders_silence_sweep

    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=True):
        order_stop(order=order)
    long_ago = timezone.now() - dt.timedelta(seconds=settings.LEASE_SILENCE_S * 10)
    Lease.objects.filter(order=order).update(last_heartbeat_at=long_ago)

    with capture(execute=True):
        orders_silence_sweep()
        report = order_reconcile(order_id=order.pk)
    order.refresh_from_db()

    assert (order.state, order.health) == (OrderState.STOPPED, OrderHealth.HEALTHY)
    assert report.terminated == [] and report.errors == []
    assert _host_instance(order, held_hosts).state == "stopped"
    assert order.instances.get().active


def test_a_lease_that_links_its_log_to_a_host_file_sends_nothing_of_it(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, client, tmp_path
):
    """The agent runs as root and reads the log the tenant writes: a link to a host file, or a FIFO that would
    hang the read, yields nothing."""
    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    agent = held_agent(order, held_hosts)
    host_secret = tmp_path / "shadow"
    host_secret.write_text("root:$6$host-secret-hash:19000::::::\n")
    log = agent.executor.plan.work_dir / "workload.log"
    log.symlink_to(host_secret)
    buyer = _api(alice)

    _report(order, held_hosts, client, capture)
    assert buyer.get(f"/api/v1/orders/{order.public_id}/logs").json()["lines"] == []

    log.unlink()
    os.mkfifo(log)
    _report(order, held_hosts, client, capture)
    assert buyer.get(f"/api/v1/orders/{order.public_id}/logs").json()["lines"] == []


def test_a_node_of_a_cluster_is_not_stopped_alone(acme, alice, held_hosts, django_capture_on_commit_callbacks):
    from marketplace.models import Cluster

    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    cluster = Cluster.objects.create(
        organization=acme, created_by=alice, offer=order.offer, nodes=2, gpu_model=order.gpu_model, gpu_count=8,
        pricing_model="on_demand", max_price_per_node_hour=order.max_price_per_hour, launch_config=order.launch_config,
        state_changed_at=timezone.now(),
    )  # fmt: skip
    Order.objects.filter(pk=order.pk).update(cluster=cluster, cluster_round=1, cluster_node=1)
    order.refresh_from_db()

    for action in (order_stop, order_restart):
        with pytest.raises(ActionUnsupported, match="node of a cluster"):
            action(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING
    assert "order.stopping" not in _kinds(order)


def test_a_start_refused_for_capacity_leaves_the_order_stopped_with_its_disk_and_why(
    acme, alice, held_hosts, django_capture_on_commit_callbacks
):
    from providers.models import Machine
    from tests.hosts import HostilePeer

    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=True):
        order_stop(order=order)
    # The machine's agent now answers a start as a provider out of capacity does (the protocol's no_capacity).
    peer = HostilePeer(lambda method, target: (409, b'{"code": "no_capacity", "message": "taken"}', {}))
    try:
        Machine.objects.filter(name="fra-h100-1").update(agent_url=peer.url)
        with capture(execute=True):
            order_start(order=order)
    finally:
        peer.close()
    order.refresh_from_db()

    assert order.state == OrderState.STOPPED
    assert order.state_reason.startswith("the provider has no capacity to start it now: ")
    assert order.state_reason.endswith("its disk is kept, try later")
    assert StoppedPeriod.objects.get(order=order).ended_at is None
    assert _kinds(order)[-3:] == ["order.stopped", "order.starting", "order.stopped"]
    agent_id = order.instance.provider_instance_id.partition("/")[2]
    assert peer.requests == [("POST", f"/v1/instances/{agent_id}/start")]


# ------------------------------------------------------------------------------------- prepaid credit


@pytest.fixture
def prepaid_buyer(acme, alice):
    """Alice's API session for Acme on prepaid terms, ready to pay (a verified address, a billing country)."""
    from marketplace.models import BillingProfile, Organization
    from marketplace.models.billing import EmailVerification

    Organization.objects.filter(pk=acme.pk).update(payment_terms="prepaid")
    EmailVerification.objects.create(user=alice, email=alice.email.lower(), verified_at=timezone.now())
    BillingProfile.objects.create(organization=acme, country="GB")
    return _api(alice)


def test_prepaid_credit_follows_a_stopped_lease_that_still_bills_and_leaves_a_free_stop_alone(
    prepaid_buyer, held_hosts, stripe_sandbox, django_capture_on_commit_callbacks
):
    """A host lease stopped keeps costing its price, so its hold must keep up or it is ended like a running one;
    a stop that costs nothing (a cloud's: its disk passed at 0) is never ended for want of credit."""
    from marketplace.billing.credit import order_held_minor
    from marketplace.billing.credit_sweep import credit_sweep
    from marketplace.orders.actions import order_stop as stop
    from tests.marketplace.test_prepaid import _hour_with_tax, _post, _topup

    capture = django_capture_on_commit_callbacks
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand", gpu_count=8)
    hour = _hour_with_tax(offer.price_usd)
    assert _topup(prepaid_buyer, f"{(hour + 100) / 100:.2f}").status_code == 201
    with capture(execute=True):
        assert (
            _post(prepaid_buyer, "/api/v1/orders", {"offer": offer.pk, "max_price_per_hour": "16"}).status_code == 201
        )
    order = Order.objects.get()
    from tests.leases import boot

    assert boot(order, held_hosts) == "running"
    with capture(execute=True):
        stop(order=order)
    start = timezone.now()
    Instance.objects.filter(order=order).update(ready_at=start)
    StoppedPeriod.objects.filter(order=order).update(started_at=start)

    # Free while stopped: an hour on, nothing is used, and the sweep does not touch it.
    StoppedPeriod.objects.filter(order=order).update(usd_per_hour=0)
    with capture(execute=True):
        assert credit_sweep(now=start + dt.timedelta(minutes=58)) == {"extended": 0, "warned": 0, "stopped": 0}
    order.refresh_from_db()
    assert order.state == OrderState.STOPPED

    # Billed while stopped (the host's rule): near the end of its hold it is ended, as a running order is.
    StoppedPeriod.objects.filter(order=order).update(usd_per_hour=order.price_per_hour)
    with capture(execute=True):
        assert credit_sweep(now=start + dt.timedelta(minutes=10))["warned"] == 1  # the hold follows it
    minutes = int(Decimal(order_held_minor(order)) / Decimal(hour) * 60) - 1
    with capture(execute=True):
        assert credit_sweep(now=start + dt.timedelta(minutes=minutes))["stopped"] == 1
    order.refresh_from_db()
    assert order.state in (OrderState.TERMINATING, OrderState.TERMINATED)
    assert "prepaid credit exhausted" in order.state_reason


def test_a_machine_started_again_whose_agent_stays_silent_runs_and_is_then_degraded(
    acme, alice, held_hosts, django_capture_on_commit_callbacks, settings
):
    from marketplace.models import OrderHealth
    from marketplace.orders.actions import orders_starting_overdue
    from marketplace.orders.silence import orders_silence_sweep

    capture = django_capture_on_commit_callbacks
    order = _host_order(acme, alice, capture, held_hosts)
    with capture(execute=True):
        order_stop(order=order)
    with capture(execute=True):
        order_start(order=order)
    order.refresh_from_db()
    deadline = order.resumed_at + dt.timedelta(seconds=settings.BOOT_TIMEOUT_S)

    assert orders_starting_overdue(now=deadline - dt.timedelta(seconds=1)) == []
    assert orders_starting_overdue(now=deadline) == [order.pk]
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING
    assert "has not reported within" in order.state_reason
    assert StoppedPeriod.objects.get(order=order).ended_at == deadline

    with capture(execute=True):
        orders_silence_sweep(now=deadline + dt.timedelta(seconds=1))
    order.refresh_from_db()
    assert order.health == OrderHealth.DEGRADED
