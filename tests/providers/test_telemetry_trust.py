"""Trust in what hosts report (issue 19, item 5): telemetry beyond what the listed GPUs can physically show is
kept but flagged and shown as unverified; a machine with no launch shows "new, no launches yet" and ranks on
a neutral prior; a self-test that does not match the listing blocks verification, with the reason."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import LedgerEntry
from marketplace.catalog.selectors import machine_reliability, machine_reliability_shown
from marketplace.machines import machine_decide
from marketplace.management.commands.demo import DEMO_MACHINES
from marketplace.models import GpuModel
from marketplace.orders.selectors import order_telemetry
from providers.community import protocol
from providers.community.agent import Agent
from providers.community.host_gpus import parse_simulated
from providers.community.plausibility import CardLimits, telemetry_problems
from providers.community.services import MachineInvalid, machine_heartbeat, machine_list
from providers.models import Machine, MachineHeartbeat, MachineState
from tests.hosts import LISTING
from tests.marketplace import test_storefront_instance as orders_on_machines
from tests.portal import conftest as provider_personas
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

# Fixtures shared with the order page's and the portal's tests: Helga's farm of two verified hosts with
# simulated agents; Petra's provider organisation and its operator Olga.
farm = orders_on_machines.farm
petra, petra_org, olga = provider_personas.petra, provider_personas.petra_org, provider_personas.olga

# An idle H100 SXM5 (700 W rated, 80 GB) as an honest agent reports it.
IDLE = {"utilization_pct": 0, "temperature_c": 34, "power_w": 70, "memory_used_gb": 0.5}
H100 = {"model": "NVIDIA H100 80GB HBM3", "memory_gb": 80}


@pytest.fixture
def listed(fleet):
    return machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))


def _post(client: Client, path: str, payload: dict, listed) -> dict:
    body = json.dumps(payload).encode()
    headers = protocol.sign(listed.machine.key_id, listed.secret, "POST", path, body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    answer = client.post(path, data=body, content_type="application/json", **extra)
    assert answer.status_code == 200, answer.content
    return answer.json()


def _beat(client: Client, listed, **change: float) -> tuple[dict, MachineHeartbeat]:
    """One heartbeat of the 8-GPU machine through the agent endpoint, GPU 0's sample changed by ``change``."""
    gpus = [{"index": i, **IDLE, **(change if i == 0 else {})} for i in range(8)]
    answer = _post(client, "/agent/v1/heartbeat", {"gpus": gpus, "instances": 0}, listed)
    return answer, MachineHeartbeat.objects.filter(machine=listed.machine).latest("at", "pk")


# --- Telemetry beyond physical limits ----------------------------------------------------------------------------


def test_honest_idle_telemetry_is_kept_as_fact(client, listed):
    answer, beat = _beat(client, listed)

    assert (answer["unverified"], beat.unverified_reason) == ("", "")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"power_w": 900}, "GPU 0 draws 900 W, above the card's 700 W rating"),
        ({"temperature_c": 120}, "GPU 0 at 120 °C, hotter than any GPU runs"),
        ({"temperature_c": 1}, "GPU 0 at 1 °C, colder than any room a GPU runs in"),
        ({"memory_used_gb": 86}, "GPU 0 uses 86 GB of memory, more than the card's 80 GB"),
        ({"utilization_pct": 97}, "GPU 0 97 % busy with no lease running"),
    ],
)
def test_telemetry_no_gpu_can_show_is_kept_flagged_with_the_reason(client, listed, change, reason):
    answer, beat = _beat(client, listed, **change)

    # Kept (the agent is alive and the figures are evidence), but flagged, and the agent is told why.
    assert MachineHeartbeat.objects.filter(machine=listed.machine).count() == 1
    assert (beat.unverified_reason, answer["unverified"]) == (reason, reason)


