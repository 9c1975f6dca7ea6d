"""/api/v1/fleets: replicas of one launch configuration that the broker orders and ends to follow a scaling rule
(marketplace/fleets/). Each replica is an order the buyer can also read at /api/v1/orders.

The input serializers here describe the requests for the OpenAPI schema; the checking itself is the service's
(``marketplace.fleets.specs``), one validator that the storefront and the CLI share, so every surface refuses
with the same field names and words. ``/metrics`` is the one route a replica's workload calls: it takes the
fleet's own metrics token, not a buyer's API token, and opens that fleet's metrics and nothing else.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.exceptions import APIException, NotFound, ParseError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.selectors import latest_hashes
from marketplace.api import idempotency, pagination
from marketplace.api.launch import client_address
from marketplace.api.launch_schema import LaunchConfigurationField
from marketplace.api.schema import ERROR
from marketplace.api.tokens import request_organization
from marketplace.fleets import specs
from marketplace.fleets.policy import MAX_REPLICAS
from marketplace.fleets.selectors import (
    fleet_cost,
    fleet_decisions,
    fleet_for_metrics_token,
    fleet_get,
    fleet_list,
    fleet_replicas,
)
from marketplace.fleets.services import (
    FleetEnded,
    fleet_create,
    fleet_end,
    fleet_rule_json,
    fleet_update,
    metrics_url,
)
from marketplace.fleets.specs import FleetInvalid
from marketplace.fleets.telemetry import metric_record
from marketplace.matching.types import Profile, Tolerance
from marketplace.models import Fleet, FleetDecision, FleetState, Order, Organization
from marketplace.models.fleets import METRIC_VALUE_BOUND
from marketplace.numbers import DecimalSerializerField, FloatSerializerField, IntegerSerializerField
from marketplace.orders.selectors import BuyerPermission
from providers import gpu_names
from providers.types import PricingModel
from untrusted.jsonbody import bounded_json

# --- Inputs (for the schema; marketplace.fleets.specs checks them) ------------------------------------------------


class FleetDemandInput(serializers.Serializer):
    gpu_count = IntegerSerializerField(required=False, default=1, min_value=1, max_value=specs.MAX_GPUS_PER_REPLICA)
    gpu_models = serializers.ListField(
        child=serializers.ChoiceField(choices=gpu_names.SORTED), required=False, max_length=specs.MAX_GPU_MODELS
    )
    regions = serializers.ListField(
        child=serializers.RegexField(specs.REGION_PATTERN, max_length=64), required=False, max_length=specs.MAX_REGIONS
    )
    pricing_models = serializers.ListField(
        child=serializers.ChoiceField(choices=[p.value for p in PricingModel]), required=False, max_length=3
    )
    interruption_tolerance = serializers.ChoiceField(
        choices=[t.value for t in Tolerance], required=False, default=Tolerance.STATELESS.value
    )
    profile = serializers.ChoiceField(choices=[p.value for p in Profile], required=False, default="inference")
    min_gpu_memory_gb = IntegerSerializerField(required=False, default=0, min_value=0, max_value=1024)


class FleetScheduleWindowInput(serializers.Serializer):
    days = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=6), required=False)
    start = serializers.RegexField(specs.HHMM_PATTERN, help_text="HH:MM, UTC")
    end = serializers.RegexField(specs.HHMM_PATTERN, help_text="HH:MM, UTC; not after start runs past midnight")
    replicas = IntegerSerializerField(min_value=0, max_value=MAX_REPLICAS)


class FleetMetricInput(serializers.Serializer):
    name = serializers.RegexField(specs.METRIC_NAME_PATTERN, help_text="a Prometheus metric name")
    source = serializers.ChoiceField(choices=list(specs.METRIC_SOURCES), default="post")
    port = IntegerSerializerField(required=False, min_value=1, max_value=65535, help_text="prometheus: the port")
    path = serializers.RegexField(specs.PATH_PATTERN, required=False, default=specs.DEFAULT_METRIC_PATH)


class FleetRuleInput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["utilization", "metric", "schedule"])
    target = FloatSerializerField(
        required=False, default=60.0, min_value=0, max_value=specs.MAX_TARGET,
        help_text="per replica: GPU utilization in percent, or the metric's value",
    )  # fmt: skip
    tolerance = FloatSerializerField(required=False, default=0.1, min_value=0, max_value=0.9)
    window_s = IntegerSerializerField(required=False, default=300, min_value=30, max_value=specs.MAX_WINDOW_S)
    scale_out_cooldown_s = IntegerSerializerField(required=False, default=180, min_value=0, max_value=86400)
    scale_in_cooldown_s = IntegerSerializerField(required=False, default=600, min_value=0, max_value=86400)
    step_out = IntegerSerializerField(required=False, default=4, min_value=1, max_value=MAX_REPLICAS)
    step_in = IntegerSerializerField(required=False, default=2, min_value=1, max_value=MAX_REPLICAS)
    schedule = FleetScheduleWindowInput(many=True, required=False)
    metric = FleetMetricInput(required=False)


class FleetCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=specs.MAX_NAME)
    demand = FleetDemandInput(help_text="one replica's demand")
    max_price_per_gpu_hour = DecimalSerializerField(
        max_digits=10, decimal_places=4, min_value=Decimal("0.0001"), max_value=specs.MAX_PRICE_PER_GPU_HOUR
    )
    budget_usd = DecimalSerializerField(
        required=False, allow_null=True, max_digits=12, decimal_places=2, min_value=Decimal("0.01"),
        max_value=specs.MAX_BUDGET_USD, help_text="what every replica together may spend; absent: no budget",
    )  # fmt: skip
    min_replicas = IntegerSerializerField(required=False, default=0, min_value=0, max_value=MAX_REPLICAS)
    max_replicas = IntegerSerializerField(min_value=1, max_value=MAX_REPLICAS)
    rule = FleetRuleInput()
    launch = LaunchConfigurationField(required=False, help_text="every replica's launch configuration")


class FleetUpdateInput(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=specs.MAX_NAME)
    max_price_per_gpu_hour = DecimalSerializerField(
        required=False, max_digits=10, decimal_places=4, min_value=Decimal("0.0001"),
        max_value=specs.MAX_PRICE_PER_GPU_HOUR,
    )  # fmt: skip
    budget_usd = DecimalSerializerField(
        required=False, allow_null=True, max_digits=12, decimal_places=2, min_value=Decimal("0.01"),
        max_value=specs.MAX_BUDGET_USD,
    )  # fmt: skip
    min_replicas = IntegerSerializerField(required=False, min_value=0, max_value=MAX_REPLICAS)
    max_replicas = IntegerSerializerField(required=False, min_value=1, max_value=MAX_REPLICAS)
    rule = FleetRuleInput(required=False)


class FleetMetricPostInput(serializers.Serializer):
    name = serializers.CharField(max_length=128, help_text="the metric the fleet's rule reads")
    value = FloatSerializerField(min_value=-METRIC_VALUE_BOUND, max_value=METRIC_VALUE_BOUND)
    replica = serializers.UUIDField(required=False, help_text="the replica (its order id) that measured it")


# --- Outputs ------------------------------------------------------------------------------------------------------


class FleetReplicaOutput(serializers.Serializer):
    order = serializers.UUIDField()
    state = serializers.CharField()
    health = serializers.CharField()
    provider = serializers.CharField()
    instance_type = serializers.CharField()
    region = serializers.CharField()
    price_per_hour = serializers.CharField()
    created_at = serializers.DateTimeField()


class FleetOutput(serializers.Serializer):
    """What ``fleet_output`` writes. The metrics token appears once, in the answer that created the fleet."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
    demand = serializers.DictField()
    max_price_per_gpu_hour = serializers.CharField()
    budget_usd = serializers.CharField(allow_null=True)
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    desired = serializers.IntegerField()
    rule = serializers.DictField()
    replicas = FleetReplicaOutput(many=True, help_text="the live replicas")
    spent_usd = serializers.CharField()
    price_per_hour = serializers.CharField()
    budget_left_usd = serializers.CharField(allow_null=True)
    launch_sha256 = serializers.CharField()
    metrics_url = serializers.CharField()
    metrics_token = serializers.CharField(required=False, help_text="only in the answer that created the fleet")
    ledger_head = serializers.CharField()
    evaluated_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class FleetPageOutput(serializers.Serializer):
    results = FleetOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


