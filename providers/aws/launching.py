"""What an EC2 launch brings with it: the Ubuntu and Deep Learning AMIs, the key pair, security group and
placement group a boot creates (named and tagged for the order, so they can be found and removed), the
ingress permissions to add or revoke, and the root volume. Pure functions over plain dicts.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.aws.errors import malformed
from providers.aws.mapping import ORDER_TAG, tags_dict
from providers.launch import IngressRule, OrderResource
from providers.sshkeys import SshPublicKey

UBUNTU_OWNER = "099720109477"  # Canonical's AWS account
UBUNTU_NAME_PATTERN = "ubuntu/images/*ubuntu-*-amd64-server-*"
_UBUNTU_VERSION = re.compile(r"-(\d+)\.(\d+)-amd64-server-(\d*)")


def newest_ubuntu_image(images: Iterable[Mapping[str, Any]]) -> str | None:
    """The image id of the highest Ubuntu release (then newest build) among ``describe_images`` results."""
    best: tuple[tuple[int, int, str, str], str] | None = None
    for image in images:
        name = str(image.get("Name", ""))
        match = _UBUNTU_VERSION.search(name)
        if match is None or image.get("State", "available") != "available":
            continue
        key = (int(match.group(1)), int(match.group(2)), match.group(3), str(image.get("CreationDate", "")))
        if best is None or key > best[0]:
            best = (key, str(image["ImageId"]))
    return best[1] if best else None


# ----------------------------------------------------------------------------------- what a boot creates

# The default GPU-ready image: AWS publishes each Deep Learning AMI's current id per region as a public SSM
# parameter named /aws/service/deeplearning/ami/<architecture>/<ami_type>/latest/ami-id, where ami_type is the
# AMI's name without "Deep Learning" and "AMI" ("Finding the ID of a DLAMI",
# https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html). This one is "Deep Learning Base OSS
# Nvidia Driver GPU AMI (Ubuntu 22.04)": NVIDIA driver, CUDA and the container toolkit, logging in as ubuntu.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_LOGIN_USER = "ubuntu"

# "Amazon EC2 does not accept DSA keys ... Supported lengths: 1024, 2048, and 4096" for RSA; ED25519 for Linux
# ("Create a key pair using a third-party tool and import the public key", EC2 User Guide,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/create-key-pairs.html). ECDSA is not importable.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519"})
RSA_IMPORT_BITS = frozenset({1024, 2048, 4096})
ROOT_VOLUME_TYPE = "gp3"
RESOURCE_PREFIX = "broker-"
# The limits (rules per security group per address family, user data, gp3 sizes) and their sources are on
# ``AwsAdapter.launch_limits``; these error codes are the EC2 API's ("Error codes for the Amazon EC2 API",
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
IN_USE = "DependencyViolation"
GROUP_GONE = frozenset({"InvalidGroup.NotFound", "InvalidGroupId.NotFound"})
ALREADY_THERE = frozenset({"InvalidKeyPair.Duplicate", "InvalidGroup.Duplicate", "InvalidPermission.Duplicate"})
# EC2's answer to a group created without a VpcId in a region that has no default VPC.
NO_DEFAULT_VPC = "VPCIdNotSpecified"
# Placement groups ("Error codes for the Amazon EC2 API", same page): a name taken in the Region, a name the
# Region does not know, and a group that still holds instances (DeletePlacementGroup) or holds them in another
# Availability Zone (RunInstances into a cluster group).
PLACEMENT_GROUP_DUPLICATE = "InvalidPlacementGroup.Duplicate"
PLACEMENT_GROUP_UNKNOWN = "InvalidPlacementGroup.Unknown"
PLACEMENT_GROUP_IN_USE = "InvalidPlacementGroup.InUse"
# "cluster: packs instances close together inside an Availability Zone" (CreatePlacementGroup's Strategy,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html).
CLUSTER_STRATEGY = "cluster"
PLACEMENT_GROUP_TAG = "broker:placement-group"


def resource_name(order_ref: str) -> str:
    """The key pair's and the security group's name for an order: one of each per order and region, so a
    repeated launch finds them by name (both names are unique per region; a group's per VPC)."""
    return f"{RESOURCE_PREFIX}{order_ref}"


def order_tags(resource_type: str, order_ref: str) -> list[dict[str, Any]]:
    """``TagSpecifications`` marking one created resource with the broker's order."""
    return [{"ResourceType": resource_type, "Tags": [{"Key": ORDER_TAG, "Value": order_ref}]}]


def placement_group_tags(name: str) -> list[dict[str, Any]]:
    """``TagSpecifications`` marking a placement group as the broker's, so it can be found by tag."""
    return [{"ResourceType": "placement-group", "Tags": [{"Key": PLACEMENT_GROUP_TAG, "Value": name}]}]


def order_filter(order_ref: str | None = None) -> list[dict[str, Any]]:
    """``Filters`` for resources tagged with one order, or with any order when ``order_ref`` is None."""
    if order_ref is None:
        return [{"Name": "tag-key", "Values": [ORDER_TAG]}]
    return [{"Name": f"tag:{ORDER_TAG}", "Values": [order_ref]}]


def native_key(keys: Iterable[SshPublicKey]) -> SshPublicKey | None:
    """The first key EC2's ``ImportKeyPair`` takes (RSA of a documented length, or ED25519). An instance has one
    key pair, so the others, and ECDSA keys, reach the machine through the boot script alone."""
    for key in keys:
        if key.key_type == "ssh-ed25519" or (key.key_type == "ssh-rsa" and key.bits in RSA_IMPORT_BITS):
            return key
    return None


Permission = tuple[str, int, str]  # (protocol, port, CIDR): one security group rule


def wanted_permissions(rules: Iterable[IngressRule]) -> list[Permission]:
    """Every (protocol, port, CIDR) the boot opens, in a stable order, without repeats."""
    seen: dict[Permission, None] = {}
    for rule in rules:
        for cidr in rule.cidrs:
            seen[(rule.protocol, rule.port, str(ipaddress.ip_network(cidr, strict=False)))] = None
    return list(seen)


def existing_permissions(ip_permissions: Iterable[Mapping[str, Any]]) -> set[Permission]:
    """The (protocol, port, CIDR) rules of a group's ``IpPermissions`` that open a single port."""
    found: set[Permission] = set()
    try:
        for permission in ip_permissions:
            if permission.get("FromPort") != permission.get("ToPort") or permission.get("FromPort") is None:
                continue
            key = (str(permission["IpProtocol"]), int(permission["FromPort"]))
            found.update((*key, str(r["CidrIp"])) for r in permission.get("IpRanges") or [])
            found.update((*key, str(r["CidrIpv6"])) for r in permission.get("Ipv6Ranges") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable security group permission ({exc!r})") from None
    return found


def ip_permissions(permissions: Iterable[Permission]) -> list[dict[str, Any]]:
    """``IpPermissions`` for ``AuthorizeSecurityGroupIngress``: one entry per (protocol, port), IPv4 ranges in
    ``IpRanges`` and IPv6 ranges in ``Ipv6Ranges`` (API reference, IpPermission)."""
    grouped: dict[tuple[str, int], dict[str, Any]] = {}
    for protocol, port, cidr in permissions:
        entry = grouped.setdefault(
            (protocol, port),
            {"IpProtocol": protocol, "FromPort": port, "ToPort": port, "IpRanges": [], "Ipv6Ranges": []},
        )
        if ipaddress.ip_network(cidr, strict=False).version == 6:
            entry["Ipv6Ranges"].append({"CidrIpv6": cidr})
        else:
            entry["IpRanges"].append({"CidrIp": cidr})
    return [{k: v for k, v in entry.items() if v != []} for entry in grouped.values()]


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """What a launch needs of its image: where the root volume attaches and the smallest size it may have."""

    image_id: str
    root_device: str
    root_snapshot_gb: int | None


def image_facts(image: Mapping[str, Any]) -> ImageFacts:
    """A ``describe_images`` entry -> its root device and the size of the snapshot behind it."""
    try:
        image_id = str(image["ImageId"])
        root = str(image["RootDeviceName"])
        snapshot_gb = next(
            (
                int(m["Ebs"]["VolumeSize"])
                for m in image.get("BlockDeviceMappings") or []
                if m.get("DeviceName") == root and (m.get("Ebs") or {}).get("VolumeSize") is not None
            ),
            None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable image entry ({exc!r})") from None
    return ImageFacts(image_id, root, snapshot_gb)


def root_volume(facts: ImageFacts, disk_gb: int) -> list[dict[str, Any]]:
    """``BlockDeviceMappings`` that size the image's root volume (gp3, gone with the instance)."""
    return [
        {
            "DeviceName": facts.root_device,
            "Ebs": {"VolumeSize": disk_gb, "VolumeType": ROOT_VOLUME_TYPE, "DeleteOnTermination": True},
        }
    ]


def order_resource(kind: str, item: Mapping[str, Any], region: str) -> OrderResource:
    """A tagged ``KeyPairs[]`` or ``SecurityGroups[]`` entry -> ``OrderResource``."""
    tags = tags_dict(item.get("Tags"))
    try:
        if kind == "key_pair":
            resource_id, extra = str(item["KeyPairId"]), {"name": str(item["KeyName"])}
        else:
            resource_id = str(item["GroupId"])
            extra = {"name": str(item.get("GroupName", "")), "vpc_id": str(item.get("VpcId", ""))}
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable {kind} entry ({exc!r})") from None
    return OrderResource(
        kind=kind, resource_id=resource_id, region=region, order_ref=tags.get(ORDER_TAG, ""), extra=extra
    )
