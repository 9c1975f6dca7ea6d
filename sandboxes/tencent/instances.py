"""The Tencent sandbox's instances: ``RunInstances`` (idempotent on ``ClientToken``, with what a launch carries),
``DescribeInstances``, ``DescribeInstancesStatus``, ``DescribeInstancesAttributes``, ``TerminateInstances``, and
the clock that moves an instance from PENDING to RUNNING, booting it, and on to the recycle bin.
"""

from __future__ import annotations

import base64
import itertools
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from sandboxes.boot import Booter, simulated_gpus
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.tencent import access
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.catalogue import ON_DEMAND, PUBLIC_IMAGES, REGIONS, SPOT, SeedPrice
from sandboxes.tencent.state import (
    _IMAGE_ID,
    _INSTANCE_ID,
    DEFAULT_SECURITY_GROUP,
    DISK_TYPES,
    FAULT_ERRORS,
    ORDERING_TIMEOUT,
    SECURITY_GROUPS_PER_INSTANCE,
    SYSTEM_DISK_DEFAULT_GB,
    SYSTEM_DISK_MAX_GB,
    USER_DATA_MAX_BYTES,
    _Carried,
    _filters,
    _Instance,
    _int,
    _matches,
    _Request,
    _string_list,
    _Timing,
)

# Each power action's state while CVM carries it out, and once it is done (the InstanceState values of
# DescribeInstances, https://www.tencentcloud.com/document/api/213/33258).
POWER_STATES = {"stop": ("STOPPING", "STOPPED"), "start": ("STARTING", "RUNNING"), "reboot": ("REBOOTING", "RUNNING")}
POWER_OPERATIONS = {"stop": "StopInstances", "start": "StartInstances", "reboot": "RebootInstances"}


