"""The AWS sandbox: moto's EC2 emulator, in-process, behind a thin WSGI layer that adds what moto lacks.

What the layer adds (everything else is moto):

- the Price List API (``AWSPriceListService.GetProducts``, JSON protocol) answered from the seed CSV, with
  TERM_MATCH filters (refused past AWS's documented lengths), ``MaxResults``/``NextToken`` pagination and
  ``PriceList`` items as JSON strings; ``restate_on_demand`` states a price in another unit or currency;
- ``DescribeSpotPriceHistory`` from seeded per-zone spot prices with a short deterministic history;
- ``RunInstances`` idempotency on ``ClientToken`` per region (moto creates a new instance every time), and
  ``SpotMaxPriceTooLow`` when a spot ``MaxPrice`` is below the zone's price;
- injectable faults (``sandbox.faults``) and credential rejection: a key id the sandbox does not know
  (``aws_keys.KNOWN_KEYS``, or an explicit allow-list) is refused as AWS refuses it, ``AuthFailure`` on EC2 and
  ``UnrecognizedClientException`` on the JSON services (Price List, Systems Manager);
- per-zone offerings so every seeded (region, type) is offered in at least two zones, including the zone
  its seed spot price was observed in;
- what a booted launch needs (``sandboxes/aws/launch.py``): the refusals EC2 answers that moto lets
  through (user data over 16 KB, unknown AMI or key pair, root volume sizes, 60 inbound rules per address
  family, a security group still in use), Systems Manager's public parameter naming the region's Deep
  Learning AMI, ``image_missing`` faults on every image lookup, and booting each launched instance from its
  user data (``self.booter``), halting it when it is terminated;
- EC2's limit of 200 filter values in one call (``FilterLimitExceeded``), which moto does not enforce;
- placement groups (``sandboxes/aws/placement.py``): ``CreatePlacementGroup``,
  ``DescribePlacementGroups``, ``DeletePlacementGroup``, and ``RunInstances`` into ``Placement.GroupName`` under
  EC2's rules (an unknown group, a cluster group in use in another zone).

Use in-process: ``sandbox = start_aws_sandbox()``; point boto3 (or ``AwsAdapter``) at ``sandbox.url`` for
``ec2``, ``ssm`` and ``pricing``; ``sandbox.reset()`` between tests. Standalone: ``python -m sandboxes
serve``. Moto's state is process-global, so run one ``AwsSandbox`` per process.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import re
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

from moto.ec2.models import ec2_backends
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.wrappers import Request, Response

from sandboxes.aws import launch as aws_launch
from sandboxes.aws.catalogue import SEED_PATH, ensure_offered, load_seed, price_product, vary
from sandboxes.aws.keys import KNOWN_KEYS
from sandboxes.aws.placement import ACTIONS as PLACEMENT_ACTIONS
from sandboxes.aws.placement import PlacementGroups
from sandboxes.faults import IMAGE_ACTION, OUTCOME_KINDS, TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
PRICING_TARGET = "AWSPriceListService."
SSM_TARGET = "AmazonSSM."
SPOT_PRODUCT = "Linux/UNIX"
SPOT_HISTORY_AGES_H = (0, 5, 13, 29)
PRICING_MAX_RESULTS = 100
# Filter.Field and Filter.Value: strings of 1 to 1024 characters; at most 50 filters (Price List API
# reference, Filter, https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_Filter.html,
# and botocore's pricing service model). botocore checks only the minimum; AWS refuses the rest.
PRICING_FILTER_TEXT_MAX = 1024
PRICING_FILTERS_MAX = 50
SPOT_MAX_RESULTS = 1000
_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_INDEXED = re.compile(r"^InstanceType\.\d+$")
_FILTER_NAME = re.compile(r"^Filter\.(\d+)\.Name$")
_FILTER_VALUE = re.compile(r"^Filter\.\d+\.Value\.\d+$")
# EC2 refuses a call with more filter values than this, across its filters: FilterLimitExceeded ("The request
# uses too many filters or too many filter values", Error codes for the Amazon EC2 API,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), in the words of EC2's answer
# "The maximum number of filter values specified on a single call is 200". moto accepts any number.
FILTER_VALUES_MAX = 200


# What each fault kind looks like on the EC2 wire: (code, HTTP status, message template).
EC2_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.CAPACITY: (
        "InsufficientInstanceCapacity",
        500,
        "We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested "
        "({zone}). Our system will be working on provisioning additional capacity.",
    ),
    FaultKind.QUOTA: (
        "VcpuLimitExceeded",
        400,
        "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance "
        "bucket that the specified instance type belongs to.",
    ),
    FaultKind.THROTTLE: ("RequestLimitExceeded", 503, "Request limit exceeded."),
    # An access key EC2 has no record of ("Error codes for the Amazon EC2 API", AuthFailure,
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
    FaultKind.CREDENTIALS: ("AuthFailure", 401, "AWS was not able to validate the provided access credentials"),
}
PRICING_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.THROTTLE: ("ThrottlingException", 400, "Rate exceeded"),
    # The JSON-protocol services' answer to an unknown key ("The most likely cause is an AWS access key ID or
    # secret key that's not valid", botocore reference, UnrecognizedClientException,
    # https://docs.aws.amazon.com/botocore/latest/reference/services/logs/client/exceptions/UnrecognizedClientException.html).
    FaultKind.CREDENTIALS: (
        "UnrecognizedClientException",
        400,
        "The security token included in the request is invalid.",
    ),
}
# Systems Manager speaks the same JSON protocol as the Price List API and refuses a bad key the same way.
SSM_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.THROTTLE: ("ThrottlingException", 400, "Rate exceeded"),
    FaultKind.CREDENTIALS: PRICING_FAULTS[FaultKind.CREDENTIALS],
}
CODE_STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InternalError": 500,
    "Unavailable": 503,
    "RequestLimitExceeded": 503,
    "AuthFailure": 401,
    "UnauthorizedOperation": 403,
}

# Catalogue reads whose answers never change for a given request: served from a cache after the first call.
STATIC_ACTIONS = frozenset({"DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeRegions"})


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as moto holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    lifecycle: str
    client_token: str
    tags: dict[str, str]


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    service: str
    action: str
    region: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None
    # The instances the request names, as InstanceId.N or as values of an ``instance-id`` filter.
    instance_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Stored:
    fingerprint: tuple[tuple[str, str], ...]
    status: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(slots=True)
class _Request:
    service: str
    action: str
    region: str
    access_key: str
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


def _request_id() -> str:
    return str(uuid.uuid4())


def _ec2_error(code: str, message: str, status: int) -> Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{_request_id()}</RequestID></Response>"
    )
    return Response(body, status=status, mimetype="text/xml")


def _json_error(code: str, message: str, status: int) -> Response:
    body = json.dumps({"__type": code, "message": message})
    return Response(body, status=status, content_type="application/x-amz-json-1.1")


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _filters_refusal(filters: Any) -> str | None:
    """The refusal, worded as AWS words its request validation errors, of GetProducts ``Filters`` outside the
    documented lengths; None when they are within them."""
    if not isinstance(filters, list):
        return "1 validation error detected: Value at 'filters' failed to satisfy constraint: Member must be a list"
    if len(filters) > PRICING_FILTERS_MAX:
        return (
            f"1 validation error detected: Value at 'filters' failed to satisfy constraint: Member must have "
            f"length less than or equal to {PRICING_FILTERS_MAX}"
        )
    for position, item in enumerate(filters, start=1):
        for name in ("Field", "Value"):
            text = str(item.get(name, "")) if isinstance(item, dict) else ""
            if len(text) > PRICING_FILTER_TEXT_MAX:
                return (
                    f"1 validation error detected: Value '{text[:40]}...' at 'filters.{position}.member."
                    f"{name.lower()}' failed to satisfy constraint: Member must have length less than or equal "
                    f"to {PRICING_FILTER_TEXT_MAX}"
                )
    return None


def _named_instances(params: dict[str, str]) -> tuple[str, ...]:
    """The instance ids an EC2 query names: ``InstanceId.N`` and the values of an ``instance-id`` filter."""
    named = [v for k, v in params.items() if k.startswith("InstanceId.")]
    for key, name in params.items():
        match = _FILTER_NAME.match(key)
        if match and name == "instance-id":
            prefix = f"Filter.{match.group(1)}.Value."
            named.extend(v for k, v in params.items() if k.startswith(prefix))
    return tuple(named)


def _encode_token(offset: int, query: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "q": query}).encode()).decode()


def _decode_token(token: str, query: str) -> int:
    """The offset in ``token``; ValueError if it is not one this sandbox issued for the same query."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset = int(data["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("invalid NextToken") from exc
    if data.get("q") != query or offset < 0:
        raise ValueError("NextToken does not belong to this query")
    return offset


