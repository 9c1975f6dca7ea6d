"""What the Tencent sandbox keeps for a launch's access besides the instance: CVM key pairs and VPC security
groups with their policies, in the two APIs' own wire shapes, and the checks each field gets.

Field names, limits and error codes, with their sources:

- ImportKeyPair (https://cloud.tencent.com/document/api/213/15703): ``KeyName`` of digits, letters and underscores,
  at most 25 characters (``InvalidKeyPairNameEmpty``, ``InvalidKeyPairNameTooLong``,
  ``InvalidKeyPairNameIncludeIllegalChar``, ``InvalidKeyPairName.Duplicate``); ``ProjectId``; ``PublicKey`` in
  OpenSSH RSA format (``InvalidPublicKey.Malformed``; a key already imported is ``InvalidPublicKey.Duplicate``);
  ``TagSpecification`` with ResourceType ``keypair``. Answers ``KeyId`` (``skey-`` and 8 characters).
- DeleteKeyPairs (https://cloud.tencent.com/document/api/213/15700): at most 100 ``KeyIds``; a key pair an
  instance uses cannot be deleted. The sandbox answers that with ``InvalidParameterValue.KeyPairNotSupported``
  (see ``providers/tencent/mapping.py`` for why that code).
- CreateSecurityGroup (https://cloud.tencent.com/document/api/215/15806): ``GroupName`` at most 60 characters,
  ``GroupDescription`` at most 100, ``Tags``; a new group denies everything in both directions.
- CreateSecurityGroupPolicies (https://cloud.tencent.com/document/api/215/15807): one direction per request;
  policies of ``Protocol`` (TCP, UDP, ICMP, ICMPv6, ALL), ``Port`` for TCP and UDP only (one port, ``a,b`` or
  ``a-b``; ``all`` with ALL), ``CidrBlock`` or ``Ipv6CidrBlock`` (exclusive) and ``Action`` (ACCEPT or DROP),
  at most 100 rules per group (DescribeSecurityGroupLimits,
  https://cloud.tencent.com/document/api/215/41428; ``LimitExceeded.SecurityGroupPolicySet`` beyond).
- DeleteSecurityGroup: ``ResourceInUse`` while an instance is in the group, ``InvalidSecurityGroupID.NotFound``
  for an unknown id (the VPC SDK's error table).

Every error is raised as ``ApiError`` and answered with HTTP 200, as Tencent Cloud API 3.0 answers them.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

KEY_NAME_MAX_LENGTH = 25
GROUP_NAME_MAX_LENGTH = 60
GROUP_DESCRIPTION_MAX_LENGTH = 100
POLICIES_PER_GROUP = 100
KEY_IDS_PER_REQUEST = 100
_KEY_NAME = re.compile(r"^[A-Za-z0-9_]+$")
KEY_ID = re.compile(r"^skey-[a-z0-9]{8}$")
GROUP_ID = re.compile(r"^sg-[a-z0-9]{8}$")
_PORT = re.compile(r"^(all|\d{1,5}(-\d{1,5})?(,\d{1,5})*)$", re.IGNORECASE)
PROTOCOLS = frozenset({"TCP", "UDP", "ICMP", "ICMPV6", "ALL"})
ACTIONS = frozenset({"ACCEPT", "DROP"})
DIRECTIONS = ("Ingress", "Egress")


class ApiError(Exception):
    """An error answer: HTTP 200 with ``Response.Error``."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(slots=True)
class KeyPairRecord:
    key_id: str
    region: str
    name: str
    project_id: int
    public_key: str
    created_at: datetime
    tags: dict[str, str] = field(default_factory=dict)

    def to_json(self, associated: list[str]) -> dict[str, Any]:
        """A ``KeyPair`` as DescribeKeyPairs answers it; CVM keeps no private key of an imported pair."""
        return {
            "KeyId": self.key_id,
            "KeyName": self.name,
            "ProjectId": self.project_id,
            "Description": "",
            "PublicKey": self.public_key,
            "PrivateKey": None,
            "AssociatedInstanceIds": associated,
            "CreatedTime": _time(self.created_at),
            "Tags": tag_list(self.tags),
        }


