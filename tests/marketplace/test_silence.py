"""Silence is noticed on every provider kind (issue 33, point 5): a running cloud order whose lease agent stops
reporting is degraded after ``BROKER_LEASE_SILENCE_S``, announced (``instance.unhealthy``), shown on its page and
in the API, its silent minutes recorded; a heartbeat again recovers it; ``on_silence: replace`` stops the machine
and fails over, ``keep`` keeps it.

Driven on the AWS sandbox with the lease agent the sandbox holds for each machine (``tests.leases``); time passes
by handing the sweep its ``now``, never by sleeping."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import socket
from decimal import Decimal

import pytest
from brokerclient.cli import _order_lines
from django.conf import settings
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.launch.config import LaunchChoice
from marketplace.models import (
    Attempt,
    Instance,
    LaunchConfiguration,
    Lease,
    Offer,
    Order,
    OrderHealth,
    OrderState,
    SilentPeriod,
    SshKey,
    WebhookDelivery,
    WebhookEventType,
)
from marketplace.orders.launching import Step
from marketplace.orders.losses import order_silence_replace
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.orders.silence import LEASE_AGENT, orders_silence_sweep
from marketplace.tasks import orders_silence_sweep_task
from marketplace.webhooks.services import webhook_endpoint_create
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.leases import boot_if_launched, held_agent

pytestmark = pytest.mark.django_db

SILENCE = dt.timedelta(seconds=settings.LEASE_SILENCE_S)
SECOND = dt.timedelta(seconds=1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _running(acme, alice, aws_account, aws_sandbox, capture, *, on_silence: str | None = None, offer=None) -> Order:
    """An on-demand g4dn.xlarge order, booted by its agent and running, that may fail over."""
    data: dict = {"allowed_cidrs": ["127.0.0.1/32"]}
    if on_silence is not None:
        data["on_silence"] = on_silence
    offer = (
        offer
        or aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
            "price_usd", "pk"
        )[0]
    )
    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LaunchChoice(data=data), offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("1")
            ),
        ).order
    with capture(execute=True):
        boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def _last_heard(order: Order, at: dt.datetime) -> None:
    """The agent's last heartbeat was at ``at``."""
    Lease.objects.filter(attempt__instance__order=order, attempt__instance__active=True).update(last_heartbeat_at=at)


def _events(order: Order) -> list[str]:
    deliveries = WebhookDelivery.objects.filter(payload__order=str(order.public_id)).order_by("id")
    return [d.event_type for d in deliveries if d.event_type.startswith("instance.")]


def _since_ready(order: Order) -> list[str]:
    """The order's instance events after its first machine was ready."""
    events = _events(order)
    return events[events.index(WebhookEventType.INSTANCE_READY) + 1 :]


def _entries(order: Order, kind: str) -> list[dict]:
    rows = LedgerEntry.objects.filter(kind=kind, subject=f"order:{order.public_id}").order_by("id")
    return [json.loads(e.payload) for e in rows]


@pytest.fixture
def hook(acme, alice):
    return webhook_endpoint_create(organization=acme, user=alice, url=f"http://127.0.0.1:{_closed_port()}/hook")