def test_an_idle_gpu_reading_a_few_per_cent_is_not_work(client, listed):
    # nvidia-smi on an idle card reads a few per cent (the driver, the monitoring itself); so does --simulate.
    _, beat = _beat(client, listed, utilization_pct=3)

    assert beat.unverified_reason == ""


def test_power_within_a_tenth_above_the_rating_is_a_transient_not_a_lie(client, listed):
    _, beat = _beat(client, listed, power_w=765)

    assert beat.unverified_reason == ""


def test_an_agent_reporting_fewer_gpus_than_listed_is_flagged(listed):
    beat = machine_heartbeat(machine=listed.machine, gpus=[{"index": i, **IDLE} for i in range(4)], instances=0)

    assert beat.unverified_reason == "telemetry for 4 GPUs, the listing has 8"


def test_a_consumer_card_is_judged_on_its_own_rating(fleet):
    # An RTX 4090 is rated 450 W: 600 W is no 4090, though it would be a quiet H100.
    listing = {**LISTING, "gpu_model": "RTX-4090", "gpu_count": 1, "gpu_memory_gb": 24}
    machine = machine_list(account=fleet, name="home-4090", listing=listing).machine

    beat = machine_heartbeat(machine=machine, gpus=[{"index": 0, **IDLE, "power_w": 600}], instances=0)

    assert beat.unverified_reason == "GPU 0 draws 600 W, above the card's 450 W rating"


def test_utilization_during_a_live_order_is_fact_and_after_it_is_flagged(
    farm, acme, alice, django_capture_on_commit_callbacks
):
    order = orders_on_machines.order_on_machine(farm, acme, alice, django_capture_on_commit_callbacks)
    machine = Machine.objects.get(account=farm, name="fra-h100-1")
    busy = [{"index": i, **IDLE, "utilization_pct": 95, "power_w": 650} for i in range(8)]

    during = machine_heartbeat(machine=machine, gpus=busy, instances=1)
    instance = order.instance
    instance.terminated_at = timezone.now() - dt.timedelta(minutes=5)
    instance.save(update_fields=["terminated_at"])
    after = machine_heartbeat(machine=machine, gpus=busy, instances=0)

    assert during.unverified_reason == ""
    assert after.unverified_reason.startswith("GPU 0 95 % busy with no lease running; GPU 1 95 % busy")


def test_the_order_page_shows_a_flagged_host_report_as_unverified(
    farm, acme, alice, django_capture_on_commit_callbacks
):
    order = orders_on_machines.order_on_machine(farm, acme, alice, django_capture_on_commit_callbacks)
    machine = Machine.objects.get(account=farm, name="fra-h100-1")
    hot = [{"index": i, **IDLE, "utilization_pct": 90, "power_w": 1500} for i in range(8)]
    machine_heartbeat(machine=machine, gpus=hot, instances=1)

    page = orders_on_machines._page(alice, order)

    assert "From the host agent of machine" in page
    assert "The latest report is unverified: GPU 0 draws 1500 W, above the card&#x27;s 700 W rating" in page
    assert page.count('<em class="err small">unverified</em>') == 3
    # The claim is shown as the latest, flagged; the charts hold only beats that could be true (none here).
    order.refresh_from_db()
    telemetry = order_telemetry(order, since=timezone.now() - dt.timedelta(hours=1), now=timezone.now())
    assert telemetry.latest.unverified_reason and telemetry.minutes == []


