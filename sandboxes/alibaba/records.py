"""The records the ECS sandbox keeps besides instances (images, vSwitches, key pairs, security groups and what an
instance binds) and the documented limits and checks on their names, keys and rules.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sandboxes.alibaba.wire import WireError

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
