"""The OpenAPI schema is one a generator can use (issue 36): the launch configuration typed field by field with
the limits marketplace.launch.config enforces, every error status an operation can answer declared with the
one error body, and the bounds of query parameters and decimal amounts stated."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pytest

from marketplace.api.pagination import MAX_CURSOR, MAX_LIMIT
from marketplace.api.schema import decimal_text_pattern, whole_range_pattern
from marketplace.launch import config

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def spec(django_db_blocker):
    from django.test import Client

    with django_db_blocker.unblock():
        return Client().get("/api/v1/schema", HTTP_ACCEPT="application/json").json()


def _operations(spec):
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield f"{method.upper()} {path}", operation


@pytest.mark.parametrize(
    "component", ["OrderPlaceInputRequest", "QuoteCreateInputRequest", "ClusterPlaceInputRequest",
                  "LaunchTemplateInputRequest", "ProcurementDemandInputRequest"],
)  # fmt: skip
def test_every_launch_field_a_request_takes_is_the_typed_launch_configuration(spec, component):
    launch = spec["components"]["schemas"][component]["properties"]["launch"]
    assert launch.get("allOf", [launch])[0]["$ref"] == "#/components/schemas/LaunchConfiguration"


def test_the_launch_configuration_states_the_limits_the_broker_enforces(spec):
    schemas = spec["components"]["schemas"]
    launch = schemas["LaunchConfiguration"]
    assert set(launch["properties"]) == config.FIELDS and launch["additionalProperties"] is False
    assert (launch["properties"]["disk_gb"]["minimum"], launch["properties"]["disk_gb"]["maximum"]) == (
        config.DISK_GB_MIN,
        config.DISK_GB_MAX,
    )
    assert launch["properties"]["ports"]["maxItems"] == config.MAX_PORTS
    assert launch["properties"]["allowed_cidrs"]["maxItems"] == config.MAX_CIDRS
    assert launch["properties"]["on_silence"]["enum"] == list(config.ON_SILENCE)
    container = schemas["LaunchWorkloadContainer"]["properties"]
    assert set(container) == config.WORKLOAD_FIELDS[config.WorkloadKind.CONTAINER]
    assert set(schemas["LaunchWorkloadScript"]["properties"]) == config.WORKLOAD_FIELDS[config.WorkloadKind.SCRIPT]
    assert (
        container["args"]["maxItems"] == config.MAX_ARGS and container["args"]["items"]["maxLength"] == config.MAX_ARG
    )
    assert container["shm_size_gb"]["maximum"] == config.SHM_GB_MAX
    assert schemas["LaunchWorkloadScript"]["properties"]["script"]["maxLength"] == config.MAX_SCRIPT
    env = schemas["LaunchEnvVar"]["properties"]
    assert env["value"]["maxLength"] == config.MAX_ENV_VALUE and container["env"]["maxItems"] == config.MAX_ENV
    reserved = re.compile(env["name"]["not"]["pattern"])
    assert all(reserved.match(n) for n in ["CUDA_VISIBLE_DEVICES", "nvidia_driver_capabilities", "BROKER_X"])
    assert not reserved.match("MODEL") and re.match(env["name"]["pattern"], "MODEL")
    spend = re.compile(launch["properties"]["spend_cap_usd"]["oneOf"][0]["pattern"])
    assert [bool(spend.match(t)) for t in ["0", "0.01", "50", "12.50", "1000000", "1000000.01", "1.234"]] == [
        False, True, True, True, True, False, False,
    ]  # fmt: skip


def test_answers_carry_the_stored_launch_configuration_typed(spec):
    schemas = spec["components"]["schemas"]
    for component in ["OrderOutput", "QuoteOutput", "LaunchTemplateOutput"]:
        launch = schemas[component]["properties"]["launch"]
        assert launch["allOf"] == [{"$ref": "#/components/schemas/LaunchConfigurationView"}], component


def test_every_operation_declares_the_errors_it_can_answer_with_the_one_error_body(spec):
    error = {"$ref": "#/components/schemas/ErrorOutput"}
    for label, operation in _operations(spec):
        responses = operation["responses"]
        public = operation.get("security") == [{}] or {} in operation.get("security", [])
        expected = {"406", "429"} | (set() if public else {"401", "403"})
        assert expected <= set(responses), label
        if "{" in label:
            assert "404" in responses, label
        if operation.get("requestBody"):
            assert {"400", "413", "415"} <= set(responses), label
            assert list(operation["requestBody"]["content"]) == ["application/json"], label
        for code, response in responses.items():
            if code.startswith("4"):
                assert response["content"]["application/json"]["schema"] == error, (label, code)
        assert "Retry-After" in responses["429"]["headers"], label


def test_list_bounds_are_stated(spec):
    listing = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/orders"]["get"]["parameters"]}
    assert listing["limit"]["minimum"] == 1 and listing["limit"]["maximum"] == MAX_LIMIT
    assert listing["cursor"]["maxLength"] == MAX_CURSOR
    days = {p["name"]: p["schema"] for p in spec["paths"]["/api/v1/offers/{offer_id}/prices"]["get"]["parameters"]}
    assert (days["days"]["minimum"], days["days"]["maximum"]) == (1, 365)
    demands = spec["components"]["schemas"]["ProcurementInputRequest"]["properties"]["demands"]
    assert demands["minItems"] == 1 and demands["maxItems"] == 100


def test_a_topup_states_that_it_needs_an_idempotency_key(spec):
    header = next(p for p in spec["paths"]["/api/v1/billing/topups"]["post"]["parameters"] if p["in"] == "header")
    assert header["name"] == "Idempotency-Key" and header["required"] is True


@pytest.mark.parametrize(
    ("low", "high", "places"),
    [("0", "99999999", 6), ("0.000001", "99999999", 6), ("0.01", "8760", 2), ("5", "10000", 2), ("0.0001", "999", 4)],
)
def test_a_decimal_pattern_matches_exactly_the_amounts_in_bounds(low, high, places):
    low_d, high_d = Decimal(low), Decimal(high)
    pattern = re.compile(decimal_text_pattern(low_d, high_d, places))
    rng = random.Random(36)
    scale = Decimal(10) ** places
    edges = [low_d, high_d, low_d - 1 / scale, high_d + 1 / scale, Decimal(0), high_d - 1 / scale, low_d + 1 / scale]
    samples = [*edges, *(Decimal(rng.randint(0, int(high_d * scale) + 10)) / scale for _ in range(3000))]
    for value in samples:
        if value < 0:
            continue
        text = format(value.quantize(1 / scale), "f")
        assert bool(pattern.match(text)) == (low_d <= value <= high_d), text
    assert not pattern.match("") and not pattern.match(f"{low}0" * 20)


def test_a_whole_range_pattern_matches_exactly_the_range():
    for low, high in [(0, 9), (3, 8759), (1, 99998), (17, 23456)]:
        pattern = re.compile(f"^{whole_range_pattern(low, high)}$")
        assert [n for n in range(0, high + 30) if pattern.match(str(n))] == list(range(low, high + 1))


def test_every_answer_is_typed_field_by_field(spec):
    """No 2xx answer is a bare free-form object: each names a component or lists its properties, so a generated
    client gets a model, not a dict (issue 36)."""
    untyped = []
    for label, operation in _operations(spec):
        for code, response in operation["responses"].items():
            if not code.startswith("2"):
                continue
            for media, content in response.get("content", {}).items():
                schema = content.get("schema", {})
                if media == "application/json" and "$ref" not in schema and "properties" not in schema:
                    untyped.append((label, code))
    assert untyped == []


def test_an_orders_connection_and_boot_are_typed(spec):
    order = spec["components"]["schemas"]["OrderOutput"]["properties"]
    for field, component in [("connection", "ConnectionOutput"), ("boot", "BootOutput")]:
        assert order[field]["allOf"] == [{"$ref": f"#/components/schemas/{component}"}], field
        assert order[field]["nullable"] is True, field
