"""Prometheus metrics at /metrics: figures computed from the database, and who may read them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db.models import Count
from django.utils import timezone
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.models import Checkpoint, LedgerHead
from marketplace.fleets.services import fleet_create, fleet_evaluate
from marketplace.models import Lease, Offer, OrderState
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.orders.silence import orders_silence_sweep
from providers.community.services import machine_heartbeat, machine_list
from providers.models import Machine, MachineHeartbeat, ProviderAccount
from providers.services import provider_account_connect
from tests.leases import LAUNCH, boot_if_launched
from tests.providers.test_community import LISTING

pytestmark = pytest.mark.django_db


def _scrape(client, **extra) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value}, for every sample of the scrape."""
    answer = client.get("/metrics", **extra)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"] == CONTENT_TYPE_LATEST
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        assert family.documentation, family.name
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _one(samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture
def t4_offer(aws_account):
    # The cheapest on-demand g4dn.xlarge; other zones of the same region sell it at the same price.
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
        "price_usd", "zone"
    )[0]


def test_the_scrape_counts_offers_orders_failovers_and_the_ledger(
    client,
    acme,
    alice,
    aws_account,
    aws_sandbox,
    t4_offer,
    django_capture_on_commit_callbacks,
    django_assert_max_num_queries,
):
    synced = timezone.now() - dt.timedelta(seconds=90)
    ProviderAccount.objects.filter(pk=aws_account.pk).update(last_synced_at=synced, sync_status="ok")
    aws_sandbox.faults.inject("capacity", instance_type=t4_offer.instance_type, zone=t4_offer.zone)
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=t4_offer.pk, max_price_per_hour=t4_offer.price_usd + Decimal("0.01")
            ),
        ).order
    boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    assert [(a.number, a.outcome, a.error_class) for a in order.attempts.all()] == [
        (1, "failed", "capacity"),
        (2, "launched", ""),
    ]
    ledger_checkpoint_and_anchor()

    # A fixed number of aggregate queries, however many offers, orders, attempts and leases there are (two of
    # them the fleets': the active ones and the decisions by action; test_fleets_are_scraped_... counts the rest;
    # three the SLAs': open outages, orders below their SLA, credits paid).
    with django_assert_max_num_queries(25):
        samples = _scrape(client)

    expected = Offer.objects.values("account__kind", "status").annotate(n=Count("pk"))
    assert expected
    for row in expected:
        assert _one(samples, "broker_offers", provider=row["account__kind"], status=row["status"]) == row["n"]
    assert sum(samples["broker_offers"].values()) == Offer.objects.count()

    account = {"account": "aws-sandbox", "provider": "aws", "seller": "Petra Cloud Resale"}
    age = _one(samples, "broker_offer_sync_age_seconds", **account)
    assert 90 <= age < 90 + 60
    assert _one(samples, "broker_offer_sync_failed", **account) == 0

    assert _one(samples, "broker_orders", state="running") == 1
    assert {labels[0][1] for labels in samples["broker_orders"]} == set(OrderState.values)
    assert sum(samples["broker_orders"].values()) == 1

    assert _one(samples, "broker_provisioning_attempts_total", outcome="failed", error_class="capacity") == 1
    assert _one(samples, "broker_provisioning_attempts_total", outcome="launched", error_class="") == 1
    assert _one(samples, "broker_failovers_total") == 1

    assert _one(samples, "broker_provisioning_seconds_count") == 1
    assert _one(samples, "broker_provisioning_seconds_bucket", le="+Inf") == 1
    instance = order.instances.get(active=True)
    # From placement to ready: what the buyer waited for, not the provider's earlier "running".
    latency = (instance.ready_at - order.created_at).total_seconds()
    assert _one(samples, "broker_provisioning_seconds_sum") == pytest.approx(latency, abs=1e-3)
    for bucket in (1, 5, 15, 30, 60, 120, 300, 600, 1200):
        assert _one(samples, "broker_provisioning_seconds_bucket", le=str(float(bucket))) == (latency <= bucket)

    assert _one(samples, "broker_ledger_entries") == LedgerHead.objects.get().size > 0
    assert (_one(samples, "broker_ledger_queued_entries"), _one(samples, "broker_ledger_queued_age_seconds")) == (0, 0)
    assert _one(samples, "broker_ledger_checkpoint_size") == Checkpoint.objects.order_by("-size")[0].size
    assert 0 <= _one(samples, "broker_ledger_last_anchor_age_seconds") < 60


