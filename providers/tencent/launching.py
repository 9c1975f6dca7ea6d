"""What a CVM launch brings with it: the Ubuntu image, the key pair and security group a boot creates (named
and tagged for the order, so they can be found and removed), their ingress policies, and the user data.
Pure functions over plain dicts.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from providers.launch import IngressRule
from providers.tencent.mapping import ORDER_TAG, tags_dict

UBUNTU_PLATFORM = "Ubuntu"
_VERSION = re.compile(r"(\d+)\.(\d+)")


def newest_ubuntu_image(images: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of the highest Ubuntu release (then newest build) among usable x86_64 ``DescribeImages`` results."""
    best: tuple[tuple[int, int, str], str] | None = None
    for image in images:
        if str(image.get("Platform", "")) != UBUNTU_PLATFORM or image.get("ImageDeprecated"):
            continue
        if str(image.get("Architecture", "x86_64")) != "x86_64" or str(image.get("ImageState", "NORMAL")) != "NORMAL":
            continue
        match = _VERSION.search(str(image.get("OsName", "")))
        if match is None:
            continue
        key = (int(match.group(1)), int(match.group(2)), str(image.get("CreatedTime", "")))
        if best is None or key > best[0]:
            best = (key, str(image["ImageId"]))
    return best[1] if best else None


# ------------------------------------------------------------------------------------------------ boot
#
# What a launch carries on CVM (``providers.launch.BootSpec``) in CVM's and VPC's own fields. Sources:
# RunInstances https://cloud.tencent.com/document/api/213/15730 (UserData, SystemDisk, LoginSettings.KeyIds,
# SecurityGroupIds), ImportKeyPair https://cloud.tencent.com/document/api/213/15703, DeleteKeyPairs
# https://cloud.tencent.com/document/api/213/15700, CreateSecurityGroup https://cloud.tencent.com/document/api/215/15806
# and DescribeSecurityGroupLimits https://cloud.tencent.com/document/api/215/41428.

# ImportKeyPair KeyName: "digits, letters and underscores, at most 25 characters".
KEY_NAME_MAX_LENGTH = 25
KEY_NAME_PREFIX = "brk_"
# ImportKeyPair PublicKey: "the public key of the key pair, in OpenSSH RSA format". Other key types reach the
# machine through the boot script alone.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa"})
# CreateSecurityGroup GroupName: "any name of at most 60 characters"; GroupDescription: at most 100.
SECURITY_GROUP_NAME_MAX_LENGTH = 60
SECURITY_GROUP_DESCRIPTION = "gpu-broker: the buyer's addresses for one order"
# DescribeSecurityGroupLimits' SecurityGroupPolicyLimit: 100 rules in one security group (its documented example).
SECURITY_GROUP_POLICY_LIMIT = 100
# RunInstances UserData: "base64-encoded, at most 16 KB". The limit is read as applying to the encoded field
# (the stricter reading): a script refused here might have fitted, never the other way round.
USER_DATA_MAX_BYTES = 16 * 1024

# A new security group denies everything in both directions until rules are added (CreateSecurityGroup's
# description), so the machine gets explicit egress or it could not fetch its agent. With Protocol ALL the
# SecurityGroupPolicy data type asks for Port "all".
EGRESS_POLICIES: tuple[dict[str, str], ...] = (
    {"Protocol": "ALL", "Port": "all", "CidrBlock": "0.0.0.0/0", "Action": "ACCEPT"},
    {"Protocol": "ALL", "Port": "all", "Ipv6CidrBlock": "::/0", "Action": "ACCEPT"},
)

# DeleteKeyPairs: "a key pair used by an instance or image cannot be deleted". The code is not in the reference's
# excerpt we could read; InvalidParameterValue.KeyPairNotSupported ("the key does not support this operation",
# the SDK's error table) is the one Tencent's own Terraform provider retries a key pair deletion on.
KEY_PAIR_IN_USE_CODES = frozenset({"InvalidParameterValue.KeyPairNotSupported", "InvalidKeyPair"})
KEY_PAIR_GONE_CODES = frozenset({"InvalidKeyPairId.NotFound"})
KEY_NAME_TAKEN_CODE = "InvalidKeyPairName.Duplicate"
PUBLIC_KEY_TAKEN_CODE = "InvalidPublicKey.Duplicate"
# DeleteSecurityGroup on a group still bound to an instance: ResourceInUse ("the resource is in use", VPC's table).
SECURITY_GROUP_IN_USE_CODES = frozenset({"ResourceInUse"})
SECURITY_GROUP_GONE_CODES = frozenset({"InvalidSecurityGroupID.NotFound"})


def canonical_public_key(text: str) -> str:
    """``"<type> <base64>"`` of an OpenSSH public key line; CVM keeps the comment, comparisons must not."""
    return " ".join(str(text).split()[:2])


def key_pair_name(order_ref: str, public_key: str) -> str:
    """A deterministic KeyName for one buyer key of one order: ``brk_`` and 21 hex digits of a hash, so a
    resumed launch asks for the same name and the order reference (longer than 25 characters) is in the tag."""
    digest = hashlib.sha256(f"{order_ref}\n{canonical_public_key(public_key)}".encode()).hexdigest()
    return (KEY_NAME_PREFIX + digest)[:KEY_NAME_MAX_LENGTH]


def security_group_name(order_ref: str) -> str:
    return f"broker-{order_ref}"[:SECURITY_GROUP_NAME_MAX_LENGTH]


def order_tags(order_ref: str) -> list[dict[str, str]]:
    return [{"Key": ORDER_TAG, "Value": order_ref}]


def order_of(tags: Iterable[Mapping[str, Any]] | None) -> str | None:
    """The order reference tagged on a key pair or security group, if any."""
    return tags_dict(tags).get(ORDER_TAG) or None


def ingress_policies(rules: Iterable[IngressRule]) -> list[dict[str, str]]:
    """One ACCEPT policy per (port, address range): ``CidrBlock`` for IPv4, ``Ipv6CidrBlock`` for IPv6 (the two
    are exclusive in one policy)."""
    policies: list[dict[str, str]] = []
    for rule in rules:
        for cidr in rule.cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            field = "CidrBlock" if network.version == 4 else "Ipv6CidrBlock"
            policies.append(
                {"Protocol": rule.protocol.upper(), "Port": str(rule.port), field: str(network), "Action": "ACCEPT"}
            )
    return policies


def policy_key(policy: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What makes two policies the same rule, whatever else CVM returns with them (index, time, description)."""
    cidr = str(policy.get("CidrBlock") or policy.get("Ipv6CidrBlock") or "")
    return (
        str(policy.get("Protocol") or "").upper(),
        str(policy.get("Port") or "").lower(),
        cidr,
        str(policy.get("Action") or ""),
    )


def missing_policies(wanted: Iterable[Mapping[str, Any]], present: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The wanted policies a security group lacks: a resumed launch adds only those."""
    have = {policy_key(p) for p in present}
    return [dict(p) for p in wanted if policy_key(p) not in have]


def encode_user_data(script: bytes) -> str:
    return base64.b64encode(script).decode("ascii")
