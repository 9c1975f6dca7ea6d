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

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from sandboxes.boot import simulated_gpus
from sandboxes.faults import (
    IMAGE_ACTION,
    OUTCOME_KINDS,
    TRANSPORT_KINDS,
    Fault,
    FaultKind,
    FaultRegistry,
)
from sandboxes.gcp import boot as gcp_boot
from sandboxes.gcp import filters as gcp_filter
from sandboxes.gcp.auth import AuthRejected, KeyRing, Principal
from sandboxes.gcp.seed import BILLING_SERVICE, GPU_LABELS, REGION_ZONES, SEED_PATH, SeedMachine, load_seed
from sandboxes.gcp.wire import (
    API_BASE,
    CREATED,
    MAX_RESULTS,
    OPERATION_ERRORS,
    SKU_PAGE_MAX,
    SYNC_ALIASES,
    SYNC_ERRORS,
    ApiError,
    accelerator_json,
    decoy_skus,
    encode_token,
    last_segment,
    machine_json,
    now_iso,
    numeric_id,
    page_bounds,
    sku_json,
    with_project,
)
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

DEFAULT_PROJECT = "broker-sandbox"
DEFAULT_SETTLE_SECONDS = 2.0
LAUNCH_ACTION = "compute.instances.insert"
SHORT_GPU_NAMES = {accelerator: label for label, accelerator in GPU_LABELS.items()}
OPERATION_ONLY_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_OPERATION_RATE_EXCEEDED"}
)
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_ROUTE = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<rest>.*)$")

# The code each fault kind produces unless the fault names its own.
KIND_CODES = {
    FaultKind.CAPACITY: "ZONE_RESOURCE_POOL_EXHAUSTED",
    FaultKind.QUOTA: "QUOTA_EXCEEDED",
    FaultKind.THROTTLE: "RATE_LIMIT_EXCEEDED",
    FaultKind.CREDENTIALS: "PERMISSION_DENIED",
}
GPU_QUOTA_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
}
DEFAULT_GPU_QUOTA = 64.0  # per GPU metric and region, unless a test sets its own with ``set_quota``
# Non-GPU machine types every zone lists, so a client has something to skip.
PLAIN_MACHINE_TYPES = (("e2-standard-4", 4, 16), ("n2-standard-8", 8, 32), ("n1-standard-1", 1, 3.75))


# ------------------------------------------------------------------------------------------------ state


@dataclass(slots=True)
class _Instance:
    project: str
    zone: str
    body: dict[str, Any]
    request_id: str
    staged_seen: bool = False
    booted: bool = False
    since: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return str(self.body["name"])


