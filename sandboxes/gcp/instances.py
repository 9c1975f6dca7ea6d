"""The GCP sandbox's instances: insert (with Compute Engine's checks on names, labels, machine types and boot
fields), get, list, aggregated list, delete, and the first boot that starts an instance's lease agent."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.boot import Booter, simulated_gpus
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.gcp import boot as gcp_boot
from sandboxes.gcp import filters as gcp_filter
from sandboxes.gcp.auth import Principal
from sandboxes.gcp.seed import GPU_LABELS, SeedMachine
from sandboxes.gcp.state import _UUID, KIND_CODES, LAUNCH_ACTION, SandboxInstance, _Instance, _Operation, _Request
from sandboxes.gcp.wire import (
    API_BASE,
    OPERATION_ERRORS,
    ApiError,
    last_segment,
    list_page,
    now_iso,
    numeric_id,
)
from sandboxes.server import json_response

SHORT_GPU_NAMES = {accelerator: label for label, accelerator in GPU_LABELS.items()}
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


class InstanceHandlers:
    """The ``instances`` handlers, mixed into ``GcpSandbox``."""

    faults: FaultRegistry
    booter: Booter
    _lock: threading.Lock
    _counter: itertools.count[int]
    _instances: dict[tuple[str, str, str], _Instance]
    _operations: dict[tuple[str, str, str], _Operation]
    _request_ids: dict[tuple[str, str], tuple[str, str]]
    _seed_by_name: dict[tuple[str, str], SeedMachine]
    _machine_types: dict[str, dict[str, dict[str, Any]]]
    _accelerators: dict[str, dict[str, dict[str, Any]]]
    _images: dict[tuple[str, str], gcp_boot.SeedImage]
    _disks: dict[tuple[str, str, str], dict[str, Any]]
    _aggregated: Callable[[_Request, str, str, dict[str, list[dict[str, Any]]]], Response]
    _boot_disk: Callable[[str, str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    _source_image: Callable[[str, str, str], gcp_boot.SeedImage | None]
    _check_gpu_quota: Callable[[_Request, str, dict[str, Any]], None]
    _quota_metric: Callable[[_Request], str]
    _new_operation: Callable[[str, str, str, _Instance, Principal, tuple[str, int, str, str] | None], _Operation]
    _complete: Callable[[_Operation], None]
    _on_operation: Callable[[str], bool]
    _sync_error: Callable[[str, _Request], ApiError]

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
        return json_response(
            list_page(
                request.query,
                query,
                found,
                kind="compute#instanceList",
                path=f"projects/{request.project}/zones/{zone}/instances",
            )
        )

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

    def _power(self, request: _Request, principal: Principal) -> Response:
        """instances.stop, start and reset, each a zone operation (a repeated ``requestId`` answers with the first).
        As Compute Engine: a stop moves the instance to STOPPING, then TERMINATED (GCP's word for stopped) with
        its disk kept; a start of a TERMINATED instance to STAGING, then RUNNING, and a start the zone has no
        capacity for (a ``capacity`` fault on ``compute.instances.start``) fails its operation with
        ``ZONE_RESOURCE_POOL_EXHAUSTED`` and leaves it TERMINATED; a reset keeps it RUNNING. A stop of a stopped
        instance and a start of a running one are operations that change nothing; an instance in the middle of
        another change, or a reset of one not running, is refused with 400 ``resourceNotReady``; a deleted one 404s.
        The lease agent stops with the instance and starts again, re-attaching to its lease, when it runs again."""
        action = request.action.rsplit(".", 1)[1]
        request_id = request.query.get("requestId", "")
        if request_id and not _UUID.match(request_id):
            raise ApiError(400, f"Invalid value for field 'requestId': '{request_id}'. Must be a UUID.", "invalid")
        with self._lock:
            known = self._request_ids.get((request.project, request_id)) if request_id else None
            if known is not None and (request.project, known[0], known[1]) in self._operations:
                return json_response(self._operations[(request.project, known[0], known[1])].body)
            inst = self._instance_or_404(request)
            status = str(inst.body["status"])
            settled = {"stop": ("TERMINATED",), "start": ("RUNNING", "STAGING", "PROVISIONING"), "reset": ()}
            ready = {"stop": ("RUNNING", "STAGING"), "start": ("TERMINATED",), "reset": ("RUNNING",)}
            if status not in settled[action] and status not in ready[action]:
                path = f"projects/{request.project}/zones/{inst.zone}/instances/{inst.name}"
                raise ApiError(400, f"The resource '{path}' is not ready", "resourceNotReady")
            broker_type = self._broker_type(inst.body)
        failure: tuple[str, int, str, str] | None = None
        if action == "start" and status == "TERMINATED":
            fault = self.faults.take(request.action, (broker_type,), inst.zone, kinds=OUTCOME_KINDS)
            if fault is not None:
                code = (fault.code or KIND_CODES[fault.kind]).removeprefix("operation:")
                failure = self._operation_failure(code, request, inst.zone, inst.name)
        with self._lock:
            op = self._new_operation(request.project, inst.zone, action, inst, principal, failure)
            if status in settled[action]:
                self._complete(op)  # nothing to change: GCP answers with an operation that is already done
            elif action == "stop":
                inst.body["status"] = "STOPPING"
            if request_id:
                self._request_ids[(request.project, request_id)] = (inst.zone, op.body["name"])
            return json_response(op.body)

    def _powered(self, action: str, inst: _Instance) -> None:
        """A stop, start or reset operation finished: the instance's status and its machine follow. Caller holds
        the lock."""
        instance_id = f"{inst.zone}/{inst.name}"
        if action == "stop" and inst.body["status"] != "TERMINATED":
            inst.body["status"] = "TERMINATED"
            inst.body["lastStopTimestamp"] = now_iso()
            self.booter.power_off(instance_id)
        elif action == "start" and inst.body["status"] == "TERMINATED":
            inst.body["status"] = "STAGING"
            inst.staged_seen = False
            inst.since = time.monotonic()
            self.booter.power_on(instance_id)
        elif action == "reset" and inst.body["status"] == "RUNNING":
            self.booter.power_off(instance_id)
            self.booter.power_on(instance_id)

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
