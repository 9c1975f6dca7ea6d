"""Independent providers' machines: the host agent protocol, the reference agent, the broker's agent
endpoints, and the community adapter selling and provisioning through agents."""

from __future__ import annotations

import datetime as dt
import json
import logging
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from providers.community import protocol
from providers.community.adapter import available_now
from providers.community.services import machine_list, machines_withdraw_silent
from providers.errors import CapacityUnavailable, CredentialsRejected
from providers.models import Machine, MachineHeartbeat, MachineState
from providers.services import adapter_for_account
from providers.types import InstanceState, LaunchSpec, PricingModel
from tests.hosts import LISTING as HOST_LISTING
from tests.hosts import start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched

# The hosts' listing, sold as interruptible too.
LISTING = {**HOST_LISTING, "min_bid_per_gpu_hour": Decimal("0.9500")}


# --- The protocol ------------------------------------------------------------------------------------------------


def test_a_signed_request_checks_and_any_change_is_refused():
    body = b'{"gpus": 8}'
    headers = protocol.sign("mk_1", "s3cret", "POST", "/v1/instances", body, now=1_000_000)
    assert protocol.check(headers, {"mk_1": "s3cret"}, "POST", "/v1/instances", body, now=1_000_010).key_id == "mk_1"
    for method, target, changed in [("POST", "/v1/instances", b'{"gpus": 9}'), ("GET", "/v1/instances", body),
                                    ("POST", "/v1/instances?x=1", body)]:  # fmt: skip
        with pytest.raises(protocol.Rejected) as refused:
            protocol.check(headers, {"mk_1": "s3cret"}, method, target, changed, now=1_000_010)
        assert refused.value.code == "bad_signature"
    with pytest.raises(protocol.Rejected, match="more than 300 s"):
        protocol.check(headers, {"mk_1": "s3cret"}, "POST", "/v1/instances", body, now=1_000_000 + 301)
    with pytest.raises(protocol.Rejected) as unknown:
        protocol.check(headers, {}, "POST", "/v1/instances", body, now=1_000_010)
    assert unknown.value.code == "unknown_key"
    with pytest.raises(protocol.Rejected, match="missing"):
        protocol.check({}, {"mk_1": "s3cret"}, "POST", "/v1/instances", body)


@pytest.mark.parametrize(
    "windows, moment, expected",
    [
        ([], "2026-12-07T03:00", True),
        ([{"weekdays": [0, 1, 2, 3, 4], "start": "08:00", "end": "20:00"}], "2026-12-07T09:30", True),  # Monday
        ([{"weekdays": [0, 1, 2, 3, 4], "start": "08:00", "end": "20:00"}], "2026-12-06T09:30", False),  # Sunday
        ([{"weekdays": [4], "start": "22:00", "end": "06:00"}], "2026-12-05T02:00", True),  # Friday night, Sat 2am
        ([{"weekdays": [4], "start": "22:00", "end": "06:00"}], "2026-12-06T02:00", False),
    ],
)
def test_availability_windows(windows, moment, expected):
    assert available_now(windows, dt.datetime.fromisoformat(moment).replace(tzinfo=dt.UTC)) is expected


# --- The broker's agent endpoints ------------------------------------------------------------------------------


@pytest.fixture
def listed(fleet):
    return machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))


def _post(client: Client, path: str, payload: dict, key_id: str, secret: str, **override: str):
    body = json.dumps(payload).encode()
    headers = {**protocol.sign(key_id, secret, "POST", path, body), **override}
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, data=body, content_type="application/json", **extra), extra, body


def test_an_agent_registers_with_a_self_test_and_heartbeats(client, listed):
    machine, secret = listed.machine, listed.secret
    self_test = {"ok": True, "gpus": [{"model": "H100 80GB HBM3", "memory_gb": 80}] * 8, "driver": "550.54"}
    answer, _, _ = _post(client, "/agent/v1/register", {"agent_url": "http://127.0.0.1:7070",
                         "hardware": {}, "self_test": self_test}, machine.key_id, secret)  # fmt: skip
    assert answer.status_code == 200 and answer.json()["self_test_ok"] is True
    machine.refresh_from_db()
    assert (machine.agent_url, machine.online, machine.state) == ("http://127.0.0.1:7070", True, MachineState.PENDING)

    gpus = [{"index": i, "utilization_pct": 90, "temperature_c": 60 + i, "power_w": 600} for i in range(8)]
    beat, _, _ = _post(client, "/agent/v1/heartbeat", {"gpus": gpus, "instances": 1}, machine.key_id, secret)
    assert beat.status_code == 200
    row = MachineHeartbeat.objects.get(machine=machine)
    assert (row.utilization_pct, row.temperature_c, row.power_w, row.instances) == (90, 67, 4800, 1)