class FleetDecisionOutput(serializers.Serializer):
    id = serializers.UUIDField()
    number = serializers.IntegerField()
    at = serializers.DateTimeField()
    action = serializers.CharField()
    desired = serializers.IntegerField()
    current = serializers.IntegerField()
    load = serializers.FloatField(allow_null=True)
    reason = serializers.CharField()
    placed = serializers.ListField(child=serializers.UUIDField())
    ended = serializers.ListField(child=serializers.UUIDField())
    price_per_hour = serializers.CharField()


class FleetDecisionPageOutput(serializers.Serializer):
    results = FleetDecisionOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


class FleetMetricOutput(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.FloatField()
    at = serializers.DateTimeField()


_CENT = Decimal("0.01")


def _replica_output(order: Order) -> dict[str, object]:
    return {
        "order": str(order.public_id),
        "state": order.state,
        "health": order.health,
        "provider": order.offer.account.kind,
        "instance_type": order.offer.instance_type,
        "region": order.offer.region,
        "price_per_hour": format(order.price_per_hour, "f"),
        "created_at": order.created_at.isoformat(),
    }


def fleet_output(fleet: Fleet, heads: dict[str, str] | None = None) -> dict[str, object]:
    subject = f"fleet:{fleet.public_id}"
    if heads is None:
        heads = latest_hashes([subject])
    cost = fleet_cost(fleet=fleet, now=timezone.now())
    return {
        "id": str(fleet.public_id),
        "name": fleet.name,
        "state": fleet.state,
        "state_reason": fleet.state_reason,
        "demand": fleet.demand,
        "max_price_per_gpu_hour": format(fleet.max_price_per_gpu_hour, "f"),
        "budget_usd": None if fleet.budget_usd is None else format(fleet.budget_usd, "f"),
        "min_replicas": fleet.min_replicas,
        "max_replicas": fleet.max_replicas,
        "desired": fleet.desired,
        "rule": fleet_rule_json(fleet),
        "replicas": [_replica_output(o) for o in fleet_replicas(fleet=fleet, live=True)],
        "spent_usd": format(cost.spent_usd.quantize(Decimal("0.000001")), "f"),
        "price_per_hour": format(cost.price_per_hour, "f"),
        "budget_left_usd": None
        if cost.budget_left is None
        else format(cost.budget_left.quantize(Decimal("0.01")), "f"),
        "launch_sha256": fleet.launch_config.sha256,
        "metrics_url": metrics_url(fleet.public_id),
        "ledger_head": heads.get(subject, ""),
        "evaluated_at": None if fleet.evaluated_at is None else fleet.evaluated_at.isoformat(),
        "created_at": fleet.created_at.isoformat(),
    }


def _decision_output(decision: FleetDecision) -> dict[str, object]:
    return {
        "id": str(decision.public_id),
        "number": decision.number,
        "at": decision.at.isoformat(),
        "action": decision.action,
        "desired": decision.desired,
        "current": decision.current,
        "load": decision.load,
        "reason": decision.reason,
        "placed": decision.placed,
        "ended": decision.ended,
        "price_per_hour": format(decision.price_per_hour, "f"),
    }


def _fleet_or_404(request: Request, fleet_id: str, permission: BuyerPermission = BuyerPermission.READ) -> Fleet:
    fleet = fleet_get(organization=request_organization(request, permission), public_id=fleet_id)
    if fleet is None:
        raise NotFound("no such fleet")
    return fleet


def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FleetInvalid({"non_field_errors": "the body is a JSON object"})
    return data


# --- Views --------------------------------------------------------------------------------------------------------


class FleetListCreateApi(APIView):
    """GET lists the caller's fleets; POST creates one (``Idempotency-Key`` makes a retry return it again)."""

    required_scopes = {"GET": ("orders:place", "instances:manage"), "POST": ("orders:place",)}

    @extend_schema(operation_id="fleets_list", parameters=pagination.PARAMETERS, responses={200: FleetPageOutput})
    def get(self, request: Request) -> Response:
        organization: Organization = request_organization(request)
        fleets = fleet_list(organization=organization).order_by("-id")
        page = pagination.paginate(
            request, fleets, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("fleets")
        )
        heads = latest_hashes(f"fleet:{f.public_id}" for f in page.rows)
        return Response(page.body(request, [fleet_output(f, heads) for f in page.rows]))

    @extend_schema(
        request=FleetCreateInput,
        parameters=[idempotency.PARAMETER],
        responses={200: FleetOutput, 201: FleetOutput, 400: ERROR, 409: ERROR},
    )
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.ORDER)
        created = fleet_create(
            organization=organization,
            user=request.user,
            data=_object(request.data),
            idempotency_key=idempotency.idempotency_key(request),
            caller_address=client_address(request),
        )
        body = fleet_output(created.fleet)
        if created.metrics_token is not None:
            body["metrics_token"] = created.metrics_token
        response = Response(body, status=status.HTTP_201_CREATED if created.created else status.HTTP_200_OK)
        if not created.created:
            response["Idempotent-Replayed"] = "true"
        return response


