"""One order's page: state and ledger history, the instance and how to reach it, cost, and the GPU telemetry the
agent on the machine reports, for the order's own organisation only."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.catalog.services import offers_sync
from marketplace.models import LeaseHeartbeat, Offer, Order, OrderState
from marketplace.orders.selectors import order_telemetry
from marketplace.orders.services import PlaceRequest, order_place
from providers.community.services import machine_heartbeat
from providers.models import Machine, MachineHeartbeat
from providers.services import provider_account_connect
from tests.hosts import start_hosts, stop_hosts
from tests.leases import LAUNCH, boot, held_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def farm(db):
    """Helga's independent machines fra-h100-1 and -2, verified, each with a simulated host agent in this
    process that holds each lease for the test to boot, and their offers (on-demand and spot) synced into the
    catalogue."""
    account = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = start_hosts(account, ["fra-h100-1", "fra-h100-2"], lease_threads=False)
    # Rented by the hour or, below the list price, as spot: each machine sells both.
    Machine.objects.filter(account=account).update(min_bid_per_gpu_hour=Decimal("0.9500"))
    assert offers_sync(account_id=account.pk).ok
    account.agents = agents
    yield account
    stop_hosts(agents)


def order_on_machine(account, organization, user, capture, zone: str = "fra-h100-1") -> Order:
    """An order placed on one of the farm's machines, run through the real provisioning (its tasks run eagerly
    when ``capture``, django_capture_on_commit_callbacks, runs the on-commit callbacks) and booted: the
    machine's agent claimed it and reported ready."""
    offer = Offer.objects.get(account=account, zone=zone, pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(
            organization=organization, user=user, request=PlaceRequest(offer_id=offer.pk, launch=LAUNCH)
        ).order
    with capture(execute=True):
        boot(order, account.agents)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def beats_over_the_last_hour(machine: Machine, *, since: dt.datetime, values: list[int]) -> None:
    """Heartbeats from the agent, one per value, spread evenly from ``since`` to now (each sent at its own time,
    so the per-minute heartbeat limit counts them as the agent's real pace)."""
    now = timezone.now()
    step = (now - since) / len(values)
    for i, util in enumerate(values):
        gpus = [{"index": g, "utilization_pct": util, "temperature_c": 50 + util // 5 + g, "power_w": 300 + util * 4}
                for g in range(8)]  # fmt: skip
        sent = since + step * (i + 1)
        beat = machine_heartbeat(machine=machine, gpus=gpus, instances=1, now=sent)
        MachineHeartbeat.objects.filter(pk=beat.pk).update(at=sent)


@pytest.fixture
def running(farm, acme, alice, django_capture_on_commit_callbacks):
    order = order_on_machine(farm, acme, alice, django_capture_on_commit_callbacks)
    # It has been running for 40 minutes, with a heartbeat every four.
    started = timezone.now() - dt.timedelta(minutes=40)
    order.instances.update(ready_at=started, launched_at=started - dt.timedelta(seconds=30))
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
    assert f"{running.price_per_hour:.4f} USD" in page  # the locked price, 15.2000
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
    assert page.count('aria-labelledby="chart-') == 3
    assert "does not report GPU telemetry" not in page
    # Each reported minute has a tooltip with its value, in each chart's unit
    assert len(re.findall(r"<title>\d{4}-\d\d-\d\d \d\d:\d\d UTC: 93 %</title>", page)) == 1
    assert len(re.findall(r"<title>[^<]* UTC: \d+ °C</title>", page)) == 10
    assert len(re.findall(r"<title>[^<]* UTC: 75 °C</title>", page)) == 4  # utilization 90-93: 50 + 18 + 7 C
    assert len(re.findall(r"<title>[^<]* UTC: \d+ %</title>", page)) == 10


def test_telemetry_counts_only_the_heartbeats_of_the_orders_own_run(running):
    machine = Machine.objects.get(name="fra-h100-1")
    instance = running.instance
    # Before the order ran, the machine served someone else: that load is not this buyer's business.
    earlier = machine_heartbeat(machine=machine, gpus=[{"utilization_pct": 7}], instances=1)
    MachineHeartbeat.objects.filter(pk=earlier.pk).update(at=instance.ready_at - dt.timedelta(minutes=5))
    now = timezone.now()

    telemetry = order_telemetry(running, since=now - dt.timedelta(hours=1), now=now)

    assert telemetry is not None and telemetry.machine == "fra-h100-1"
    assert len(telemetry.minutes) == 10
    assert [u for _, u, _, _ in telemetry.minutes] == [Decimal(v) for v in (10, 35, 60, 85, 90, 95, 92, 88, 91, 93)]
    assert telemetry.tdp_w == 8 * 700


def test_the_agent_on_the_machine_reports_telemetry_and_the_page_says_where_it_comes_from(
    farm, acme, alice, django_capture_on_commit_callbacks
):
    order = order_on_machine(farm, acme, alice, django_capture_on_commit_callbacks)
    before = _page(alice, order)
    assert "the first report from the agent on the machine is due within 15 s" in before

    agent = held_agent(order, farm.agents)
    assert agent.heartbeat() == "running"
    page = _page(alice, order)

    beat = LeaseHeartbeat.objects.get(lease__order=order)
    assert "From the broker's agent on the machine" in page
    assert f'id="latest-utilization">{beat.utilization_pct} %' in page
    assert page.count('aria-labelledby="chart-') == 3
    assert "only independent machines" not in page and "does not report GPU telemetry" not in page


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
    assert page.count('aria-labelledby="chart-') == 3


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