def test_a_self_test_that_does_not_match_the_listing_is_flagged(client, listed):
    found = {"ok": True, "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}] * 8}
    answer, _, _ = _post(client, "/agent/v1/register", {"agent_url": "http://127.0.0.1:7070", "self_test": found},
                         listed.machine.key_id, listed.secret)  # fmt: skip
    assert answer.json()["self_test_ok"] is False
    assert "8x H100-SXM5, the agent found 0" in answer.json()["problem"]


def test_the_reference_agents_failed_self_test_is_one_line_the_broker_keeps(client, listed, tmp_path, monkeypatch):
    # A driver that fails as nvidia-smi does, its complaint over several lines: the broker refuses control
    # characters (newlines among them) in what an agent reports, so the agent sends the complaint on one line.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf 'NVIDIA-SMI has failed\\n\\tMake sure the driver is loaded.\\n' >&2\nexit 9\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    from providers.community.agent import Agent

    self_test = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret).self_test()
    answer, _, _ = _post(client, "/agent/v1/register", {"agent_url": "http://127.0.0.1:7070", "self_test": self_test},
                         listed.machine.key_id, listed.secret)  # fmt: skip

    assert answer.status_code == 200, answer.content
    assert answer.json()["problem"] == "nvidia-smi failed: NVIDIA-SMI has failed Make sure the driver is loaded."


def test_forged_and_replayed_agent_requests_are_refused_and_logged(client, listed, caplog):
    machine = listed.machine
    caplog.set_level(logging.WARNING, logger="providers.community.security")
    forged, _, _ = _post(client, "/agent/v1/heartbeat", {"gpus": []}, machine.key_id, "not-the-secret")
    assert forged.status_code == 401 and forged.json()["code"] == "bad_signature"

    first, extra, body = _post(client, "/agent/v1/heartbeat", {"gpus": []}, machine.key_id, listed.secret)
    assert first.status_code == 200
    replay = client.post("/agent/v1/heartbeat", data=body, content_type="application/json", **extra)
    assert replay.status_code == 401 and replay.json()["code"] == "replayed"

    stranger, _, _ = _post(client, "/agent/v1/heartbeat", {"gpus": []}, "mk_nobody", "x")
    assert stranger.status_code == 401 and stranger.json()["code"] == "unknown_key"
    refusals = [r.getMessage() for r in caplog.records if "agent request refused" in r.getMessage()]
    assert len(refusals) == 3 and any("code=replayed" in r for r in refusals)
    assert MachineHeartbeat.objects.filter(machine=machine).count() == 1
    assert listed.secret not in caplog.text


def test_a_silent_machine_is_withdrawn(listed):
    Machine.objects.filter(pk=listed.machine.pk).update(online=True, last_heartbeat_at=timezone.now())
    assert machines_withdraw_silent() == 0
    later = timezone.now() + dt.timedelta(seconds=121)
    assert machines_withdraw_silent(now=later) == 1
    assert Machine.objects.get(pk=listed.machine.pk).online is False


def test_heartbeats_older_than_the_retention_are_deleted(listed):
    from providers.community.services import machine_heartbeat

    Machine.objects.filter(pk=listed.machine.pk).update(state=MachineState.VERIFIED)
    listed.machine.refresh_from_db()
    machine_heartbeat(machine=listed.machine, gpus=[{"utilization_pct": 50}], instances=0)
    machines_withdraw_silent(now=timezone.now() + dt.timedelta(days=1))
    assert MachineHeartbeat.objects.count() == 1  # still needed for a day's reliability
    machines_withdraw_silent(now=timezone.now() + dt.timedelta(days=3))
    assert MachineHeartbeat.objects.count() == 0


# --- Selling and provisioning through agents ---------------------------------------------------------------------


@pytest.fixture
def hosts(fleet):
    """Two verified machines of the fleet, each with a simulated agent in this process (leases held for the test
    to boot: tests.leases)."""
    agents = start_hosts(fleet, ["fra-h100-1", "fra-h100-2"], lease_threads=False, listing=LISTING)
    yield agents
    stop_hosts(agents)


def _spec(zone: str, token: str) -> LaunchSpec:
    return LaunchSpec(region="eu-de", zone=zone, instance_type="community-8xH100-SXM5",
                      pricing_model=PricingModel.ON_DEMAND, client_token=token, order_ref="ord-x")  # fmt: skip