class FleetDetailApi(APIView):
    """GET the fleet; PATCH its name, bounds, rule, price cap or budget (it evaluates again at once)."""

    required_scopes = {"GET": ("orders:place", "instances:manage"), "PATCH": ("orders:place",)}

    @extend_schema(responses={200: FleetOutput, 404: ERROR})
    def get(self, request: Request, fleet_id: str) -> Response:
        return Response(fleet_output(_fleet_or_404(request, fleet_id)))

    @extend_schema(request=FleetUpdateInput, responses={200: FleetOutput, 400: ERROR, 404: ERROR, 409: ERROR})
    def patch(self, request: Request, fleet_id: str) -> Response:
        fleet = _fleet_or_404(request, fleet_id, BuyerPermission.ORDER)
        return Response(fleet_output(fleet_update(fleet=fleet, data=_object(request.data))))


class FleetEndApi(APIView):
    """POST /api/v1/fleets/<id>/end: terminate every replica and place no more; idempotent, 202 while they stop."""

    required_scopes = {"POST": ("orders:place", "instances:manage")}

    @extend_schema(request=None, responses={202: FleetOutput, 404: ERROR})
    def post(self, request: Request, fleet_id: str) -> Response:
        fleet = _fleet_or_404(request, fleet_id, BuyerPermission.ORDER)
        return Response(fleet_output(fleet_end(fleet=fleet)), status=status.HTTP_202_ACCEPTED)


