"""What the AWS sandbox adds so a launch can carry a boot, as EC2 and Systems Manager would take it.

moto keeps key pairs, security groups and their rules, tags, user data and block device mappings, but lets
through several requests the real APIs refuse. The sandbox's WSGI layer (``sandboxes/aws/app.py``) asks
this module first and answers with EC2's own codes and statuses:

- ``RunInstances``: user data over 16 KB raw (``InvalidParameterValue``), an AMI or key pair the region does
  not hold (``InvalidAMIID.NotFound``, ``InvalidKeyPair.NotFound``), a root volume outside gp3's sizes or
  smaller than its image's snapshot (``InvalidParameterValue``, ``InvalidBlockDeviceMapping``);
- ``AuthorizeSecurityGroupIngress``: more than 60 inbound rules per address family in one group
  (``RulesPerSecurityGroupLimitExceeded``);
- ``DeleteSecurityGroup``: a group an instance that is not yet terminated still uses (``DependencyViolation``);
- Systems Manager ``GetParameter`` for the public parameter naming the region's current Deep Learning AMI,
  answered with an AMI this module registers in moto for the region (``ParameterNotFound`` when an
  ``image_missing`` fault fires).

Each refusal is (code, message, HTTP status); None lets the request through to moto.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.amis import Ami
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.ec2.models.security_groups import SecurityGroupBackend

from providers.aws import catalog
from providers.community.executor_base import GpuSeen
from sandboxes.boot import simulated_gpus

Refusal = tuple[str, str, int]  # (code, message, HTTP status)

# The public parameter AWS publishes per region for this DLAMI ("Finding the ID of a DLAMI",
# https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html). Spelled out here rather than taken
# from the adapter, so a wrong path on either side fails a test.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20250601"  # a sandbox publication
DLAMI_PUBLISHED = datetime(2025, 6, 1, tzinfo=UTC)
SANDBOX_IMAGE_OWNER = "000000000000"  # not a real AWS account: the sandbox's stand-in for AWS's DLAMI owner

# "User data is limited to 16 KB, in raw form, before it is base64-encoded" (EC2 User Guide, Work with instance
# user data). EC2 answers a larger one "InvalidParameterValue: User data is limited to 16384 bytes", HTTP 400
# (as reported in github.com/dask/dask-cloudprovider/issues/249 and supergiant/capacity/issues/148).
USER_DATA_MAX = 16 * 1024
# gp2 and gp3 VolumeSize "1 - 16,384 GiB" (EC2 API reference, EbsBlockDevice).
VOLUME_SIZES = {"gp2": (1, 16384), "gp3": (1, 16384), "io1": (4, 16384), "io2": (4, 65536), "standard": (1, 1024)}
# "Inbound or outbound rules per security group: 60 ... enforced separately for IPv4 rules and IPv6 rules"
# (Amazon VPC quotas, https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html).
RULES_PER_FAMILY = 60
_AMI_ID = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")
_INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")

_lock = threading.Lock()
_original_rule_check = SecurityGroupBackend._verify_group_will_respect_rule_count_limit


def _rule_check_per_family(
    self: SecurityGroupBackend,
    group: Any,
    current_rule_nb: int,
    ip_ranges: list[str],
    source_groups: list[dict[str, str]] | None = None,
    egress: bool = False,
) -> None:
    # moto counts IPv4 and IPv6 inbound rules together against 60; EC2 counts them apart. The layer checks the
    # inbound rules the way EC2 does before moto sees them, so moto's own check is kept for outbound only.
    if egress:
        _original_rule_check(self, group, current_rule_nb, ip_ranges, source_groups, egress)


SecurityGroupBackend._verify_group_will_respect_rule_count_limit = _rule_check_per_family  # type: ignore[method-assign]


def backend(region: str) -> Any:
    """moto's EC2 state for the region, in the account every sandbox key maps to."""
    return ec2_backends[DEFAULT_ACCOUNT_ID][region]