@dataclass(slots=True)
class SecurityGroupRecord:
    group_id: str
    region: str
    name: str
    description: str
    project_id: str
    created_at: datetime
    updated_at: datetime
    tags: dict[str, str] = field(default_factory=dict)
    ingress: list[dict[str, Any]] = field(default_factory=list)
    egress: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        """A ``SecurityGroup`` as DescribeSecurityGroups and CreateSecurityGroup answer it."""
        return {
            "SecurityGroupId": self.group_id,
            "SecurityGroupName": self.name,
            "SecurityGroupDesc": self.description,
            "ProjectId": self.project_id,
            "IsDefault": False,
            "CreatedTime": self.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "TagSet": tag_list(self.tags),
            "UpdateTime": self.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
        }

    def policy_set(self) -> dict[str, Any]:
        """``SecurityGroupPolicySet`` as DescribeSecurityGroupPolicies answers it, with each rule's index."""
        return {
            "Version": str(self.version),
            "Ingress": [{**p, "PolicyIndex": i, "SecurityGroupId": self.group_id} for i, p in enumerate(self.ingress)],
            "Egress": [{**p, "PolicyIndex": i, "SecurityGroupId": self.group_id} for i, p in enumerate(self.egress)],
            "PolicyStatistics": {
                "IngressIPv4TotalCount": sum(1 for p in self.ingress if "CidrBlock" in p),
                "IngressIPv6TotalCount": sum(1 for p in self.ingress if "Ipv6CidrBlock" in p),
                "EgressIPv4TotalCount": sum(1 for p in self.egress if "CidrBlock" in p),
                "EgressIPv6TotalCount": sum(1 for p in self.egress if "Ipv6CidrBlock" in p),
            },
        }


