"""/api/v1/fleets (issue 38): create with an Idempotency-Key, read, change, end, list decisions; the workload's
metric posted with the fleet's own metrics token; hostile posts refused naming the field; a stranger sees and
changes nothing of another organisation's fleet."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from marketplace.api.tokens import api_token_create
from marketplace.fleets.services import fleet_evaluate
from marketplace.models import Fleet, FleetDecision, FleetMetricSample, FleetState, Order, TokenScope

pytestmark = pytest.mark.django_db

BODY = {
    "name": "inference",
    "demand": {"gpu_count": 1, "gpu_models": ["T4"]},
    "max_price_per_gpu_hour": "2.5",
    "budget_usd": "500",
    "min_replicas": 1,
    "max_replicas": 8,
    "rule": {"kind": "metric", "target": 40, "metric": {"name": "requests_per_second", "source": "post"}},
    "launch": {
        "allowed_cidrs": ["127.0.0.1/32"],
        "workload": {"kind": "container", "image": "vllm/vllm-openai:v0.6.3"},
    },
}


def _api(user=None, bearer=None) -> APIClient:
    api = APIClient()
    if user is not None:
        api.force_authenticate(user)
    if bearer is not None:
        api.credentials(HTTP_AUTHORIZATION=bearer)
    return api


@pytest.fixture
def created(acme, alice):
    answer = _api(alice).post("/api/v1/fleets", BODY, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()


def test_creating_a_fleet_answers_it_with_its_metrics_token_once(acme, alice):
    api = _api(alice)

    first = api.post("/api/v1/fleets", BODY, format="json", HTTP_IDEMPOTENCY_KEY="fleet-1")
    again = api.post("/api/v1/fleets", BODY, format="json", HTTP_IDEMPOTENCY_KEY="fleet-1")

    assert (first.status_code, again.status_code) == (201, 200)
    body = first.json()
    assert body["metrics_token"].startswith("fmt_")
    assert (body["state"], body["desired"], body["min_replicas"], body["max_replicas"]) == ("active", 0, 1, 8)
    assert (body["max_price_per_gpu_hour"], body["budget_usd"], body["budget_left_usd"]) == (
        "2.5000",
        "500.00",
        "500.00",
    )
    assert body["rule"]["metric"] == {"name": "requests_per_second", "source": "post"}
    assert body["metrics_url"].endswith(f"/api/v1/fleets/{body['id']}/metrics")
    assert "metrics_token" not in again.json() and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == body["id"]
    assert Fleet.objects.count() == 1


def test_a_fleet_with_wrong_fields_is_refused_naming_each_field(acme, alice):
    body = {**BODY, "max_replicas": 65, "rule": {"kind": "metric", "metric": {"name": "9bad", "source": "post"}}}
    body["demand"] = {"gpu_count": True, "colour": "red"}

    answer = _api(alice).post("/api/v1/fleets", body, format="json")

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid"
    assert set(answer.json()["error"]["fields"]) == {
        "max_replicas",
        "demand.gpu_count",
        "demand.colour",
        "rule.metric.name",
    }
    assert (Fleet.objects.count(), LedgerEntry.objects.filter(kind="fleet.created").count()) == (0, 0)


def test_a_buyer_may_not_set_the_metrics_token_variable_herself(acme, alice):
    launch = {"workload": {"kind": "script", "script": "#!/bin/sh\nrun",
                           "env": [{"name": "BROKER_FLEET_METRICS_TOKEN", "value": "fmt_mine"}]}}  # fmt: skip

    answer = _api(alice).post("/api/v1/fleets", {**BODY, "launch": launch}, format="json")

    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["launch.workload.env[0].name"]
    assert Fleet.objects.count() == 0


def test_a_token_without_orders_place_cannot_create_a_fleet(acme, alice):
    raw = api_token_create(organization=acme, user=alice, name="read", scopes=[TokenScope.OFFERS_READ]).raw

    answer = _api(bearer=f"Bearer {raw}").post("/api/v1/fleets", BODY, format="json")

    assert answer.status_code == 403
    assert Fleet.objects.count() == 0


def test_patching_a_fleet_changes_its_bounds_and_rule_and_is_ledgered(acme, alice, created):
    rule = {"kind": "utilization", "target": 70, "scale_in_cooldown_s": 900}

    answer = _api(alice).patch(f"/api/v1/fleets/{created['id']}", {"max_replicas": 3, "rule": rule}, format="json")

    assert answer.status_code == 200, answer.json()
    assert (answer.json()["max_replicas"], answer.json()["rule"]["kind"], answer.json()["rule"]["target"]) == (
        3,
        "utilization",
        70.0,
    )
    entry = LedgerEntry.objects.get(kind="fleet.updated")
    assert json.loads(entry.payload)["changed"] == ["max_replicas", "rule"]


def test_patching_min_above_max_is_refused_and_changes_nothing(acme, alice, created):
    answer = _api(alice).patch(f"/api/v1/fleets/{created['id']}", {"min_replicas": 9}, format="json")

    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["min_replicas"]
    assert Fleet.objects.get().min_replicas == 1


def test_ending_a_fleet_answers_202_and_an_ended_fleet_cannot_be_changed(acme, alice, created):
    api = _api(alice)

    ended = api.post(f"/api/v1/fleets/{created['id']}/end")
    patched = api.patch(f"/api/v1/fleets/{created['id']}", {"max_replicas": 2}, format="json")

    assert (ended.status_code, ended.json()["state"]) == (202, FleetState.ENDED)
    assert (patched.status_code, patched.json()["error"]["code"]) == (409, "fleet_ended")


def test_decisions_are_listed_newest_first_a_page_at_a_time(acme, alice, created):
    fleet = Fleet.objects.get()
    now = timezone.now()
    # No offer is on sale in this test: each evaluation is a scale-out that places nothing, its reason says why.
    fleet_evaluate(fleet_id=fleet.pk, now=now)
    Fleet.objects.filter(pk=fleet.pk).update(max_replicas=1, min_replicas=0)
    fleet_evaluate(fleet_id=fleet.pk, now=now + dt.timedelta(seconds=30))

    first = _api(alice).get(f"/api/v1/fleets/{created['id']}/decisions?limit=1").json()
    second = _api(alice).get(f"/api/v1/fleets/{created['id']}/decisions?limit=1&cursor={first['next_cursor']}").json()

    decisions = list(FleetDecision.objects.filter(fleet=fleet).order_by("-id"))
    assert [d["id"] for d in first["results"] + second["results"]] == [str(d.public_id) for d in decisions]
    assert first["results"][0]["reason"] == decisions[0].reason
    assert "not placed: no offer on sale fits the demand" in second["results"][0]["reason"]


# --- The workload's metric -----------------------------------------------------------------------------------


def _metrics(created, token=None, body=None, **extra):
    api = APIClient()
    if token is not None:
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api.post(f"/api/v1/fleets/{created['id']}/metrics", body, format="json", **extra)


def test_the_workload_posts_its_metric_with_the_fleets_metrics_token(acme, alice, created):
    answer = _metrics(created, created["metrics_token"], {"name": "requests_per_second", "value": 37.5})

    assert answer.status_code == 201, answer.json()
    sample = FleetMetricSample.objects.get()
    assert (sample.fleet.public_id.hex, sample.name, sample.value, sample.order) == (
        created["id"].replace("-", ""),
        "requests_per_second",
        37.5,
        None,
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "other_metric", "value": 1}, "name"),
        ({"name": "requests_per_second", "value": "12"}, "value"),
        ({"name": "requests_per_second", "value": True}, "value"),
        ({"name": "requests_per_second", "value": 1e13}, "value"),
        ({"name": "requests_per_second", "value": 10**400}, "value"),
        ({"name": "requests_per_second", "value": 1, "replica": "not-a-uuid"}, "replica"),
        ({"name": "requests_per_second", "value": 1, "replica": "7d1c8c4c-0000-4000-8000-000000000000"}, "replica"),
        ({"name": "requests_per_second", "value": 1, "extra": 1}, "extra"),
        ([1, 2], "non_field_errors"),
    ],
)
def test_a_hostile_metric_is_refused_naming_the_field_and_nothing_is_stored(acme, alice, created, body, field):
    answer = _metrics(created, created["metrics_token"], body)

    assert answer.status_code == 400, answer.json()
    assert list(answer.json()["error"]["fields"]) == [field]
    assert FleetMetricSample.objects.count() == 0


def test_an_oversized_or_deep_metric_body_is_refused_before_it_is_read(acme, alice, created):
    big = _metrics(created, created["metrics_token"], {"name": "requests_per_second", "value": 1, "pad": "x" * 2000})
    deep = _metrics(created, created["metrics_token"], {"name": {"a": {"b": 1}}, "value": 1})

    assert (big.status_code, big.json()["error"]["code"]) == (400, "parse_error")
    assert (deep.status_code, deep.json()["error"]["code"]) == (400, "parse_error")
    assert FleetMetricSample.objects.count() == 0


def test_the_metrics_route_takes_only_that_fleets_own_token(acme, alice, alice_bearer, charlie, created):
    other = _api(charlie).post("/api/v1/fleets", {**BODY, "name": "charlie's"}, format="json").json()
    body = {"name": "requests_per_second", "value": 1}

    no_token = _metrics(created, None, body)
    buyer_token = APIClient()
    buyer_token.credentials(HTTP_AUTHORIZATION=alice_bearer)
    with_buyer_token = buyer_token.post(f"/api/v1/fleets/{created['id']}/metrics", body, format="json")
    with_another_fleets = _metrics(created, other["metrics_token"], body)
    with_a_made_up_one = _metrics(created, "fmt_" + "A" * 43, body)

    assert no_token.status_code == 401
    assert (with_buyer_token.status_code, with_another_fleets.status_code, with_a_made_up_one.status_code) == (
        404,
        404,
        404,
    )
    assert FleetMetricSample.objects.count() == 0


def test_an_ended_fleet_takes_no_metric(acme, alice, created):
    _api(alice).post(f"/api/v1/fleets/{created['id']}/end")

    answer = _metrics(created, created["metrics_token"], {"name": "requests_per_second", "value": 1})

    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "fleet_ended")
    assert FleetMetricSample.objects.count() == 0


# --- Strangers ------------------------------------------------------------------------------------------------


def test_a_stranger_sees_and_changes_nothing_of_another_organisations_fleet(acme, alice, charlie, created):
    stranger = _api(charlie)
    fleet_url = f"/api/v1/fleets/{created['id']}"

    answers = [
        stranger.get(fleet_url),
        stranger.patch(fleet_url, {"max_replicas": 2}, format="json"),
        stranger.post(f"{fleet_url}/end"),
        stranger.get(f"{fleet_url}/decisions"),
    ]
    listed = stranger.get("/api/v1/fleets").json()

    assert [a.status_code for a in answers] == [404, 404, 404, 404]
    assert listed["results"] == []
    fleet = Fleet.objects.get()
    assert (fleet.state, fleet.max_replicas) == (FleetState.ACTIVE, 8)
    assert LedgerEntry.objects.filter(kind__in=["fleet.updated", "fleet.scaled"]).count() == 0
    assert Order.objects.count() == 0
