"""The Tencent sandbox's key pairs (CVM's ``ImportKeyPair``, ``DescribeKeyPairs``, ``DeleteKeyPairs``) and security
groups (the VPC API's ``CreateSecurityGroup``, ``CreateSecurityGroupPolicies``, ``DescribeSecurityGroups``,
``DescribeSecurityGroupPolicies``, ``DeleteSecurityGroup``); neither can be deleted while an instance uses it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sandboxes.tencent import access
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.state import RELEASED_STATES, _filters, _Instance, _int, _matches, _Request, _string_list


class SecurityHandlers:
    """CVM's key pair and VPC's security group actions, mixed into ``TencentSandbox``."""

    _clock: Callable[[], float]
    _instances: dict[str, _Instance]
    _key_pairs: dict[str, access.KeyPairRecord]
    _lock: threading.Lock
    _security_groups: dict[str, access.SecurityGroupRecord]
    _state: Callable[[_Instance, float], str]

    def _import_key_pair(self, request: _Request) -> dict[str, Any]:
        params = request.params
        name = access.check_key_name(params.get("KeyName"))
        project = params.get("ProjectId")
        if project is None:
            raise ApiError("MissingParameter", "The parameter ProjectId is required.")
        if isinstance(project, bool) or not isinstance(project, int):
            raise ApiError("InvalidParameterValue", "ProjectId must be an integer.")
        public_key = access.check_rsa_public_key(params.get("PublicKey"))
        tags = access.spec_tags(params, "keypair")
        with self._lock:
            mine = [k for k in self._key_pairs.values() if k.region == request.region]
            if any(k.name == name for k in mine):
                raise ApiError("InvalidKeyPairName.Duplicate", f"The key pair name {name} already exists.")
            if any(access.key_body(k.public_key) == access.key_body(public_key) for k in mine):
                raise ApiError("InvalidPublicKey.Duplicate", "The public key has already been imported.")
            key_id = self._new_resource_id("skey-", self._key_pairs)
            self._key_pairs[key_id] = access.KeyPairRecord(
                key_id=key_id,
                region=request.region,
                name=name,
                project_id=project,
                public_key=public_key,
                created_at=datetime.now(UTC).replace(microsecond=0),
                tags=tags,
            )
        return {"KeyId": key_id}

    def _describe_key_pairs(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "KeyIds", 100)
        filters = _filters(
            params, ("project-id", "key-name", "tag-key", "tag-value"), max_filters=10, max_values=5, tags=True
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "KeyIds and Filters cannot be specified together.")
        for key_id in ids:
            if not access.KEY_ID.match(key_id):
                raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            chosen = [
                k
                for k in sorted(self._key_pairs.values(), key=lambda k: (k.created_at, k.key_id))
                if k.region == request.region
                and (not ids or k.key_id in ids)
                and _matches(
                    self._tag_fields(k.tags, {"project-id": [str(k.project_id)], "key-name": [k.name]}), filters
                )
            ]
            page = [k.to_json(self._key_users(k.key_id, now)) for k in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "KeyPairSet": page}

    def _delete_key_pairs(self, request: _Request) -> dict[str, Any]:
        ids = _string_list(request.params, "KeyIds", access.KEY_IDS_PER_REQUEST)
        if not ids:
            raise ApiError("MissingParameter", "The parameter KeyIds is required.")
        now = self._clock()
        with self._lock:
            for key_id in ids:
                if not access.KEY_ID.match(key_id):
                    raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
                known = self._key_pairs.get(key_id)
                if known is None or known.region != request.region:
                    raise ApiError("InvalidKeyPairId.NotFound", f"The key pair {key_id} does not exist.")
                if self._key_users(key_id, now):
                    raise ApiError(
                        "InvalidParameterValue.KeyPairNotSupported",
                        f"The key pair {key_id} is bound to an instance and cannot be deleted.",
                    )
            for key_id in ids:
                del self._key_pairs[key_id]
        return {}

    def _key_users(self, key_id: str, now: float) -> list[str]:
        """Instances still bound to the key pair (caller locks)."""
        return [
            i.instance_id
            for i in sorted(self._instances.values(), key=lambda i: i.sequence)
            if key_id in i.key_ids and self._state(i, now) not in RELEASED_STATES
        ]

    def _create_security_group(self, request: _Request) -> dict[str, Any]:
        params = request.params
        name, description = access.check_group_fields(params)
        tags = access.tags_from(params.get("Tags"), "Tags")
        now = datetime.now(UTC).replace(microsecond=0)
        with self._lock:
            group_id = self._new_resource_id("sg-", self._security_groups)
            group = access.SecurityGroupRecord(
                group_id=group_id,
                region=request.region,
                name=name,
                description=description,
                project_id=str(params.get("ProjectId") or "0"),
                created_at=now,
                updated_at=now,
                tags=tags,
            )
            self._security_groups[group_id] = group
            return {"SecurityGroup": group.to_json()}

    def _group(self, request: _Request) -> access.SecurityGroupRecord:
        """The request's ``SecurityGroupId`` in its region (caller locks)."""
        group_id = request.params.get("SecurityGroupId")
        if not isinstance(group_id, str) or not group_id:
            raise ApiError("MissingParameter", "The parameter SecurityGroupId is required.")
        if not access.GROUP_ID.match(group_id):
            raise ApiError("InvalidSecurityGroupID.Malformed", f"The security group id {group_id} is malformed.")
        group = self._security_groups.get(group_id)
        if group is None or group.region != request.region:
            raise ApiError("InvalidSecurityGroupID.NotFound", f"The security group {group_id} does not exist.")
        return group

    def _create_security_group_policies(self, request: _Request) -> dict[str, Any]:
        policy_set = request.params.get("SecurityGroupPolicySet")
        if not isinstance(policy_set, dict):
            raise ApiError("MissingParameter", "The parameter SecurityGroupPolicySet is required.")
        given = [d for d in access.DIRECTIONS if policy_set.get(d)]
        if len(given) != 1:
            raise ApiError("InvalidParameter", "Create the rules of one direction (Ingress or Egress) per request.")
        direction = given[0]
        raw = policy_set[direction]
        if not isinstance(raw, list):
            raise ApiError("InvalidParameter", f"{direction} must be a list.")
        policies = [access.check_policy(p) for p in raw]
        with self._lock:
            group = self._group(request)
            if len(group.ingress) + len(group.egress) + len(policies) > access.POLICIES_PER_GROUP:
                raise ApiError(
                    "LimitExceeded.SecurityGroupPolicySet",
                    f"A security group holds at most {access.POLICIES_PER_GROUP} rules.",
                )
            (group.ingress if direction == "Ingress" else group.egress).extend(policies)
            group.version += 1
            group.updated_at = datetime.now(UTC).replace(microsecond=0)
        return {}

    def _describe_security_groups(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "SecurityGroupIds", 100)
        filters = _filters(
            params,
            ("security-group-id", "project-id", "security-group-name", "tag-key"),
            max_filters=10,
            max_values=5,
            tags=True,
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "SecurityGroupIds and Filters cannot be specified together.")
        # VPC types Offset and Limit as strings (the SDK's DescribeSecurityGroupsRequest).
        paging = {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in params.items()}
        offset = _int(paging, "Offset", 0, 0, 1_000_000)
        limit = _int(paging, "Limit", 20, 1, 100)
        with self._lock:
            chosen = [
                g
                for g in sorted(self._security_groups.values(), key=lambda g: (g.created_at, g.group_id))
                if g.region == request.region
                and (not ids or g.group_id in ids)
                and _matches(
                    self._tag_fields(
                        g.tags,
                        {
                            "security-group-id": [g.group_id],
                            "project-id": [g.project_id],
                            "security-group-name": [g.name],
                        },
                    ),
                    filters,
                )
            ]
            page = [g.to_json() for g in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "SecurityGroupSet": page}

    def _describe_security_group_policies(self, request: _Request) -> dict[str, Any]:
        with self._lock:
            return {"SecurityGroupPolicySet": self._group(request).policy_set()}

    def _delete_security_group(self, request: _Request) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            group = self._group(request)
            if self._group_users(group.group_id, now):
                raise ApiError("ResourceInUse", f"The security group {group.group_id} is bound to an instance.")
            del self._security_groups[group.group_id]
        return {}

    def _group_users(self, group_id: str, now: float) -> list[str]:
        """Instances still in the security group (caller locks)."""
        return [
            i.instance_id
            for i in self._instances.values()
            if group_id in i.security_group_ids and self._state(i, now) not in RELEASED_STATES
        ]

    @staticmethod
    def _tag_fields(tags: Mapping[str, str], fields: dict[str, list[str]]) -> dict[str, Iterable[str]]:
        found: dict[str, Iterable[str]] = {**fields, "tag-key": list(tags), "tag-value": list(tags.values())}
        for key, value in tags.items():
            found[f"tag:{key}"] = [value]
        return found

    @staticmethod
    def _new_resource_id(prefix: str, taken: Mapping[str, Any]) -> str:
        while True:
            candidate = prefix + uuid.uuid4().hex[:8]
            if candidate not in taken:
                return candidate