class InstanceHandlers:
    """CVM's instance actions and the instances' life cycle, mixed into ``TencentSandbox``."""

    _clock: Callable[[], float]
    _fault_error: Callable[[Fault, _Request], ApiError]
    _instances: dict[str, _Instance]
    _key_pairs: dict[str, access.KeyPairRecord]
    _lock: threading.Lock
    _security_groups: dict[str, access.SecurityGroupRecord]
    _seed_by_key: dict[tuple[str, str], SeedPrice]
    _sequence: itertools.count[int]
    _sold_out: set[tuple[str, str, str]]
    _timing: _Timing
    _token_locks: dict[tuple[str, str], threading.Lock]
    _tokens: dict[tuple[str, str], list[str]]
    booter: Booter
    faults: FaultRegistry
    seed: list[SeedPrice]

    def _describe_instances(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "InstanceIds", 100)
        filters = _filters(
            params,
            (
                "zone",
                "instance-id",
                "instance-state",
                "instance-charge-type",
                "instance-name",
                "instance-type",
                "tag-key",
                "tag-value",
            ),
            max_filters=10,
            max_values=5,
            tags=True,
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "InstanceIds and Filters cannot be specified together.")
        for instance_id in ids:
            if not _INSTANCE_ID.match(instance_id):
                raise ApiError("InvalidInstanceId.Malformed", f"The instance id {instance_id} is malformed.")
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = [
                i
                for i in sorted(self._instances.values(), key=lambda i: i.sequence)
                if i.region == request.region
                and (not ids or i.instance_id in ids)
                and _matches(self._filter_fields(i, now), filters)
            ]
            page = [self._instance_json(i, now) for i in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "InstanceSet": page}

    def _describe_instances_status(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "InstanceIds", 100)
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = [
                i
                for i in sorted(self._instances.values(), key=lambda i: i.sequence)
                if i.region == request.region and (not ids or i.instance_id in ids)
            ]
            statuses = [
                {"InstanceId": i.instance_id, "InstanceState": self._state(i, now)}
                for i in chosen[offset : offset + limit]
            ]
        return {"TotalCount": len(chosen), "InstanceStatusSet": statuses}

    def _run_instances(self, request: _Request) -> dict[str, Any]:
        params = request.params
        token = params.get("ClientToken") or ""
        if not isinstance(token, str):
            raise ApiError("InvalidParameter", "ClientToken must be a string")
        if len(token.encode()) > 64:
            raise ApiError("InvalidClientToken.TooLong", "The ClientToken must be at most 64 bytes.")
        if not token:
            return {"InstanceIdSet": self._create(request)}
        key = (request.region, token)
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first, then answers its ids.
        if not token_lock.acquire(timeout=ORDERING_TIMEOUT):
            raise ApiError("InternalError", "A request with the same ClientToken is still in progress.")
        try:
            with self._lock:
                stored = self._tokens.get(key)
            # The token is looked up before any validation or fault: a retry of an accepted request must get the
            # accepted answer even if the zone has sold out since.
            if stored is not None:
                return {"InstanceIdSet": list(stored)}
            ids = self._create(request)
            with self._lock:
                self._tokens[key] = ids
            return {"InstanceIdSet": ids}
        finally:
            token_lock.release()

    def _create(self, request: _Request) -> list[str]:
        """Validate a RunInstances request, apply outcome faults and create its instances (PENDING)."""
        params = request.params
        charge = params.get("InstanceChargeType") or ON_DEMAND
        if charge not in (ON_DEMAND, SPOT):
            raise ApiError("InvalidParameterValue", "The sandbox sells POSTPAID_BY_HOUR and SPOTPAID instances only.")
        placement = params.get("Placement")
        zone = str(placement.get("Zone") or "") if isinstance(placement, dict) else ""
        instance_type = str(params.get("InstanceType") or "")
        image_id = str(params.get("ImageId") or "")
        for name, value in (("Placement.Zone", zone), ("InstanceType", instance_type), ("ImageId", image_id)):
            if not value:
                raise ApiError("MissingParameter", f"The parameter {name} is required.")
        count = _int(params, "InstanceCount", 1, 1, 100)
        if zone not in {z.name for z in REGIONS[request.region]}:
            raise ApiError("InvalidZone.MismatchRegion", f"The zone {zone} is not in {request.region}.")
        if not _IMAGE_ID.match(image_id):
            raise ApiError("InvalidImageId.Malformed", f"The image id {image_id} is malformed.")
        image = next((i for i in PUBLIC_IMAGES if i["ImageId"] == image_id), None)
        if image is None:
            raise ApiError("InvalidImageId.NotFound", f"The image {image_id} is not found.")
        seed = self._seed_by_key.get((request.region, instance_type))
        if seed is None:
            if not any(r.instance_type == instance_type for r in self.seed):
                raise ApiError("InvalidParameterValue.InstanceTypeNotFound", f"{instance_type} does not exist.")
            raise ApiError("ResourceUnavailable.InstanceType", f"{instance_type} is not sold in {request.region}.")
        if zone not in seed.all_zones:
            raise ApiError("ResourceUnavailable.InstanceType", f"{instance_type} is not sold in {zone}.")
        if charge == SPOT:
            self._check_spot(seed, params)
        carried = self._launch_fields(request, image)
        with self._lock:
            sold_out = (request.region, zone, instance_type) in self._sold_out
        if sold_out:
            raise ApiError(
                "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance", f"{instance_type} is sold out in {zone}."
            )
        if params.get("DryRun"):
            raise ApiError("DryRunOperation", "The request would have succeeded, but DryRun was set.")

        failure: tuple[str, str] | None = None
        fail_after = self._timing.launch_seconds
        fault = self.faults.take("RunInstances", [instance_type], zone, kinds=OUTCOME_KINDS)
        if fault is not None:
            if fault.kind is FaultKind.CAPACITY and not fault.code:
                # CVM's own stock-out shape: the request is accepted and the instance fails to launch later.
                code, template = FAULT_ERRORS[FaultKind.CAPACITY]
                failure = (code, f"{code}: " + template.format(instance_type=instance_type, zone=zone))
                fail_after = fault.seconds or fail_after
            else:
                raise self._fault_error(fault, request)

        tags: dict[str, str] = {}
        # Only instance tags matter here; other resource types (disks, images) are not emulated.
        for spec in params.get("TagSpecification") or []:
            if isinstance(spec, dict) and spec.get("ResourceType") == "instance":
                tags.update({str(t["Key"]): str(t.get("Value") or "") for t in spec.get("Tags") or []})
        now = self._clock()
        created = datetime.now(UTC).replace(microsecond=0)
        name = str(params.get("InstanceName") or "未命名")
        ids: list[str] = []
        with self._lock:
            for _ in range(count):
                sequence = next(self._sequence)
                instance_id = self._new_id()
                self._instances[instance_id] = _Instance(
                    instance_id=instance_id,
                    uuid=str(uuid.uuid4()),
                    sequence=sequence,
                    region=request.region,
                    zone=zone,
                    seed=seed,
                    charge_type=charge,
                    image=image,
                    name=name if count == 1 else f"{name}{len(ids) + 1}",
                    tags=dict(tags),
                    client_token=str(params.get("ClientToken") or ""),
                    created_at=created,
                    private_ip=f"10.{sorted(REGIONS).index(request.region)}.{sequence // 250}.{sequence % 250 + 2}",
                    run_request_id=request.request_id,
                    ready_at=now + (fail_after if failure else self._timing.launch_seconds),
                    failure=failure,
                    user_data=carried.user_data,
                    system_disk=dict(carried.system_disk),
                    key_ids=list(carried.key_ids),
                    security_group_ids=list(carried.security_group_ids),
                )
                ids.append(instance_id)
        return ids

    def _launch_fields(self, request: _Request, image: dict[str, Any]) -> _Carried:
        """RunInstances' access fields, checked as CVM checks them: ``UserData``, ``SystemDisk``,
        ``LoginSettings.KeyIds`` (key pairs of this region) and ``SecurityGroupIds`` (groups of this region)."""
        params = request.params
        user_data = None
        if params.get("UserData") is not None:
            user_data = access.decode_user_data(params["UserData"], USER_DATA_MAX_BYTES)
        disk = params.get("SystemDisk") or {}
        if not isinstance(disk, dict):
            raise ApiError("InvalidParameter", "SystemDisk must be an object.")
        size = disk.get("DiskSize", SYSTEM_DISK_DEFAULT_GB)
        smallest = int(image.get("ImageSize") or 1)
        if isinstance(size, bool) or not isinstance(size, int) or not smallest <= size <= SYSTEM_DISK_MAX_GB:
            raise ApiError(
                "InvalidParameterValue",
                f"The value `{size}` specified in the parameter `SystemDisk.DiskSize` is not valid.",
            )
        disk_type = str(disk.get("DiskType") or "CLOUD_PREMIUM")
        if disk_type not in DISK_TYPES:
            raise ApiError("InvalidParameterValue", f"The disk type {disk_type} is not valid.")
        login = params.get("LoginSettings") or {}
        if not isinstance(login, dict):
            raise ApiError("InvalidParameter", "LoginSettings must be an object.")
        key_ids = _string_list(login, "KeyIds", 100)
        if key_ids and login.get("Password"):
            raise ApiError("InvalidParameterCombination", "LoginSettings takes a password or key pairs, not both.")
        groups = _string_list(params, "SecurityGroupIds", 100)
        if len(groups) > SECURITY_GROUPS_PER_INSTANCE:
            raise ApiError(
                "LimitExceeded.AssociateUSGLimitExceeded",
                f"An instance can be bound to at most {SECURITY_GROUPS_PER_INSTANCE} security groups.",
            )
        with self._lock:
            for key_id in key_ids:
                if not access.KEY_ID.match(key_id):
                    raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
                known = self._key_pairs.get(key_id)
                if known is None or known.region != request.region:
                    raise ApiError("InvalidParameterValue.KeyPairNotFound", f"The key pair {key_id} does not exist.")
            for group_id in groups:
                known_group = self._security_groups.get(group_id)
                if known_group is None or known_group.region != request.region:
                    raise ApiError("InvalidSecurityGroupId.NotFound", f"The security group {group_id} does not exist.")
        return _Carried(
            user_data=user_data,
            system_disk={"DiskType": disk_type, "DiskSize": size},
            key_ids=tuple(key_ids),
            security_group_ids=tuple(groups),
        )

    @staticmethod
    def _check_spot(seed: SeedPrice, params: dict[str, Any]) -> None:
        if seed.spot is None:
            # The seed has no sourced spot price for any Tencent type, so none is offered (or invented).
            raise ApiError(
                "UnsupportedOperation.NoInstanceTypeSupportSpot", f"{seed.instance_type} is not sold as spot."
            )
        market = params.get("InstanceMarketOptions") or {}
        raw = (market.get("SpotOptions") or {}).get("MaxPrice")
        try:
            bid = Decimal(str(raw)) if raw not in (None, "") else None
        except InvalidOperation:
            raise ApiError("InvalidParameterValue", f"MaxPrice {raw!r} is not a number.") from None
        if bid is not None and bid < seed.spot:
            raise ApiError("InvalidParameterValue.InsufficientPrice", f"The bid {bid} is below the spot price.")

    def _terminate_instances(self, request: _Request) -> dict[str, Any]:
        ids = _string_list(request.params, "InstanceIds", 100)
        if not ids:
            raise ApiError("MissingParameter", "The parameter InstanceIds is required.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen: list[_Instance] = []
            for instance_id in ids:
                if not _INSTANCE_ID.match(instance_id):
                    raise ApiError("InvalidInstanceId.Malformed", f"The instance id {instance_id} is malformed.")
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != request.region:
                    raise ApiError("InvalidInstanceId.NotFound", f"The instance {instance_id} is not found.")
                state = self._state(instance, now)
                if state == "TERMINATING":
                    raise ApiError("UnsupportedOperation.InstanceStateTerminating", f"{instance_id} is terminating.")
                if state == "SHUTDOWN":
                    raise ApiError("UnsupportedOperation.InstanceStateShutdown", f"{instance_id} is shut down.")
                chosen.append(instance)
            for instance in chosen:
                instance.terminate_at = now
                instance.terminate_request_id = request.request_id
        for instance in chosen:
            self.booter.halt(instance.instance_id)
        return {}

    def _describe_instances_attributes(self, request: _Request) -> dict[str, Any]:
        attributes = _string_list(request.params, "Attributes", 10)
        ids = _string_list(request.params, "InstanceIds", 100)
        if attributes != ["UserData"]:
            raise ApiError("InvalidParameterValue", "Attributes takes UserData.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            found = []
            for instance_id in ids:
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != request.region:
                    raise ApiError("InvalidInstanceId.NotFound", f"The instance {instance_id} is not found.")
                found.append({"InstanceId": instance_id, "Attributes": {"UserData": instance.user_data}})
        return {"InstanceSet": found}

    def _advance(self) -> None:
        """Boot every instance that has begun running since it was last looked at, from its user data."""
        now = self._clock()
        starting: list[_Instance] = []
        with self._lock:
            for instance in self._instances.values():
                if not instance.booted and self._state(instance, now) == "RUNNING":
                    instance.booted = True
                    starting.append(instance)
        for instance in starting:
            seed = instance.seed
            self.booter.boot(
                instance_id=instance.instance_id,
                user_data=base64.b64decode(instance.user_data) if instance.user_data else None,
                gpus=simulated_gpus(seed.gpu_key, seed.gpu_count, seed.gpu_memory_gb),
                instance_type=seed.instance_type,
                zone=instance.zone,
            )

    def _new_id(self) -> str:
        while True:
            candidate = "ins-" + uuid.uuid4().hex[:8]
            if candidate not in self._instances:
                return candidate

    def _state(self, instance: _Instance, now: float) -> str:
        # States are computed from timestamps when asked for: no background thread, and a test clock moves them.
        timing = self._timing
        if instance.terminate_at is not None:
            return "TERMINATING" if now < instance.terminate_at + timing.terminate_seconds else "SHUTDOWN"
        if now < instance.ready_at:
            return "PENDING"
        if instance.failure:
            return "LAUNCH_FAILED"
        if instance.power_at is not None:
            during, after = POWER_STATES[instance.power_action]
            return during if now < instance.power_at + timing.power_seconds else after
        return "RUNNING"

    def _purge(self, now: float) -> None:
        """Forget what CVM no longer describes: recycled launch failures and terminated instances (caller locks)."""
        timing = self._timing
        gone = []
        for instance in self._instances.values():
            if instance.terminate_at is not None:
                until = instance.terminate_at + timing.terminate_seconds + timing.retention_seconds
            elif instance.failure is not None:
                until = instance.ready_at + timing.retention_seconds
            else:
                continue
            if now >= until:
                gone.append(instance.instance_id)
        for instance_id in gone:
            del self._instances[instance_id]

    def _filter_fields(self, instance: _Instance, now: float) -> dict[str, Iterable[str]]:
        fields: dict[str, Iterable[str]] = {
            "zone": [instance.zone],
            "instance-id": [instance.instance_id],
            "instance-state": [self._state(instance, now)],
            "instance-charge-type": [instance.charge_type],
            "instance-name": [instance.name],
            "instance-type": [instance.seed.instance_type],
            "tag-key": list(instance.tags),
            "tag-value": list(instance.tags.values()),
        }
        for key, value in instance.tags.items():
            fields[f"tag:{key}"] = [value]
        return fields

    def _instance_json(self, instance: _Instance, now: float) -> dict[str, Any]:
        """An ``Instance`` as DescribeInstances answers it (the fields the SDK model defines that matter here)."""
        state = self._state(instance, now)
        if instance.terminate_at is not None:
            operation, request_id = "TerminateInstances", instance.terminate_request_id
            operation_state = "OPERATING" if state == "TERMINATING" else "SUCCESS"
            error_message = None
        elif instance.power_at is not None:
            operation, request_id = POWER_OPERATIONS[instance.power_action], instance.power_request_id
            operation_state = "OPERATING" if state in ("STOPPING", "STARTING", "REBOOTING") else "SUCCESS"
            error_message = None
        else:
            operation, request_id = "RunInstances", instance.run_request_id
            operation_state = {"PENDING": "OPERATING", "LAUNCH_FAILED": "FAILED"}.get(state, "SUCCESS")
            error_message = instance.failure[1] if instance.failure and state == "LAUNCH_FAILED" else None
        seed = instance.seed
        return {
            "Placement": {"Zone": instance.zone, "ProjectId": 0},
            "InstanceId": instance.instance_id,
            "InstanceType": seed.instance_type,
            "CPU": seed.vcpus,
            "Memory": seed.memory_gib,
            "RestrictState": "NORMAL",
            "InstanceName": instance.name,
            "InstanceChargeType": instance.charge_type,
            "SystemDisk": {
                "DiskType": instance.system_disk.get("DiskType", "CLOUD_PREMIUM"),
                "DiskId": "disk-" + instance.instance_id[4:],
                "DiskSize": instance.system_disk.get("DiskSize", SYSTEM_DISK_DEFAULT_GB),
            },
            "DataDisks": None,
            "PrivateIpAddresses": [instance.private_ip],
            "PublicIpAddresses": None,  # no InternetAccessible bandwidth was bought
            "InternetAccessible": {"InternetChargeType": "", "InternetMaxBandwidthOut": 0, "PublicIpAssigned": False},
            "VirtualPrivateCloud": {"VpcId": "vpc-sbx00001", "SubnetId": "subnet-sbx00001", "AsVpcGateway": False},
            "ImageId": instance.image["ImageId"],
            "RenewFlag": None,
            "CreatedTime": instance.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ExpiredTime": None,
            "OsName": instance.image["OsName"],
            "SecurityGroupIds": list(instance.security_group_ids) or [DEFAULT_SECURITY_GROUP],
            "LoginSettings": {"KeyIds": list(instance.key_ids) or None},
            "InstanceState": state,
            "Tags": [{"Key": k, "Value": v} for k, v in sorted(instance.tags.items())],
            # KEEP_CHARGING or STOP_CHARGING for an instance stopped (or stopping) in that mode.
            "StopChargingMode": instance.stopped_mode or "NOT_APPLICABLE",
            "Uuid": instance.uuid,
            "LatestOperation": operation,
            "LatestOperationState": operation_state,
            "LatestOperationRequestId": request_id,
            "LatestOperationErrorMsg": error_message,
            "IsolatedSource": "NOTISOLATED",
            "GPUInfo": {"GPUCount": float(seed.gpu_count), "GPUId": [], "GPUType": seed.gpu_type},
            "LicenseType": "TencentCloud",
            "DisableApiTermination": False,
            "DefaultLoginUser": "ubuntu",
            "DefaultLoginPort": 22,
        }
