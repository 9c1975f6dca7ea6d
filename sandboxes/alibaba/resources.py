"""What the ECS sandbox keeps besides instances: public and custom images, the VPC and vSwitches of each region,
SSH key pairs and security groups with their rules and tags, all in the ECS API's own field names and formats.

Each operation answers as the ECS 2014-05-26 API reference describes it (the page is named at each handler).
Every figure the sandbox refuses on is the documented one:

- ImportKeyPair: rsa, dsa, ssh-rsa, ssh-dss and ecdsa keys only (``InvalidPublicKeyBody.Malformed``), names of
  2-128 characters starting with a letter, unique per region (``KeyPair.AlreadyExist``), 500 per region;
- DeleteKeyPairs: a key pair bound to an instance is not deleted
  (``InvalidParameter.KeypairAlreadyAttachedInstance``);
- AuthorizeSecurityGroup: at most 200 inbound rules per group (``AuthorizationLimitExceed``, 403); a rule the group
  already has is accepted and not added again; ``Permissions.N`` from 1 to 100 per call;
- DeleteSecurityGroup: a group an instance is still in answers ``DependencyViolation`` (403);
- DescribeImages: the newest build of a family is the one with the latest ``CreationTime``; an ``image_missing``
  fault makes the lookup answer what ECS answers for an image it does not have: no images.

Security groups and vSwitches the sandbox did not create are taken on trust by RunInstances (a seller's own
``security_group_id`` or ``vswitch_id`` option needs no set-up), as before key pairs and groups existed here.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import ipaddress
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.wire import WireError
from sandboxes.faults import IMAGE_ACTION, FaultKind, FaultRegistry

# ImportKeyPair reference (https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-
# importkeypair): "rsa, dsa, ssh-rsa, ssh-dss, ecdsa" and their OpenSSH certificates. ED25519 is not listed.
IMPORTABLE_KEY_TYPES = frozenset(
    {
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "ssh-rsa-cert-v00@openssh.com",
        "ssh-dss-cert-v00@openssh.com",
        "ssh-rsa-cert-v01@openssh.com",
        "ssh-dss-cert-v01@openssh.com",
        "ecdsa-sha2-nistp256-cert-v01@openssh.com",
        "ecdsa-sha2-nistp384-cert-v01@openssh.com",
        "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    }
)
KEY_PAIRS_PER_REGION = 500
KEY_PAIR_NAMES_PER_DELETE = 100
INBOUND_RULES_PER_GROUP = 200
PERMISSIONS_PER_CALL = 100
IP_PROTOCOLS = frozenset({"tcp", "udp", "icmp", "gre", "all"})
GROUP_TYPES = frozenset({"normal", "enterprise"})
IMAGE_STATUSES = frozenset({"Available", "UnAvailable", "Creating", "CreateFailed", "Deprecated"})
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.-")


@dataclass(frozen=True, slots=True)
class SandboxImage:
    """One image as DescribeImages lists it. ``owner`` is ImageOwnerAlias: ``system`` (public) or ``self``."""

    image_id: str
    name: str
    family: str
    os_name: str
    size_gb: int
    created: str
    owner: str = "system"
    status: str = "Available"


# Public Ubuntu builds, one family each. SYNTHETIC: the ids follow Alibaba's public naming
# (<os>_<version>_x64_20G_alibase_<date>.vhd) and the 2023-08-15 build is the one the adapter pinned before image
# families; the 2024-09-26 build is invented so a family holds more than one build and the newest must win.
PUBLIC_IMAGES: tuple[SandboxImage, ...] = (
    SandboxImage(
        "ubuntu_22_04_x64_20G_alibase_20230815.vhd",
        "ubuntu_22_04_x64_20G_alibase_20230815.vhd",
        "acs:ubuntu_22_04_x64",
        "Ubuntu  22.04 64位",
        20,
        "2023-08-15T06:00:00Z",
    ),
    SandboxImage(
        "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
        "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
        "acs:ubuntu_22_04_x64",
        "Ubuntu  22.04 64位",
        20,
        "2024-09-26T06:00:00Z",
    ),
    SandboxImage(
        "ubuntu_20_04_x64_20G_alibase_20230815.vhd",
        "ubuntu_20_04_x64_20G_alibase_20230815.vhd",
        "acs:ubuntu_20_04_x64",
        "Ubuntu  20.04 64位",
        20,
        "2023-08-15T06:00:00Z",
    ),
)


@dataclass(frozen=True, slots=True)
class VSwitch:
    vswitch_id: str
    vpc_id: str
    zone: str
    cidr: str


@dataclass(slots=True)
class KeyPair:
    name: str
    public_key: str
    fingerprint: str
    tags: dict[str, str]
    created: str


@dataclass(slots=True)
class SecurityGroup:
    group_id: str
    region: str
    vpc_id: str
    name: str
    description: str
    group_type: str
    tags: dict[str, str]
    created: str
    rules: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Binding:
    """What a live instance holds on to: its key pair and its security groups."""

    instance_id: str
    key_pair_name: str
    security_group_ids: tuple[str, ...]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def md5_fingerprint(blob: bytes) -> str:
    """KeyPairFingerPrint: the RFC 4716 fingerprint, the MD5 of the key's blob as colon-separated hex."""
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def parse_public_key(body: str) -> tuple[str, bytes]:
    """(type, blob) of a PublicKeyBody ECS imports; ``InvalidPublicKeyBody.Malformed`` for anything else."""
    refused = WireError("InvalidPublicKeyBody.Malformed", "The PublicKeyBody format is not supported.", 400)
    parts = body.strip().split()
    if len(parts) < 2 or parts[0] not in IMPORTABLE_KEY_TYPES:
        raise refused
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise refused from None
    length = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if length < 1 or blob[4 : 4 + length].decode("ascii", "replace") != parts[0]:
        raise refused
    return parts[0], blob