def test_the_portal_shows_a_flagged_latest_report_as_unverified_and_charts_only_facts(petra, olga):
    client = client_for(olga)
    client.post("/provider/machines/new", {"name": "fra-h100-1", "gpu_model": "H100-SXM5", "gpu_count": "1",
                "gpu_memory_gb": "80", "vcpus": "12", "memory_gib": "128", "disk_gb": "500", "network_gbps": "10",
                "country": "DE", "region": "eu-de", "price_per_gpu_hour": "1.95", "availability": ""})  # fmt: skip
    machine = Machine.objects.get(name="fra-h100-1")
    machine_heartbeat(machine=machine, gpus=[{"index": 0, **IDLE}], instances=0)
    honest = client.get("/provider/machines").content.decode()

    machine_heartbeat(machine=machine, gpus=[{"index": 0, **IDLE, "utilization_pct": 40}], instances=0)
    flagged = client.get("/provider/machines").content.decode()

    assert "telemetry-unverified" not in honest and "0.0 %" in honest
    assert "40.0 % unverified: GPU 0 40 % busy with no lease running" in flagged
    # The chart still has only the fact: one minute at 0 %.
    assert flagged.count('aria-labelledby="chart-') == honest.count('aria-labelledby="chart-') == 1
    assert "between 0 and 0 %, latest 0 %" in flagged


# --- Reliability of a new machine ----------------------------------------------------------------------------------


def test_a_new_machine_shows_new_no_launches_yet_and_ranks_on_the_neutral_prior(client, petra, olga):
    from providers.community.services import machine_register

    client_for(olga).post("/provider/machines/new", {"name": "fra-h100-1", "gpu_model": "H100-SXM5",
                          "gpu_count": "1", "gpu_memory_gb": "80", "vcpus": "12", "memory_gib": "128",
                          "disk_gb": "500", "network_gbps": "10", "country": "DE", "region": "eu-de",
                          "price_per_gpu_hour": "1.95", "availability": ""})  # fmt: skip
    machine = Machine.objects.get(name="fra-h100-1")
    machine_register(machine=machine, agent_url="http://127.0.0.1:7070", hardware={},
                     self_test={"ok": True, "gpus": [H100]})  # fmt: skip
    machine_heartbeat(machine=machine, gpus=[{"index": 0, **IDLE}], instances=0)
    now = timezone.now() + dt.timedelta(seconds=1)
    key = (machine.account_id, machine.name)

    page = client_for(olga).get("/provider/machines").content.decode()

    assert machine_reliability_shown(now=now) == {key: None}
    # Launch success unknown: the prior a cloud account with no history gets (19 in 20), times measured uptime.
    assert machine_reliability(now=now) == {key: pytest.approx(19 / 20)}
    assert "new, no launches yet" in page and 'id="provider-reliability"' not in page


# --- Verification against the self-test --------------------------------------------------------------------------


def _register(client: Client, listed, self_test: dict, hardware: dict | None = None) -> dict:
    payload = {"agent_url": "http://127.0.0.1:7070", "hardware": hardware or {}, "self_test": self_test}
    return _post(client, "/agent/v1/register", payload, listed)


def test_an_agent_that_lies_about_its_gpu_count_cannot_be_verified(client, admin_client, admin_user, listed):
    # Its own hardware report (nvidia-smi) shows 4 GPUs; its self-test claims the 8 the listing promises.
    answer = _register(client, listed, {"ok": True, "gpus": [H100] * 8}, hardware={"gpus": [H100] * 4})
    reason = "the agent's hardware report lists 4 GPUs, its self-test 8"
    assert (answer["self_test_ok"], answer["problem"]) == (False, reason)

    with pytest.raises(MachineInvalid) as refused:
        machine_decide(machine=listed.machine, state=MachineState.VERIFIED, by=admin_user, reason="looks fine")
    staff_page = admin_client.post(
        "/admin/providers/machine/", {"action": "verify", "_selected_action": [listed.machine.pk]}, follow=True
    ).content.decode()

    assert str(refused.value) == f"self_test: not verified: {reason}"
    assert f"Machine fra-h100-1: self_test: not verified: {reason}" in staff_page.replace("&#x27;", "'")
    assert Machine.objects.get(pk=listed.machine.pk).state == MachineState.PENDING
    assert not LedgerEntry.objects.filter(kind="machine.verified").exists()


