"""The GCP sandbox: Compute Engine v1 and the Cloud Billing Catalog over REST/JSON, on one local port.

It answers the calls the broker's adapter makes, in the real wire format (camelCase JSON, aggregated lists keyed
by scope, ``nextPageToken`` pagination, Google error bodies), so ``google-cloud-compute`` and
``google-cloud-billing`` run unchanged against it with ``ClientOptions(api_endpoint=sandbox.url)``:

- ``machineTypes``/``acceleratorTypes`` aggregated lists from the seed (each seeded type in two zones of its
  region, plus a few non-GPU types), ``regions.get``, ``zones.list``;
- ``services/6F81-5844-456A/skus``: the per-resource GPU, vCPU and RAM SKUs of ``prices.csv`` (plus
  storage, licence and commitment SKUs a client must skip);
- ``instances.insert`` / ``get`` / ``list`` / ``delete`` / ``aggregatedList`` (with label filters) and zone
  operations ``get`` / ``list`` (with filters) / ``wait``. Insert and delete return an Operation that is RUNNING
  and turns DONE when it is next observed (get, wait or list) or after ``settle_seconds``; a capacity failure is
  reported on the operation, and the instance, briefly visible as PROVISIONING, then 404s. A successful insert
  moves the instance PROVISIONING -> STAGING (operation done) -> RUNNING (next read);
- ``requestId`` idempotency: a repeated insert or delete with the same request id returns the first operation;
- what a launch carries (``boot``): ``images.get`` / ``getFromFamily`` and the zonal ``imageFamilyViews.get``
  over the public Deep Learning VM, Ubuntu and Debian families plus any ``add_image`` publishes; the boot ``Disk``
  an insert creates (``disks.get``); metadata, network tag and disk size checks with GCP's 400s; VPC
  ``firewalls.insert`` / ``get`` / ``list`` / ``delete`` with global operations ``get`` / ``wait`` (a rule
  appears or goes when its operation is done); and the ``startup-script`` of an instance booted by the shared
  Booter when it first runs, halted when it is deleted;
- authentication: self-signed service-account JWTs or access tokens from ``POST /token`` (see ``auth``);
  emails or key ids starting with ``bad`` get 401 UNAUTHENTICATED, projects starting with ``bad`` 403;
- faults (``sandbox.faults``, default action ``compute.instances.insert``): ``capacity`` ->
  ZONE_RESOURCE_POOL_EXHAUSTED on the operation; ``quota`` -> synchronous 403 QUOTA_EXCEEDED (``code=
  "operation:QUOTA_EXCEEDED"`` puts it on the operation instead); ``throttle`` -> 429 rateLimitExceeded
  (``code="RESOURCE_OPERATION_RATE_EXCEEDED"`` fails the insert operation instead); ``credentials`` -> 403
  forbidden (``code="UNAUTHENTICATED"``: 401); ``slow`` -> the answer waits ``seconds``; ``image_missing``
  (action ``image``, optional ``region``) -> the image lookups answer 404 notFound, as for an image GCP lacks.

Use in-process: ``sandbox = start_gcp_sandbox()``; ``sandbox.new_service_account()`` gives a key file whose JWTs
the sandbox verifies; ``sandbox.reset()`` between tests. Standalone: ``python -m sandboxes serve``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from sandboxes.faults import TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.gcp import boot as gcp_boot
from sandboxes.gcp.auth import AuthRejected, KeyRing, Principal
from sandboxes.gcp.catalogue import PLAIN_MACHINE_TYPES, CatalogueHandlers
from sandboxes.gcp.firewalls import FirewallHandlers
from sandboxes.gcp.images import ImageHandlers
from sandboxes.gcp.instances import InstanceHandlers
from sandboxes.gcp.operations import OperationHandlers
from sandboxes.gcp.quotas import QuotaHandlers
from sandboxes.gcp.seed import REGION_ZONES, SEED_PATH, SeedMachine, load_seed
from sandboxes.gcp.state import (
    KIND_CODES,
    LAUNCH_ACTION,
    Call,
    SandboxInstance,
    _GlobalOperation,
    _Instance,
    _Operation,
    _Request,
)
from sandboxes.gcp.wire import (
    SYNC_ALIASES,
    SYNC_ERRORS,
    ApiError,
    accelerator_json,
    decoy_skus,
    last_segment,
    machine_json,
    sku_json,
)
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

POWER_ACTIONS = frozenset({"compute.instances.stop", "compute.instances.start", "compute.instances.reset"})

DEFAULT_PROJECT = "broker-sandbox"
DEFAULT_SETTLE_SECONDS = 2.0
OPERATION_ONLY_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_OPERATION_RATE_EXCEEDED"}
)
_ROUTE = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<rest>.*)$")


# ---------------------------------------------------------------------------------------------- sandbox


class GcpSandbox(
    QuotaHandlers, CatalogueHandlers, OperationHandlers, ImageHandlers, FirewallHandlers, InstanceHandlers, SandboxApp
):
    """The GCP sandbox WSGI app. ``start()`` serves it; ``faults`` injects failures; ``reset()`` forgets state."""

    kind = "gcp"

    def __init__(self, seed_path: Path = SEED_PATH, settle_seconds: float = DEFAULT_SETTLE_SECONDS):
        super().__init__(FaultRegistry(default_action=LAUNCH_ACTION))
        self.machines, self.skus = load_seed(seed_path)
        self.settle_seconds = settle_seconds
        self.keys = KeyRing()
        self._lock = threading.Lock()
        self._quota_limits: dict[str, float] = {}
        self._machine_types: dict[str, dict[str, dict[str, Any]]] = {z: {} for zs in REGION_ZONES.values() for z in zs}
        self._accelerators: dict[str, dict[str, dict[str, Any]]] = {z: {} for z in self._machine_types}
        self._seed_by_name: dict[tuple[str, str], SeedMachine] = {}
        for m in self.machines:
            self._seed_by_name[(m.region, m.name)] = m
            for zone in m.zones:
                attached = m.machine_type.startswith("n1-")
                gpus = None if attached else (m.accelerator, m.gpu_count)
                self._machine_types[zone][m.machine_type] = machine_json(
                    zone, m.machine_type, m.vcpus, Decimal(m.memory_gib), gpus
                )
                self._accelerators[zone][m.accelerator] = accelerator_json(zone, m.accelerator)
        for zone, types in self._machine_types.items():
            for name, vcpus, memory in PLAIN_MACHINE_TYPES:
                types.setdefault(name, machine_json(zone, name, vcpus, Decimal(str(memory)), None))
        effective = "2025-06-01T00:00:00Z"
        regions = {s.region for s in self.skus}
        self._sku_items = [sku_json(s, effective) for s in sorted(self.skus, key=lambda s: s.sku_id)]
        self._sku_items += decoy_skus(regions, effective)
        self._instances: dict[tuple[str, str, str], _Instance] = {}
        self._operations: dict[tuple[str, str, str], _Operation] = {}
        self._request_ids: dict[tuple[str, str], tuple[str, str]] = {}
        self._counter = itertools.count(1)
        self._generation = 0
        self._images: dict[tuple[str, str], gcp_boot.SeedImage] = {}
        self._image_zones: dict[tuple[str, str], frozenset[str] | None] = {}
        self._firewalls: dict[tuple[str, str], dict[str, Any]] = {}
        self._global_ops: dict[tuple[str, str], _GlobalOperation] = {}
        self._global_request_ids: dict[tuple[str, str], str] = {}
        self._disks: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._seed_images()

    # -------------------------------------------------------------------------------- public helpers

    @property
    def zones(self) -> list[str]:
        return sorted(self._machine_types)

    def zones_of(self, region: str, instance_type: str) -> list[str]:
        """The zones a seeded type is offered in (two per type)."""
        row = self._seed_by_name.get((region, instance_type))
        return list(row.zones) if row else []

    def price(self, region: str, instance_type: str, spot: bool = False) -> Decimal | None:
        """The seeded total (what the adapter's composed price must equal)."""
        row = self._seed_by_name.get((region, instance_type))
        if row is None:
            return None
        return row.spot if spot else row.on_demand

    def new_service_account(
        self, email: str = "broker@broker-sandbox.iam.gserviceaccount.com", project_id: str = DEFAULT_PROJECT
    ) -> dict[str, Any]:
        """A service-account key file the sandbox verifies (``token_uri`` points at this sandbox)."""
        return self.keys.new_service_account(email=email, project_id=project_id, token_uri=f"{self.url}/token")

    def account_credentials(self, email: str | None = None, project_id: str = DEFAULT_PROJECT) -> dict[str, str]:
        """The ``Credentials.values`` a ProviderAccount needs for this sandbox."""
        info = self.new_service_account(email or f"broker@{project_id}.iam.gserviceaccount.com", project_id)
        return {"service_account_json": json.dumps(info), "project_id": project_id}

    def accept_service_accounts(self, emails: Iterable[str] | None) -> None:
        """Accept only these service-account emails (401 for others); None restores the default rule."""
        self.keys.accept_only(emails)

    def instances(self, zone: str | None = None) -> list[SandboxInstance]:
        """Every instance the sandbox holds (deleted ones are gone, as in GCP), optionally in one zone."""
        with self._lock:
            found = [self._snapshot(i) for i in self._instances.values() if zone is None or i.zone == zone]
        return sorted(found, key=lambda i: i.instance_id)

    def operations(self, zone: str | None = None) -> list[dict[str, Any]]:
        """Every operation (camelCase JSON), oldest first."""
        with self._lock:
            ops = [dict(o.body) for o in self._operations.values() if zone is None or o.zone == zone]
        return sorted(ops, key=lambda o: (o["insertTime"], o["name"]))

    def forget_request_ids(self) -> None:
        """Drop every remembered ``requestId``, as GCP does after a while: a repeat then reaches the name check."""
        with self._lock:
            self._request_ids.clear()

    def settle(self) -> None:
        """Finish every running operation (zonal and global) now."""
        with self._lock:
            for op in list(self._operations.values()):
                self._complete(op)
            for global_op in list(self._global_ops.values()):
                self._complete_global(global_op)

    def reset(self) -> None:
        self._generation += 1
        self.faults.clear()
        self.keys.accept_only(None)
        self.booter.reset()
        with self._lock:
            self._instances.clear()
            self._operations.clear()
            self._request_ids.clear()
            self._quota_limits.clear()
            self._firewalls.clear()
            self._global_ops.clear()
            self._global_request_ids.clear()
            self._disks.clear()
            self._seed_images()
            self.clear_calls()

    def instance_resource(self, instance_id: str) -> dict[str, Any]:
        """The stored instance (camelCase, as ``instances.get`` answers it) for ``<zone>/<name>``; KeyError if none."""
        zone, _, name = instance_id.partition("/")
        with self._lock:
            for (_, z, n), inst in self._instances.items():
                if (z, n) == (zone, name):
                    return json.loads(json.dumps(inst.body))
        raise KeyError(instance_id)

    def control_extra(self, request: Request, route: str) -> Response | None:
        if route == "quotas" and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            limit = body.get("limit")
            self.set_quota(str(body.get("metric", "")), None if limit is None else float(limit))
            return json_response({"metric": body.get("metric"), "limit": limit})
        if route == "credentials" and request.method in ("PUT", "POST"):
            body = request.get_json(force=True, silent=True) or {}
            emails = body.get("service_accounts")
            self.accept_service_accounts(emails if emails is None else [str(e) for e in emails])
            return json_response({"service_accounts": emails})
        if route == "service-accounts" and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            project = str(body.get("project_id") or DEFAULT_PROJECT)
            email = str(body.get("email") or f"broker@{project}.iam.gserviceaccount.com")
            return json_response(self.new_service_account(email, project), status=201)
        if route == "settle" and request.method == "POST":
            self.settle()
            return json_response({"settled": True})
        if route == "calls" and request.method == "GET":
            return json_response({"calls": [[c.service, c.action, c.zone] for c in self.calls()]})
        if route == "instances" and request.method == "GET":
            return json_response(
                {"instances": [{"instance_id": i.instance_id, "state": i.state} for i in self.instances()]}
            )
        return None

    # -------------------------------------------------------------------------------------- routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        query = {k: v[0] for k, v in parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True).items()}
        request = _Request(
            method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
            path=str(environ.get("PATH_INFO", "")),
            query=query,
            body=body,
            authorization=str(environ.get("HTTP_AUTHORIZATION", "")),
        )
        billing = request.path.startswith("/v1/")
        try:
            self._route(request)
            with self._lock:
                self.record_call(
                    Call(request.service, request.action, request.project, request.zone, request.instance_types)
                )
            response = self._dispatch(request)
        except ApiError as exc:
            response = exc.response(billing=billing)
        return response(environ, start_response)

    def _route(self, request: _Request) -> None:
        """Name the action (``compute.instances.insert``) and pick out project, zone and instance types."""
        method, path = request.method, request.path
        if path == "/token":
            request.service, request.action = "oauth2", "oauth2.token"
            return
        if path.startswith("/v1/"):
            request.service = "cloudbilling"
            if path == "/v1/services" and method == "GET":
                request.action = "cloudbilling.services.list"
                return
            match = re.fullmatch(r"/v1/(services/[^/]+)/skus", path)
            if match and method == "GET":
                request.action, request.route = "cloudbilling.services.skus.list", {"service": match[1]}
                return
            raise ApiError(404, f"Method not found: {method} {path}", "notFound")
        match = _ROUTE.match(path)
        if match is None:
            raise ApiError(404, f"The requested URL {path} was not found on this server.", "notFound")
        request.project, rest = match["project"], match["rest"]
        routes: tuple[tuple[str, str, str], ...] = (
            ("GET", r"aggregated/machineTypes", "compute.machineTypes.aggregatedList"),
            ("GET", r"aggregated/acceleratorTypes", "compute.acceleratorTypes.aggregatedList"),
            ("GET", r"aggregated/instances", "compute.instances.aggregatedList"),
            ("GET", r"regions/(?P<region>[^/]+)", "compute.regions.get"),
            ("GET", r"zones", "compute.zones.list"),
            ("POST", r"zones/(?P<zone>[^/]+)/instances", "compute.instances.insert"),
            ("GET", r"zones/(?P<zone>[^/]+)/instances", "compute.instances.list"),
            ("GET", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "compute.instances.get"),
            ("DELETE", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "compute.instances.delete"),
            # instances.stop, instances.start, instances.reset: POST, answered with a zone Operation (Compute Engine
            # API reference, https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop, .../start,
            # .../reset).
            ("POST", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/stop", "compute.instances.stop"),
            ("POST", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/start", "compute.instances.start"),
            ("POST", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/reset", "compute.instances.reset"),
            ("GET", r"zones/(?P<zone>[^/]+)/operations", "compute.zoneOperations.list"),
            ("GET", r"zones/(?P<zone>[^/]+)/operations/(?P<operation>[^/]+)", "compute.zoneOperations.get"),
            ("POST", r"zones/(?P<zone>[^/]+)/operations/(?P<operation>[^/]+)/wait", "compute.zoneOperations.wait"),
            ("GET", r"zones/(?P<zone>[^/]+)/disks/(?P<disk>[^/]+)", "compute.disks.get"),
            ("GET", r"zones/(?P<zone>[^/]+)/imageFamilyViews/(?P<family>[^/]+)", "compute.imageFamilyViews.get"),
            ("GET", r"global/images/family/(?P<family>[^/]+)", "compute.images.getFromFamily"),
            ("GET", r"global/images/(?P<image>[^/]+)", "compute.images.get"),
            ("POST", r"global/firewalls", "compute.firewalls.insert"),
            ("GET", r"global/firewalls", "compute.firewalls.list"),
            ("GET", r"global/firewalls/(?P<firewall>[^/]+)", "compute.firewalls.get"),
            ("DELETE", r"global/firewalls/(?P<firewall>[^/]+)", "compute.firewalls.delete"),
            ("GET", r"global/operations/(?P<operation>[^/]+)", "compute.globalOperations.get"),
            ("POST", r"global/operations/(?P<operation>[^/]+)/wait", "compute.globalOperations.wait"),
        )
        for verb, pattern, action in routes:
            found = re.fullmatch(pattern, rest)
            if found and verb == method:
                request.action, request.route = action, found.groupdict()
                request.zone = request.route.get("zone")
                break
        else:
            raise ApiError(404, f"The requested URL {path} was not found on this server.", "notFound")
        if request.action == LAUNCH_ACTION:
            request.instance_types = self._requested_types(request)

    def _requested_types(self, request: _Request) -> tuple[str, ...]:
        try:
            body = request.json()
        except ApiError:
            return ()
        machine = last_segment(str(body.get("machineType", "")))
        return tuple(dict.fromkeys((machine, self._broker_type(body))))

    def _dispatch(self, request: _Request) -> Response:
        if request.action == "oauth2.token":
            return self._token(request)
        principal = self._authenticate(request)
        fault = self._transport_fault(request)
        deferred: Fault | None = None
        if fault is not None:
            code = fault.code or KIND_CODES[fault.kind]
            if request.action == LAUNCH_ACTION and self._on_operation(code):
                deferred = fault  # an insert that GCP accepts and then fails
            else:
                raise self._sync_error(code, request)
        if request.service == "cloudbilling":
            return self._billing(request)
        if request.project.startswith("bad"):
            raise ApiError(403, f"Required '{request.action}' permission for 'projects/{request.project}'", "forbidden")
        self._sweep()
        if request.action == LAUNCH_ACTION:
            return self._insert(request, principal, deferred)
        if request.action == "compute.instances.delete":
            return self._delete(request, principal)
        if request.action in POWER_ACTIONS:  # instances.stop, start, reset
            return self._power(request, principal)
        if request.action == "compute.firewalls.insert":
            return self._firewalls_insert(request, principal)
        if request.action == "compute.firewalls.delete":
            return self._firewalls_delete(request, principal)
        handlers: dict[str, Any] = {
            "compute.machineTypes.aggregatedList": self._machine_types_list,
            "compute.acceleratorTypes.aggregatedList": self._accelerator_types_list,
            "compute.instances.aggregatedList": self._instances_aggregated,
            "compute.instances.get": self._instances_get,
            "compute.instances.list": self._instances_list,
            "compute.regions.get": self._regions_get,
            "compute.zones.list": self._zones_list,
            "compute.zoneOperations.get": self._operations_get,
            "compute.zoneOperations.wait": self._operations_get,
            "compute.zoneOperations.list": self._operations_list,
            "compute.disks.get": self._disks_get,
            "compute.imageFamilyViews.get": self._image_family_view,
            "compute.images.getFromFamily": self._images_from_family,
            "compute.images.get": self._images_get,
            "compute.firewalls.list": self._firewalls_list,
            "compute.firewalls.get": self._firewalls_get,
            "compute.globalOperations.get": self._global_operations_get,
            "compute.globalOperations.wait": self._global_operations_get,
        }
        response: Response = handlers[request.action](request)
        return response

    # ------------------------------------------------------------------------------------------ auth

    def _authenticate(self, request: _Request) -> Principal:
        try:
            return self.keys.authenticate(request.authorization)
        except AuthRejected as exc:
            raise ApiError(401, f"{SYNC_ERRORS['UNAUTHENTICATED'][3]} ({exc.reason})", "authError") from None

    def _token(self, request: _Request) -> Response:
        fault = self._transport_fault(request)
        if fault is not None and fault.kind is FaultKind.CREDENTIALS:
            return json_response(
                {"error": "invalid_grant", "error_description": "Invalid grant: account not found"}, 400
            )
        if fault is not None:
            return json_response({"error": "rate_limit_exceeded", "error_description": "Rate limit exceeded"}, 429)
        form = {k: v[0] for k, v in parse_qs(request.body.decode("utf-8", "replace")).items()}
        try:
            granted = self.keys.grant(form, f"{self.url}/token")
        except AuthRejected as exc:
            error = "unsupported_grant_type" if exc.reason == "unsupported_grant_type" else "invalid_grant"
            return json_response({"error": error, "error_description": exc.reason}, 400)
        return json_response(granted)

    # ---------------------------------------------------------------------------------------- faults

    def _transport_fault(self, request: _Request) -> Fault | None:
        fault = self.faults.take(request.action, request.instance_types, request.zone, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            generation = self._generation
            self.faults.sleep(fault.seconds)
            if generation != self._generation:
                # The client gave up long ago and a reset happened since: acting now would leak into the next test.
                raise ApiError(503, "The sandbox was reset while this request waited.", "backendError")
            fault = self.faults.take(
                request.action, request.instance_types, request.zone, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        return fault

    @staticmethod
    def _on_operation(code: str) -> bool:
        return code.startswith("operation:") or code in OPERATION_ONLY_CODES

    def _sync_error(self, code: str, request: _Request) -> ApiError:
        canonical = SYNC_ALIASES.get(code, code)
        region = (request.zone or "us-central1").rsplit("-", 1)[0]
        if canonical not in SYNC_ERRORS:
            return ApiError(400, f"Sandbox fault {code}.", code)
        status, reason, info_reason, template = SYNC_ERRORS[canonical]
        metric = self._quota_metric(request)
        message = template.format(metric=metric, region=region, project=request.project, action=request.action)
        metadata = {"quota_metric": f"compute.googleapis.com/{metric.lower()}", "region": region}
        return ApiError(status, message, reason, info_reason, metadata if canonical == "QUOTA_EXCEEDED" else None)


def start_gcp_sandbox(host: str = "127.0.0.1", port: int = 0) -> GcpSandbox:
    """Build a ``GcpSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = GcpSandbox()
    sandbox.start(host, port)
    return sandbox
