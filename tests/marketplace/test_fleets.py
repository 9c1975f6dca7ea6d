"""Fleets that follow their own telemetry (issue 38): replicas placed by the matching engine on the sandbox clouds,
grown under load and shrunk after the cooldown, replaced when lost, never above the price cap or the budget,
each decision ledgered and announced."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.fleets.selectors import fleet_cost, fleet_replica_series
from marketplace.fleets.services import (
    TOKEN_ENV,
    URL_ENV,
    fleet_create,
    fleet_end,
    fleet_evaluate,
    fleet_update,
    placement_key,
)
from marketplace.fleets.specs import FleetInvalid
from marketplace.fleets.telemetry import metric_record
from marketplace.launch.config import launch_secrets
from marketplace.models import (
    Fleet,
    FleetAction,
    FleetDecision,
    FleetState,
    Order,
    OrderState,
    WebhookDelivery,
    WebhookEndpoint,
)
from marketplace.orders.errors import IdempotencyConflict
from marketplace.orders.services import order_terminate
from marketplace.orders.transitions import order_transition
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0)
WORKLOAD = {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000]}


def _data(**overrides):
    data = {
        "name": "inference",
        "demand": {"gpu_count": 1, "gpu_models": ["T4"], "pricing_models": ["on_demand"]},
        "max_price_per_gpu_hour": "5",
        "min_replicas": 1,
        "max_replicas": 4,
        "rule": {
            "kind": "metric",
            "target": 10,
            "tolerance": 0.1,
            "window_s": 60,
            "scale_out_cooldown_s": 120,
            "scale_in_cooldown_s": 600,
            "metric": {"name": "queue_depth", "source": "post"},
        },
        "launch": {"allowed_cidrs": ["127.0.0.1/32"], "workload": WORKLOAD},
    }
    data.update(overrides)
    return data


def _create(acme, alice, **overrides) -> Fleet:
    return fleet_create(organization=acme, user=alice, data=_data(**overrides), now=T0).fleet


def _evaluate(fleet, now, capture, sandbox=None):
    """Evaluate at ``now``, run what it queued (provisioning), and boot what launched."""
    with capture(execute=True):
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=now)
    if sandbox is not None:
        for order in evaluation.placed:
            with capture(execute=True):
                boot_if_launched(order, sandbox)
    return evaluation


def _live(fleet) -> list[Order]:
    return list(Order.objects.filter(fleet=fleet).exclude(state__in=Order.FINAL_STATES).order_by("pk"))


def _post(fleet, value, at, replica=None):
    metric_record(fleet=fleet, name="queue_depth", value=value, replica=replica, now=at)


def test_creating_a_fleet_stores_its_terms_and_gives_the_replicas_the_metrics_token_as_a_secret(acme, alice):
    created = fleet_create(organization=acme, user=alice, data=_data(budget_usd="100"), now=T0)

    fleet = created.fleet
    assert created.created and created.metrics_token.startswith("fmt_")
    assert (fleet.state, fleet.desired, fleet.min_replicas, fleet.max_replicas) == (FleetState.ACTIVE, 0, 1, 4)
    assert (fleet.max_price_per_gpu_hour, fleet.budget_usd) == (Decimal("5"), Decimal("100"))
    assert (fleet.rule_kind, fleet.rule_target, fleet.metric_name, fleet.metric_source) == (
        "metric",
        10.0,
        "queue_depth",
        "post",
    )
    env = fleet.launch_config.spec["workload"]["env"]
    assert {"name": TOKEN_ENV, "secret": True} in env
    assert {"name": URL_ENV, "value": f"http://127.0.0.1:8000/api/v1/fleets/{fleet.public_id}/metrics"} in env
    assert launch_secrets(fleet.launch_config)["env"] == {TOKEN_ENV: created.metrics_token}
    entry = LedgerEntry.objects.get(kind="fleet.created", subject=f"fleet:{fleet.public_id}")
    assert created.metrics_token not in entry.payload
    assert json.loads(entry.payload)["max_price_per_gpu_hour"] == "5"


def test_a_fleet_with_wrong_fields_is_refused_naming_each_and_nothing_is_stored(acme, alice):
    data = _data(min_replicas=5, max_replicas=4, max_price_per_gpu_hour="-1")
    data["demand"] = {"gpu_count": 0, "gpu_models": ["NOT-A-GPU"]}
    data["rule"] = {"kind": "metric", "target": float("inf"), "metric": {"name": "bad name", "source": "ftp"}}

    with pytest.raises(FleetInvalid) as refused:
        fleet_create(organization=acme, user=alice, data=data, now=T0)

    assert set(refused.value.fields) == {
        "min_replicas",
        "max_price_per_gpu_hour",
        "demand.gpu_count",
        "demand.gpu_models",
        "rule.target",
        "rule.metric.name",
        "rule.metric.source",
    }
    assert (Fleet.objects.count(), LedgerEntry.objects.filter(kind__startswith="fleet.").count()) == (0, 0)


def test_the_same_idempotency_key_returns_the_first_fleet_and_another_body_conflicts(acme, alice):
    first = fleet_create(organization=acme, user=alice, data=_data(), idempotency_key="k1", now=T0)
    again = fleet_create(organization=acme, user=alice, data=_data(), idempotency_key="k1", now=T0)

    assert (again.fleet.pk, again.created, again.metrics_token) == (first.fleet.pk, False, None)

    with pytest.raises(IdempotencyConflict):
        fleet_create(organization=acme, user=alice, data=_data(name="other"), idempotency_key="k1", now=T0)
    assert Fleet.objects.count() == 1


def test_a_fleet_grows_under_posted_load_and_shrinks_after_the_cooldown(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice)

    # Given: the first evaluation places the minimum, which boots and runs.
    first = _evaluate(fleet, T0, capture, aws_sandbox)
    assert (first.decision.action, first.decision.desired, len(first.placed)) == ("scale_out", 1, 1)
    assert [o.state for o in _live(fleet)] == [OrderState.RUNNING]

    # When: the workload reports 35 queued jobs for a target of 10 per replica.
    at = T0 + dt.timedelta(minutes=5)
    _post(fleet, 35, at - dt.timedelta(seconds=10))
    grown = _evaluate(fleet, at, capture, aws_sandbox)

    # Then: it grows to 4, each new replica placed with its own idempotency key, and the decision says why.
    assert (grown.decision.action, grown.decision.desired, len(grown.placed)) == ("scale_out", 4, 3)
    assert "35.0 (metric) per replica against a target of 10: 4 needed" in grown.record.reason
    assert sorted(o.idempotency_key for o in grown.placed) == [placement_key(fleet, 2, i) for i in range(3)]
    assert all(o.fleet_id == fleet.pk and o.duration_hours is None for o in grown.placed)
    assert len(_live(fleet)) == 4

    # When the load falls, the fleet holds until the scale-in cooldown has passed since the scale-out ...
    low = at + dt.timedelta(minutes=5)
    _post(fleet, 4, low - dt.timedelta(seconds=5))
    held = _evaluate(fleet, low, capture)
    assert (held.decision.action, held.decision.desired, held.ended) == ("hold", 4, ())
    assert "no scale-in before" in held.decision.reason

    # ... and then shrinks by at most step_in, ending the dearest replicas.
    later = at + dt.timedelta(minutes=11)
    _post(fleet, 4, later - dt.timedelta(seconds=5))
    shrunk = _evaluate(fleet, later, capture)
    assert (shrunk.decision.action, shrunk.decision.desired, len(shrunk.ended)) == ("scale_in", 2, 2)
    assert {o.state for o in Order.objects.filter(pk__in=[o.pk for o in shrunk.ended])} == {OrderState.TERMINATED}
    assert len(_live(fleet)) == 2
    # (The ended replicas' own reactions evaluated the fleet again at the wall clock's time: holds.)
    ours = FleetDecision.objects.filter(fleet=fleet, at__in=[T0, at, low, later]).order_by("at", "id")
    assert [d.action for d in ours] == [
        "scale_out",
        "scale_out",
        "hold",
        "scale_in",
    ]


def test_a_preempted_or_failed_replica_is_replaced_at_once(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice, min_replicas=2)
    _evaluate(fleet, T0, capture, aws_sandbox)
    lost, kept = _live(fleet)

    # Given: one replica failed (as a preempted order without failover does).
    order_transition(order=lost, to=OrderState.FAILED, reason="spot instance reclaimed")

    # When: the fleet evaluates within its scale-out cooldown.
    replaced = _evaluate(fleet, T0 + dt.timedelta(seconds=30), capture, aws_sandbox)

    # Then: the lost one is replaced regardless, and the decision says so.
    assert (replaced.decision.action, replaced.decision.desired, len(replaced.placed)) == ("replace", 2, 1)
    assert "1 replica to replace" in replaced.record.reason
    assert {o.pk for o in _live(fleet)} == {kept.pk, replaced.placed[0].pk}


def test_no_replica_costs_more_than_the_price_cap(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    cheapest_t4 = aws_account.offers.filter(gpu_model__key="T4", gpu_count=1, pricing_model="on_demand").order_by(
        "price_usd"
    )[0]
    # A cap below every T4 on sale: nothing may be placed, and the decision says why.
    fleet = _create(acme, alice, max_price_per_gpu_hour=str((cheapest_t4.price_usd / 2).quantize(Decimal("0.0001"))))

    evaluation = _evaluate(fleet, T0, capture)

    assert (evaluation.decision.action, evaluation.placed) == ("scale_out", ())
    assert "1 not placed: no offer on sale fits the demand" in evaluation.record.reason
    assert Order.objects.filter(fleet=fleet).count() == 0

    fleet_update(fleet=fleet, data={"max_price_per_gpu_hour": format(cheapest_t4.price_usd, "f")})
    placed = _evaluate(fleet, T0 + dt.timedelta(seconds=30), capture)
    assert [o.price_per_hour for o in placed.placed] == [cheapest_t4.price_usd]
    assert all(o.price_per_hour <= cheapest_t4.price_usd for o in Order.objects.filter(fleet=fleet))


def test_the_budget_caps_the_replicas_and_is_never_exceeded(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    price = (
        aws_account.offers.filter(gpu_model__key="T4", gpu_count=1, pricing_model="on_demand")
        .order_by("price_usd")[0]
        .price_usd
    )
    # Two and a half hours of one replica: two replicas' next hour fits, a third's does not.
    fleet = _create(acme, alice, budget_usd=format((price * Decimal("2.5")).quantize(Decimal("0.01")), "f"),
                    max_price_per_gpu_hour=format(price, "f"), min_replicas=4)  # fmt: skip

    evaluation = _evaluate(fleet, T0, capture, aws_sandbox)

    assert (evaluation.decision.desired, len(evaluation.placed)) == (2, 2)
    assert "the budget allows 2" in evaluation.record.reason
    assert sum(o.price_per_hour for o in _live(fleet)) <= fleet.budget_usd
    cost = fleet_cost(fleet=fleet, now=T0)
    assert cost.price_per_hour == price * 2


def test_each_decision_is_ledgered_with_its_reason_and_its_webhook_queued(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    WebhookEndpoint.objects.create(organization=acme, created_by=alice, url="http://127.0.0.1:9/hook",
                                   events=["fleet.scaled"], secret_encrypted="x")  # fmt: skip
    fleet = _create(acme, alice)

    with capture() as queued:
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=T0)

    decision = evaluation.record
    entry = LedgerEntry.objects.get(kind="fleet.scaled", subject=f"fleet:{fleet.public_id}")
    payload = json.loads(entry.payload)
    assert (payload["decision"], payload["action"], payload["reason"]) == (
        str(decision.public_id),
        "scale_out",
        decision.reason,
    )
    assert payload["placed"] == [str(evaluation.placed[0].public_id)]
    delivery = WebhookDelivery.objects.get(event_type="fleet.scaled")
    assert (delivery.payload["fleet"], delivery.payload["decision"], delivery.payload["desired"]) == (
        str(fleet.public_id),
        str(decision.public_id),
        1,
    )
    assert len(queued) >= 2  # the replica's provisioning and the webhook's send, after the commit
    assert ledger_verify().ok


def test_a_hold_is_recorded_only_when_its_reason_changes(acme, alice, aws_account, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice, min_replicas=0)

    first = _evaluate(fleet, T0, capture)
    second = _evaluate(fleet, T0 + dt.timedelta(seconds=30), capture)

    assert (first.decision.action, second.decision.action) == ("hold", "hold")
    assert (first.record is not None, second.record) == (True, None)
    assert FleetDecision.objects.filter(fleet=fleet).count() == 1
    assert LedgerEntry.objects.filter(kind="fleet.scaled").count() == 1


def test_ending_a_fleet_terminates_every_replica_and_places_no_more(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice, min_replicas=2)
    _evaluate(fleet, T0, capture, aws_sandbox)

    with capture(execute=True):
        fleet_end(fleet=fleet, now=T0 + dt.timedelta(minutes=1))

    fleet.refresh_from_db()
    assert (fleet.state, fleet.desired) == (FleetState.ENDED, 0)
    assert {o.state for o in Order.objects.filter(fleet=fleet)} == {OrderState.TERMINATED}
    assert FleetDecision.objects.filter(fleet=fleet, action=FleetAction.END).count() == 1
    assert fleet_evaluate(fleet_id=fleet.pk, now=T0 + dt.timedelta(minutes=2)) is None
    assert Order.objects.filter(fleet=fleet).count() == 2
    # Ending again changes nothing.
    fleet_end(fleet=fleet)
    assert FleetDecision.objects.filter(fleet=fleet).count() == 2  # the first scale-out and the end


def test_a_replica_that_ends_by_hand_makes_its_fleet_replace_it(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice)
    _evaluate(fleet, T0, capture, aws_sandbox)
    (replica,) = _live(fleet)

    # The reaction table queues the fleet's evaluation when a replica reaches a final state.
    with capture(execute=True):
        order_terminate(order=replica, reason="ended by hand")

    assert Order.objects.get(pk=replica.pk).state == OrderState.TERMINATED
    assert len(_live(fleet)) == 1 and _live(fleet)[0].pk != replica.pk


def test_the_replicas_over_time_follow_the_placements_and_ends(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice, min_replicas=2)
    _evaluate(fleet, T0, capture, aws_sandbox)
    with capture(execute=True):
        fleet_end(fleet=fleet, now=timezone.now())

    series = fleet_replica_series(fleet=fleet, now=timezone.now() + dt.timedelta(minutes=1))

    assert max(p.replicas for p in series) == 2
    assert series[-1].replicas == 0 and series[-1].desired == 0


def test_replicas_failing_as_fast_as_they_are_placed_are_not_placed_again_within_the_window(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    fleet = _create(acme, alice, min_replicas=2)
    _evaluate(fleet, T0, capture)
    for order in _live(fleet):
        order_transition(order=order, to=OrderState.FAILED, reason="the image would not start")

    again = _evaluate(fleet, T0 + dt.timedelta(seconds=30), capture)

    assert (again.decision.action, again.placed) == ("replace", ())
    assert "2 replicas failed in the last 300 s: none placed" in again.record.reason
    assert Order.objects.filter(fleet=fleet).count() == 2


def test_a_schedule_rule_holds_what_the_open_window_asks_for(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    now = T0.replace(hour=10, minute=0)
    if now > T0:
        # Ten o'clock has not come yet today: the one before, or the offers synced now would be hours stale then.
        now -= dt.timedelta(days=1)
    window = {"days": [now.weekday()], "start": "09:00", "end": "17:00", "replicas": 3}
    fleet = _create(acme, alice, min_replicas=0, rule={"kind": "schedule", "schedule": [window]})

    open_window = _evaluate(fleet, now, capture)
    fleet.refresh_from_db()
    closed = fleet_evaluate(fleet_id=fleet.pk, now=now.replace(hour=18) + dt.timedelta(minutes=15))

    assert (open_window.decision.action, open_window.decision.desired, len(open_window.placed)) == ("scale_out", 3, 3)
    assert open_window.record.reason == "the schedule asks for 3 now"
    assert (closed.decision.action, closed.decision.desired, len(closed.ended)) == ("scale_in", 1, 2)
    assert closed.decision.reason.startswith("no schedule window is open: the minimum, 0")
