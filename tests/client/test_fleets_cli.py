"""``broker fleet …`` against a live broker: a fleet defined from the command line with its rule and launch
options, listed, shown, its workload's metric posted with the fleet's own token, evaluated (placing replicas on
the AWS sandbox), its decisions read, its limits changed, and ended; wrong command lines refused naming why."""

from __future__ import annotations

import json

import pytest
from brokerclient.fleets import schedule_window

from marketplace.api.tokens import api_token_create
from marketplace.fleets.services import fleet_evaluate
from marketplace.models import Fleet, FleetMetricSample, FleetState, Order
from tests.client.test_launch import broker

ALL = ["offers:read", "orders:place", "instances:manage"]


@pytest.fixture
def cli_env(live_server, acme, alice):
    raw = api_token_create(organization=acme, user=alice, name="cli", scopes=ALL).raw
    return {"BROKER_URL": live_server.url, "BROKER_TOKEN": raw}


def _create(cli_env, *extra):
    return broker(
        cli_env, "fleet", "create", "--name", "web", "--gpu", "T4", "--max-price-per-gpu", "5", "--min", "1",
        "--max", "3", "--metric", "queue_depth", "--target", "10", "--scale-in-cooldown-s", "900",
        "--image", "vllm/vllm-openai:v0.6.3", "--run", "serve", "--port", "8000", "--allow", "127.0.0.1/32", *extra,
    )  # fmt: skip


def test_a_fleet_is_defined_watched_fed_scaled_and_ended_from_the_command_line(
    cli_env, acme, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    created = _create(cli_env, "--json")
    assert created.returncode == 0, created.stderr
    body = json.loads(created.stdout)
    fleet = Fleet.objects.get(public_id=body["id"])
    assert (fleet.min_replicas, fleet.max_replicas, fleet.rule_kind, fleet.metric_name, fleet.rule_target) == (
        1, 3, "metric", "queue_depth", 10.0
    )  # fmt: skip
    assert fleet.scale_in_cooldown_s == 900 and fleet.demand["gpu_models"] == ["T4"]
    assert fleet.launch_config.spec["workload"]["image"] == "vllm/vllm-openai:v0.6.3"
    token = body["metrics_token"]

    # The workload's view: its metric posted with the fleet's token, not the buyer's.
    posted = broker({**cli_env, "BROKER_FLEET_METRICS_TOKEN": token}, "fleet", "metric", body["id"],
                    "--name", "queue_depth", "--value", "25")  # fmt: skip
    assert posted.returncode == 0, posted.stderr
    assert posted.stdout.startswith("queue_depth = 25 at ")
    assert list(FleetMetricSample.objects.values_list("name", "value")) == [("queue_depth", 25.0)]
    wrong = broker(cli_env, "fleet", "metric", body["id"], "--name", "queue_depth", "--value", "1",
                   "--metrics-token", "fmt_" + "x" * 40)  # fmt: skip
    assert wrong.returncode == 1 and FleetMetricSample.objects.count() == 1

    with django_capture_on_commit_callbacks(execute=True):
        fleet_evaluate(fleet_id=fleet.pk)

    listed = broker(cli_env, "fleet", "list")
    shown = broker(cli_env, "fleet", "show", body["id"])
    decisions = broker(cli_env, "fleet", "decisions", body["id"])
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if body["id"] in line)
    assert " web " in row and " active " in row and "1..3" in row
    assert shown.returncode == 0, shown.stderr
    assert f"fleet     {body['id']}  web" in shown.stdout
    assert "rule      10.0 queue_depth per replica" in shown.stdout
    live = Order.objects.filter(fleet=fleet).count()
    assert live >= 1 and f"replicas  {live} live" in shown.stdout
    assert decisions.returncode == 0, decisions.stderr
    assert "scale_out  0->1      no telemetry from a running replica yet; the minimum is 1" in decisions.stdout

    scaled = broker(cli_env, "fleet", "scale", body["id"], "--max", "5")
    assert scaled.returncode == 0, scaled.stderr
    fleet.refresh_from_db()
    assert fleet.max_replicas == 5 and "5" in scaled.stdout.splitlines()[2]

    ended = broker(cli_env, "fleet", "end", body["id"])
    assert ended.returncode == 0, ended.stderr
    fleet.refresh_from_db()
    assert fleet.state == FleetState.ENDED and "state     ended" in ended.stdout


def test_wrong_fleet_command_lines_are_refused_naming_what_is_wrong(cli_env):
    no_rule = broker(cli_env, "fleet", "create", "--name", "x", "--gpu", "T4", "--max-price-per-gpu", "1",
                     "--max", "2")  # fmt: skip
    two_rules = _create(cli_env, "--utilization", "60")
    bad_window = broker(cli_env, "fleet", "create", "--name", "x", "--gpu", "T4", "--max-price-per-gpu", "1",
                        "--max", "2", "--schedule", "someday 9-5=2")  # fmt: skip
    no_target = broker(cli_env, "fleet", "create", "--name", "x", "--gpu", "T4", "--max-price-per-gpu", "1",
                       "--max", "2", "--metric", "queue_depth")  # fmt: skip
    no_id = broker(cli_env, "fleet", "show")
    refused_by_broker = _create(cli_env, "--min", "4")  # above --max 3

    assert no_rule.returncode == 2 and "give exactly one rule" in no_rule.stderr
    assert two_rules.returncode == 2 and "give exactly one rule" in two_rules.stderr
    assert bad_window.returncode == 2 and "--schedule wants [DAYS ]HH:MM-HH:MM=REPLICAS" in bad_window.stderr
    assert no_target.returncode == 2 and "--metric needs --target" in no_target.stderr
    assert no_id.returncode == 2 and "fleet show needs a fleet id" in no_id.stderr
    assert refused_by_broker.returncode == 1 and "min_replicas" in refused_by_broker.stderr
    assert Fleet.objects.count() == 0


def test_a_schedule_is_read_in_utc_days_and_ranges(cli_env):
    assert schedule_window("mon-fri 09:00-18:00=4") == {"days": [0, 1, 2, 3, 4], "start": "09:00", "end": "18:00",
                                                        "replicas": 4}  # fmt: skip
    assert schedule_window("sat,sun 00:00-24:00=1")["days"] == [5, 6]
    assert schedule_window("fri-mon 22:00-06:00=2")["days"] == [0, 4, 5, 6]
    assert schedule_window("22:00-06:00=2")["days"] == list(range(7))
    created = broker(cli_env, "fleet", "create", "--name", "nightly", "--gpu", "T4", "--max-price-per-gpu", "1",
                     "--max", "4", "--schedule", "mon-fri 22:00-06:00=3", "--json")  # fmt: skip
    assert created.returncode == 0, created.stderr
    fleet = Fleet.objects.get(public_id=json.loads(created.stdout)["id"])
    assert (fleet.rule_kind, fleet.schedule) == (
        "schedule", [{"days": [0, 1, 2, 3, 4], "start": "22:00", "end": "06:00", "replicas": 3}]
    )  # fmt: skip