def test_a_cloud_order_whose_agent_stops_reporting_is_degraded_after_the_stated_time(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    instance = order.instances.get(active=True)
    heard = timezone.now().replace(microsecond=0) - dt.timedelta(hours=1)
    _last_heard(order, heard)
    entries, deliveries = LedgerEntry.objects.count(), WebhookDelivery.objects.count()

    # Just inside the stated time: nothing happens.
    early = orders_silence_sweep(now=heard + SILENCE - SECOND)
    assert (early.degraded, early.recovered, early.failed) == ([], [], [])
    order.refresh_from_db()
    assert order.health == OrderHealth.HEALTHY
    assert (LedgerEntry.objects.count(), WebhookDelivery.objects.count(), SilentPeriod.objects.count()) == (
        entries,
        deliveries,
        0,
    )

    noticed = heard + SILENCE + SECOND
    with django_capture_on_commit_callbacks(execute=False) as queued:
        swept = orders_silence_sweep(now=noticed)

    assert swept.degraded == [order.pk]
    order.refresh_from_db()
    assert (order.state, order.health) == (OrderState.RUNNING, OrderHealth.DEGRADED)
    period = SilentPeriod.objects.get(order=order)
    assert (period.instance_id, period.cause, period.started_at, period.noticed_at, period.ended_at) == (
        instance.pk,
        LEASE_AGENT,
        heard,
        noticed,
        None,
    )
    assert _since_ready(order) == [WebhookEventType.INSTANCE_UNHEALTHY]
    unhealthy = WebhookDelivery.objects.get(event_type=WebhookEventType.INSTANCE_UNHEALTHY)
    assert unhealthy.payload["instance"]["provider_instance_id"] == instance.provider_instance_id
    assert (unhealthy.payload["silent_since"], unhealthy.payload["on_silence"]) == (heard.isoformat(), "keep")
    [entry] = _entries(order, "order.degraded")
    assert (entry["instance"], entry["previous"], entry["health"], entry["silent_seconds"]) == (
        instance.provider_instance_id,
        "healthy",
        "degraded",
        int((SILENCE + SECOND).total_seconds()),
    )
    # keep: only the webhook's delivery is queued, no replacement.
    assert len(queued) == 1
    assert Instance.objects.get(pk=instance.pk).active is True
    # A second sweep finds it degraded already and does nothing more.
    again = orders_silence_sweep(now=noticed + dt.timedelta(minutes=10))
    assert (again.degraded, again.recovered, again.replace_again) == ([], [], [])
    assert SilentPeriod.objects.filter(order=order).count() == 1
    assert ledger_verify().ok


def test_the_order_page_and_the_api_show_the_silence_and_its_minutes(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    instance = order.instances.get(active=True)
    heard = timezone.now().replace(microsecond=0) - dt.timedelta(minutes=30)
    _last_heard(order, heard)
    orders_silence_sweep(now=heard + SILENCE + SECOND)

    client = Client()
    client.force_login(alice)
    page = client.get(f"/orders/{order.public_id}/").content.decode()
    assert 'id="order-silence"' in page
    assert f"the agent on <code>{instance.provider_instance_id}</code> has not reported since" in page
    assert "the machine is kept and recovers when its agent reports again" in page
    assert 'id="order-silent-minutes"' in page and "over 1 silent period " in page

    api = APIClient()
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/orders/{order.public_id}").json()
    assert body["health"] == "degraded"
    [period] = body["silence"]["periods"]
    assert (period["cause"], period["instance"], period["ended_at"], period["ended_by"]) == (
        LEASE_AGENT,
        instance.provider_instance_id,
        None,
        "",
    )
    assert 30 * 60 <= period["seconds"] < 31 * 60  # from the last report, still counting
    assert 30.0 <= body["silence"]["minutes"] < 31.0
    listed = api.get("/api/v1/orders").json()["results"]
    assert [(o["id"], o["health"]) for o in listed] == [(str(order.public_id), "degraded")]
    # The client's `broker order` shows the same.
    shown = io.StringIO()
    _order_lines(body, shown)
    assert f"health    degraded: its agent has not reported since {period['started_at']}\n" in shown.getvalue()
    assert f"silent    {body['silence']['minutes']} min without reports, 1 period(s)\n" in shown.getvalue()


def test_a_heartbeat_again_recovers_the_order_and_closes_its_silent_period(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)
    orders_silence_sweep(now=heard + SILENCE + SECOND)

    agent = held_agent(order, aws_sandbox)
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.heartbeat() == "running"

    order.refresh_from_db()
    assert (order.state, order.health) == (OrderState.RUNNING, OrderHealth.HEALTHY)
    period = SilentPeriod.objects.get(order=order)
    beat = Lease.objects.get(attempt__instance__order=order).heartbeats.get()
    assert (period.ended_at, period.ended_by) == (beat.at, "recovered")
    assert period.seconds(timezone.now()) == int((beat.at - heard).total_seconds())
    assert _since_ready(order) == [WebhookEventType.INSTANCE_UNHEALTHY, WebhookEventType.INSTANCE_RECOVERED]
    [entry] = _entries(order, "order.recovered")
    assert (entry["previous"], entry["health"]) == ("degraded", "healthy")
    # Healthy from here: another heartbeat queues nothing, a sweep finds nothing.
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert agent.heartbeat() == "running"
    assert queued == []
    swept = orders_silence_sweep(now=timezone.now())
    assert (swept.degraded, swept.recovered) == ([], [])
    assert ledger_verify().ok


def test_the_sweep_recovers_an_order_whose_recovery_task_was_lost(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)
    orders_silence_sweep(now=heard + SILENCE + SECOND)
    with django_capture_on_commit_callbacks(execute=False):  # the recovery task is never run
        assert held_agent(order, aws_sandbox).heartbeat() == "running"

    swept = orders_silence_sweep(now=timezone.now())

    assert swept.recovered == [order.pk]
    order.refresh_from_db()
    assert order.health == OrderHealth.HEALTHY
    assert SilentPeriod.objects.get(order=order).ended_by == "recovered"


def test_on_silence_replace_stops_the_silent_machine_and_fails_over(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, on_silence="replace")
    first = order.instances.get(active=True)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)

    with django_capture_on_commit_callbacks(execute=True):
        swept = orders_silence_sweep(now=heard + SILENCE + SECOND)
    assert swept.degraded == [order.pk]

    # The silent machine is stopped at the provider and its attempt failed; the order launched elsewhere.
    first.refresh_from_db()
    assert first.active is False
    assert adapter_for_account(aws_account).describe(first.region, first.provider_instance_id).state in (
        InstanceState.TERMINATED,
        InstanceState.STOPPING,
    )
    attempt = Attempt.objects.get(pk=first.attempt_id)
    assert (attempt.outcome, attempt.error_class, attempt.provider_code) == ("failed", "agent_silent", "agent_silent")
    boot_if_launched(order, aws_sandbox)
    assert (order.state, order.health) == (OrderState.RUNNING, OrderHealth.HEALTHY), order.state_reason
    second = order.instances.get(active=True)
    assert second.pk != first.pk and second.attempt.offer_id != first.attempt.offer_id
    period = SilentPeriod.objects.get(order=order)
    assert (period.instance_id, period.ended_by) == (first.pk, "replaced")
    [lost] = _entries(order, "order.instance_lost")
    assert (lost["instance"], lost["code"]) == (first.provider_instance_id, "agent_silent")
    assert _since_ready(order)[:3] == [
        WebhookEventType.INSTANCE_UNHEALTHY,
        WebhookEventType.INSTANCE_LOST,
        WebhookEventType.INSTANCE_LAUNCHED,
    ]
    # The zone is not blocked for other orders: one machine's silence is no capacity signal.
    assert attempt.error_class != "capacity"
    assert ledger_verify().ok


def test_a_replacement_that_finds_the_agent_reporting_again_stops_nothing(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, on_silence="replace")
    instance = order.instances.get(active=True)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)
    # The sweep degrades it and queues the replacement; the agent reports before that task runs.
    with django_capture_on_commit_callbacks(execute=False):
        orders_silence_sweep(now=heard + SILENCE + SECOND)
        assert held_agent(order, aws_sandbox).heartbeat() == "running"

    assert order_silence_replace(order_id=order.pk) == Step.DONE

    assert list(order.instances.values_list("pk", "active")) == [(instance.pk, True)]
    assert order.attempts.count() == 1
    assert adapter_for_account(aws_account).describe(instance.region, instance.provider_instance_id).state == (
        InstanceState.RUNNING
    )
    assert _entries(order, "order.instance_lost") == []