@dataclass(slots=True)
class _Operation:
    project: str
    zone: str
    body: dict[str, Any]
    kind: str  # insert | delete
    target: str  # instance name
    failure: tuple[str, int, str, str] | None = None  # (code, http status, http message, message)
    created: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _GlobalOperation:
    """A firewall insert or delete: the rule appears (or goes) when the operation completes, as in GCP."""

    project: str
    body: dict[str, Any]
    kind: str  # insert | delete
    target: str  # firewall name
    firewall: dict[str, Any] | None = None  # the rule an insert creates
    created: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance the sandbox holds (for tests asserting what was, or was not, launched)."""

    instance_id: str  # <zone>/<name>, as the adapter names it
    project: str
    zone: str
    name: str
    instance_type: str  # the broker's name: n1-standard-8+1xT4 for attached GPUs
    state: str  # the GCP status
    provisioning_model: str
    labels: dict[str, str]
    request_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    service: str
    action: str
    project: str = ""
    zone: str | None = None
    instance_types: tuple[str, ...] = ()


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes
    authorization: str
    service: str = "compute"
    action: str = ""
    project: str = ""
    zone: str | None = None
    instance_types: tuple[str, ...] = ()
    route: dict[str, str] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received.", "parseError") from None
        if not isinstance(value, dict):
            raise ApiError(400, "Invalid JSON payload received.", "parseError")
        return value


# ---------------------------------------------------------------------------------------------- sandbox


class GcpSandbox(SandboxApp):
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

    # ------------------------------------------------------------------------- images, disks, firewalls

    def _seed_images(self) -> None:
        self._images = {(i.project, i.name): i for i in gcp_boot.PUBLIC_IMAGES}
        self._image_zones = {}

    def add_image(
        self, project: str, name: str, *, family: str = "", disk_size_gb: int = 10, zones: Iterable[str] | None = None
    ) -> dict[str, Any]:
        """Publish an image (a buyer's own, say) until the next reset; ``zones`` limits where its family view sees
        it (None: everywhere). Returns the image as ``images.get`` answers it."""
        image = gcp_boot.SeedImage(project, name, family, disk_size_gb, f"{name}, added by a test")
        with self._lock:
            self._images[(project, name)] = image
            self._image_zones[(project, name)] = frozenset(zones) if zones is not None else None
        return gcp_boot.image_json(image)

    def _newest_in_family(self, project: str, family: str, zone: str | None) -> gcp_boot.SeedImage | None:
        """The newest image of a family (by name, as dated names sort), optionally rolled out in ``zone``."""
        found = [
            image
            for key, image in self._images.items()
            if key[0] == project and image.family == family and self._rolled_out(key, zone)
        ]
        return max(found, key=lambda i: i.name) if found else None

    def _rolled_out(self, key: tuple[str, str], zone: str | None) -> bool:
        zones = self._image_zones.get(key)
        return zone is None or zones is None or zone in zones

    def add_firewall(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a firewall rule at once (a seller's own, say), checked as ``firewalls.insert`` checks it."""
        firewall = gcp_boot.firewall_json(project, body)
        with self._lock:
            self._firewalls[(project, firewall["name"])] = firewall
        return dict(firewall)

    def firewall_rules(self, project: str | None = None) -> list[dict[str, Any]]:
        """Every VPC firewall rule (as ``firewalls.get`` answers it), optionally of one project, by name."""
        with self._lock:
            rules = [dict(f) for (p, _), f in self._firewalls.items() if project is None or p == project]
        return sorted(rules, key=lambda f: f["name"])

    def instance_resource(self, instance_id: str) -> dict[str, Any]:
        """The stored instance (camelCase, as ``instances.get`` answers it) for ``<zone>/<name>``; KeyError if none."""
        zone, _, name = instance_id.partition("/")
        with self._lock:
            for (_, z, n), inst in self._instances.items():
                if (z, n) == (zone, name):
                    return json.loads(json.dumps(inst.body))
        raise KeyError(instance_id)

    def disk_resource(self, zone: str, name: str) -> dict[str, Any]:
        """The boot disk an insert created (as ``disks.get`` answers it); KeyError if none."""
        with self._lock:
            for (_, z, n), disk in self._disks.items():
                if (z, n) == (zone, name):
                    return dict(disk)
        raise KeyError(f"{zone}/{name}")

    def lets_in(self, instance_id: str) -> set[tuple[int, str]]:
        """Each (tcp port, source range) the project's firewall rules let reach the instance, deny rules applied."""
        body = self.instance_resource(instance_id)
        project = body["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
        network = body["networkInterfaces"][0]["network"]
        tags = list((body.get("tags") or {}).get("items") or [])
        return gcp_boot.lets_in(self.firewall_rules(project), network, tags)

    def set_quota(self, metric: str, limit: float | None) -> None:
        """Set a regional quota's limit in every region (None restores the default). ``regions.get`` reports it
        beside the live usage, and an insert that would exceed it is refused with QUOTA_EXCEEDED."""
        with self._lock:
            if limit is None:
                self._quota_limits.pop(metric, None)
            else:
                self._quota_limits[metric] = float(limit)

    def _gpu_use(self, body: dict[str, Any]) -> tuple[str, int] | None:
        """The GPU quota metric an instance body counts against, and how many GPUs."""
        attached = [a for a in body.get("guestAccelerators") or [] if a]
        if not attached:
            return None
        accelerator = last_segment(str(attached[0].get("acceleratorType", "")))
        metric = GPU_QUOTA_METRICS.get(accelerator, "GPUS_ALL_REGIONS")
        if body.get("scheduling", {}).get("provisioningModel") == "SPOT":
            metric = f"PREEMPTIBLE_{metric}"
        return metric, sum(int(a.get("acceleratorCount") or 0) for a in attached)

    def _gpu_usage(self, project: str, region: str) -> dict[str, float]:
        """GPUs in use per quota metric in ``region``, from the live instances. Caller holds the lock."""
        usage: dict[str, float] = {}
        for inst in self._instances.values():
            live = inst.body.get("status") != "TERMINATED"
            if live and inst.project == project and inst.zone.rsplit("-", 1)[0] == region:
                use = self._gpu_use(inst.body)
                if use is not None:
                    usage[use[0]] = usage.get(use[0], 0.0) + use[1]
        return usage

    def _quota_limit(self, metric: str) -> float:
        return self._quota_limits.get(metric, DEFAULT_GPU_QUOTA)

    def _snapshot(self, inst: _Instance) -> SandboxInstance:
        body = inst.body
        return SandboxInstance(
            instance_id=f"{inst.zone}/{inst.name}",
            project=inst.project,
            zone=inst.zone,
            name=inst.name,
            instance_type=self._broker_type(body),
            state=str(body["status"]),
            provisioning_model=str(body["scheduling"].get("provisioningModel", "STANDARD")),
            labels=dict(body.get("labels") or {}),
            request_id=inst.request_id,
        )

    @staticmethod
    def _broker_type(body: dict[str, Any]) -> str:
        machine = last_segment(body.get("machineType", ""))
        attached = body.get("guestAccelerators") or []
        if attached and machine.startswith("n1-"):
            accelerator = last_segment(attached[0].get("acceleratorType", ""))
            count = sum(int(a.get("acceleratorCount") or 0) for a in attached)
            return f"{machine}+{count}x{SHORT_GPU_NAMES.get(accelerator, accelerator)}"
        return machine

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

    def _quota_metric(self, request: _Request) -> str:
        for name in request.instance_types:
            for (_region, instance_type), row in self._seed_by_name.items():
                if instance_type == name or row.machine_type == name:
                    return GPU_QUOTA_METRICS.get(row.accelerator, "GPUS_ALL_REGIONS")
        return "CPUS"

    # -------------------------------------------------------------------------------------- billing

    def _billing(self, request: _Request) -> Response:
        if request.action == "cloudbilling.services.list":
            service = {
                "name": BILLING_SERVICE,
                "serviceId": BILLING_SERVICE.split("/", 1)[1],
                "displayName": "Compute Engine",
                "businessEntityName": "businessEntities/GCP",
            }
            return json_response({"services": [service], "nextPageToken": ""})
        if request.route["service"] != BILLING_SERVICE:
            raise ApiError(404, f"Service {request.route['service']} not found.", "notFound")
        currency = request.query.get("currencyCode") or "USD"
        if currency != "USD":
            raise ApiError(400, f"The sandbox prices in USD only, not {currency}.", "invalid")
        query = json.dumps([request.route["service"], currency])
        offset, size = page_bounds(request.query, query, SKU_PAGE_MAX, key="pageSize")
        page = self._sku_items[offset : offset + size]
        more = offset + size < len(self._sku_items)
        return json_response({"skus": page, "nextPageToken": encode_token(offset + size, query) if more else ""})

    # -------------------------------------------------------------------------------- catalogue reads

    def _aggregated(
        self, request: _Request, kind: str, items_key: str, by_zone: dict[str, list[dict[str, Any]]]
    ) -> Response:
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        flat = [(zone, item) for zone in sorted(by_zone) for item in by_zone[zone] if matches(item)]
        query = json.dumps([kind, request.project, request.query.get("filter", "")])
        offset, size = page_bounds(request.query, query, MAX_RESULTS)
        page = flat[offset : offset + size]
        items: dict[str, Any] = {}
        for zone in sorted(by_zone):
            on_page = [item for z, item in page if z == zone]
            if on_page:
                items[f"zones/{zone}"] = {items_key: on_page}
            else:
                items[f"zones/{zone}"] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{zone}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
        body: dict[str, Any] = {
            "kind": f"compute#{kind}AggregatedList",
            "id": f"projects/{request.project}/aggregated/{items_key}",
            "items": items,
            "selfLink": f"{API_BASE}projects/{request.project}/aggregated/{items_key}",
        }
        if offset + size < len(flat):
            body["nextPageToken"] = encode_token(offset + size, query)
        return json_response(body)

    def _machine_types_list(self, request: _Request) -> Response:
        by_zone = {
            z: [with_project(t, request.project) for _, t in sorted(types.items())]
            for z, types in self._machine_types.items()
        }
        return self._aggregated(request, "machineType", "machineTypes", by_zone)

    def _accelerator_types_list(self, request: _Request) -> Response:
        by_zone = {
            z: [with_project(t, request.project) for _, t in sorted(types.items())]
            for z, types in self._accelerators.items()
        }
        return self._aggregated(request, "acceleratorType", "acceleratorTypes", by_zone)

    def _regions_get(self, request: _Request) -> Response:
        region = request.route["region"]
        if region not in REGION_ZONES:
            raise ApiError(404, f"The resource 'projects/{request.project}/regions/{region}' was not found", "notFound")
        with self._lock:
            live = [i for i in self._instances.values() if i.project == request.project and i.zone.startswith(region)]
            cpus = sum(self._vcpus(i) for i in live)
            quotas = [
                {"metric": "CPUS", "limit": 2400.0, "usage": float(cpus)},
                {"metric": "INSTANCES", "limit": 6000.0, "usage": float(len(live))},
            ]
            gpus = self._gpu_usage(request.project, region)
            metrics = sorted(GPU_QUOTA_METRICS.values())
            for metric in [*metrics, *(f"PREEMPTIBLE_{m}" for m in metrics)]:
                quotas.append({"metric": metric, "limit": self._quota_limit(metric), "usage": gpus.get(metric, 0.0)})
        return json_response(
            {
                "kind": "compute#region",
                "id": numeric_id("region", region),
                "creationTimestamp": CREATED,
                "name": region,
                "description": region,
                "status": "UP",
                "zones": [f"{API_BASE}projects/{request.project}/zones/{z}" for z in REGION_ZONES[region]],
                "quotas": quotas,
                "selfLink": f"{API_BASE}projects/{request.project}/regions/{region}",
                "supportsPzs": False,
            }
        )

    def _vcpus(self, inst: _Instance) -> int:
        machine = self._machine_types.get(inst.zone, {}).get(last_segment(inst.body.get("machineType", "")))
        return int(machine["guestCpus"]) if machine else 0

    def _zones_list(self, request: _Request) -> Response:
        items = [
            {
                "kind": "compute#zone",
                "id": numeric_id("zone", zone),
                "creationTimestamp": CREATED,
                "name": zone,
                "description": zone,
                "status": "UP",
                "region": f"{API_BASE}projects/{request.project}/regions/{zone.rsplit('-', 1)[0]}",
                "selfLink": f"{API_BASE}projects/{request.project}/zones/{zone}",
            }
            for zone in self.zones
        ]
        return json_response(
            {
                "kind": "compute#zoneList",
                "id": f"projects/{request.project}/zones",
                "items": items,
                "selfLink": f"{API_BASE}projects/{request.project}/zones",
            }
        )

    # ------------------------------------------------------------------------------------ instances

    def _zone_or_404(self, request: _Request) -> str:
        zone = request.zone or ""
        if zone not in self._machine_types:
            raise ApiError(404, f"The resource 'projects/{request.project}/zones/{zone}' was not found", "notFound")
        return zone

    def _instance_or_404(self, request: _Request) -> _Instance:
        zone = self._zone_or_404(request)
        inst = self._instances.get((request.project, zone, request.route["name"]))
        if inst is None:
            path = f"projects/{request.project}/zones/{zone}/instances/{request.route['name']}"
            raise ApiError(404, f"The resource '{path}' was not found", "notFound")
        return inst

    def _read_instance(self, inst: _Instance) -> dict[str, Any]:
        """The instance as a read sees it; a STAGING instance is RUNNING from the read after the first."""
        body = json.loads(json.dumps(inst.body))
        if inst.body["status"] == "STAGING":
            if inst.staged_seen:
                self._set_running(inst)
                body = json.loads(json.dumps(inst.body))
            else:
                inst.staged_seen = True
        return body

    def _set_running(self, inst: _Instance) -> None:
        """The instance runs: on its first start it boots from its ``startup-script``. Caller holds the lock."""
        inst.body["status"] = "RUNNING"
        inst.body["lastStartTimestamp"] = now_iso()
        inst.body["cpuPlatform"] = "Intel Cascade Lake"
        inst.since = time.monotonic()
        if not inst.booted:
            inst.booted = True
            self._boot(inst)

    def _boot(self, inst: _Instance) -> None:
        """Hand the instance's startup script and GPUs to the shared Booter (``sandboxes/boot.py``)."""
        metadata = {str(i.get("key")): str(i.get("value", "")) for i in inst.body["metadata"].get("items") or []}
        script = metadata.get("startup-script")
        attached = inst.body.get("guestAccelerators") or []
        gpus = []
        if attached:
            accelerator = last_segment(str(attached[0].get("acceleratorType", "")))
            count = sum(int(a.get("acceleratorCount") or 0) for a in attached)
            key, memory_gb = gcp_boot.SIMULATED_GPUS.get(accelerator, (accelerator, 0))
            gpus = simulated_gpus(key, count, memory_gb)
        self.booter.boot(
            instance_id=f"{inst.zone}/{inst.name}",
            user_data=script.encode() if script is not None else None,
            gpus=gpus,
            instance_type=self._broker_type(inst.body),
            zone=inst.zone,
        )

    def _instances_get(self, request: _Request) -> Response:
        with self._lock:
            return json_response(self._read_instance(self._instance_or_404(request)))

    def _instances_list(self, request: _Request) -> Response:
        zone = self._zone_or_404(request)
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        with self._lock:
            found = [
                self._read_instance(i)
                for key, i in sorted(self._instances.items())
                if key[0] == request.project and key[1] == zone
            ]
        found = [i for i in found if matches(i)]
        query = json.dumps(["instances", request.project, zone, request.query.get("filter", "")])
        offset, size = page_bounds(request.query, query, MAX_RESULTS)
        body: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{request.project}/zones/{zone}/instances",
            "items": found[offset : offset + size],
            "selfLink": f"{API_BASE}projects/{request.project}/zones/{zone}/instances",
        }
        if offset + size < len(found):
            body["nextPageToken"] = encode_token(offset + size, query)
        return json_response(body)

    def _instances_aggregated(self, request: _Request) -> Response:
        with self._lock:
            by_zone: dict[str, list[dict[str, Any]]] = {z: [] for z in self._machine_types}
            for (project, zone, _name), inst in sorted(self._instances.items()):
                if project == request.project:
                    by_zone[zone].append(self._read_instance(inst))
        return self._aggregated(request, "instance", "instances", by_zone)

    def _insert(self, request: _Request, principal: Principal, deferred: Fault | None) -> Response:
        zone = self._zone_or_404(request)
        request_id = request.query.get("requestId", "")
        if request_id and not _UUID.match(request_id):
            raise ApiError(400, f"Invalid value for field 'requestId': '{request_id}'. Must be a UUID.", "invalid")
        body = request.json()
        with self._lock:
            known = self._request_ids.get((request.project, request_id)) if request_id else None
            if known is not None:
                op = self._operations.get((request.project, known[0], known[1]))
                if op is not None:
                    # GCP answers a repeated request id with the first operation, as it is now.
                    return json_response(op.body)
        resource = self._validated(request, zone, body)
        outcome = self.faults.take(LAUNCH_ACTION, request.instance_types, zone, kinds=OUTCOME_KINDS) or deferred
        failure: tuple[str, int, str, str] | None = None
        if outcome is not None:
            code = outcome.code or KIND_CODES[outcome.kind]
            if not self._on_operation(code) and outcome.kind is not FaultKind.CAPACITY:
                raise self._sync_error(code, request)
            failure = self._operation_failure(code.removeprefix("operation:"), request, zone, resource["name"])
        with self._lock:
            key = (request.project, zone, resource["name"])
            if request_id and (request.project, request_id) in self._request_ids:
                # A concurrent twin won the race while we validated: answer with its operation.
                z, name = self._request_ids[(request.project, request_id)]
                return json_response(self._operations[(request.project, z, name)].body)
            if key in self._instances:
                raise ApiError(
                    409,
                    f"The resource 'projects/{request.project}/zones/{zone}/instances/{resource['name']}' already "
                    "exists",
                    "alreadyExists",
                )
            inst = _Instance(request.project, zone, self._instance_body(request.project, zone, resource), request_id)
            self._check_gpu_quota(request, zone, inst.body)
            self._instances[key] = inst
            self._disks[key] = self._boot_disk(request.project, zone, resource, inst.body)
            op = self._new_operation(request.project, zone, "insert", inst, principal, failure)
            if request_id:
                self._request_ids[(request.project, request_id)] = (zone, op.body["name"])
            return json_response(op.body)

    def _check_gpu_quota(self, request: _Request, zone: str, body: dict[str, Any]) -> None:
        """GCP refuses an insert that would take the region past a GPU quota. Caller holds the lock."""
        use = self._gpu_use(body)
        if use is None:
            return
        metric, count = use
        region = zone.rsplit("-", 1)[0]
        limit = self._quota_limit(metric)
        if self._gpu_usage(request.project, region).get(metric, 0.0) + count > limit:
            status, reason, info_reason, _template = SYNC_ERRORS["QUOTA_EXCEEDED"]
            message = f"Quota '{metric}' exceeded.  Limit: {limit} in region {region}."
            metadata = {"quota_metric": f"compute.googleapis.com/{metric.lower()}", "region": region}
            raise ApiError(status, message, reason, info_reason, metadata)

    def _operation_failure(self, code: str, request: _Request, zone: str, name: str) -> tuple[str, int, str, str]:
        status, status_message, template = OPERATION_ERRORS.get(code, (400, "BAD REQUEST", f"Sandbox fault {code}."))
        message = template.format(
            project=request.project, zone=zone, name=name, metric=self._quota_metric(request), region=zone[:-2]
        )
        return code, status, status_message, message

    def _validated(self, request: _Request, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """GCP's checks on an insert body; raises the 400 GCP would answer."""
        name = str(body.get("name") or "")
        if not _NAME.match(name):
            raise ApiError(
                400,
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
                "invalid",
            )
        machine_name = last_segment(str(body.get("machineType", "")))
        machine = self._machine_types[zone].get(machine_name)
        if machine is None:
            raise ApiError(
                400,
                f"Invalid value for field 'resource.machineType': '{body.get('machineType', '')}'. Machine type with "
                f"name '{machine_name}' does not exist in zone '{zone}'.",
                "invalid",
            )
        attached = [a for a in body.get("guestAccelerators") or [] if a]
        if attached and machine.get("accelerators"):
            raise ApiError(
                400, f"Machine type {machine_name} comes with its GPUs; guestAccelerators must be empty.", "invalid"
            )
        for accelerator in attached:
            accelerator_name = last_segment(str(accelerator.get("acceleratorType", "")))
            spec = self._accelerators[zone].get(accelerator_name)
            count = int(accelerator.get("acceleratorCount") or 0)
            if spec is None:
                raise ApiError(
                    400,
                    f"Invalid value for field 'resource.guestAccelerators[0].acceleratorType': "
                    f"'{accelerator.get('acceleratorType')}'. Accelerator type '{accelerator_name}' does not exist "
                    f"in zone '{zone}'.",
                    "invalid",
                )
            if not 0 < count <= int(spec["maximumCardsPerInstance"]):
                raise ApiError(
                    400,
                    f"Invalid value for field 'resource.guestAccelerators[0].acceleratorCount': {count}.",
                    "invalid",
                )
        scheduling = dict(body.get("scheduling") or {})
        has_gpus = bool(attached or machine.get("accelerators"))
        if has_gpus and scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise ApiError(
                400,
                "Instances with guest accelerators do not support live migration. Set "
                "scheduling.onHostMaintenance to TERMINATE.",
                "invalid",
            )
        if scheduling.get("provisioningModel") == "SPOT":
            if scheduling.get("automaticRestart", False):
                raise ApiError(400, "Spot VMs cannot be set to restart automatically.", "invalid")
            row = self._seed_by_name.get((zone.rsplit("-", 1)[0], self._broker_type(body)))
            if row is not None and row.spot is None:
                raise ApiError(400, f"Spot VMs are not offered for {machine_name} in {zone}.", "invalid")
        disks = [d for d in body.get("disks") or [] if d]
        boot = [d for d in disks if d.get("boot")]
        if len(boot) != 1 or not ((boot[0].get("initializeParams") or {}).get("sourceImage") or boot[0].get("source")):
            raise ApiError(400, "Invalid value for field 'resource.disks': ''. Boot disk must be specified.", "invalid")
        params = boot[0].get("initializeParams") or {}
        source = str(params.get("sourceImage") or "")
        with self._lock:
            image = self._source_image(request.project, zone, source) if source else None
            known_projects = {p for p, _ in self._images}
        parsed = gcp_boot.image_of_source(source, request.project) if source else None
        if image is None and parsed is not None and parsed[0] in known_projects:
            raise gcp_boot.image_not_found(gcp_boot.image_path(*parsed))
        gcp_boot.check_disk_size(params, image.disk_size_gb if image is not None else None)
        gcp_boot.check_metadata(body)
        gcp_boot.check_tags(body)
        for key, value in (body.get("labels") or {}).items():
            if not _LABEL_KEY.match(str(key)) or not _LABEL_VALUE.match(str(value)):
                raise ApiError(
                    400,
                    f"Invalid value for field 'resource.labels': '{key}={value}'. Label keys and values ...",
                    "invalid",
                )
        return body

    def _instance_body(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """The stored instance: the request normalised to what GCP returns (full URLs, ids, addresses)."""
        n = next(self._counter)
        name = str(body["name"])
        zone_url = f"{API_BASE}projects/{project}/zones/{zone}"
        region = zone.rsplit("-", 1)[0]
        machine_name = last_segment(str(body["machineType"]))
        machine = self._machine_types[zone][machine_name]
        accelerators = [
            {
                "acceleratorType": f"{zone_url}/acceleratorTypes/{last_segment(str(a.get('acceleratorType', '')))}",
                "acceleratorCount": int(a.get("acceleratorCount") or 0),
            }
            for a in body.get("guestAccelerators") or []
            if a
        ]
        if not accelerators and machine.get("accelerators"):
            # GCP reports the bundled GPUs of A2/A3/G2 instances as guest accelerators too.
            bundled = machine["accelerators"][0]
            accelerators = [
                {
                    "acceleratorType": f"{zone_url}/acceleratorTypes/{bundled['guestAcceleratorType']}",
                    "acceleratorCount": bundled["guestAcceleratorCount"],
                }
            ]
        interfaces = []
        for index, nic in enumerate(body.get("networkInterfaces") or [{}]):
            access = [
                {
                    "kind": "compute#accessConfig",
                    "type": str(a.get("type") or "ONE_TO_ONE_NAT"),
                    "name": str(a.get("name") or "External NAT"),
                    "natIP": f"34.{(n >> 16) % 256}.{(n >> 8) % 256}.{n % 256}",
                    "networkTier": "PREMIUM",
                }
                for a in nic.get("accessConfigs") or []
            ]
            network = last_segment(str(nic.get("network") or "default"))
            interfaces.append(
                {
                    "kind": "compute#networkInterface",
                    "network": f"{API_BASE}projects/{project}/global/networks/{network}",
                    "subnetwork": f"{API_BASE}projects/{project}/regions/{region}/subnetworks/"
                    f"{last_segment(str(nic.get('subnetwork') or network))}",
                    "networkIP": f"10.{128 + index}.{(n >> 8) % 256}.{n % 256 or 2}",
                    "name": f"nic{index}",
                    "accessConfigs": access,
                    "fingerprint": base64.b64encode(hashlib.sha256(f"{name}{index}".encode()).digest()[:8]).decode(),
                    "stackType": "IPV4_ONLY",
                }
            )
        tags = gcp_boot.check_tags(body)
        disks = []
        for index, disk in enumerate(d for d in body.get("disks") or [] if d):
            params = disk.get("initializeParams") or {}
            if index == 0 and not params.get("diskSizeGb"):
                image = self._source_image(project, zone, str(params.get("sourceImage") or ""))
                params = {**params, "diskSizeGb": str(image.disk_size_gb if image else 10)}
            disk_name = name if index == 0 else f"{name}-{index}"
            disks.append(
                {
                    "kind": "compute#attachedDisk",
                    "type": str(disk.get("type") or "PERSISTENT"),
                    "mode": "READ_WRITE",
                    "source": f"{zone_url}/disks/{disk_name}",
                    "deviceName": f"persistent-disk-{index}",
                    "index": index,
                    "boot": bool(disk.get("boot")),
                    "autoDelete": bool(disk.get("autoDelete")),
                    "interface": "SCSI",
                    "diskSizeGb": str(params.get("diskSizeGb") or "10"),
                }
            )
        scheduling = dict(body.get("scheduling") or {})
        spot = scheduling.get("provisioningModel") == "SPOT"
        normalized_scheduling: dict[str, Any] = {
            "onHostMaintenance": scheduling.get("onHostMaintenance", "MIGRATE"),
            "automaticRestart": bool(scheduling.get("automaticRestart", not spot)),
            "preemptible": bool(scheduling.get("preemptible", False)),
            "provisioningModel": "SPOT" if spot else "STANDARD",
        }
        if spot:
            normalized_scheduling["instanceTerminationAction"] = scheduling.get("instanceTerminationAction", "STOP")
        labels = dict(body.get("labels") or {})
        return {
            "kind": "compute#instance",
            "id": numeric_id(project, zone, name, str(n)),
            "creationTimestamp": now_iso(),
            "name": name,
            "description": str(body.get("description") or ""),
            "tags": {"fingerprint": "42WmSpB8rSM=", **({"items": tags} if tags else {})},
            "machineType": f"{zone_url}/machineTypes/{machine_name}",
            "status": "PROVISIONING",
            "zone": zone_url,
            "canIpForward": False,
            "networkInterfaces": interfaces,
            "disks": disks,
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": "sandbox-metadata",
                "items": [i for i in (body.get("metadata") or {}).get("items") or [] if i],
            },
            "serviceAccounts": body.get("serviceAccounts") or [],
            "selfLink": f"{zone_url}/instances/{name}",
            "scheduling": normalized_scheduling,
            "cpuPlatform": "Unknown CPU Platform",
            "labels": labels,
            "labelFingerprint": base64.b64encode(
                hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).digest()[:8]
            ).decode(),
            "startRestricted": False,
            "deletionProtection": False,
            "guestAccelerators": accelerators,
            "fingerprint": base64.b64encode(hashlib.sha256(name.encode()).digest()[:8]).decode(),
        }

    def _delete(self, request: _Request, principal: Principal) -> Response:
        request_id = request.query.get("requestId", "")
        with self._lock:
            known = self._request_ids.get((request.project, request_id)) if request_id else None
            if known is not None and (request.project, known[0], known[1]) in self._operations:
                return json_response(self._operations[(request.project, known[0], known[1])].body)
            inst = self._instance_or_404(request)
            # A delete while the insert still runs: GCP finishes (or fails) the insert first.
            for op in list(self._operations.values()):
                if op.kind == "insert" and op.target == inst.name and op.zone == inst.zone:
                    self._complete(op)
            inst = self._instance_or_404(request)
            inst.body["status"] = "STOPPING"
            op = self._new_operation(request.project, inst.zone, "delete", inst, principal, None)
            if request_id:
                self._request_ids[(request.project, request_id)] = (inst.zone, op.body["name"])
            return json_response(op.body)

    # ----------------------------------------------------------------------------------- operations

    def _new_operation(
        self,
        project: str,
        zone: str,
        kind: str,
        inst: _Instance,
        principal: Principal,
        failure: tuple[str, int, str, str] | None,
    ) -> _Operation:
        now = now_iso()
        stamp = int(time.time() * 1000)
        n = next(self._counter)
        name = f"operation-{stamp}-{hashlib.sha256(f'{n}{inst.name}'.encode()).hexdigest()[:13]}-{n:08x}-sandbox"
        zone_url = f"{API_BASE}projects/{project}/zones/{zone}"
        body = {
            "kind": "compute#operation",
            "id": numeric_id("operation", name),
            "name": name,
            "zone": zone_url,
            "operationType": kind,
            "targetLink": f"{zone_url}/instances/{inst.name}",
            "targetId": inst.body["id"],
            "status": "RUNNING",
            "user": principal.email,
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": f"{zone_url}/operations/{name}",
        }
        op = _Operation(project, zone, body, kind, inst.name, failure)
        self._operations[(project, zone, name)] = op
        return op

    def _complete(self, op: _Operation) -> None:
        """Finish a running operation and apply its effect. Caller holds the lock."""
        if op.body["status"] == "DONE":
            return
        op.body.update(status="DONE", progress=100, endTime=now_iso())
        key = (op.project, op.zone, op.target)
        inst = self._instances.get(key)
        if op.failure is not None:
            code, status, status_message, message = op.failure
            op.body["error"] = {"errors": [{"code": code, "message": message}]}
            op.body["httpErrorStatusCode"] = status
            op.body["httpErrorMessage"] = status_message
            if op.kind == "insert":
                self._instances.pop(key, None)
                self._disks.pop(key, None)
            return
        if op.kind == "insert" and inst is not None and inst.body["status"] == "PROVISIONING":
            inst.body["status"] = "STAGING"
            inst.since = time.monotonic()
        elif op.kind == "delete":
            self._instances.pop(key, None)
            self._disks.pop(key, None)  # the boot disk is created with autoDelete
            self.booter.halt(f"{op.zone}/{op.target}")

    def _sweep(self) -> None:
        """Operations (and STAGING instances) older than ``settle_seconds`` finish on their own, as in GCP."""
        deadline = time.monotonic() - self.settle_seconds
        with self._lock:
            for op in list(self._operations.values()):
                if op.body["status"] != "DONE" and op.created <= deadline:
                    self._complete(op)
            for inst in self._instances.values():
                if inst.body["status"] == "STAGING" and inst.since <= deadline:
                    self._set_running(inst)
            for global_op in list(self._global_ops.values()):
                if global_op.body["status"] != "DONE" and global_op.created <= deadline:
                    self._complete_global(global_op)

    def _operation_or_404(self, request: _Request) -> _Operation:
        zone = self._zone_or_404(request)
        op = self._operations.get((request.project, zone, request.route["operation"]))
        if op is None:
            raise ApiError(
                404,
                f"The resource 'projects/{request.project}/zones/{zone}/operations/{request.route['operation']}' "
                "was not found",
                "notFound",
            )
        return op

    def _operations_get(self, request: _Request) -> Response:
        with self._lock:
            op = self._operation_or_404(request)
            self._complete(op)  # observing an operation is what moves it on in the sandbox
            return json_response(op.body)

    def _operations_list(self, request: _Request) -> Response:
        zone = self._zone_or_404(request)
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        with self._lock:
            ops = sorted(
                (o for o in self._operations.values() if o.project == request.project and o.zone == zone),
                key=lambda o: (o.body["insertTime"], o.body["name"]),
            )
            listed = [o for o in ops if matches(o.body)]
            for op in listed:
                self._complete(op)
            items = [dict(o.body) for o in listed]
        query = json.dumps(["operations", request.project, zone, request.query.get("filter", "")])
        offset, size = page_bounds(request.query, query, MAX_RESULTS)
        body: dict[str, Any] = {
            "kind": "compute#operationList",
            "id": f"projects/{request.project}/zones/{zone}/operations",
            "items": items[offset : offset + size],
            "selfLink": f"{API_BASE}projects/{request.project}/zones/{zone}/operations",
        }
        if offset + size < len(items):
            body["nextPageToken"] = encode_token(offset + size, query)
        return json_response(body)

    # ------------------------------------------------------------------------------- images and disks

    def _image_fault(self, request: _Request, path: str) -> None:
        """An injected ``image_missing`` answers as GCP answers an image it does not have: 404 notFound."""
        region = request.zone.rsplit("-", 1)[0] if request.zone else None
        fault = self.faults.take(IMAGE_ACTION, (), request.zone, kinds={FaultKind.IMAGE_MISSING}, region=region)
        if fault is not None:
            raise gcp_boot.image_not_found(path)

    def _image_family_view(self, request: _Request) -> Response:
        """``imageFamilyViews.get``: the newest image of the family rolled out in the zone, as ``{"image": ...}``."""
        zone = self._zone_or_404(request)
        family = request.route["family"]
        path = gcp_boot.image_path(request.project, family=family)
        self._image_fault(request, path)
        with self._lock:
            image = self._newest_in_family(request.project, family, zone)
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response({"image": gcp_boot.image_json(image)})

    def _images_from_family(self, request: _Request) -> Response:
        family = request.route["family"]
        path = gcp_boot.image_path(request.project, family=family)
        self._image_fault(request, path)
        with self._lock:
            image = self._newest_in_family(request.project, family, None)
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response(gcp_boot.image_json(image))

    def _images_get(self, request: _Request) -> Response:
        path = gcp_boot.image_path(request.project, request.route["image"])
        self._image_fault(request, path)
        with self._lock:
            image = self._images.get((request.project, request.route["image"]))
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response(gcp_boot.image_json(image))

    def _source_image(self, project: str, zone: str, source: str) -> gcp_boot.SeedImage | None:
        """The sandbox's image for a ``sourceImage``; None for one it never heard of (accepted as given, so a test
        may launch from a made-up image). Caller holds the lock."""
        parsed = gcp_boot.image_of_source(source, project)
        if parsed is None:
            return None
        image_project, name, family = parsed
        if family:
            return self._newest_in_family(image_project, family, zone)
        return self._images.get((image_project, name))

    def _boot_disk(self, project: str, zone: str, request: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The Disk resource an insert creates for its boot disk; it keeps the image the request named, resolved
        to one image as GCP resolves a family. Caller holds the lock."""
        params = next((d.get("initializeParams") or {} for d in request.get("disks") or [] if d and d.get("boot")), {})
        source = str(params.get("sourceImage") or "")
        image = self._source_image(project, zone, source)
        link = gcp_boot.image_json(image)["selfLink"] if image is not None else source
        image_id = numeric_id("image", image.project, image.name) if image is not None else ""
        size = int(body["disks"][0]["diskSizeGb"])
        return gcp_boot.disk_json(project, zone, str(body["name"]), size, link, image_id)

    def _disks_get(self, request: _Request) -> Response:
        zone = self._zone_or_404(request)
        with self._lock:
            disk = self._disks.get((request.project, zone, request.route["disk"]))
        if disk is None:
            path = f"projects/{request.project}/zones/{zone}/disks/{request.route['disk']}"
            raise ApiError(404, f"The resource '{path}' was not found", "notFound")
        return json_response(disk)

    # ------------------------------------------------------------------------------------ firewalls

    def _firewall_or_404(self, request: _Request) -> dict[str, Any]:
        firewall = self._firewalls.get((request.project, request.route["firewall"]))
        if firewall is None:
            path = f"projects/{request.project}/global/firewalls/{request.route['firewall']}"
            raise ApiError(404, f"The resource '{path}' was not found", "notFound")
        return firewall

    def _firewalls_get(self, request: _Request) -> Response:
        with self._lock:
            return json_response(self._firewall_or_404(request))

    def _firewalls_list(self, request: _Request) -> Response:
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        with self._lock:
            found = [dict(f) for (p, _), f in sorted(self._firewalls.items()) if p == request.project]
        found = [f for f in found if matches(f)]
        query = json.dumps(["firewalls", request.project, request.query.get("filter", "")])
        offset, size = page_bounds(request.query, query, MAX_RESULTS)
        body: dict[str, Any] = {
            "kind": "compute#firewallList",
            "id": f"projects/{request.project}/global/firewalls",
            "items": found[offset : offset + size],
            "selfLink": f"{API_BASE}projects/{request.project}/global/firewalls",
        }
        if offset + size < len(found):
            body["nextPageToken"] = encode_token(offset + size, query)
        return json_response(body)

    def _repeated_global(self, request: _Request) -> Response | None:
        """A repeated request id answers with the first operation, as it is now. Caller holds the lock."""
        request_id = request.query.get("requestId", "")
        if request_id and not _UUID.match(request_id):
            raise ApiError(400, f"Invalid value for field 'requestId': '{request_id}'. Must be a UUID.", "invalid")
        name = self._global_request_ids.get((request.project, request_id)) if request_id else None
        op = self._global_ops.get((request.project, name)) if name else None
        return json_response(op.body) if op is not None else None

    def _firewalls_insert(self, request: _Request, principal: Principal) -> Response:
        body = request.json()
        with self._lock:
            repeated = self._repeated_global(request)
            if repeated is not None:
                return repeated
            firewall = gcp_boot.firewall_json(request.project, body)
            name = firewall["name"]
            pending = any(
                o.kind == "insert" and o.target == name and o.project == request.project and o.body["status"] != "DONE"
                for o in self._global_ops.values()
            )
            if (request.project, name) in self._firewalls or pending:
                path = f"projects/{request.project}/global/firewalls/{name}"
                raise ApiError(409, f"The resource '{path}' already exists", "alreadyExists")
            op = self._new_global_operation(request, principal, "insert", name, firewall)
            return json_response(op.body)

    def _firewalls_delete(self, request: _Request, principal: Principal) -> Response:
        with self._lock:
            repeated = self._repeated_global(request)
            if repeated is not None:
                return repeated
            firewall = self._firewall_or_404(request)
            op = self._new_global_operation(request, principal, "delete", firewall["name"], None)
            return json_response(op.body)

    def _new_global_operation(
        self, request: _Request, principal: Principal, kind: str, target: str, firewall: dict[str, Any] | None
    ) -> _GlobalOperation:
        """A RUNNING global operation on a firewall rule. Caller holds the lock."""
        now = now_iso()
        name = gcp_boot.operation_name(target, next(self._counter), int(time.time() * 1000))
        base = f"{API_BASE}projects/{request.project}/global"
        body = {
            "kind": "compute#operation",
            "id": numeric_id("operation", name),
            "name": name,
            "operationType": kind,
            "targetLink": f"{base}/firewalls/{target}",
            "targetId": numeric_id("firewall", request.project, target),
            "status": "RUNNING",
            "user": principal.email,
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": f"{base}/operations/{name}",
        }
        op = _GlobalOperation(request.project, body, kind, target, firewall)
        self._global_ops[(request.project, name)] = op
        request_id = request.query.get("requestId", "")
        if request_id:
            self._global_request_ids[(request.project, request_id)] = name
        return op

    def _complete_global(self, op: _GlobalOperation) -> None:
        """Finish a firewall operation and apply it. Caller holds the lock."""
        if op.body["status"] == "DONE":
            return
        op.body.update(status="DONE", progress=100, endTime=now_iso())
        if op.kind == "insert" and op.firewall is not None:
            self._firewalls[(op.project, op.target)] = op.firewall
        elif op.kind == "delete":
            self._firewalls.pop((op.project, op.target), None)

    def _global_operations_get(self, request: _Request) -> Response:
        with self._lock:
            op = self._global_ops.get((request.project, request.route["operation"]))
            if op is None:
                path = f"projects/{request.project}/global/operations/{request.route['operation']}"
                raise ApiError(404, f"The resource '{path}' was not found", "notFound")
            self._complete_global(op)  # observing an operation is what moves it on in the sandbox
            return json_response(op.body)


def start_gcp_sandbox(host: str = "127.0.0.1", port: int = 0) -> GcpSandbox:
    """Build a ``GcpSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = GcpSandbox()
    sandbox.start(host, port)
    return sandbox
