"""One poisoned order, machine or account cannot stop a sweep for everyone else (issue 17, item 5).

Each sweep is run with one poisoned item among good ones: the poisoned one is reported (logged with its id
and counted) and the good ones progress."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import LedgerEntry
from marketplace.catalog.services import offers_sync
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    Lease,
    Offer,
    OfferStatus,
    Order,
    OrderHealth,
    OrderState,
    SilentPeriod,
)
from marketplace.orders.reconcile import account_resources_reconcile, order_reconcile
from marketplace.orders.services import PlaceRequest, order_place, orders_end_scheduled
from marketplace.orders.silence import orders_silence_sweep
from marketplace.tasks import orders_reconcile_task, orders_sweep_task
from providers.models import Machine, ProviderAccount
from providers.services import adapter_for_account
from tests.hosts import HostilePeer, start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db

# The answer that stopped every tenant's sweep: an instance whose tags are a list.
POISON = {"id": "i-1", "state": "running", "tags": ["broker:order", "x"], "ssh": "203.0.113.9:22"}


@pytest.fixture
def hosts(held_hosts):
    return held_hosts


@pytest.fixture
def poisoned():
    """A peer answering every request with ``POISON`` (as an instance, and as a list of them)."""
    body = json.dumps({**POISON, "instances": [POISON]}).encode()
    peer = HostilePeer(lambda method, target: (200, body, {}))
    yield peer
    peer.close()


def _running(acme, alice, zone: str, hosts, capture, *, allow_failover: bool = False) -> Order:
    offer = Offer.objects.get(zone=zone, pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=Decimal("16"),
            allow_failover=allow_failover)).order  # fmt: skip
    boot_if_launched(order, hosts)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def test_the_running_orders_sweep_checks_the_others_past_a_poisoned_machine(
    fleet, hosts, poisoned, acme, alice, django_capture_on_commit_callbacks, caplog
):
    bad = _running(acme, alice, "fra-h100-1", hosts, django_capture_on_commit_callbacks)
    good = _running(acme, alice, "fra-h100-2", hosts, django_capture_on_commit_callbacks)
    Machine.objects.filter(name="fra-h100-1").update(agent_url=poisoned.url)
    instance = good.instance  # the provider takes the good order's machine away
    adapter_for_account(fleet).terminate(instance.region, instance.provider_instance_id)

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()

    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.state == OrderState.FAILED and "terminated by the provider" in good.state_reason
    assert bad.state == OrderState.RUNNING
    assert f"could not be checked: [{bad.pk}]" in caplog.text


@pytest.fixture
def other_seller(fleet):
    """A second independent provider's account with one machine on sale."""
    from providers.services import provider_account_connect

    account = provider_account_connect(provider_name="Mallory's Rigs", kind="community", name="rigs", credentials={},
                                       regions=["eu-de"])  # fmt: skip
    agents = start_hosts(account, ["evil-1"], lease_threads=False)
    assert offers_sync(account_id=account.pk).ok
    yield agents
    stop_hosts(agents)


def test_the_reconciler_reconciles_the_others_past_a_poisoned_machine(
    fleet, hosts, other_seller, poisoned, acme, alice, django_capture_on_commit_callbacks
):
    bad = _running(acme, alice, "evil-1", other_seller, django_capture_on_commit_callbacks)
    good = _running(acme, alice, "fra-h100-2", hosts, django_capture_on_commit_callbacks)
    Machine.objects.filter(name="evil-1").update(agent_url=poisoned.url)
    # The good order ended in the broker's books while its machine still runs: an orphan to stop.
    Order.objects.filter(pk=good.pk).update(state=OrderState.TERMINATED, state_changed_at=timezone.now())
    Order.objects.filter(pk=bad.pk).update(state_changed_at=timezone.now() - timezone.timedelta(hours=1))

    totals = orders_reconcile_task.apply().get()

    assert [i.state for i in hosts[1].instances.values()] == ["terminated"]
    assert (totals["terminated"], totals["errors"]) == (1, 1)
    assert Order.objects.get(pk=bad.pk).state == OrderState.RUNNING


