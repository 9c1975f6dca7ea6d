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

import json
import threading
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs

from moto.ec2.models import ec2_backends
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.wrappers import Request, Response

from sandboxes.aws.catalogue import SEED_PATH, ensure_offered, load_seed, price_product, vary
from sandboxes.aws.ec2 import Ec2Handlers
from sandboxes.aws.keys import KNOWN_KEYS
from sandboxes.aws.placement import PlacementGroups
from sandboxes.aws.prices import PriceHandlers
from sandboxes.aws.state import (
    _FILTER_NAME,
    _INDEXED,
    _SCOPE,
    CODE_STATUS,
    EC2_FAULTS,
    PRICING_TARGET,
    SSM_TARGET,
    Call,
    SandboxInstance,
    _ec2_error,
    _json_error,
    _named_instances,
    _Request,
    _Stored,
)
from sandboxes.faults import TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

# --------------------------------------------------------------------------------------------- sandbox


class AwsSandbox(Ec2Handlers, PriceHandlers, SandboxApp):
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


def start_aws_sandbox(host: str = "127.0.0.1", port: int = 0) -> AwsSandbox:
    """Build an ``AwsSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = AwsSandbox()
    sandbox.start(host, port)
    return sandbox
