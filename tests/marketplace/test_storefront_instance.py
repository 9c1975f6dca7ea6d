"""One order's page: state and ledger history, the instance and how to reach it, cost, and the GPU telemetry an
independent machine's host agent reports, for the order's own organisation only."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.models import Offer, Order, OrderState
from marketplace.orders.selectors import order_telemetry
from marketplace.orders.services import PlaceRequest, order_place
from providers.community.agent import Agent, parse_simulated
from providers.community.services import machine_heartbeat, machine_list
from providers.models import Machine, MachineHeartbeat, MachineState
from providers.services import provider_account_connect

pytestmark = pytest.mark.django_db

H100_BOX = {
    "gpu_model": "H100-SXM5",
    "gpu_count": 8,
    "gpu_memory_gb": 80,
    "vcpus": 96,
    "memory_gib": 1024,
    "disk_gb": 4000,
    "network_gbps": Decimal("100"),
    "country": "DE",
    "region": "eu-de",
    "price_per_gpu_hour": Decimal("1.9000"),
    "min_bid_per_gpu_hour": Decimal("0.9500"),
}


@pytest.fixture
def farm(db):
    """Helga's independent machines fra-h100-1 and -2, verified, each with a simulated host agent in this
    process, and their offers synced into the catalogue."""
    from marketplace.catalog.services import offers_sync

    account = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = []
    for name in ("fra-h100-1", "fra-h100-2"):
        listed = machine_list(account=account, name=name, listing=dict(H100_BOX))
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                      simulated=parse_simulated("H100:80x8"), launch_seconds=0)  # fmt: skip
        url = agent.serve("127.0.0.1", 0, report=False)
        now = timezone.now()
        Machine.objects.filter(pk=listed.machine.pk).update(
            agent_url=url, state=MachineState.VERIFIED, online=True, last_heartbeat_at=now, registered_at=now
        )
        agents.append(agent)
    assert offers_sync(account_id=account.pk).ok
    yield account
    for agent in agents:
        agent.stop()


def order_on_machine(account, organization, user, capture, zone: str = "fra-h100-1") -> Order:
    """An order placed on one of the farm's machines and run through the real provisioning (its tasks run
    eagerly when ``capture``, django_capture_on_commit_callbacks, runs the on-commit callbacks)."""
    offer = Offer.objects.get(account=account, zone=zone, pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(organization=organization, user=user, request=PlaceRequest(offer_id=offer.pk)).order
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def beats_over_the_last_hour(machine: Machine, *, since: dt.datetime, values: list[int]) -> None:
    """Heartbeats from the agent, one per value, spread evenly from ``since`` to now."""
    now = timezone.now()
    step = (now - since) / len(values)
    for i, util in enumerate(values):
        gpus = [{"index": g, "utilization_pct": util, "temperature_c": 50 + util // 5 + g, "power_w": 300 + util * 4}
                for g in range(8)]  # fmt: skip
        beat = machine_heartbeat(machine=machine, gpus=gpus, instances=1)
        MachineHeartbeat.objects.filter(pk=beat.pk).update(at=since + step * (i + 1))


@pytest.fixture
def running(farm, acme, alice, django_capture_on_commit_callbacks):
    order = order_on_machine(farm, acme, alice, django_capture_on_commit_callbacks)
    # It has been running for 40 minutes, with a heartbeat every four.
    started = timezone.now() - dt.timedelta(minutes=40)
    order.instances.update(running_at=started, launched_at=started - dt.timedelta(seconds=30))
    machine = Machine.objects.get(name="fra-h100-1")
    beats_over_the_last_hour(machine, since=started, values=[10, 35, 60, 85, 90, 95, 92, 88, 91, 93])
    return order


def _page(user, order) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/orders/{order.public_id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_order_page_shows_state_instance_cost_and_history(running, alice):
    page = _page(alice, running)

    instance = running.instance
    assert 'id="order-state">running<' in page
    assert instance.provider_instance_id in page
    assert "fra-h100-1" in page
    assert f"${running.price_per_hour:.4f}" in page  # the locked price, 15.2000
    assert "order.placed" in page and "order.running" in page
    assert page.index("order.placed") < page.index("order.running")
    assert f'action="/orders/{running.public_id}/terminate"' in page
    assert f'href="/orders/{running.public_id}/receipt"' in page
    assert 'data-api="/api/v1/orders/' in page  # the live refresh polls the orders API


def test_the_order_page_draws_the_machines_telemetry_and_its_latest_values(running, alice):
    page = _page(alice, running)

    # The latest heartbeat: utilization 93 on every GPU, the hottest at 50 + 18 + 7 C, 8 x (300 + 372) W.
    assert 'id="latest-utilization">93.0 %' in page
    assert 'id="latest-temperature">75.0 °C' in page
    assert 'id="latest-power">5376 W' in page
    assert page.count("<polyline") == 3
    assert "does not report GPU telemetry" not in page


def test_telemetry_counts_only_the_heartbeats_of_the_orders_own_run(running):
    machine = Machine.objects.get(name="fra-h100-1")
    instance = running.instance
    # Before the order ran, the machine served someone else: that load is not this buyer's business.
    earlier = machine_heartbeat(machine=machine, gpus=[{"utilization_pct": 7}], instances=1)
    MachineHeartbeat.objects.filter(pk=earlier.pk).update(at=instance.running_at - dt.timedelta(minutes=5))
    now = timezone.now()

    telemetry = order_telemetry(running, since=now - dt.timedelta(hours=1), now=now)

    assert telemetry is not None and telemetry.machine == "fra-h100-1"
    assert len(telemetry.minutes) == 10
    assert [u for _, u, _, _ in telemetry.minutes] == [Decimal(v) for v in (10, 35, 60, 85, 90, 95, 92, 88, 91, 93)]
    assert telemetry.tdp_w == 8 * 700


def test_an_order_on_a_cloud_says_plainly_that_there_is_no_telemetry(
    aws_account, acme, alice, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(offer_id=offer.pk)).order
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING, order.state_reason

    page = _page(alice, order)

    assert "This provider does not report GPU telemetry to the broker" in page
    assert "<polyline" not in page
    assert order.instance.provider_instance_id in page


def test_a_teammate_sees_the_order_and_a_stranger_gets_404(running, bob, charlie):
    assert running.instance.provider_instance_id in _page(bob, running)

    stranger = Client()
    stranger.force_login(charlie)
    response = stranger.get(f"/orders/{running.public_id}/")
    assert response.status_code == 404
    assert running.instance.provider_instance_id not in response.content.decode()
    assert stranger.get("/orders/not-a-uuid/").status_code == 404


def test_the_order_page_needs_a_login(running):
    response = Client().get(f"/orders/{running.public_id}/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_terminated_order_shows_its_end_and_no_terminate_button(running, alice, django_capture_on_commit_callbacks):
    client = Client()
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/orders/{running.public_id}/terminate")
    assert response.status_code == 302
    running.refresh_from_db()
    assert running.state == OrderState.TERMINATED

    page = _page(alice, running)

    assert 'id="order-state">terminated<' in page
    assert "order.terminated" in page
    assert "/terminate" not in page
    assert "data-api=" not in page  # nothing left to poll
    # Its 40 minutes of telemetry stay on the page: heartbeats up to its termination.
    assert page.count("<polyline") == 3


def test_my_orders_links_each_order_to_its_page(running, alice):
    client = Client()
    client.force_login(alice)

    page = client.get("/orders/").content.decode()

    assert f'href="/orders/{running.public_id}/"' in page


def test_the_orders_api_the_page_polls_answers_the_session(running, alice, charlie):
    client = Client()
    client.force_login(alice)
    body = client.get(f"/api/v1/orders/{running.public_id}").json()
    assert (body["state"], body["instance"]["zone"]) == ("running", "fra-h100-1")

    stranger = Client()
    stranger.force_login(charlie)
    assert stranger.get(f"/api/v1/orders/{running.public_id}").status_code == 404