def test_the_adapter_lists_launches_idempotently_and_terminates(fleet, hosts):
    adapter = adapter_for_account(fleet)
    offers = adapter.list_offers()
    assert sorted((o.zone, o.pricing_model.value, o.price) for o in offers) == [
        ("fra-h100-1", "on_demand", Decimal("15.2000")),
        ("fra-h100-1", "spot", Decimal("7.6000")),
        ("fra-h100-2", "on_demand", Decimal("15.2000")),
        ("fra-h100-2", "spot", Decimal("7.6000")),
    ]
    handle = adapter.launch(_spec("fra-h100-1", "ord-x-a1"))
    again = adapter.launch(_spec("fra-h100-1", "ord-x-a1"))
    assert handle.instance_id == again.instance_id and handle.instance_id.startswith("fra-h100-1/i-")
    with pytest.raises(CapacityUnavailable, match="GPUs are taken"):
        adapter.launch(_spec("fra-h100-1", "ord-y-a1"))
    assert adapter.describe("eu-de", handle.instance_id).state is InstanceState.RUNNING
    assert [h.instance_id for h in adapter.find_by_order("ord-x")] == [handle.instance_id]
    # A leased machine stays on sale: the broker's GPU holds say it is taken, and an order that outranks an
    # interruptible lease there may still outbid it (tests/marketplace/test_bids.py).
    assert {o.zone for o in adapter.list_offers()} == {"fra-h100-1", "fra-h100-2"}
    assert adapter.terminate("eu-de", handle.instance_id).state is InstanceState.TERMINATED
    assert adapter.terminate("eu-de", handle.instance_id).state is InstanceState.TERMINATED


def test_an_agent_refuses_the_broker_with_a_wrong_secret(fleet, hosts):
    Machine.objects.filter(name="fra-h100-1").update(
        secret_encrypted=Machine.objects.get(name="fra-h100-2").secret_encrypted
    )
    adapter = adapter_for_account(fleet)
    with pytest.raises(CredentialsRejected, match="signature"):
        adapter.launch(_spec("fra-h100-1", "ord-x-a1"))
    assert "bad_signature" in hosts[0].rejected


def test_an_unreachable_machine_is_left_out_of_the_offers(fleet, hosts):
    hosts[1].stop()
    assert {o.zone for o in adapter_for_account(fleet).list_offers()} == {"fra-h100-1"}


def test_orders_run_on_independent_machines_and_fail_over_between_them(
    fleet, hosts, acme, alice, django_capture_on_commit_callbacks
):
    from ledger.services import ledger_verify
    from marketplace.catalog.services import offers_sync
    from marketplace.models import Offer, OrderState
    from marketplace.orders.services import PlaceRequest, order_place

    assert offers_sync(account_id=fleet.pk).ok
    first_offer = Offer.objects.get(account=fleet, zone="fra-h100-1", pricing_model="on_demand")
    assert (first_offer.capacity, first_offer.gpu_model.key, first_offer.price_usd) == (
        1,
        "H100-SXM5",
        Decimal("15.2"),
    )

    def place():
        with django_capture_on_commit_callbacks(execute=True):
            order = order_place(organization=acme, user=alice, request=PlaceRequest(
                launch=LAUNCH,
                offer_id=first_offer.pk, max_price_per_hour=Decimal("16"))).order  # fmt: skip
        return boot_if_launched(order, hosts)

    first, second = place(), place()
    assert first.state == second.state == OrderState.RUNNING, (first.state_reason, second.state_reason)
    assert first.instance.zone == "fra-h100-1"
    # The first machine is taken (reserved by the broker): the second order lands on the other one.
    assert second.instance.zone == "fra-h100-2"
    assert [i.state for i in hosts[0].instances.values()] == ["running"]
    assert ledger_verify().ok


def test_a_machine_that_misses_heartbeats_ranks_below_a_steady_one(fleet, hosts, acme):
    from marketplace.catalog.selectors import machine_reliability, offer_book
    from marketplace.catalog.services import offers_sync
    from marketplace.matching import Demand, rank
    from providers.community.services import machine_heartbeat

    assert offers_sync(account_id=fleet.pk).ok
    now = timezone.now()
    registered = now - dt.timedelta(minutes=10)  # 40 heartbeats due at one per 15 s
    Machine.objects.update(registered_at=registered)
    steady, flaky = Machine.objects.get(name="fra-h100-2"), Machine.objects.get(name="fra-h100-1")
    for beat in range(40):
        at = registered + dt.timedelta(seconds=15 * beat)
        machine_heartbeat(machine=steady, gpus=[{"utilization_pct": 0}], instances=0, now=at)
    for beat in range(10):
        at = registered + dt.timedelta(seconds=15 * beat)
        machine_heartbeat(machine=flaky, gpus=[{"utilization_pct": 0}], instances=0, now=at)

    scores = machine_reliability(now=now + dt.timedelta(seconds=1))
    assert scores[(fleet.pk, "fra-h100-2")] == pytest.approx(0.95, abs=0.01)  # full uptime x the 19-in-20 prior
    assert scores[(fleet.pk, "fra-h100-1")] == pytest.approx(0.95 * 10 / 40, abs=0.01)
    demand = Demand(gpu_count=8, gpu_models=frozenset({"H100-SXM5"}), pricing_models=frozenset({"on_demand"}))
    ranking = rank(demand, offer_book(now=now), now=now, limit=10)
    assert [q.offer.zone for q in ranking.quotes] == ["fra-h100-2", "fra-h100-1"]