def test_on_silence_keep_keeps_the_machine(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, on_silence="keep")
    instance = order.instances.get(active=True)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)

    with django_capture_on_commit_callbacks(execute=True):
        orders_silence_sweep(now=heard + SILENCE + SECOND)
        # Long after: still kept, and no replacement queued again.
        assert orders_silence_sweep(now=heard + dt.timedelta(hours=2)).replace_again == []

    order.refresh_from_db()
    assert (order.state, order.health) == (OrderState.RUNNING, OrderHealth.DEGRADED)
    assert list(order.instances.values_list("pk", "active")) == [(instance.pk, True)]
    assert order.attempts.count() == 1
    assert adapter_for_account(aws_account).describe(instance.region, instance.provider_instance_id).state == (
        InstanceState.RUNNING
    )
    assert _entries(order, "order.instance_lost") == []
    assert WebhookEventType.INSTANCE_LOST not in _events(order)


def test_a_malformed_on_silence_is_refused_naming_the_field(alice, aws_account, django_capture_on_commit_callbacks):
    api = APIClient()
    api.force_authenticate(alice)
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()
    for bad in ("restart", True, ["replace"], "REPLACE"):
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post(
                "/api/v1/orders",
                {"offer": offer.pk, "launch": {"allowed_cidrs": ["127.0.0.1/32"], "on_silence": bad}},
                format="json",
            )
        assert response.status_code == 400, response.json()
        assert response.json()["error"]["code"] == "invalid_launch"
        assert response.json()["error"]["fields"] == {"launch.on_silence": ['either "keep" (the default) or "replace"']}
    assert not LaunchConfiguration.objects.exists()
    assert not Order.objects.exists()


def test_one_bad_order_does_not_stop_the_sweep_for_another(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    offers = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
        "price_usd", "pk"
    )
    bad = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, offer=offers[0])
    good = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, offer=offers[1])
    heard = timezone.now() - dt.timedelta(minutes=10)
    # The bad one silent longer, so the sweep meets it first; its record is broken (a silent period left open
    # while the order is healthy), so degrading it fails on the one-open-period constraint.
    _last_heard(bad, heard - dt.timedelta(minutes=1))
    _last_heard(good, heard)
    SilentPeriod.objects.create(
        order=bad, instance=bad.instances.get(active=True), cause=LEASE_AGENT, started_at=heard, noticed_at=heard
    )

    swept = orders_silence_sweep(now=heard + SILENCE + SECOND)

    assert (swept.failed, swept.degraded) == ([bad.pk], [good.pk])
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.health, good.health) == (OrderHealth.HEALTHY, OrderHealth.DEGRADED)
    assert _entries(bad, "order.degraded") == []
    assert WebhookEventType.INSTANCE_UNHEALTHY not in _events(bad)
    assert WebhookEventType.INSTANCE_UNHEALTHY in _events(good)