class FleetDecisionListApi(APIView):
    """Every scaling decision of the fleet, newest first: what it did and why."""

    required_scopes = {"GET": ("orders:place", "instances:manage")}

    @extend_schema(parameters=pagination.PARAMETERS, responses={200: FleetDecisionPageOutput, 404: ERROR})
    def get(self, request: Request, fleet_id: str) -> Response:
        fleet = _fleet_or_404(request, fleet_id)
        decisions = fleet_decisions(fleet=fleet).order_by("-id")
        page = pagination.paginate(
            request,
            decisions,
            keys=[pagination.Key("id", descending=True)],
            tag=pagination.listing_tag("fleet-decisions", fleet.pk),
        )
        return Response(page.body(request, [_decision_output(d) for d in page.rows]))


class MetricJSONParser(JSONParser):
    """A metric post is a few dozen bytes: at most ``MAX_BYTES`` of JSON, nested at most 2 deep."""

    MAX_BYTES = 1024

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        raw = stream.read(self.MAX_BYTES + 1) if stream is not None else b""
        if len(raw) > self.MAX_BYTES:
            raise ParseError(f"JSON parse error - a metric is at most {self.MAX_BYTES} bytes")
        try:
            return bounded_json(raw.decode("utf-8"), max_bytes=self.MAX_BYTES, max_depth=2)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


class MetricsTokenMissing(APIException):
    # Not DRF's NotAuthenticated: a view without authenticators would answer that as a 403.
    status_code = status.HTTP_401_UNAUTHORIZED
    default_code = "token_missing"
    default_detail = "send the fleet's metrics token: 'Authorization: Bearer fmt_…'"


class FleetMetricsApi(APIView):
    """POST one value of the fleet's metric, from its workload: ``Authorization: Bearer fmt_…``, the fleet's
    metrics token (its replicas have it as ``BROKER_FLEET_METRICS_TOKEN``). Any other token, or another fleet's,
    answers 404 as an unknown fleet does."""

    authentication_classes: list[type] = []
    permission_classes = [permissions.AllowAny]
    parser_classes = [MetricJSONParser]

    @extend_schema(
        request=FleetMetricPostInput,
        parameters=[OpenApiParameter("Authorization", str, OpenApiParameter.HEADER, description="Bearer fmt_…")],
        responses={201: FleetMetricOutput, 400: ERROR, 401: ERROR, 404: ERROR, 409: ERROR, 429: ERROR},
    )
    def post(self, request: Request, fleet_id: str) -> Response:
        header = request.headers.get("Authorization", "")
        scheme, _, raw = header.partition(" ")
        if not header:
            raise MetricsTokenMissing()
        fleet = None
        if scheme == "Bearer" and raw.startswith("fmt_") and len(raw) <= 100:
            fleet = fleet_for_metrics_token(public_id=fleet_id, raw_token=raw.strip())
        if fleet is None:
            raise NotFound("no such fleet")
        if fleet.state != FleetState.ACTIVE:
            raise FleetEnded(f"fleet {fleet.public_id} has ended")
        data = _object(request.data)
        unknown = sorted(str(k)[:40] for k in set(data) - {"name", "value", "replica"})
        if unknown:
            raise FleetInvalid({name: "not a field of a metric" for name in unknown})
        sample = metric_record(
            fleet=fleet, name=data.get("name"), value=data.get("value"), replica=data.get("replica"), now=timezone.now()
        )
        body = {"name": sample.name, "value": sample.value, "at": sample.at.isoformat()}
        return Response(body, status=status.HTTP_201_CREATED)