def test_staff_verify_a_machine_only_after_a_passing_self_test(admin_client, listed, client):
    from ledger.models import LedgerEntry
    from ledger.services import ledger_verify

    machine = listed.machine
    admin_client.post("/admin/providers/machine/", {"action": "verify", "_selected_action": [machine.pk]})
    assert Machine.objects.get(pk=machine.pk).state == MachineState.PENDING  # no self-test yet
    self_test = {"ok": True, "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_gb": 80}] * 8}
    _post(client, "/agent/v1/register", {"agent_url": "http://127.0.0.1:7070", "self_test": self_test},
          machine.key_id, listed.secret)  # fmt: skip
    admin_client.post("/admin/providers/machine/", {"action": "verify", "_selected_action": [machine.pk]})
    assert Machine.objects.get(pk=machine.pk).state == MachineState.VERIFIED
    entry = LedgerEntry.objects.get(kind="machine.verified")
    payload = json.loads(entry.payload)
    assert (payload["previous"], payload["self_test_ok"]) == ("pending", True) and "admin" not in entry.payload
    assert ledger_verify().ok


def test_a_machine_sold_on_demand_and_interruptible_is_reserved_once_for_both(
    fleet, hosts, acme, alice, django_capture_on_commit_callbacks
):
    from marketplace.catalog.services import offers_sync
    from marketplace.models import Offer, OrderState
    from marketplace.orders.services import PlaceRequest, order_place, order_terminate

    assert offers_sync(account_id=fleet.pk).ok
    spot = Offer.objects.get(account=fleet, zone="fra-h100-1", pricing_model="spot")
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH,
            offer_id=spot.pk, max_price_per_hour=spot.price_usd, allow_failover=False)).order  # fmt: skip
    boot_if_launched(order, hosts)
    assert order.state == OrderState.RUNNING, order.state_reason
    assert dict(Offer.objects.filter(zone="fra-h100-1").values_list("pricing_model", "reserved")) == {
        "spot": 1,
        "on_demand": 1,
    }
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    assert set(Offer.objects.filter(zone="fra-h100-1").values_list("reserved", flat=True)) == {0}


def test_utilization_over_time_comes_from_heartbeats(listed):
    from providers.community.selectors import machine_utilization
    from providers.community.services import machine_heartbeat

    machine = listed.machine
    for util in (20, 40):
        machine_heartbeat(
            machine=machine, gpus=[{"utilization_pct": util}, {"utilization_pct": util + 10}], instances=1
        )
    series = machine_utilization(machine=machine, since=timezone.now() - dt.timedelta(hours=1))
    assert sum(len([p]) for p in series) >= 1
    assert series[-1][1] in (Decimal("25.0"), Decimal("35.0"), Decimal("30.0"))


def test_a_price_change_never_alters_an_order_already_placed(
    fleet, hosts, acme, alice, django_capture_on_commit_callbacks
):
    from marketplace.catalog.services import offers_sync
    from marketplace.models import Offer
    from marketplace.orders.services import PlaceRequest, order_place, order_terminate

    assert offers_sync(account_id=fleet.pk).ok
    offer = Offer.objects.get(account=fleet, zone="fra-h100-1", pricing_model="on_demand")
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH,
            offer_id=offer.pk, max_price_per_hour=Decimal("16"), allow_failover=False)).order  # fmt: skip
    boot_if_launched(order, hosts)
    locked = order.price_per_hour
    assert locked == Decimal("15.2")
    Machine.objects.filter(name="fra-h100-1").update(price_per_gpu_hour=Decimal("3.10"))
    order.instances.update(ready_at=timezone.now() - dt.timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    assert offers_sync(account_id=fleet.pk).ok
    assert Offer.objects.get(pk=offer.pk).price_usd == Decimal("24.8")  # the listing moved; the order did not
    order.refresh_from_db()
    assert order.price_per_hour == locked and order.invoice_line.price_per_hour == locked