def dlami_id(region: str) -> str:
    """The sandbox's current DLAMI in ``region``: one id per region, the same after every reset."""
    return "ami-" + hashlib.sha256(f"dlami/{region}".encode()).hexdigest()[:17]


def ensure_dlami(region: str) -> str:
    """Register the region's DLAMI in moto (idempotent) and return its id. moto ships no Deep Learning AMI, and
    a region reset forgets what was registered, so every lookup of the parameter makes sure of it."""
    ami_id = dlami_id(region)
    ec2 = backend(region)
    with _lock:
        if ami_id not in ec2.amis:
            zones = RegionsAndZonesBackend.zones.get(region) or []
            ec2.amis[ami_id] = Ami(
                ec2,
                ami_id,
                name=DLAMI_NAME,
                description="NVIDIA driver, CUDA, the NVIDIA container toolkit and Docker on Ubuntu 22.04",
                owner_id=SANDBOX_IMAGE_OWNER,
                owner_alias="amazon",
                public=True,
                virtualization_type="hvm",
                architecture="x86_64",
                creation_date=DLAMI_PUBLISHED,
                root_device_type="ebs",
                root_device_name="/dev/sda1",
                region_name=zones[0].name if zones else f"{region}a",
            )
    return ami_id


def parameter_answer(name: str, value: str, region: str) -> dict[str, Any]:
    """A ``GetParameter`` answer for a public parameter (SSM API reference, GetParameter / Parameter)."""
    return {
        "Parameter": {
            "Name": name,
            "Type": "String",
            "Value": value,
            "Version": 1,
            "LastModifiedDate": DLAMI_PUBLISHED.timestamp(),
            "ARN": f"arn:aws:ssm:{region}::parameter{name}",
            "DataType": "text",
        }
    }


def indexed(params: Mapping[str, str], prefix: str, suffix: str = "") -> list[str]:
    """Values of ``<prefix>.<n><suffix>`` query parameters in index order (EC2's list encoding)."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+){re.escape(suffix)}$")
    found = sorted((int(m.group(1)), v) for k, v in params.items() if (m := pattern.match(k)))
    return [v for _, v in found]


def decoded_user_data(params: Mapping[str, str]) -> bytes | None:
    """The raw boot script of a ``RunInstances`` request (its ``UserData`` is base64 on the wire)."""
    encoded = params.get("UserData")
    if not encoded:
        return None
    return base64.b64decode(encoded, validate=True)


def run_instances_refusal(region: str, params: Mapping[str, str], image_missing: bool) -> Refusal | None:
    """What EC2 would refuse in this ``RunInstances`` before launching anything; None when it takes it."""
    try:
        user_data = decoded_user_data(params)
    except (binascii.Error, ValueError):
        return ("InvalidUserData.Malformed", "Invalid BASE64 encoding of user data.", 400)
    if user_data is not None and len(user_data) > USER_DATA_MAX:
        return ("InvalidParameterValue", f"User data is limited to {USER_DATA_MAX} bytes", 400)
    ec2 = backend(region)
    image_id = params.get("ImageId", "")
    if image_id and not _AMI_ID.match(image_id):
        return ("InvalidAMIID.Malformed", f'Invalid id: "{image_id}" (expecting "ami-...")', 400)
    image = ec2.amis.get(image_id)
    if image_id and (image is None or image_missing):
        return ("InvalidAMIID.NotFound", f"The image id '[{image_id}]' does not exist", 400)
    key_name = params.get("KeyName")
    if key_name and key_name not in ec2.key_pairs:
        return ("InvalidKeyPair.NotFound", f"The key pair '{key_name}' does not exist", 400)
    for index in range(1, 1 + len(indexed(params, "BlockDeviceMapping", ".DeviceName"))):
        refusal = _volume_refusal(params, f"BlockDeviceMapping.{index}", image)
        if refusal is not None:
            return refusal
    return None


def _volume_refusal(params: Mapping[str, str], prefix: str, image: Any) -> Refusal | None:
    size_text = params.get(f"{prefix}.Ebs.VolumeSize")
    if size_text is None:
        return None
    size = int(size_text)
    volume_type = params.get(f"{prefix}.Ebs.VolumeType", "gp2")
    low, high = VOLUME_SIZES.get(volume_type, (1, 16384))
    if not low <= size <= high:
        # The API reference states the range but not the refusal's text; the code is EC2's for a bad value.
        return ("InvalidParameterValue", f"Volume size {size} GiB is outside {volume_type}'s {low}-{high} GiB", 400)
    if image is None or params.get(f"{prefix}.DeviceName") != image.root_device_name:
        return None
    snapshot = next((m["Ebs"] for m in image.block_device_mappings if m["DeviceName"] == image.root_device_name), None)
    if snapshot is not None and size < int(snapshot["VolumeSize"]):
        # "If you specify a snapshot ... the volume size must be equal or greater than the snapshot size."
        return (
            "InvalidBlockDeviceMapping",
            f"Volume of size {size}GB is smaller than snapshot '{snapshot['SnapshotId']}', "
            f"expect size >= {snapshot['VolumeSize']}GB",
            400,
        )
    return None


def ingress_refusal(region: str, params: Mapping[str, str]) -> Refusal | None:
    """``RulesPerSecurityGroupLimitExceeded`` when the group would hold more than 60 inbound rules of one
    address family; EC2 then adds none of the request's rules."""
    group = backend(region).get_security_group_from_id(params.get("GroupId", ""))
    if group is None:
        return None  # moto answers the unknown group itself
    ipv4 = len(indexed_nested(params, "CidrIp")) + (1 if params.get("CidrIp") else 0)
    ipv6 = len(indexed_nested(params, "CidrIpv6"))
    have4 = sum(1 for rule in group.ingress_rules if "CidrIp" in rule.ip_range)
    have6 = sum(1 for rule in group.ingress_rules if "CidrIpv6" in rule.ip_range)
    if have4 + ipv4 > RULES_PER_FAMILY or have6 + ipv6 > RULES_PER_FAMILY:
        return (
            "RulesPerSecurityGroupLimitExceeded",
            "The maximum number of rules per security group has been reached.",
            400,
        )
    return None