def test_an_order_that_ends_while_degraded_closes_its_silent_period(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(order, heard)
    orders_silence_sweep(now=heard + SILENCE + SECOND)

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)

    order.refresh_from_db()
    assert (order.state, order.health) == (OrderState.TERMINATED, OrderHealth.HEALTHY)
    period = SilentPeriod.objects.get(order=order)
    assert period.ended_by == "ended" and period.ended_at is not None


def test_a_healthy_order_and_one_not_yet_ready_are_left_alone(
    acme, alice, aws_account, aws_sandbox, hook, django_capture_on_commit_callbacks
):
    order = _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks)
    _last_heard(order, timezone.now())
    entries, deliveries = LedgerEntry.objects.count(), WebhookDelivery.objects.count()

    with django_capture_on_commit_callbacks(execute=False) as queued:
        result = orders_silence_sweep_task.apply().get()

    assert result == {"degraded": 0, "recovered": 0, "replace_again": 0, "failed": 0}
    assert queued == []
    order.refresh_from_db()
    assert order.health == OrderHealth.HEALTHY
    assert (LedgerEntry.objects.count(), WebhookDelivery.objects.count(), SilentPeriod.objects.count()) == (
        entries,
        deliveries,
        0,
    )


def test_the_sweep_is_bounded_per_run(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offers = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
        "price_usd", "pk"
    )
    orders = [
        _running(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, offer=offers[i])
        for i in range(2)
    ]
    heard = timezone.now() - dt.timedelta(minutes=10)
    _last_heard(orders[0], heard - dt.timedelta(minutes=1))
    _last_heard(orders[1], heard)

    first = orders_silence_sweep(now=heard + SILENCE + SECOND, limit=1)
    second = orders_silence_sweep(now=heard + SILENCE + SECOND, limit=1)

    # The longest silent first; the next run carries on.
    assert (first.degraded, second.degraded) == ([orders[0].pk], [orders[1].pk])


# ------------------------------------------------------------------------------- independent hosts, storefront


def _configure_page(browser: Client, offer, **fields: object):
    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    nonce = re.search(r'name="nonce" value="([^"]+)"', page).group(1)
    key = SshKey.objects.get(name="alice@laptop")
    form = {
        "offer": offer.pk, "nonce": nonce, "duration_hours": "2", "ssh_keys": [str(key.public_id)],
        "workload_kind": "none", "access": "mine", "allow_failover": "on", "env_rows": "0",
    }  # fmt: skip
    form.update(fields)
    return browser.post("/orders/new", form)


def test_the_storefront_takes_the_choice_shows_it_and_refuses_anything_else(
    alice, held_hosts, django_capture_on_commit_callbacks
):
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")
    browser = Client()
    browser.force_login(alice)
    assert 'id="id_on_silence"' in browser.get(f"/orders/new?offer={offer.pk}").content.decode()

    refused = _configure_page(browser, offer, on_silence="restart")
    assert refused.status_code == 400
    assert "Select a valid choice. restart is not one of the available choices." in refused.content.decode()

    configured = _configure_page(browser, offer, on_silence="replace")
    assert configured.status_code == 302
    confirm = browser.get(configured["Location"]).content.decode()
    assert 'id="launch-on-silence">replace the machine with the next offer<' in confirm
    nonce = re.search(r'name="nonce" value="([^"]+)"', confirm).group(1)
    with django_capture_on_commit_callbacks(execute=True):
        browser.post("/orders/place", {"nonce": nonce})
    assert Order.objects.get().launch_config.spec["on_silence"] == "replace"


def test_an_independent_hosts_order_whose_lease_agent_is_silent_is_degraded_too(
    acme, alice, held_hosts, hook, django_capture_on_commit_callbacks
):
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(launch=LaunchChoice(data={"allowed_cidrs": ["127.0.0.1/32"]}), offer_id=offer.pk),
        ).order
    with django_capture_on_commit_callbacks(execute=True):
        boot_if_launched(order, held_hosts)
    assert order.state == OrderState.RUNNING, order.state_reason
    heard = timezone.now() - dt.timedelta(minutes=1)
    _last_heard(order, heard)

    swept = orders_silence_sweep(now=heard + SILENCE + SECOND)

    assert swept.degraded == [order.pk]
    order.refresh_from_db()
    assert (order.state, order.health) == (OrderState.RUNNING, OrderHealth.DEGRADED)
    assert _since_ready(order) == [WebhookEventType.INSTANCE_UNHEALTHY]
