"""The ECS sandbox's key pairs (``ImportKeyPair``, ``DescribeKeyPairs``, ``DeleteKeyPairs``) and security groups
(``CreateSecurityGroup``, ``AuthorizeSecurityGroup``, ``DescribeSecurityGroups``,
``DescribeSecurityGroupAttribute``, ``DeleteSecurityGroup``), neither deleted while an instance holds it.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.records import (
    _NAME_CHARS,
    GROUP_TYPES,
    INBOUND_RULES_PER_GROUP,
    IP_PROTOCOLS,
    KEY_PAIR_NAMES_PER_DELETE,
    KEY_PAIRS_PER_REGION,
    PERMISSIONS_PER_CALL,
    Binding,
    KeyPair,
    SecurityGroup,
    VSwitch,
    _name_ok,
    _now,
    _rule_identity,
    md5_fingerprint,
    parse_public_key,
)
from sandboxes.alibaba.wire import WireError


class SecurityHandlers:
    """ECS's key pair and security group actions, mixed into ``EcsResources``."""

    _bindings: Callable[[str], list[Binding]]
    _deleted_groups: set[str]
    _group_tokens: dict[tuple[str, str], tuple[str, str]]
    _groups: dict[str, SecurityGroup]
    _key_pairs: dict[tuple[str, str], KeyPair]
    _lock: threading.Lock
    _regions: Mapping[str, tuple[str, tuple[str, ...], str]]
    key_pairs: Callable[[str | None], list[KeyPair]]
    vswitches: Callable[[str], list[VSwitch]]

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