def _time(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def tags_from(items: Any, where: str) -> dict[str, str]:
    """``[{"Key", "Value"}]`` -> dict; a repeated key is ``InvalidParameterValue.DuplicateTags`` as on CVM."""
    if items is None:
        return {}
    if not isinstance(items, list) or not all(isinstance(t, dict) and t.get("Key") for t in items):
        raise ApiError("InvalidParameter", f"{where} must be a list of {{Key, Value}}.")
    tags: dict[str, str] = {}
    for item in items:
        key = str(item["Key"])
        if key in tags:
            raise ApiError("InvalidParameterValue.DuplicateTags", f"The tag key {key} is repeated.")
        tags[key] = str(item.get("Value") or "")
    return tags


def spec_tags(params: dict[str, Any], resource_type: str) -> dict[str, str]:
    """The tags a ``TagSpecification`` list binds to one resource type."""
    tags: dict[str, str] = {}
    specs = params.get("TagSpecification") or []
    if not isinstance(specs, list):
        raise ApiError("InvalidParameter", "TagSpecification must be a list.")
    for spec in specs:
        if isinstance(spec, dict) and spec.get("ResourceType") == resource_type:
            tags.update(tags_from(spec.get("Tags") or [], "TagSpecification.Tags"))
    return tags


def check_key_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ApiError("InvalidKeyPairNameEmpty", "The key pair name is empty.")
    if len(name) > KEY_NAME_MAX_LENGTH:
        raise ApiError("InvalidKeyPairNameTooLong", f"The key pair name exceeds {KEY_NAME_MAX_LENGTH} characters.")
    if not _KEY_NAME.match(name):
        raise ApiError(
            "InvalidKeyPairNameIncludeIllegalChar", "The key pair name takes letters, digits and underscores only."
        )
    return name


def check_rsa_public_key(text: Any) -> str:
    """The key as stored (the line as given, trimmed), refused unless it is an OpenSSH RSA public key."""
    parts = str(text or "").split()
    if len(parts) < 2 or parts[0] != "ssh-rsa":
        raise ApiError("InvalidPublicKey.Malformed", "The public key must be in OpenSSH RSA format.")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("InvalidPublicKey.Malformed", "The public key is not valid base64.") from None
    if not blob.startswith(b"\x00\x00\x00\x07ssh-rsa"):
        raise ApiError("InvalidPublicKey.Malformed", "The public key data is not an RSA key.")
    return " ".join(parts)


def key_body(public_key: str) -> str:
    """What makes two stored keys the same key: type and data, not the comment."""
    return " ".join(public_key.split()[:2])


def check_policy(raw: Any) -> dict[str, Any]:
    """One ``SecurityGroupPolicy`` as given, checked and stored with the fields a describe returns."""
    if not isinstance(raw, dict):
        raise ApiError("InvalidParameter", "Each security group policy must be an object.")
    protocol = str(raw.get("Protocol") or "").upper()
    port = str(raw.get("Port") or "").strip()
    action = str(raw.get("Action") or "").upper()
    if protocol not in PROTOCOLS:
        raise ApiError("InvalidParameterValue.Malformed", f"The protocol {raw.get('Protocol')!r} is not valid.")
    # Ports go with TCP and UDP only; for ALL the SecurityGroupPolicy type asks for "all" (or none at all).
    if protocol not in ("TCP", "UDP"):
        if port.lower() not in ("", "all"):
            raise ApiError("InvalidParameter", f"{protocol} takes no port.")
        port = "all"
    if not _PORT.match(port):
        raise ApiError("InvalidParameterValue.Range", f"The port {port!r} is not valid for {protocol}.")
    for number in re.split(r"[,-]", port):
        if number.isdigit() and not 1 <= int(number) <= 65535:
            raise ApiError("InvalidParameterValue.Range", f"The port {number} is not between 1 and 65535.")
    if action not in ACTIONS:
        raise ApiError("InvalidParameterValue.Malformed", "The action must be ACCEPT or DROP.")
    v4, v6 = raw.get("CidrBlock"), raw.get("Ipv6CidrBlock")
    if bool(v4) == bool(v6):
        raise ApiError("InvalidParameter", "Give one of CidrBlock and Ipv6CidrBlock in a policy.")
    field_name, version = ("CidrBlock", 4) if v4 else ("Ipv6CidrBlock", 6)
    try:
        network = ipaddress.ip_network(str(v4 or v6), strict=False)
    except ValueError:
        raise ApiError("InvalidParameterValue.Malformed", f"{field_name} {v4 or v6!r} is not a network.") from None
    if network.version != version:
        raise ApiError("InvalidParameterValue.Malformed", f"{field_name} {network} is of the other IP version.")
    if protocol == "ICMP" and version == 6:
        raise ApiError("InvalidParameter", "ICMP and Ipv6CidrBlock are exclusive: use ICMPV6.")
    return {
        "Protocol": protocol,
        "Port": port.lower() if port.lower() == "all" else port,
        field_name: str(network),
        "Action": action,
        "PolicyDescription": str(raw.get("PolicyDescription") or ""),
        "ModifyTime": "",
    }


def check_group_fields(params: dict[str, Any]) -> tuple[str, str]:
    name = params.get("GroupName")
    description = params.get("GroupDescription")
    if not isinstance(name, str) or not name:
        raise ApiError("MissingParameter", "The parameter GroupName is required.")
    if not isinstance(description, str) or not description:
        raise ApiError("MissingParameter", "The parameter GroupDescription is required.")
    if len(name) > GROUP_NAME_MAX_LENGTH:
        raise ApiError("InvalidParameterValue.TooLong", f"GroupName exceeds {GROUP_NAME_MAX_LENGTH} characters.")
    if len(description) > GROUP_DESCRIPTION_MAX_LENGTH:
        raise ApiError(
            "InvalidParameterValue.TooLong", f"GroupDescription exceeds {GROUP_DESCRIPTION_MAX_LENGTH} characters."
        )
    return name, description


def decode_user_data(value: Any, limit: int) -> str:
    """RunInstances ``UserData``: a base64 string of at most ``limit`` characters, kept as sent."""
    if not isinstance(value, str):
        raise ApiError("InvalidParameterValue.InvalidUserDataFormat", "UserData must be a base64 string.")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            "InvalidParameterValue.InvalidUserDataFormat", "UserData is malformed; it must be base64-encoded."
        ) from None
    if len(value) > limit:
        raise ApiError("InvalidParameterValue.TooLong", f"UserData is {len(value)} bytes; the limit is {limit}.")
    return value