def test_an_orders_misconfigured_account_does_not_keep_its_other_accounts_unreconciled(
    fleet, hosts, acme, alice, aws_account, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, "fra-h100-1", hosts, django_capture_on_commit_callbacks)
    # Its first attempt went to an account since pointed where the broker may not go.
    Attempt.objects.filter(order=order).update(number=2)
    Attempt.objects.create(order=order, number=1, offer=aws_account.offers.first(), client_token=f"{order.ref}-a0",
                           started_at=timezone.now(), outcome=AttemptOutcome.FAILED)  # fmt: skip
    ProviderAccount.objects.filter(pk=aws_account.pk).update(endpoint_url="http://169.254.169.254/")
    Order.objects.filter(pk=order.pk).update(state=OrderState.TERMINATED, state_changed_at=timezone.now())

    report = order_reconcile(order_id=order.pk)

    assert report.terminated == [order.instance.provider_instance_id]
    assert len(report.errors) == 1 and report.errors[0].startswith("aws/")
    assert [i.state for i in hosts[0].instances.values()] == ["terminated"]


def test_the_offer_sync_lists_the_other_machines_past_one_with_unreadable_windows(fleet, hosts):
    Machine.objects.filter(name="fra-h100-1").update(availability=[{"weekdays": [0], "start": "soon"}])

    assert offers_sync(account_id=fleet.pk).ok

    on_sale = Offer.objects.filter(account=fleet, status="available").values_list("zone", flat=True)
    assert set(on_sale) == {"fra-h100-2"}


def _poison_updates_of(order: Order) -> None:
    """Make the database refuse every update of this one order's row, as a corrupt row or a failing disk
    page would: the broker's own code runs unchanged and meets the failure where it really happens."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"CREATE TRIGGER poison BEFORE UPDATE ON marketplace_order WHEN OLD.id = {order.pk} "
                           "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END")  # fmt: skip
        else:
            cursor.execute("CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS "
                           "$$ BEGIN RAISE EXCEPTION 'poisoned row'; END $$")  # fmt: skip
            cursor.execute(f"CREATE TRIGGER poison BEFORE UPDATE ON marketplace_order FOR EACH ROW "
                           f"WHEN (OLD.id = {order.pk}) EXECUTE FUNCTION poison()")  # fmt: skip


def test_the_scheduled_end_sweep_ends_the_others_past_a_poisoned_order(
    fleet, hosts, acme, alice, django_capture_on_commit_callbacks, caplog
):
    good = _running(acme, alice, "fra-h100-1", hosts, django_capture_on_commit_callbacks)
    bad = _running(acme, alice, "fra-h100-2", hosts, django_capture_on_commit_callbacks)  # newer: swept first
    ended = timezone.now() - timezone.timedelta(minutes=1)
    Order.objects.filter(pk__in=[good.pk, bad.pk]).update(run_until=ended, duration_hours=Decimal("1"))
    _poison_updates_of(bad)

    with django_capture_on_commit_callbacks(execute=True):
        assert orders_end_scheduled() == 1

    assert Order.objects.get(pk=good.pk).state == OrderState.TERMINATED
    assert Order.objects.get(pk=bad.pk).state == OrderState.RUNNING
    assert f"ending order {bad.public_id} at its scheduled end failed" in caplog.text


def _failed_aws_order(acme, alice, aws_account, capture) -> Order:
    """An order every zone refused: the launch made its key pair and security group, then EC2 said no."""
    offer = (
        aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand", region="us-east-1",
                                  status=OfferStatus.AVAILABLE)
        .order_by("price_usd", "zone")
        .first()
    )  # fmt: skip
    with capture(execute=True):
        request = PlaceRequest(launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=Decimal("16"), allow_failover=False)
        order = order_place(organization=acme, user=alice, request=request).order
    order.refresh_from_db()
    assert order.state == OrderState.FAILED, order.state_reason
    return order


def _poison_ledger_entries_of(order: Order) -> None:
    """Make the database refuse this one order's ledger entries (as a full disk or a corrupt page would)."""
    subject = f"order:{order.public_id}"
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"CREATE TRIGGER poison_ledger BEFORE INSERT ON ledger_ledgerentry WHEN NEW.subject = "
                           f"'{subject}' BEGIN SELECT RAISE(ABORT, 'poisoned entry'); END")  # fmt: skip
        else:
            cursor.execute("CREATE FUNCTION poison_ledger() RETURNS trigger LANGUAGE plpgsql AS "
                           "$$ BEGIN RAISE EXCEPTION 'poisoned entry'; END $$")  # fmt: skip
            cursor.execute(f"CREATE TRIGGER poison_ledger BEFORE INSERT ON ledger_ledgerentry FOR EACH ROW "
                           f"WHEN (NEW.subject = '{subject}') EXECUTE FUNCTION poison_ledger()")  # fmt: skip


