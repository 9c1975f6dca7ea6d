"""The ECS sandbox's instances: ``RunInstances`` (idempotent on ``ClientToken``, checking what a launch carries),
``DescribeInstances``, ``DescribeInstanceStatus``, ``DescribeUserData``, ``DescribeInstanceAttribute``,
``DescribeDisks`` and ``DeleteInstances``, and the boot of an instance once it is seen running.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.records import SandboxImage
from sandboxes.alibaba.resources import EcsResources
from sandboxes.alibaba.state import (
    INSTANCES_MAX_RESULTS,
    REGIONS,
    SPOT_STRATEGIES,
    STATUS_MAX_PAGE,
    SYSTEM_DISK_DEFAULT_GB,
    SYSTEM_DISK_MAX_GB,
    SYSTEM_DISK_MIN_GB,
    USER_DATA_MAX_BYTES,
    _Instance,
    _minutes,
    _Request,
    _Stored,
)
from sandboxes.alibaba.wire import WireError
from sandboxes.boot import Booter, simulated_gpus
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultRegistry


class InstanceHandlers:
    """ECS's instance actions, mixed into ``AlibabaSandbox``."""

    _catalogue: dict[str, dict[str, Any]]
    _code: Callable[[str], tuple[str, str, int]]
    _fault_error: Callable[[Fault], WireError]
    _gpus: dict[str, tuple[str, int, int]]
    _instances: dict[str, _Instance]
    _ip_counter: itertools.count[int]
    _lock: threading.Lock
    _page: Callable[[list[Any], dict[str, str], int], tuple[list[Any], str]]
    _region: Callable[[_Request], str]
    _release_tokens: set[tuple[str, str]]
    _token_locks: dict[tuple[str, str], threading.Lock]
    _tokens: dict[tuple[str, str], _Stored]
    _zone: Callable[[str, str], str]
    boot_observations: int
    booter: Booter
    faults: FaultRegistry
    on_demand_price: Callable[[str, str], Decimal | None]
    resources: EcsResources
    stock: Callable[[str, str, str], str | None]

    def _run_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        launch = self._launch_request(region, params)
        token = params.get("ClientToken", "")
        if token and (len(token) > 64 or not token.isascii()):
            raise WireError("InvalidClientToken.ValueNotSupported", "The ClientToken provided is invalid.", 400)
        if not token:
            return self._create(req, region, launch)
        key = (region, token)
        # Every other parameter is part of the request's identity: a token reused for another request is refused.
        fingerprint = tuple(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first, then gets its answer.
        with token_lock:
            with self._lock:
                stored = self._tokens.get(key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    raise WireError(
                        "IdempotenceParamNotMatch",
                        "Request uses a client token in a previous request but is not identical to that request.",
                        400,
                    )
                return json.loads(json.dumps(stored.body))  # a copy: the stored answer must stay as first sent
            body = self._create(req, region, launch)
            with self._lock:
                self._tokens[key] = _Stored(fingerprint, body)
            return body

    def _launch_request(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """Validate a RunInstances request (final errors only) and return what ``_create`` needs."""
        instance_type = wire.required(params, "InstanceType")
        if instance_type not in self._catalogue:
            raise WireError(
                "InvalidInstanceType.ValueNotSupported",
                "The specified InstanceType does not exist or beyond the permitted range.",
                400,
            )
        image = self.resources.image(region, wire.required(params, "ImageId"))
        if image is None:
            raise WireError("InvalidImageId.NotFound", "The specified ImageId does not exist.", 404)
        zone = self._zone(region, params["ZoneId"]) if params.get("ZoneId") else ""
        amount = wire.integer(params, "Amount", 1, 1, 100)
        min_amount = wire.integer(params, "MinAmount", amount, 1, 100)
        if min_amount > amount:
            raise WireError("InvalidMinAmount.Malformed", "The specified parameter MinAmount is not valid.", 400)
        charge_type = params.get("InstanceChargeType") or "PostPaid"
        if charge_type != "PostPaid":
            raise WireError("InvalidParameter", "The sandbox sells pay-as-you-go (PostPaid) instances only.")
        strategy = params.get("SpotStrategy") or "NoSpot"
        if strategy not in SPOT_STRATEGIES:
            raise WireError("InvalidSpotStrategy", "The specified SpotStrategy is not valid.", 400)
        limit = 0.0
        if strategy == "SpotWithPriceLimit":
            try:
                limit = float(wire.required(params, "SpotPriceLimit"))
            except ValueError:
                limit = -1.0
            if limit <= 0:
                raise WireError("InvalidSpotPriceLimit", "The specified SpotPriceLimitis not valid.", 400)
        tags = wire.tags(params)
        user_data = self._user_data(params)
        disk = self._system_disk(params, image)
        key_pair = params.get("KeyPairName") or ""
        if key_pair and self.resources.key_pair(region, key_pair) is None:
            raise WireError(
                "InvalidKeyPairName.NotFound", "The specified KeyPairName does not exist in our records.", 404
            )
        prefix = REGIONS[region][2]
        vswitch_id = params.get("VSwitchId") or f"vsw-sandbox{prefix}"
        vswitch = self.resources.vswitch(region, vswitch_id)
        if vswitch is not None and zone and vswitch.zone != zone:
            raise WireError("InvalidParameter.Mismatch", "Specified virtual switch is not in the specified zone.", 400)
        if vswitch is not None and not zone:  # ECS launches in the vSwitch's zone when no zone is named
            zone = vswitch.zone
        vpc_id = vswitch.vpc_id if vswitch is not None else f"vpc-sandbox{prefix}"
        group_id = params.get("SecurityGroupId") or f"sg-sandbox{prefix}"
        group = self.resources.group(group_id)
        if self.resources.group_deleted(group_id) or (group is not None and group.region != region):
            raise WireError("InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist.", 404)
        if group is not None and group.vpc_id != vpc_id:
            raise WireError(
                "InvalidParameter.Mismatch", "Specified security group and virtual switch are not in the same VPC.", 400
            )
        return {
            "instance_type": instance_type,
            "image_id": image.image_id,
            "zone": zone,
            "amount": amount,
            "strategy": strategy,
            "limit": limit,
            "tags": tags,
            "vswitch_id": vswitch_id,
            "vpc_id": vpc_id,
            "security_group_id": group_id,
            "user_data": user_data,
            "system_disk_gb": disk,
            "key_pair_name": key_pair,
        }

    @staticmethod
    def _user_data(params: dict[str, str]) -> str:
        """UserData as sent: Base64 of at most 32 KB of raw data (the limit counts the bytes before encoding)."""
        encoded = params.get("UserData") or ""
        if not encoded:
            return ""
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise WireError("InvalidUserData.Base64FormatInvalid", "The specified UserData is not valid", 400) from None
        if len(raw) > USER_DATA_MAX_BYTES:
            raise WireError("InvalidUserData.SizeExceeded", 'The specified parameter "UserData" exceeds the size.', 400)
        return encoded

    @staticmethod
    def _system_disk(params: dict[str, str], image: SandboxImage) -> int:
        """SystemDisk.Size in GiB: 20 to 2048 and not below the image (ECS answers these refusals with 404)."""
        raw = params.get("SystemDisk.Size") or ""
        if not raw:
            return max(SYSTEM_DISK_DEFAULT_GB, image.size_gb)
        try:
            size = int(raw)
        except ValueError:
            raise WireError(
                "InvalidSystemDiskSize", "The specified parameter SystemDisk.Size is invalid.", 404
            ) from None
        if size < SYSTEM_DISK_MIN_GB:
            raise WireError(
                "InvalidSystemDiskSize.LessThanMinSize",
                "The specified parameter SystemDisk.Size is less than the min size.",
                404,
            )
        if size > SYSTEM_DISK_MAX_GB:
            raise WireError(
                "InvalidSystemDiskSize.MoreThanMaxSize",
                "The specified parameter SystemDisk.Size is more than the max size.",
                404,
            )
        if size < image.size_gb:
            raise WireError(
                "InvalidSystemDiskSize.LessThanImageSize",
                "The specified parameter SystemDisk.Size is less than the image size.",
                404,
            )
        return size

    def _create(self, req: _Request, region: str, launch: dict[str, Any]) -> dict[str, Any]:
        """What ECS decides after accepting the request: injected outcomes, then stock, then the instances."""
        instance_type = str(launch["instance_type"])
        # Outcome faults fire only for a request ECS would act on: a replayed token returned its answer before.
        fault = self.faults.take(req.action, (instance_type,), launch["zone"] or None, kinds=OUTCOME_KINDS)
        if fault is not None:
            raise self._fault_error(fault)
        zone = str(launch["zone"]) or self._zone_with_stock(region, instance_type)
        category = self.stock(region, zone, instance_type)
        if category is None:
            raise WireError(
                "InvalidInstanceType.ZoneNotSupported", "The specified zone does not support this instancetype.", 403
            )
        if category == "WithoutStock":
            raise WireError(*self._code("OperationDenied.NoStock"))
        now = datetime.now(UTC)
        created: list[str] = []
        with self._lock:
            for _ in range(int(launch["amount"])):
                instance_id = f"i-{REGIONS[region][2]}{uuid.uuid4().hex[:17]}"
                n = next(self._ip_counter)
                self._instances[instance_id] = _Instance(
                    instance_id=instance_id,
                    region=region,
                    zone=zone,
                    instance_type=instance_type,
                    image_id=str(launch["image_id"]),
                    spot_strategy=str(launch["strategy"]),
                    spot_price_limit=float(launch["limit"]),
                    client_token=req.params.get("ClientToken", ""),
                    tags=dict(launch["tags"]),
                    created=now,
                    private_ip=f"172.16.{n // 250}.{n % 250 + 1}",
                    vswitch_id=str(launch["vswitch_id"]),
                    security_group_id=str(launch["security_group_id"]),
                    vpc_id=str(launch["vpc_id"]),
                    user_data=str(launch["user_data"]),
                    system_disk_gb=int(launch["system_disk_gb"]),
                    key_pair_name=str(launch["key_pair_name"]),
                )
                created.append(instance_id)
        price = self.on_demand_price(region, instance_type)
        return {
            "OrderId": str(int(now.timestamp() * 1000)),
            "TradePrice": float(price) if price is not None else 0.0,
            "InstanceIdSets": {"InstanceIdSet": created},
        }

    def _zone_with_stock(self, region: str, instance_type: str) -> str:
        for zone in REGIONS[region][1]:
            if self.stock(region, zone, instance_type) in ("WithStock", "ClosedWithStock"):
                return zone
        raise WireError(*self._code("OperationDenied.NoStock"))

    def _observe(self, instance: _Instance, started: list[_Instance]) -> None:
        """A Describe call saw the instance: it runs after ``boot_observations`` looks (caller holds the lock).
        One that just reached Running is added to ``started``, to boot once the lock is released."""
        if instance.status == "Pending":
            if instance.observed >= self.boot_observations:
                instance.status = "Running"
                started.append(instance)
            instance.observed += 1
        elif instance.status in ("Stopping", "Starting"):  # a stop or start (power.py) is done once seen
            instance.status = "Stopped" if instance.status == "Stopping" else "Running"

    def _boot(self, started: list[_Instance]) -> None:
        """Start the lease agent each instance's user data names, as cloud-init runs it on a real machine."""
        for instance in started:
            key, count, memory = self._gpus.get(instance.instance_type, ("", 0, 0))
            self.booter.boot(
                instance_id=instance.instance_id,
                user_data=base64.b64decode(instance.user_data) if instance.user_data else None,
                gpus=simulated_gpus(key, count, memory),
                instance_type=instance.instance_type,
                zone=instance.zone,
            )

    def _listed(self, region: str) -> list[_Instance]:
        # Released instances vanish from every Describe call, as ECS forgets them; instances() still shows them.
        return sorted(
            (i for i in self._instances.values() if i.region == region and i.status != "Deleted"),
            key=lambda i: (i.created, i.instance_id),
        )

    def _describe_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids: set[str] | None = None
        if params.get("InstanceIds"):
            try:
                parsed = json.loads(params["InstanceIds"])
                if not isinstance(parsed, list) or not all(isinstance(i, str) for i in parsed) or len(parsed) > 100:
                    raise ValueError("not a list of at most 100 ids")
            except ValueError:
                raise WireError(
                    "InvalidInstanceIds.Malformed", "The specified parameter InstanceIds is not valid.", 400
                ) from None
            ids = set(parsed) if parsed else None
        tags = wire.indexed_pairs(params, "Tag")
        token_mode = bool(params.get("NextToken") or params.get("MaxResults"))
        if token_mode:
            size = wire.integer(params, "MaxResults", 10, 1, INSTANCES_MAX_RESULTS)
        else:
            size = wire.integer(params, "PageSize", 10, 1, INSTANCES_MAX_RESULTS)
            number = wire.integer(params, "PageNumber", 1, 1, 1_000_000)
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if (ids is None or i.instance_id in ids)
                and (not params.get("ZoneId") or i.zone == params["ZoneId"])
                and (not params.get("InstanceType") or i.instance_type == params["InstanceType"])
                and all(k in i.tags and (v is None or v == "" or i.tags[k] == v) for k, v in tags)
            ]
            if token_mode:
                page, token = self._page(matches, params, size)
            else:
                page, token = matches[(number - 1) * size : number * size], ""
            started: list[_Instance] = []
            for instance in page:
                self._observe(instance, started)
            items = [self._instance_item(i) for i in page]
        self._boot(started)
        body: dict[str, Any] = {"TotalCount": len(matches), "Instances": {"Instance": items}}
        if token_mode:
            body["NextToken"] = token
        else:
            body.update({"PageNumber": number, "PageSize": size})
        return body

    def _instance_item(self, i: _Instance) -> dict[str, Any]:
        entry = self._catalogue[i.instance_type]
        image = self.resources.image(i.region, i.image_id)
        return {
            "InstanceId": i.instance_id,
            "InstanceName": i.instance_id,
            "HostName": f"iZ{i.instance_id[2:]}Z",
            "RegionId": i.region,
            "ZoneId": i.zone,
            "InstanceType": i.instance_type,
            "InstanceTypeFamily": entry["InstanceTypeFamily"],
            "Cpu": entry["CpuCoreCount"],
            "Memory": int(entry["MemorySize"] * 1024),  # DescribeInstances reports MiB
            "GPUAmount": entry["GPUAmount"],
            "GPUSpec": entry["GPUSpec"],
            "Status": i.status,
            # The mode a stopped instance was stopped in; "Not-applicable" while it is not stopped.
            "StoppedMode": i.stopped_mode or "Not-applicable",
            "CreationTime": _minutes(i.created),
            "StartTime": _minutes(i.created),
            "ExpiredTime": "2099-12-31T15:59Z",
            "ImageId": i.image_id,
            "OSType": "linux",
            "OSName": image.os_name if image is not None else "",
            "InstanceChargeType": "PostPaid",
            "InternetChargeType": "PayByTraffic",
            "InternetMaxBandwidthOut": 0,
            "SpotStrategy": i.spot_strategy,
            "SpotPriceLimit": i.spot_price_limit,
            "InstanceNetworkType": "vpc",
            "IoOptimized": True,
            "DeletionProtection": False,
            "SerialNumber": str(uuid.uuid5(uuid.NAMESPACE_OID, i.instance_id)),
            "PublicIpAddress": {"IpAddress": []},
            "InnerIpAddress": {"IpAddress": []},
            "EipAddress": {"IpAddress": "", "AllocationId": "", "Bandwidth": 0},
            "VpcAttributes": {
                "VpcId": i.vpc_id,
                "VSwitchId": i.vswitch_id,
                "PrivateIpAddress": {"IpAddress": [i.private_ip]},
                "NatIpAddress": "",
            },
            "SecurityGroupIds": {"SecurityGroupId": [i.security_group_id]},
            "KeyPairName": i.key_pair_name,
            "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in sorted(i.tags.items())]},
        }

    def _one_instance(self, req: _Request) -> _Instance:
        """The listed instance ``InstanceId`` names (the caller holds the lock). DescribeInstanceAttribute has no
        RegionId (the regional endpoint says it); one endpoint serves every region here, so the id decides."""
        region = self._region(req) if req.params.get("RegionId") else None
        instance_id = wire.required(req.params, "InstanceId")
        instance = self._instances.get(instance_id)
        if instance is None or region not in (None, instance.region) or instance.status == "Deleted":
            raise WireError("InvalidInstanceId.NotFound", "The specified InstanceId does not exist.", 404)
        return instance

    def _describe_user_data(self, req: _Request) -> dict[str, Any]:
        """DescribeUserData: the UserData the instance was launched with, still Base64-encoded ("" for none)."""
        with self._lock:
            instance = self._one_instance(req)
            return {"InstanceId": instance.instance_id, "RegionId": instance.region, "UserData": instance.user_data}

    def _describe_instance_attribute(self, req: _Request) -> dict[str, Any]:
        """DescribeInstanceAttribute: the instance's image, network, security groups and state."""
        with self._lock:
            instance = self._one_instance(req)
            item = self._instance_item(instance)
        keys = (
            "InstanceId", "InstanceName", "HostName", "RegionId", "ZoneId", "InstanceType", "Cpu", "Memory",
            "Status", "CreationTime", "ExpiredTime", "ImageId", "InstanceChargeType", "InternetChargeType",
            "InternetMaxBandwidthOut", "InstanceNetworkType", "SerialNumber", "PublicIpAddress",
            "InnerIpAddress", "EipAddress", "VpcAttributes", "SecurityGroupIds",
        )  # fmt: skip
        return {
            **{k: item[k] for k in keys},
            "IoOptimized": "optimized",
            "InternetMaxBandwidthIn": 200,
            "Description": "",
            "StoppedMode": "Not-applicable",
            "OperationLocks": {"LockReason": []},
        }

    def _describe_disks(self, req: _Request) -> dict[str, Any]:
        """DescribeDisks: one system disk per listed instance (``SystemDisk.Size`` GiB, released with it);
        InstanceId, DiskType (all, system or data) and ZoneId filters, PageNumber/PageSize pages (at most 100)."""
        params = req.params
        region = self._region(req)
        disk_type = params.get("DiskType") or "all"
        if disk_type not in ("all", "system", "data"):
            raise WireError("InvalidDiskType.ValueNotSupported", 'The specified parameter "DiskType" is not valid.')
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if disk_type != "data"
                and (not params.get("InstanceId") or i.instance_id == params["InstanceId"])
                and (not params.get("ZoneId") or i.zone == params["ZoneId"])
            ]
        page, number, size = wire.number_page(matches, params, 10, 100)
        disks = [
            {
                "DiskId": f"d-{REGIONS[i.region][2]}{hashlib.sha256(i.instance_id.encode()).hexdigest()[:17]}",
                "RegionId": i.region,
                "ZoneId": i.zone,
                "InstanceId": i.instance_id,
                "Type": "system",
                "Category": "cloud_efficiency",
                "Size": i.system_disk_gb,
                "ImageId": i.image_id,
                "Device": "/dev/xvda",
                "Status": "In_use",
                "Portable": False,
                "DeleteWithInstance": True,
                "Encrypted": False,
                "CreationTime": _minutes(i.created),
                "Tags": {"Tag": []},
            }
            for i in page
        ]
        return {"TotalCount": len(matches), "PageNumber": number, "PageSize": size, "Disks": {"Disk": disks}}

    def _describe_instance_status(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids = set(wire.indexed_list(params, "InstanceId"))
        size = wire.integer(params, "PageSize", 10, 1, STATUS_MAX_PAGE)
        number = wire.integer(params, "PageNumber", 1, 1, 1_000_000)
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if (not ids or i.instance_id in ids) and (not params.get("ZoneId") or i.zone == params["ZoneId"])
            ]
            page = matches[(number - 1) * size : number * size]
            started: list[_Instance] = []
            for instance in page:
                self._observe(instance, started)
            statuses = [{"InstanceId": i.instance_id, "Status": i.status} for i in page]
        self._boot(started)
        return {
            "TotalCount": len(matches),
            "PageNumber": number,
            "PageSize": size,
            "InstanceStatuses": {"InstanceStatus": statuses},
        }

    def _delete_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids = wire.indexed_list(params, "InstanceId")
        if not ids:
            wire.required(params, "InstanceId.1")
        force = wire.boolean(params, "Force")
        token = params.get("ClientToken", "")
        with self._lock:
            if token and (region, token) in self._release_tokens:  # the same release again: same (empty) answer
                return {}
            targets: list[_Instance] = []
            for instance_id in ids:
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != region or instance.status == "Deleted":
                    raise WireError(
                        "InvalidInstanceId.NotFound", f"The specified InstanceId {instance_id} does not exist.", 404
                    )
                # All or nothing: every id is checked before any is released, as one ECS request does.
                if instance.status == "Pending":
                    raise WireError(
                        "IncorrectInstanceStatus.Initializing",
                        "The specified instance is initializing, try again later.",
                        403,
                    )
                if instance.status in ("Running", "Starting", "Stopping") and not force:
                    raise WireError(
                        "IncorrectInstanceStatus",
                        "The current status of the resource does not support this operation.",
                        403,
                    )
                targets.append(instance)
            for instance in targets:
                instance.status = "Deleted"
            if token:
                self._release_tokens.add((region, token))
        for instance in targets:
            self.booter.halt(instance.instance_id)
        return {}