@pytest.mark.parametrize(
    ("self_test", "problem"),
    [
        ({"ok": True, "gpus": [H100] * 4, "h2d_bandwidth_gbs": 24.5},
         "listing promises 8x H100-SXM5, the agent found 4 (it reports 4x NVIDIA H100 80GB HBM3)"),
        ({"ok": True, "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}] * 8},
         "listing promises 8x H100-SXM5, the agent found 0 (it reports 8x NVIDIA A100-SXM4-80GB)"),
        ({"ok": True, "gpus": [{**H100, "memory_gb": 40}] * 8},
         "listing promises 80 GB per GPU, the agent found less"),
        ({"ok": True, "gpus": [H100] * 8, "h2d_bandwidth_gbs": 3.2},
         "host-to-device copies run at 3.2 GB/s; a H100-SXM5 in its proper slot gives about 16 GB/s "
         "(at least 5.3 expected)"),
    ],
)  # fmt: skip
def test_a_self_test_that_differs_from_the_listing_blocks_verification_with_the_reason(
    client, listed, admin_user, self_test, problem
):
    answer = _register(client, listed, self_test)

    assert (answer["self_test_ok"], answer["problem"]) == (False, problem)
    with pytest.raises(MachineInvalid, match="self_test: not verified: "):
        machine_decide(machine=listed.machine, state=MachineState.VERIFIED, by=admin_user, reason="looks fine")
    assert Machine.objects.get(pk=listed.machine.pk).state == MachineState.PENDING


def test_a_matching_self_test_with_a_healthy_link_is_verified(client, listed, admin_user):
    answer = _register(client, listed, {"ok": True, "gpus": [H100] * 8, "h2d_bandwidth_gbs": 24.5})

    machine = machine_decide(machine=listed.machine, state=MachineState.VERIFIED, by=admin_user, reason="matched")

    assert (answer["self_test_ok"], answer["problem"], machine.state) == (True, "", MachineState.VERIFIED)


def test_a_pcie_card_in_a_narrow_slot_is_not_the_machine_listed(client, fleet):
    # A PCIe Gen4 x16 card offers 32 GB/s each way; 8 GB/s is an x4 slot, or an invented figure.
    listing = {**LISTING, "gpu_model": "RTX-4090", "gpu_count": 2, "gpu_memory_gb": 24}
    listed = machine_list(account=fleet, name="home-4090", listing=listing)
    card = {"model": "GeForce RTX 4090", "memory_gb": 24}  # as the reference agent reports it

    narrow = _register(client, listed, {"ok": True, "gpus": [card] * 2, "h2d_bandwidth_gbs": 8.0})
    healthy = _register(client, listed, {"ok": True, "gpus": [card] * 2, "h2d_bandwidth_gbs": 24.5})

    assert narrow["problem"] == (
        "host-to-device copies run at 8 GB/s; a RTX-4090 in its proper slot gives about 32 GB/s "
        "(at least 10.7 expected)"
    )
    assert (healthy["self_test_ok"], healthy["problem"]) == (True, "")


@pytest.mark.parametrize(
    ("listed", "simulate"),
    [(model, simulate) for _, model, *_, simulate in DEMO_MACHINES] + [("L4", "L4:24x1"), ("T4", "T4:16x1")],
)
def test_a_simulated_host_at_full_load_is_plausible_for_its_card(listed, simulate):
    """The demo's hosts (and small cards) simulate a draw within their card's rating, so their heartbeats are
    charted, not flagged."""
    gpus = parse_simulated(simulate)
    agent = Agent(broker_url="http://127.0.0.1:9", key_id="mk_sim", secret="s", simulated=gpus, lease_threads=False)
    agent._launch({"client_token": "all-of-it", "gpus": len(gpus)})  # every GPU leased: its highest draw
    tdp = GpuModel.objects.get(key=listed).tdp_w

    problems = telemetry_problems(
        agent.telemetry(), card=CardLimits(tdp_w=tdp, memory_gb=gpus[0].memory_gb), listed_gpus=len(gpus), leased=True
    )

    assert tdp and problems == []