# --------------------------------------------------------------------------------------------- sandbox


class AwsSandbox(SandboxApp):
    """The AWS sandbox WSGI app. ``start()`` serves it; ``faults`` injects failures; ``reset()`` forgets state."""

    kind = "aws"

    def __init__(self, seed_path: Path = SEED_PATH):
        super().__init__(FaultRegistry(default_action="RunInstances"))
        self.seed = load_seed(seed_path)
        self._seed_by_key = {(r.region, r.instance_type): r for r in self.seed}
        self._static_cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[bytes, str, list[tuple[str, str]]]] = {}
        self._zones = ensure_offered(self.seed)
        self._spot = self._seed_spot_prices()
        self._products = [
            price_product(row, status, price)
            for row in self.seed
            for status, price in (
                ("Used", row.on_demand),
                # Same rate, other capacity states: the filters the broker sends must pick "Used".
                ("UnusedCapacityReservation", row.on_demand),
                ("AllocatedCapacityReservation", Decimal(0)),
            )
        ]
        self._moto = DomainDispatcherApplication(create_backend_app)
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, str], _Stored] = {}
        self._token_locks: dict[tuple[str, str], threading.Lock] = {}
        self._dirty_regions: set[str] = set()
        self._valid_keys: frozenset[str] | None = None
        self._restated: dict[tuple[str, str], tuple[str, str]] = {}
        self.placement_groups = PlacementGroups()

    def _seed_spot_prices(self) -> dict[tuple[str, str, str], Decimal]:
        prices: dict[tuple[str, str, str], Decimal] = {}
        for row in self.seed:
            if row.spot is None:
                continue
            zone_ids = {z.name: z.zone_id for z in RegionsAndZonesBackend.zones.get(row.region, [])}
            for zone in self._zones[(row.region, row.instance_type)]:
                if zone_ids.get(zone) == row.spot_zone_id:
                    price = row.spot
                else:
                    price = vary(row.spot, f"{row.instance_type}/{zone}", row.on_demand, 8)
                prices[(row.region, row.instance_type, zone)] = price
        return prices

    # -------------------------------------------------------------------------------- public helpers

    def zones(self, region: str, instance_type: str) -> list[str]:
        """The zones a seeded type is offered in (at least two)."""
        return list(self._zones.get((region, instance_type), []))

    def spot_price(self, region: str, instance_type: str, zone: str) -> Decimal | None:
        """The current seeded spot price of a zone (the newest point of its history)."""
        return self._spot.get((region, instance_type, zone))

    def on_demand_price(self, region: str, instance_type: str) -> Decimal | None:
        row = self._seed_by_key.get((region, instance_type))
        return row.on_demand if row else None

    def restate_on_demand(self, region: str, instance_type: str, *, unit: str = "Hrs", currency: str = "USD") -> None:
        """Until ``reset()``, the Price List states this type's on-demand price per ``unit`` in ``currency``
        (same figure): how AWS states a price the broker must not read as USD per hour, e.g. CNY in its
        China regions."""
        with self._lock:
            self._restated[(region, instance_type)] = (unit, currency)

    def accept_access_keys(self, access_key_ids: Iterable[str] | None) -> None:
        """Accept only these access key ids (AuthFailure for others); None restores the default: the keys of
        ``aws_keys.KNOWN_KEYS``."""
        with self._lock:
            self._valid_keys = frozenset(access_key_ids) if access_key_ids is not None else None

    def key_accepted(self, access_key_id: str) -> bool:
        with self._lock:
            valid = self._valid_keys
        return access_key_id in (KNOWN_KEYS if valid is None else valid)

    def instances(self, region: str | None = None) -> list[SandboxInstance]:
        """Every instance moto holds (any state), optionally in one region."""
        found: list[SandboxInstance] = []
        for account_id in list(ec2_backends.keys()):
            regional = ec2_backends[account_id]
            for region_name in list(regional.keys()):
                if region is not None and region_name != region:
                    continue
                backend = regional[region_name]
                for reservation in list(backend.reservations.values()):
                    for inst in reservation.instances:
                        tags = {t["key"]: t["value"] for t in inst.get_tags()}
                        found.append(
                            SandboxInstance(
                                instance_id=inst.id,
                                region=region_name,
                                zone=str(inst.availability_zone),
                                instance_type=inst.instance_type,
                                state=inst.state,
                                lifecycle=inst.lifecycle or "on-demand",
                                client_token=inst.client_token or "",
                                tags=tags,
                            )
                        )
        return sorted(found, key=lambda i: (i.region, i.instance_id))

    def reset(self) -> None:
        self.faults.clear()
        self.booter.reset()
        self.placement_groups.reset()
        with self._lock:
            self._tokens.clear()
            self._token_locks.clear()
            self.clear_calls()
            self._valid_keys = None
            self._restated.clear()
            dirty, self._dirty_regions = self._dirty_regions, set()
        for account_id in list(ec2_backends.keys()):
            regional = ec2_backends[account_id]
            for region_name in list(regional.keys()):
                # Instances count too: another AwsSandbox in this process shares moto's state, not our dirty set.
                if region_name in dirty or regional[region_name].reservations:
                    regional[region_name].reset()

    def control_extra(self, request: Request, route: str) -> Response | None:
        if route == "credentials" and request.method in ("PUT", "POST"):
            body = request.get_json(force=True, silent=True) or {}
            keys = body.get("valid_access_key_ids")
            self.accept_access_keys(keys if keys is None else [str(k) for k in keys])
            return json_response({"valid_access_key_ids": keys})
        if route == "calls" and request.method == "GET":
            return json_response({"calls": [[c.service, c.action, c.region] for c in self.calls()]})
        if route == "instances" and request.method == "GET":
            return json_response(
                {
                    "instances": [
                        {"instance_id": i.instance_id, "region": i.region, "state": i.state} for i in self.instances()
                    ]
                }
            )
        return None

    # -------------------------------------------------------------------------------------- routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO", "")).startswith("/moto-api"):
            # moto's own reset would bypass the layer's token store; one reset path keeps them consistent.
            response = json_response({"error": "use /_sandbox/reset and /_sandbox/faults"}, status=404)
            return response(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        request = self._parse(environ, body)
        with self._lock:
            named = _named_instances(request.params)
            self.record_call(
                Call(request.service, request.action, request.region, request.instance_types, request.zone, named)
            )
        if request.service == "pricing":
            response = self._pricing(request)
        elif request.service == "ssm":
            response = self._ssm(environ, request)
        else:
            response = self._ec2(environ, request)
        return response(environ, start_response)

    def _parse(self, environ: WSGIEnviron, body: bytes) -> _Request:
        scope = _SCOPE.search(str(environ.get("HTTP_AUTHORIZATION", "")))
        access_key, region, service = scope.groups() if scope else ("", "us-east-1", "")
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        if target.startswith(SSM_TARGET):
            try:
                ssm_payload = json.loads(body or b"{}")
            except ValueError:
                ssm_payload = {}
            ssm_payload = ssm_payload if isinstance(ssm_payload, dict) else {}
            return _Request("ssm", target[len(SSM_TARGET) :], region, access_key, body, {}, ssm_payload)
        if target.startswith(PRICING_TARGET):
            try:
                payload = json.loads(body or b"{}")
            except ValueError:
                payload = {}
            payload = payload if isinstance(payload, dict) else {}
            priced_types = tuple(
                str(f.get("Value"))
                for f in payload.get("Filters") or []
                if isinstance(f, dict) and str(f.get("Field", "")).lower() == "instancetype"
            )
            action = target[len(PRICING_TARGET) :]
            return _Request("pricing", action, region, access_key, body, {}, payload, priced_types)
        raw = body.decode("utf-8", "replace") or str(environ.get("QUERY_STRING", ""))
        params = {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}
        types = [v for k, v in params.items() if k == "InstanceType" or _INDEXED.match(k)]
        for key, name in params.items():
            match = _FILTER_NAME.match(key)
            if match and name == "instance-type":
                prefix = f"Filter.{match.group(1)}.Value."
                types.extend(v for k, v in params.items() if k.startswith(prefix))
        zone = params.get("Placement.AvailabilityZone") or params.get("AvailabilityZone") or None
        return _Request(
            service or "ec2", params.get("Action", ""), region, access_key, body, params, {}, tuple(types), zone
        )

    def _fault_response(
        self, fault: Fault, request: _Request, table: dict[FaultKind, tuple[str, int, str]]
    ) -> Response:
        code, status, template = table.get(fault.kind, EC2_FAULTS[fault.kind])
        if fault.code:
            code, status, template = fault.code, CODE_STATUS.get(fault.code, status), f"Sandbox fault {fault.code}."
        message = template.format(instance_type=",".join(request.instance_types) or "-", zone=request.zone or "-")
        if table is not EC2_FAULTS:
            return _json_error(code, message, status)
        return _ec2_error(code, message, status)

    def _transport_fault(self, request: _Request) -> Fault | None:
        fault = self.faults.take(request.action, request.instance_types, request.zone, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(
                request.action, request.instance_types, request.zone, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        return fault

    # ------------------------------------------------------------------------------------------- EC2

    def _ec2(self, environ: WSGIEnviron, request: _Request) -> Response:
        if not self.key_accepted(request.access_key):
            return _ec2_error("AuthFailure", EC2_FAULTS[FaultKind.CREDENTIALS][2], 401)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, EC2_FAULTS)
        if request.action == "DescribeSpotPriceHistory":
            return self._spot_history(request)
        if request.action == "RunInstances":
            return self._run_instances(environ, request)
        if request.action in PLACEMENT_ACTIONS:
            answer = self.placement_groups.answer(request.action, request.region, request.params)
            if len(answer) == 3:
                return _ec2_error(*answer)
            return Response(answer[0], status=answer[1], mimetype="text/xml")
        refusal = self._boot_refusal(request)
        if refusal is not None:
            return _ec2_error(*refusal)
        values = sum(1 for key in request.params if _FILTER_VALUE.match(key))
        if values > FILTER_VALUES_MAX:
            message = f"The maximum number of filter values specified on a single call is {FILTER_VALUES_MAX}"
            return _ec2_error("FilterLimitExceeded", message, 400)
        response = self._forward(environ, request)
        if request.action == "TerminateInstances" and response.status_code == 200:
            for instance_id in aws_launch.terminated_ids(request.params):
                self.booter.halt(instance_id)
        return response

    def _boot_refusal(self, request: _Request) -> aws_launch.Refusal | None:
        """EC2's refusals that moto does not make, for the requests a booted launch and its release send."""
        params = request.params
        if request.action == "DescribeImages":
            image_ids = aws_launch.indexed(params, "ImageId")
            if image_ids and self._image_missing(request):
                return ("InvalidAMIID.NotFound", f"The image id '[{', '.join(image_ids)}]' does not exist", 400)
        if request.action == "AuthorizeSecurityGroupIngress":
            return aws_launch.ingress_refusal(request.region, params)
        if request.action == "DeleteSecurityGroup" and params.get("GroupId"):
            return aws_launch.group_in_use(request.region, params["GroupId"])
        return None

    def _image_missing(self, request: _Request) -> bool:
        """An ``image_missing`` fault for this lookup: the region then has no such image."""
        fault = self.faults.take(
            IMAGE_ACTION, request.instance_types, request.zone, kinds={FaultKind.IMAGE_MISSING}, region=request.region
        )
        return fault is not None

    def _forward(self, environ: WSGIEnviron, request: _Request) -> Response:
        cache_key = None
        if request.action in STATIC_ACTIONS:
            # moto rebuilds its fixed catalogue on every call (~0.7 s a region); the real API answers fast.
            cache_key = (request.region, tuple(sorted((k, v) for k, v in request.params.items())))
            with self._lock:
                cached = self._static_cache.get(cache_key)
            if cached is not None:
                return Response(cached[0], status=cached[1], headers=cached[2])
        response = self._forward_to_moto(environ, request)
        if cache_key is not None and response.status_code == 200:
            with self._lock:
                self._static_cache[cache_key] = (response.get_data(), response.status, list(response.headers.items()))
        return response

    def _forward_to_moto(self, environ: WSGIEnviron, request: _Request) -> Response:
        env = dict(environ)
        env["wsgi.input"] = io.BytesIO(request.body)
        env["CONTENT_LENGTH"] = str(len(request.body))
        captured: dict[str, Any] = {}
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return chunks.append

        result = self._moto(env, start_response)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not request.action.startswith(("Describe", "Get", "List")):
            with self._lock:
                self._dirty_regions.add(request.region)
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        return Response(b"".join(chunks), status=captured["status"], headers=headers)

    def _run_instances(self, environ: WSGIEnviron, request: _Request) -> Response:
        token = request.params.get("ClientToken", "")
        if not token:
            return self._outcome(request) or self._booted(request, self._forward(environ, request))
        key = (request.region, token)
        fingerprint = tuple(sorted((k, v) for k, v in request.params.items() if k != "ClientToken"))
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first and then gets its answer.
        with token_lock:
            with self._lock:
                stored = self._tokens.get(key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    return _ec2_error(
                        "IdempotentParameterMismatch",
                        "Arguments on this idempotent request are inconsistent with arguments used in previous "
                        "request(s).",
                        400,
                    )
                return Response(stored.body, status=stored.status, headers=stored.headers)
            response = self._outcome(request)
            if response is not None:
                return response
            response = self._forward(environ, request)
            if response.status_code == 200:
                with self._lock:
                    self._tokens[key] = _Stored(
                        fingerprint, response.status, list(response.headers.items()), response.get_data()
                    )
            return self._booted(request, response)

    def _booted(self, request: _Request, response: Response) -> Response:
        """moto's instances run as soon as they exist: each joins the placement group its launch named, and
        boots from the user data its launch carried."""
        if response.status_code != 200:
            return response
        group = request.params.get("Placement.GroupName")
        if group:
            launched = aws_launch.launched_instance_ids(response.get_data())
            self.placement_groups.joined(request.region, group, launched)
        user_data = aws_launch.decoded_user_data(request.params)
        instance_type = request.params.get("InstanceType", "")
        for instance_id in aws_launch.launched_instance_ids(response.get_data()):
            self.booter.boot(
                instance_id=instance_id,
                user_data=user_data,
                gpus=aws_launch.instance_gpus(instance_type),
                instance_type=instance_type,
                zone=aws_launch.instance_zone(request.region, instance_id),
            )
        return response

    def _outcome(self, request: _Request) -> Response | None:
        """EC2's parameter refusals, then capacity/quota faults and the spot price check: what AWS decides after
        accepting the request."""
        image_missing = bool(request.params.get("ImageId")) and self._image_missing(request)
        refusal = aws_launch.run_instances_refusal(request.region, request.params, image_missing)
        refusal = refusal or self.placement_groups.launch_refusal(request.region, request.params)
        if refusal is not None:
            return _ec2_error(*refusal)
        fault = self.faults.take(request.action, request.instance_types, request.zone, kinds=OUTCOME_KINDS)
        if fault is not None:
            return self._fault_response(fault, request, EC2_FAULTS)
        if request.params.get("InstanceMarketOptions.MarketType") == "spot":
            max_price = request.params.get("InstanceMarketOptions.SpotOptions.MaxPrice")
            current = self._spot.get((request.region, request.params.get("InstanceType", ""), request.zone or ""))
            if max_price and current is not None and Decimal(max_price) < current:
                return _ec2_error(
                    "SpotMaxPriceTooLow",
                    f"Your Spot request price of {max_price} is lower than the minimum required Spot request "
                    f"fulfillment price of {current}.",
                    400,
                )
        return None

    def _spot_history(self, request: _Request) -> Response:
        params = request.params
        try:
            start = _parse_time(params.get("StartTime"))
            now = datetime.now(UTC)
            end = _parse_time(params.get("EndTime")) or now
            max_results = int(params.get("MaxResults") or SPOT_MAX_RESULTS)
        except ValueError as exc:
            return _ec2_error("InvalidParameterValue", str(exc), 400)
        if not 1 <= max_results <= SPOT_MAX_RESULTS:
            return _ec2_error("InvalidParameterValue", f"MaxResults must be between 1 and {SPOT_MAX_RESULTS}", 400)
        # Each constraint is (field, allowed values); a point must pass all of them.
        constraints: list[tuple[str, set[str]]] = []
        if types := {v for k, v in params.items() if _INDEXED.match(k)}:
            constraints.append(("instance-type", types))
        if products := {v for k, v in params.items() if k.startswith("ProductDescription.")}:
            constraints.append(("product-description", products))
        if params.get("AvailabilityZone"):
            constraints.append(("availability-zone", {params["AvailabilityZone"]}))
        for key, name in params.items():
            match = _FILTER_NAME.match(key)
            if not match:
                continue
            if name not in ("instance-type", "product-description", "availability-zone"):
                return _ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid", 400)
            prefix = f"Filter.{match.group(1)}.Value."
            constraints.append((name, {v for k, v in params.items() if k.startswith(prefix)}))

        anchor = now.replace(minute=0, second=0, microsecond=0)
        points: list[tuple[datetime, str, str, Decimal]] = []
        for (region, instance_type, zone), current in self._spot.items():
            fields = {"instance-type": instance_type, "product-description": SPOT_PRODUCT, "availability-zone": zone}
            if region != request.region or not all(fields[name] in allowed for name, allowed in constraints):
                continue
            ceiling = self._seed_by_key[(region, instance_type)].on_demand
            history = [
                (
                    anchor - timedelta(hours=age),
                    current if age == 0 else vary(current, f"{instance_type}/{zone}/{age}", ceiling, 4),
                )
                for age in SPOT_HISTORY_AGES_H
            ]
            in_window = [(ts, p) for ts, p in history if ts <= end and (start is None or ts >= start)]
            # Like AWS, a window that starts after the last change still reports the price in effect at its start.
            before = [(ts, p) for ts, p in history if start is not None and ts < start]
            if before:
                in_window.append(max(before))
            points.extend((ts, instance_type, zone, price) for ts, price in in_window)
        points.sort(key=lambda p: (-p[0].timestamp(), p[1], p[2]))
        return self._spot_page(points, params, max_results)

    def _spot_page(
        self,
        points: list[tuple[datetime, str, str, Decimal]],
        params: dict[str, str],
        max_results: int,
    ) -> Response:
        query = json.dumps(sorted((k, v) for k, v in params.items() if k not in ("NextToken", "MaxResults")))
        try:
            offset = _decode_token(params["NextToken"], query) if params.get("NextToken") else 0
        except ValueError as exc:
            return _ec2_error("InvalidNextToken", str(exc), 400)
        page = points[offset : offset + max_results]
        next_token = _encode_token(offset + max_results, query) if offset + max_results < len(points) else ""
        items = "".join(
            "<item>"
            f"<instanceType>{escape(instance_type)}</instanceType>"
            f"<productDescription>{SPOT_PRODUCT}</productDescription>"
            f"<spotPrice>{price:.6f}</spotPrice>"
            f"<timestamp>{ts.strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{escape(zone)}</availabilityZone>"
            "</item>"
            for ts, instance_type, zone, price in page
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<DescribeSpotPriceHistoryResponse xmlns="{EC2_XMLNS}">'
            f"<requestId>{_request_id()}</requestId>"
            f"<spotPriceHistorySet>{items}</spotPriceHistorySet>"
            f"<nextToken>{escape(next_token)}</nextToken>"
            "</DescribeSpotPriceHistoryResponse>"
        )
        return Response(body, status=200, mimetype="text/xml")

    # ------------------------------------------------------------------------------------------- SSM

    def _ssm(self, environ: WSGIEnviron, request: _Request) -> Response:
        """Systems Manager: the DLAMI's public parameter answered here (so ``image_missing`` faults reach it),
        every other request answered by moto."""
        if not self.key_accepted(request.access_key):
            code, status, message = SSM_FAULTS[FaultKind.CREDENTIALS]
            return _json_error(code, message, status)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, SSM_FAULTS)
        name = request.payload.get("Name")
        if request.action == "GetParameter" and name == aws_launch.DLAMI_PARAMETER:
            if self._image_missing(request):
                # GetParameter's error for a name the region does not have: ParameterNotFound, HTTP 400 (SSM
                # API reference, https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetParameter.html).
                return _json_error("ParameterNotFound", f"Parameter {name} not found.", 400)
            value = aws_launch.ensure_dlami(request.region)
            answer = aws_launch.parameter_answer(name, value, request.region)
            return Response(json.dumps(answer), content_type="application/x-amz-json-1.1")
        return self._forward_to_moto(environ, request)

    # --------------------------------------------------------------------------------------- pricing

    def _pricing(self, request: _Request) -> Response:
        if not self.key_accepted(request.access_key):
            code, status, message = PRICING_FAULTS[FaultKind.CREDENTIALS]
            return _json_error(code, message, status)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, PRICING_FAULTS)
        if request.action == "GetProducts":
            return self._get_products(request.payload)
        if request.action == "DescribeServices":
            body = {"Services": [{"ServiceCode": "AmazonEC2", "AttributeNames": ["instanceType", "regionCode"]}]}
            return Response(json.dumps({**body, "FormatVersion": "aws_v1"}), content_type="application/x-amz-json-1.1")
        return _json_error("UnknownOperationException", f"unknown operation {request.action}", 400)

    def _get_products(self, payload: dict[str, Any]) -> Response:
        if payload.get("ServiceCode") != "AmazonEC2":
            return _json_error("NotFoundException", f"Service {payload.get('ServiceCode')!r} not found", 400)
        max_results = payload.get("MaxResults", PRICING_MAX_RESULTS)
        if not isinstance(max_results, int) or not 1 <= max_results <= PRICING_MAX_RESULTS:
            return _json_error("InvalidParameterException", "MaxResults must be between 1 and 100", 400)
        matchers: list[tuple[str, str, str]] = []
        filters = payload.get("Filters") or []
        refusal = _filters_refusal(filters)
        if refusal is not None:
            return _json_error("ValidationException", refusal, 400)
        for item in filters:
            kind = str(item.get("Type", ""))
            if kind not in ("TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF"):
                return _json_error("InvalidParameterException", f"unsupported filter type {kind!r}", 400)
            matchers.append((kind, str(item.get("Field", "")).lower(), str(item.get("Value", ""))))
        matches = [p for p in self._products if self._product_matches(p, matchers)]
        query = json.dumps([payload.get("ServiceCode"), sorted(matchers)])
        try:
            offset = _decode_token(payload["NextToken"], query) if payload.get("NextToken") else 0
        except ValueError as exc:
            return _json_error("InvalidNextTokenException", str(exc), 400)
        page = [self._as_stated(p) for p in matches[offset : offset + max_results]]
        body: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
        if offset + max_results < len(matches):
            body["NextToken"] = _encode_token(offset + max_results, query)
        return Response(json.dumps(body), content_type="application/x-amz-json-1.1")

    def _as_stated(self, product: dict[str, Any]) -> dict[str, Any]:
        attributes = product["product"]["attributes"]
        with self._lock:
            restated = self._restated.get((attributes["regionCode"], attributes["instanceType"]))
        if restated is None or attributes["capacitystatus"] != "Used":
            return product
        unit, currency = restated
        product = copy.deepcopy(product)
        for term in product["terms"]["OnDemand"].values():
            for dimension in term["priceDimensions"].values():
                dimension["unit"] = unit
                dimension["pricePerUnit"] = {currency: next(iter(dimension["pricePerUnit"].values()))}
        return product

    @staticmethod
    def _product_matches(product: dict[str, Any], matchers: list[tuple[str, str, str]]) -> bool:
        # Field names compare case-insensitively, values exactly, as the Price List API does for TERM_MATCH.
        attributes = {k.lower(): v for k, v in product["product"]["attributes"].items()}
        for kind, name, value in matchers:
            actual = attributes.get(name)
            if kind in ("TERM_MATCH", "EQUALS") and actual != value:
                return False
            if kind == "CONTAINS" and (actual is None or value not in actual):
                return False
            if kind == "ANY_OF" and actual not in {v.strip() for v in value.split(",")}:
                return False
            if kind == "NONE_OF" and actual in {v.strip() for v in value.split(",")}:
                return False
        return True


def start_aws_sandbox(host: str = "127.0.0.1", port: int = 0) -> AwsSandbox:
    """Build an ``AwsSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = AwsSandbox()
    sandbox.start(host, port)
    return sandbox