def indexed_nested(params: Mapping[str, str], field: str) -> list[str]:
    """Every ``IpPermissions.<n>.<IpRanges|Ipv6Ranges>.<m>.<field>`` value of the request."""
    pattern = re.compile(rf"^IpPermissions\.\d+\.(IpRanges|Ipv6Ranges)\.\d+\.{re.escape(field)}$")
    return [v for k, v in params.items() if pattern.match(k)]


def group_in_use(region: str, group_id: str) -> Refusal | None:
    """``DependencyViolation`` while an instance that is not terminated (running, stopping, shutting down)
    still has the group ("Error codes for the Amazon EC2 API", DependencyViolation)."""
    for reservation in list(backend(region).reservations.values()):
        for instance in reservation.instances:
            if instance.state != "terminated" and any(g.id == group_id for g in instance.security_groups):
                return ("DependencyViolation", f"resource {group_id} has a dependent object", 400)
    return None


def launched_instance_ids(body: bytes) -> list[str]:
    """The instance ids in a ``RunInstances`` answer."""
    return [m.decode() for m in _INSTANCE_ID.findall(body)]


def instance_gpus(instance_type: str) -> list[GpuSeen]:
    """The GPUs a machine of this type shows, from moto's catalogue entry mapped to the broker's models."""
    entry = INSTANCE_TYPES.get(instance_type) or {}
    if not entry.get("GpuInfo"):
        return []
    gpu = catalog.gpu_spec(instance_type, entry["GpuInfo"])
    return simulated_gpus(gpu.model, gpu.count, gpu.memory_gb)


def instance_zone(region: str, instance_id: str) -> str | None:
    for reservation in list(backend(region).reservations.values()):
        for instance in reservation.instances:
            if instance.id == instance_id:
                return str(instance.availability_zone)
    return None


def terminated_ids(params: Mapping[str, str]) -> Iterable[str]:
    return indexed(params, "InstanceId")