def _name_ok(name: str) -> bool:
    return 2 <= len(name) <= 128 and name[0].isalpha() and not name.startswith(("http://", "https://"))


def _rule_identity(rule: Mapping[str, str]) -> tuple[str, ...]:
    # What makes two rules the same rule: AuthorizeSecurityGroup of an existing one adds nothing.
    return tuple(
        str(rule.get(k, "")).lower()
        for k in ("Direction", "IpProtocol", "PortRange", "SourceCidrIp", "Ipv6SourceCidrIp", "Policy", "Priority")
    )


class EcsResources:
    """Images, vSwitches, key pairs and security groups of the ECS sandbox's regions.

    ``regions`` maps region -> (local name, zones, instance id prefix), as the sandbox's ``REGIONS``;
    ``bindings(region)`` answers what the region's live instances hold, for the "in use" refusals. Thread-safe:
    one lock guards this state; ``bindings`` takes the sandbox's lock, so it is only called without this one
    (the sandbox takes its lock first and this one second, never the other way round).
    """

    def __init__(
        self,
        regions: Mapping[str, tuple[str, tuple[str, ...], str]],
        faults: FaultRegistry,
        bindings: Callable[[str], list[Binding]],
    ):
        self._regions = regions
        self._faults = faults
        self._bindings = bindings
        self._lock = threading.Lock()
        self._vswitches = {
            region: tuple(
                VSwitch(f"vsw-sandbox{prefix}{zone[-1]}", f"vpc-sandbox{prefix}", zone, f"172.16.{16 * n}.0/20")
                for n, zone in enumerate(zones)
            )
            for region, (_, zones, prefix) in regions.items()
        }
        self._key_pairs: dict[tuple[str, str], KeyPair] = {}
        self._groups: dict[str, SecurityGroup] = {}
        self._deleted_groups: set[str] = set()
        self._group_tokens: dict[tuple[str, str], tuple[str, str]] = {}
        self._custom_images: dict[tuple[str, str], SandboxImage] = {}
        self._retired_images: set[str] = set()

    def reset(self) -> None:
        with self._lock:
            self._key_pairs.clear()
            self._groups.clear()
            self._deleted_groups.clear()
            self._group_tokens.clear()
            self._custom_images.clear()
            self._retired_images.clear()

    # ------------------------------------------------------------------------------ for RunInstances and tests

    def add_image(self, region: str, image_id: str, *, size_gb: int = 20, name: str = "") -> None:
        """A custom image (ImageOwnerAlias ``self``) in one region, as a buyer's own image would be."""
        image = SandboxImage(image_id, name or image_id, "", "Ubuntu  22.04 64位", size_gb, _now(), owner="self")
        with self._lock:
            self._custom_images[(region, image_id)] = image

    def retire_image(self, image_id: str) -> None:
        """Withdraw a public build, as Alibaba retires dated builds: DescribeImages no longer lists it and
        RunInstances answers ``InvalidImageId.NotFound``. Restored by ``reset()``."""
        if not any(i.image_id == image_id for i in PUBLIC_IMAGES):
            raise ValueError(f"unknown public image {image_id!r}")
        with self._lock:
            self._retired_images.add(image_id)

    def image(self, region: str, image_id: str) -> SandboxImage | None:
        return next((i for i in self.images(region) if i.image_id == image_id), None)

    def images(self, region: str) -> list[SandboxImage]:
        with self._lock:
            custom = [i for (r, _), i in self._custom_images.items() if r == region]
            retired = set(self._retired_images)
        return [*(i for i in PUBLIC_IMAGES if i.image_id not in retired), *custom]

    def vswitch(self, region: str, vswitch_id: str) -> VSwitch | None:
        return next((v for v in self._vswitches.get(region, ()) if v.vswitch_id == vswitch_id), None)

    def vswitches(self, region: str) -> list[VSwitch]:
        """The region's default vSwitch in each zone, all in the region's one VPC."""
        return list(self._vswitches.get(region, ()))

    def key_pair(self, region: str, name: str) -> KeyPair | None:
        with self._lock:
            return self._key_pairs.get((region, name))

    def group(self, group_id: str) -> SecurityGroup | None:
        with self._lock:
            return self._groups.get(group_id)

    def group_deleted(self, group_id: str) -> bool:
        with self._lock:
            return group_id in self._deleted_groups

    def groups(self, region: str | None = None) -> list[SecurityGroup]:
        with self._lock:
            return [g for g in self._groups.values() if region is None or g.region == region]

    def key_pairs(self, region: str | None = None) -> list[KeyPair]:
        with self._lock:
            return [k for (r, _), k in self._key_pairs.items() if region is None or r == region]

    # ------------------------------------------------------------------------------------------------- images

    def describe_images(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeImages: ImageId (comma-separated), ImageFamily, ImageName (fuzzy), ImageOwnerAlias, OSType,
        Status (default Available) and InstanceType filters; PageNumber/PageSize pages (at most 100)."""
        instance_type = params.get("InstanceType") or ""
        fault = self._faults.take(
            IMAGE_ACTION, [instance_type] if instance_type else [], None, kinds={FaultKind.IMAGE_MISSING}, region=region
        )
        ids = {i for i in (params.get("ImageId") or "").split(",") if i}
        owner = params.get("ImageOwnerAlias") or ""
        if owner and owner not in ("system", "self", "others", "marketplace"):
            raise WireError("InvalidImageOwnerAlias.ValueNotSupported", "The ImageOwnerAlias is not valid.", 400)
        statuses = {s for s in (params.get("Status") or "Available").split(",") if s}
        if "ALL" in statuses:
            statuses = set(IMAGE_STATUSES)
        name = params.get("ImageName") or ""
        os_type = (params.get("OSType") or "").lower()
        matches = [
            image
            for image in self.images(region)
            if (not ids or image.image_id in ids)
            and (not params.get("ImageFamily") or image.family == params["ImageFamily"])
            and (not owner or image.owner == owner)
            and (not name or name.lower() in image.name.lower())
            and (not os_type or os_type == "linux")
            and image.status in statuses
        ]
        if fault is not None:  # ECS answers a lookup of an image it does not have with an empty list
            matches = []
        matches.sort(key=lambda i: i.created, reverse=True)
        page, number, size = wire.number_page(matches, params, 10, 100)
        return {
            "RegionId": region,
            "TotalCount": len(matches),
            "PageNumber": number,
            "PageSize": size,
            "Images": {"Image": [self._image_item(i) for i in page]},
        }

    @staticmethod
    def _image_item(image: SandboxImage) -> dict[str, Any]:
        return {
            "ImageId": image.image_id,
            "ImageName": image.name,
            "ImageFamily": image.family,
            "ImageOwnerAlias": image.owner,
            "ImageVersion": "",
            "Description": "",
            "OSType": "linux",
            "OSName": image.os_name,
            "OSNameEn": image.os_name.replace("位", " bit"),
            "Platform": "Ubuntu",
            "Architecture": "x86_64",
            "Size": image.size_gb,
            "Status": image.status,
            "CreationTime": image.created,
            "Progress": "100%",
            "Usage": "instance",
            "IsPublic": image.owner == "system",
            "IsSupportCloudinit": True,
            "IsSupportIoOptimized": True,
            "BootMode": "BIOS",
            "DiskDeviceMappings": {"DiskDeviceMapping": []},
            "Tags": {"Tag": []},
        }

    # ---------------------------------------------------------------------------------------------- vSwitches

    def describe_vswitches(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeVSwitches (ECS 2014-05-26): VSwitchId, VpcId, ZoneId and IsDefault filters, PageSize at most 50."""
        default = params.get("IsDefault")
        matches = [
            v
            for v in self.vswitches(region)
            if (not params.get("VSwitchId") or v.vswitch_id == params["VSwitchId"])
            and (not params.get("VpcId") or v.vpc_id == params["VpcId"])
            and (not params.get("ZoneId") or v.zone == params["ZoneId"])
            and (not default or wire.boolean(params, "IsDefault"))
        ]
        page, number, size = wire.number_page(matches, params, 10, 50)
        items = [
            {
                "VSwitchId": v.vswitch_id,
                "VpcId": v.vpc_id,
                "ZoneId": v.zone,
                "CidrBlock": v.cidr,
                "VSwitchName": "",
                "Description": "",
                "IsDefault": True,
                "Status": "Available",
                "AvailableIpAddressCount": 4091,
                "CreationTime": "2023-01-01T00:00:00Z",
                "ResourceGroupId": "",
            }
            for v in page
        ]
        return {"TotalCount": len(matches), "PageNumber": number, "PageSize": size, "VSwitches": {"VSwitch": items}}

    # ---------------------------------------------------------------------------------------------- key pairs

    def import_key_pair(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """ImportKeyPair: KeyPairName, PublicKeyBody, Tag.N -> KeyPairName, KeyPairFingerPrint."""
        name = wire.required(params, "KeyPairName")
        if not _name_ok(name) or not set(name) <= _NAME_CHARS:
            raise WireError("InvalidKeyPairName.Malformed", "Specified Key Pair name is not valid.", 400)
        _, blob = parse_public_key(wire.required(params, "PublicKeyBody"))
        held_tags = wire.tags(params)
        with self._lock:
            if (region, name) in self._key_pairs:
                raise WireError("KeyPair.AlreadyExist", "The key pair already exist.", 400)
            if sum(1 for r, _ in self._key_pairs if r == region) >= KEY_PAIRS_PER_REGION:
                raise WireError("QuotaExceed.KeyPair", "The key pair quota exceeds.", 403)
            pair = KeyPair(
                name, " ".join(params["PublicKeyBody"].split()[:2]), md5_fingerprint(blob), held_tags, _now()
            )
            self._key_pairs[(region, name)] = pair
        return {"KeyPairName": name, "KeyPairFingerPrint": pair.fingerprint}

    def describe_key_pairs(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeKeyPairs: KeyPairName (``*`` as a wildcard), KeyPairFingerPrint and Tag.N filters,
        IncludePublicKey, PageNumber/PageSize (at most 50)."""
        name = params.get("KeyPairName") or ""
        wanted = wire.indexed_pairs(params, "Tag")
        with_key = wire.boolean(params, "IncludePublicKey")
        matches = sorted(
            (
                k
                for k in self.key_pairs(region)
                if (not name or fnmatch.fnmatchcase(k.name, name))
                and (not params.get("KeyPairFingerPrint") or k.fingerprint == params["KeyPairFingerPrint"])
                and wire.tags_match(k.tags, wanted)
            ),
            key=lambda k: k.name,
        )
        page, number, size = wire.number_page(matches, params, 10, 50)
        items = []
        for k in page:
            item: dict[str, Any] = {
                "KeyPairName": k.name,
                "KeyPairFingerPrint": k.fingerprint,
                "CreationTime": k.created,
                "ResourceGroupId": "",
                "Tags": wire.tag_list(k.tags),
            }
            if with_key:
                item["PublicKey"] = k.public_key
            items.append(item)
        return {"TotalCount": len(matches), "PageNumber": number, "PageSize": size, "KeyPairs": {"KeyPair": items}}

    def delete_key_pairs(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DeleteKeyPairs: KeyPairNames, a JSON array of up to 100 names. All or nothing: a name bound to a live
        instance refuses the whole call. Names the region does not hold are skipped."""
        wire.required(params, "KeyPairNames")
        names = (
            wire.json_list(params, "KeyPairNames", KEY_PAIR_NAMES_PER_DELETE, "InvalidKeyPairNames.ValueNotSupported")
            or []
        )
        # Read before this lock is taken: the bindings take the sandbox's lock.
        bound = {b.key_pair_name for b in self._bindings(region)}
        with self._lock:
            if bound & set(names):
                raise WireError(
                    "InvalidParameter.KeypairAlreadyAttachedInstance",
                    'The specified parameter "KeyPairNames" attached to instances can not be deleted.',
                    400,
                )
            for name in names:
                self._key_pairs.pop((region, name), None)
        return {}

    # -------------------------------------------------------------------------------------- security groups

    def create_security_group(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """CreateSecurityGroup: VpcId, SecurityGroupName, Description, SecurityGroupType, Tag.N and ClientToken
        (the same token and request answer the same group; another request with it is refused)."""
        vpc_id = wire.required(params, "VpcId")
        if not any(v.vpc_id == vpc_id for v in self.vswitches(region)):
            raise WireError("InvalidVpcId.NotFound", "Specified VPC does not exist.", 404)
        name = params.get("SecurityGroupName") or ""
        if name and not _name_ok(name):
            raise WireError("InvalidSecurityGroupName.Malformed", "Specified security group name is not valid.", 400)
        group_type = params.get("SecurityGroupType") or "normal"
        if group_type not in GROUP_TYPES:
            raise WireError("InvalidSecurityGroupType.NotSupported", "The SecurityGroupType is not valid.", 400)
        held_tags = wire.tags(params)
        token = params.get("ClientToken") or ""
        fingerprint = json.dumps(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
        with self._lock:
            if token and (region, token) in self._group_tokens:
                first, group_id = self._group_tokens[(region, token)]
                if first != fingerprint:
                    raise WireError(
                        "IdempotenceParamNotMatch",
                        "Request uses a client token in a previous request but is not identical to that request.",
                        400,
                    )
                return {"SecurityGroupId": group_id}
            group_id = f"sg-{self._regions[region][2]}{uuid.uuid4().hex[:17]}"
            self._groups[group_id] = SecurityGroup(
                group_id, region, vpc_id, name, params.get("Description") or "", group_type, held_tags, _now()
            )
            if token:
                self._group_tokens[(region, token)] = (fingerprint, group_id)
        return {"SecurityGroupId": group_id}

    def _own_group(self, region: str, params: dict[str, str]) -> SecurityGroup:
        group_id = wire.required(params, "SecurityGroupId")
        group = self._groups.get(group_id)
        if group is None or group.region != region:
            raise WireError("InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist.", 404)
        return group

    def authorize_security_group(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """AuthorizeSecurityGroup: inbound rules as ``Permissions.N`` (1 to 100) or, deprecated, one rule in the
        top-level fields. All or nothing: every rule is checked before any is added."""
        records = wire.indexed_records(params, "Permissions")
        if not records:
            fields = ("IpProtocol", "PortRange", "SourceCidrIp", "Ipv6SourceCidrIp", "Policy", "Priority")
            records = [{k: params[k] for k in (*fields, "NicType", "Description") if params.get(k)}]
        if len(records) > PERMISSIONS_PER_CALL:
            raise WireError("InvalidParameter", f"Permissions.N takes 1 to {PERMISSIONS_PER_CALL} rules.", 400)
        rules = [self._rule(record) for record in records]
        with self._lock:
            group = self._own_group(region, params)
            known = {_rule_identity(r) for r in group.rules}
            new: list[dict[str, str]] = []
            for rule in rules:
                if _rule_identity(rule) not in known:
                    known.add(_rule_identity(rule))
                    new.append(rule)
            inbound = sum(1 for r in group.rules if r["Direction"] == "ingress")
            if inbound + len(new) > INBOUND_RULES_PER_GROUP:
                raise WireError(
                    "AuthorizationLimitExceed", "The limit of authorization records in the security group reaches.", 403
                )
            group.rules.extend(new)
        return {}

    def _rule(self, record: Mapping[str, str]) -> dict[str, str]:
        protocol = (record.get("IpProtocol") or "").lower()
        if protocol not in IP_PROTOCOLS:
            raise WireError(
                "InvalidIpProtocol.ValueNotSupported",
                "The parameter IpProtocol must be specified with case insensitive TCP, UDP, ICMP, GRE or All.",
                400,
            )
        port_range = wire.required(dict(record), "PortRange")
        low, _, high = port_range.partition("/")
        try:
            start, end = int(low), int(high)
        except ValueError:
            start, end = 0, -2
        ok = start == end == -1 if protocol in ("icmp", "gre", "all") else 1 <= start <= end <= 65535
        if not ok:
            raise WireError(
                "InvalidParam.PortRange",
                "Please specify the PortRange or SourcePortRange in integer, less than 65535, and separate the "
                "range with '/'.",
                400,
            )
        v4, v6 = record.get("SourceCidrIp") or "", record.get("Ipv6SourceCidrIp") or ""
        if not v4 and not v6:
            raise WireError("MissingParameter.Source", "Either SourceCidrIp or SourceGroupId must be specified.", 400)
        if v4 and v6:
            raise WireError("InvalidParam.Ipv4ProtocolConflictWithIpv6Address", "IPv4 and IPv6 cannot be mixed.", 400)
        source = self._cidr(v4, 4, "InvalidParam.SourceIp") if v4 else ""
        source6 = self._cidr(v6, 6, "InvalidParam.Ipv6SourceCidrIp") if v6 else ""
        policy = (record.get("Policy") or "accept").lower()
        if policy not in ("accept", "drop"):
            raise WireError("InvalidPolicy.Malformed", 'The specified parameter "Policy" is not valid.', 400)
        priority = record.get("Priority") or "1"
        if not priority.isdigit() or not 1 <= int(priority) <= 100:
            raise WireError("InvalidPriority.Malformed", "The parameter Priority is invalid.", 400)
        return {
            "SecurityGroupRuleId": f"sgr-{uuid.uuid4().hex[:17]}",
            "Direction": "ingress",
            "IpProtocol": protocol.upper() if protocol != "all" else "ALL",
            "PortRange": port_range,
            "SourcePortRange": "",
            "SourceCidrIp": source,
            "Ipv6SourceCidrIp": source6,
            "SourceGroupId": "",
            "SourcePrefixListId": "",
            "DestCidrIp": "",
            "Ipv6DestCidrIp": "",
            "Policy": policy.capitalize(),
            "Priority": str(int(priority)),
            "NicType": "intranet",  # the only NIC type of a VPC group's rules
            "Description": record.get("Description") or "",
            "CreateTime": _now(),
        }

    @staticmethod
    def _cidr(value: str, version: int, code: str) -> str:
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            network = None
        if network is None or network.version != version:
            raise WireError(code, f"The specified source range {value!r} is not valid.", 400)
        return str(network)

    def describe_security_group_attribute(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeSecurityGroupAttribute: the group and its rules, ``Direction`` ingress, egress or all."""
        direction = params.get("Direction") or "all"
        if direction not in ("ingress", "egress", "all"):
            raise WireError("InvalidDirection.Malformed", 'The specified parameter "Direction" is not valid.', 400)
        with self._lock:
            group = self._own_group(region, params)
            rules = [dict(r) for r in group.rules if direction in ("all", r["Direction"])]
            return {
                "RegionId": region,
                "SecurityGroupId": group.group_id,
                "SecurityGroupName": group.name,
                "Description": group.description,
                "VpcId": group.vpc_id,
                "InnerAccessPolicy": "Accept",
                "Permissions": {"Permission": rules},
            }

    def describe_security_groups(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeSecurityGroups: SecurityGroupId, SecurityGroupIds (JSON array), SecurityGroupName, VpcId,
        SecurityGroupType and Tag.N filters; MaxResults/NextToken pages (at most 100) or PageNumber/PageSize (50)."""
        ids = wire.json_list(params, "SecurityGroupIds", 100, "InvalidSecurityGroupIds.Malformed")
        wanted = wire.indexed_pairs(params, "Tag")
        with self._lock:
            matches = sorted(
                (
                    g
                    for g in self._groups.values()
                    if g.region == region
                    and (not params.get("SecurityGroupId") or g.group_id == params["SecurityGroupId"])
                    and (ids is None or g.group_id in ids)
                    and (not params.get("SecurityGroupName") or g.name == params["SecurityGroupName"])
                    and (not params.get("VpcId") or g.vpc_id == params["VpcId"])
                    and (not params.get("SecurityGroupType") or g.group_type == params["SecurityGroupType"])
                    and wire.tags_match(g.tags, wanted)
                ),
                key=lambda g: (g.created, g.group_id),
            )
            items = [self._group_item(g) for g in matches]
        body: dict[str, Any] = {"RegionId": region, "TotalCount": len(items)}
        if params.get("NextToken") or params.get("MaxResults"):
            page, token = wire.token_page(items, params, wire.integer(params, "MaxResults", 10, 1, 100))
            body["NextToken"] = token
        else:
            page, number, size = wire.number_page(items, params, 10, 50)
            body.update({"PageNumber": number, "PageSize": size})
        body["SecurityGroups"] = {"SecurityGroup": page}
        return body

    @staticmethod
    def _group_item(group: SecurityGroup) -> dict[str, Any]:
        return {
            "SecurityGroupId": group.group_id,
            "SecurityGroupName": group.name,
            "Description": group.description,
            "VpcId": group.vpc_id,
            "SecurityGroupType": group.group_type,
            "CreationTime": group.created,
            "ResourceGroupId": "",
            "ServiceManaged": False,
            "RuleCount": len(group.rules),
            "Tags": wire.tag_list(group.tags),
        }

    def delete_security_group(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DeleteSecurityGroup: refused with ``DependencyViolation`` while a live instance is in the group."""
        group_id = wire.required(params, "SecurityGroupId")
        in_use = any(group_id in b.security_group_ids for b in self._bindings(region))
        with self._lock:
            group = self._own_group(region, params)
            if in_use:
                raise WireError(
                    "DependencyViolation", "There is still instance(s) in the specified security group.", 403
                )
            del self._groups[group.group_id]
            self._deleted_groups.add(group.group_id)
        return {}


def bindings_of(instances: Iterable[Any], region: str) -> list[Binding]:
    """The key pairs and groups held by the live instances of a region (objects with ``region``, ``status``,
    ``key_pair_name`` and ``security_group_id``)."""
    return [
        Binding(i.instance_id, i.key_pair_name, (i.security_group_id,))
        for i in instances
        if i.region == region and i.status != "Deleted"
    ]