def test_the_resource_reconciler_releases_the_others_past_a_poisoned_order(
    aws_account, aws_sandbox, acme, alice, django_capture_on_commit_callbacks, caplog, settings
):
    settings.BLOCK_CAPACITY_S = 0  # the second order tries the zone the first one found sold out
    aws_sandbox.faults.inject("capacity", instance_type="g4dn.xlarge")
    first, second = sorted(
        (_failed_aws_order(acme, alice, aws_account, django_capture_on_commit_callbacks) for _ in range(2)),
        key=lambda o: o.ref,
    )
    _poison_ledger_entries_of(first)  # released first: the reconciler walks the orders by reference

    report = account_resources_reconcile(account_id=aws_account.pk, now=timezone.now() + dt.timedelta(minutes=5))

    assert report.errors == [f"{first.ref}: unexpected error (logged)"]
    assert f"releasing the resources of order {first.ref} on account {aws_account.pk} failed" in caplog.text
    assert LedgerEntry.objects.filter(kind="order.resources_released", subject=f"order:{second.public_id}").exists()
    held = {r.order_ref for r in adapter_for_account(aws_account).list_order_resources()}
    assert second.ref not in held


def test_the_silence_sweep_degrades_the_others_past_a_poisoned_order(
    fleet, hosts, acme, alice, django_capture_on_commit_callbacks, caplog
):
    good = _running(acme, alice, "fra-h100-1", hosts, django_capture_on_commit_callbacks)
    bad = _running(acme, alice, "fra-h100-2", hosts, django_capture_on_commit_callbacks)
    # Both agents silent, the poisoned order's longer: the sweep meets it first.
    heard = timezone.now() - dt.timedelta(minutes=10)
    Lease.objects.filter(order=good).update(last_heartbeat_at=heard)
    Lease.objects.filter(order=bad).update(last_heartbeat_at=heard - dt.timedelta(minutes=1))
    _poison_updates_of(bad)

    swept = orders_silence_sweep(now=timezone.now())

    assert (swept.failed, swept.degraded) == ([bad.pk], [good.pk])
    assert Order.objects.get(pk=good.pk).health == OrderHealth.DEGRADED
    assert Order.objects.get(pk=bad.pk).health == OrderHealth.HEALTHY
    assert not SilentPeriod.objects.filter(order=bad).exists()
    assert f"silence sweep: order {bad.pk} failed" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_the_resource_reconciler_ledgers_its_releases_outside_a_test_transaction(
    aws_account, aws_sandbox, acme, alice, django_capture_on_commit_callbacks
):
    # As the beat task runs it: in autocommit, where the ledger refuses an entry written outside a transaction.
    aws_sandbox.faults.inject("capacity", instance_type="g4dn.xlarge")
    order = _failed_aws_order(acme, alice, aws_account, django_capture_on_commit_callbacks)

    report = account_resources_reconcile(account_id=aws_account.pk, now=timezone.now() + dt.timedelta(minutes=5))

    assert report.errors == []
    assert LedgerEntry.objects.filter(kind="order.resources_released", subject=f"order:{order.public_id}").exists()