def test_an_empty_broker_reports_zeros_and_omits_what_never_happened(client):
    samples = _scrape(client)
    assert samples["broker_orders"] == {(("state", s),): 0 for s in OrderState.values}
    assert _one(samples, "broker_orders_degraded") == 0
    assert _one(samples, "broker_failovers_total") == 0
    assert _one(samples, "broker_provisioning_seconds_count") == 0
    assert _one(samples, "broker_ledger_entries") == 0
    for absent in ("broker_ledger_checkpoint_size", "broker_ledger_last_anchor_age_seconds", "broker_offers"):
        assert absent not in samples


def test_machine_telemetry_comes_from_the_latest_heartbeat_of_online_machines(client):
    fleet = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    busy = machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING)).machine
    idle = machine_list(account=fleet, name="fra-h100-2", listing=dict(LISTING)).machine
    old = machine_heartbeat(
        machine=busy, gpus=[{"utilization_pct": 10, "temperature_c": 40, "power_w": 100}] * 8, instances=0
    )
    MachineHeartbeat.objects.filter(pk=old.pk).update(at=timezone.now() - dt.timedelta(minutes=1))
    gpus = [{"utilization_pct": 80 + i, "temperature_c": 60 + i, "power_w": 600} for i in range(8)]
    machine_heartbeat(machine=busy, gpus=gpus, instances=1)
    # A machine that went silent: its old heartbeat is not reported.
    machine_heartbeat(machine=idle, gpus=gpus, instances=0)
    Machine.objects.filter(pk=idle.pk).update(online=False)

    samples = _scrape(client)

    base = {"account": "fleet", "provider": "community", "seller": "Helga's GPU Farm"}
    assert _one(samples, "broker_machine_online", machine="fra-h100-1", **base) == 1
    assert _one(samples, "broker_machine_online", machine="fra-h100-2", **base) == 0
    assert _one(samples, "broker_machine_gpu_utilization_percent", machine="fra-h100-1", **base) == 83.5
    assert _one(samples, "broker_machine_gpu_temperature_celsius", machine="fra-h100-1", **base) == 67
    assert _one(samples, "broker_machine_power_watts", machine="fra-h100-1", **base) == 4800
    for name in ("broker_machine_gpu_utilization_percent", "broker_machine_power_watts"):
        assert len(samples[name]) == 1
    # Never synced: no age, and not failed.
    assert "broker_offer_sync_age_seconds" not in samples
    assert _one(samples, "broker_offer_sync_failed", account="fleet", provider="community", seller=base["seller"]) == 0


def test_only_loopback_or_the_bearer_token_may_scrape(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 403
    # Through a proxy on the same host, REMOTE_ADDR is the proxy's loopback: not trusted.
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    # No token configured: a bearer token opens nothing.
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer x").status_code == 403

    settings.METRICS_TOKEN = "s3cret-scrape-token"
    right = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert right.status_code == 200 and b"broker_orders" in right.content
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Basic czNjcmV0").status_code == 403
    assert client.post("/metrics").status_code == 405


def test_a_running_cloud_orders_gpus_are_scraped_from_its_lease_agent(
    client, acme, alice, aws_account, aws_sandbox, t4_offer, django_capture_on_commit_callbacks
):
    from tests.leases import held_agent

    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=t4_offer.pk)
        ).order
    boot_if_launched(order, aws_sandbox)
    agent = held_agent(order, aws_sandbox)
    assert agent.heartbeat() == "running"
    beat = order.leases.get().heartbeats.get()

    samples = _scrape(client)

    labels = {"order": str(order.public_id), "provider": "aws", "instance_type": "g4dn.xlarge",
              "region": t4_offer.region, "gpu_model": "T4"}  # fmt: skip
    assert _one(samples, "broker_order_gpu_utilization_percent", **labels) == float(beat.utilization_pct)
    assert _one(samples, "broker_order_gpu_temperature_celsius", **labels) == float(beat.temperature_c)
    assert _one(samples, "broker_order_gpu_power_watts", **labels) == float(beat.power_w)


def test_entries_waiting_for_the_sequencer_are_counted_with_the_oldest_ones_wait(client):
    from django.db import transaction
    from django.utils import timezone

    from ledger.services import ledger_append, ledger_sequence

    with transaction.atomic():
        ledger_append(kind="test.event", subject="thing:1", payload={})
        ledger_append(kind="test.event", subject="thing:2", payload={})
    written = timezone.now()

    samples = _scrape(client)
    assert _one(samples, "broker_ledger_queued_entries") == 2
    waited = _one(samples, "broker_ledger_queued_age_seconds")
    assert 0 <= waited <= (timezone.now() - written).total_seconds() + 1  # stored to the whole second

    ledger_sequence()
    samples = _scrape(client)
    assert (_one(samples, "broker_ledger_queued_entries"), _one(samples, "broker_ledger_queued_age_seconds")) == (0, 0)
    assert _one(samples, "broker_ledger_entries") == 2


def test_a_running_order_whose_agent_fell_silent_counts_as_degraded_until_it_reports(
    client, acme, alice, aws_account, aws_sandbox, t4_offer, django_capture_on_commit_callbacks
):
    # Given a running order whose agent last reported an hour ago
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=t4_offer.pk)
        ).order
    boot_if_launched(order, aws_sandbox)
    assert _one(_scrape(client), "broker_orders_degraded") == 0
    heard = timezone.now() - dt.timedelta(hours=1)
    Lease.objects.filter(order=order).update(last_heartbeat_at=heard)

    # When the silence sweep runs, then the order counts as degraded
    with django_capture_on_commit_callbacks(execute=True):
        assert orders_silence_sweep(now=timezone.now()).degraded == [order.pk]
    assert _one(_scrape(client), "broker_orders_degraded") == 1

    # When its machine is ended, it is running no more and no longer counts
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state != OrderState.RUNNING
    assert _one(_scrape(client), "broker_orders_degraded") == 0


def test_fleets_are_scraped_by_public_id_with_their_bounds_budget_and_decisions(
    client, acme, alice, django_assert_max_num_queries
):

    data = {
        "name": "inference",
        "demand": {"gpu_count": 1},
        "max_price_per_gpu_hour": "2",
        "budget_usd": "300",
        "min_replicas": 1,
        "max_replicas": 5,
        "rule": {"kind": "utilization", "target": 60},
        "launch": {"allowed_cidrs": ["127.0.0.1/32"]},
    }
    fleet = fleet_create(organization=acme, user=alice, data=data).fleet
    fleet_evaluate(fleet_id=fleet.pk)  # nothing is on sale here: a scale-out to 1 that places nothing

    # Six more queries with fleets (their live replicas, their orders' usage in three), however many there are.
    with django_assert_max_num_queries(29):
        samples = _scrape(client)

    label = str(fleet.public_id)
    assert _one(samples, "broker_fleet_replicas_desired", fleet=label) == 1
    assert (
        _one(samples, "broker_fleet_replicas_min", fleet=label),
        _one(samples, "broker_fleet_replicas_max", fleet=label),
    ) == (1, 5)
    assert _one(samples, "broker_fleet_replicas", fleet=label, state="running") == 0
    assert _one(samples, "broker_fleet_budget_remaining_usd", fleet=label) == 300
    assert _one(samples, "broker_fleet_decisions_total", action="scale_out") == 1
