"""Microsoft.Network network security groups in the Azure sandbox, answered as Azure Resource Manager answers them,
so ``azure-mgmt-network``'s ``network_security_groups`` operations run unchanged against it.

- ``PUT .../networkSecurityGroups/{name}`` creates (201) or replaces (200) a group; it is a long-running
  operation (``Azure-AsyncOperation`` back at this server) and the body carries ``provisioningState: Updating``
  until the next read. ``GET`` answers the group with its ``securityRules``, ARM's six ``defaultSecurityRules``
  and the ``networkInterfaces`` that use it; ``GET .../networkSecurityGroups`` lists a resource group's groups
  with their tags (``nextLink`` paging; ARM has no tag filter on this list).
- ``DELETE`` is 202 plus an operation, 204 for a group that is not there, and 400
  ``InUseNetworkSecurityGroupCannotBeDeleted`` while a VM's NIC still names the group (the NIC goes with its VM).
- What ARM refuses synchronously with 400: more than 1,000 rules (``SecurityRuleCountLimitReached``, "NSG rules
  per NSG: 1,000", Azure subscription and service limits, Networking limits), a priority outside 100-4096
  (``SecurityRuleInvalidPriority``, Network security groups overview: "a number between 100 and 4096"), two
  rules with one priority and direction (``SecurityRuleConflict``), an address prefix or port range that does not
  parse (``SecurityRuleInvalidAddressPrefix``, ``SecurityRuleInvalidPortRange``). Microsoft documents the limits
  but not these answers: ``SecurityRuleCountLimitReached`` and ``InUseNetworkSecurityGroupCannotBeDeleted`` are
  as ARM's answers are quoted in public issue reports (Azure/azure-rest-api-specs#3003, Azure/RDS-Templates#695);
  the other rule codes follow ARM's naming without such a record.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from werkzeug.wrappers import Request, Response

from sandboxes.azure.wire import Operation, Operations, arm_error
from sandboxes.server import json_response

NETWORK = "Microsoft.Network"
NSG_TYPE = f"{NETWORK}/networkSecurityGroups"
RULES_MAX = 1000
PRIORITY_MIN, PRIORITY_MAX = 100, 4096
PAGE_SIZE = 50
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,78}[A-Za-z0-9_]$|^[A-Za-z0-9]$")
_SERVICE_TAGS = frozenset({"*", "internet", "virtualnetwork", "azureloadbalancer"})
_PROTOCOLS = frozenset({"Tcp", "Udp", "Icmp", "Esp", "Ah", "*"})
# ARM adds these to every group (Network security groups overview, "Default security rules").
_DEFAULT_RULES = (
    ("AllowVnetInBound", "Inbound", "Allow", 65000, "VirtualNetwork", "VirtualNetwork"),
    ("AllowAzureLoadBalancerInBound", "Inbound", "Allow", 65001, "AzureLoadBalancer", "*"),
    ("DenyAllInBound", "Inbound", "Deny", 65500, "*", "*"),
    ("AllowVnetOutBound", "Outbound", "Allow", 65000, "VirtualNetwork", "VirtualNetwork"),
    ("AllowInternetOutBound", "Outbound", "Allow", 65001, "*", "Internet"),
    ("DenyAllOutBound", "Outbound", "Deny", 65500, "*", "*"),
)


def nsg_resource_id(subscription: str, resource_group: str, name: str) -> str:
    return f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/{NSG_TYPE}/{name}"


@dataclass(slots=True)
class SandboxNsg:
    """A network security group as the sandbox holds it (``rules`` are the request's ``securityRules``)."""

    subscription: str
    resource_group: str
    name: str
    location: str
    tags: dict[str, str]
    rules: list[dict[str, Any]]
    guid: str = field(default_factory=lambda: str(uuid.uuid4()))
    etag: str = field(default_factory=lambda: str(uuid.uuid4()))
    operation: Operation | None = None
    deleting: Operation | None = None

    @property
    def resource_id(self) -> str:
        return nsg_resource_id(self.subscription, self.resource_group, self.name)


def _key(subscription: str, resource_group: str, name: str) -> tuple[str, str, str]:
    return subscription.lower(), resource_group.lower(), name.lower()


class NetworkSecurityGroups:
    """The sandbox's network security groups. ``users(nsg_id)`` names the NICs that use a group (the Compute part
    knows them: each VM's inline NIC); a group with users cannot be deleted."""

    def __init__(self, regions: list[str], operations: Operations, users: Callable[[str], list[str]]):
        self.regions = regions
        self.operations = operations
        self.users = users
        self.delete_seconds = 0.0
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str, str], SandboxNsg] = {}

    # -- for the Compute part and for tests

    def find(self, resource_id: str) -> SandboxNsg | None:
        """The group with this resource id (case-insensitive, as ARM ids are), None if absent or deleted."""
        match = re.match(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Network/"
                         r"networkSecurityGroups/([^/]+)$", resource_id, re.I)  # fmt: skip
        if match is None:
            return None
        with self._lock:
            self._sweep()
            nsg = self._groups.get(_key(*match.groups()))
            return copy.deepcopy(nsg) if nsg is not None else None

    def all(self) -> list[SandboxNsg]:
        with self._lock:
            self._sweep()
            return [copy.deepcopy(n) for n in sorted(self._groups.values(), key=lambda n: n.resource_id.lower())]

    def reset(self) -> None:
        with self._lock:
            self._groups.clear()
        self.delete_seconds = 0.0

    def _sweep(self) -> None:
        """Forget groups whose delete finished. Caller holds the lock."""
        now = time.monotonic()
        for key, nsg in list(self._groups.items()):
            if nsg.deleting is not None and now >= nsg.deleting.done_at:
                del self._groups[key]

    # -- ARM routes

    def put(self, request: Request, args: dict[str, str], body: dict[str, Any]) -> Response:
        name = args["nsg"]
        if not _NAME.match(name):
            return arm_error("InvalidResourceName", f"Resource name {name} is invalid.", 400)
        location = str(body.get("location") or "").lower()
        if location not in self.regions:
            return arm_error(
                "LocationNotAvailableForResourceType",
                f"The provided location '{location}' is not available for resource type '{NSG_TYPE}'.",
                400,
            )
        rules = list((body.get("properties") or {}).get("securityRules") or [])
        invalid = self._invalid_rules(rules)
        if invalid is not None:
            return invalid
        tags = {str(k): str(v) for k, v in (body.get("tags") or {}).items()}
        key = _key(args["sub"], args["rg"], name)
        with self._lock:
            self._sweep()
            current = self._groups.get(key)
            if current is not None and current.deleting is not None:
                return arm_error(
                    "AnotherOperationInProgress",
                    f"Another operation on this or dependent resource is in progress. Resource {current.resource_id}.",
                    409,
                )
            if current is not None and current.location != location:
                return arm_error(
                    "InvalidResourceLocation",
                    f"The resource '{name}' already exists in location '{current.location}' in resource group "
                    f"'{args['rg']}'. A resource with the same name cannot be created in location '{location}'.",
                    409,
                )
            operation = self.operations.new(location, 0.0)
            if current is None:
                current = SandboxNsg(args["sub"], args["rg"], name, location, tags, copy.deepcopy(rules))
                self._groups[key] = current
                status = 201
            else:
                current.tags, current.rules, current.etag = tags, copy.deepcopy(rules), str(uuid.uuid4())
                status = 200
            current.operation = operation
            answer = self._json(current, provisioning="Updating")
        response = json_response(answer, status=status)
        response.headers["Azure-AsyncOperation"] = self._operation_url(request, args["sub"], operation)
        return response

    def get(self, args: dict[str, str]) -> Response:
        with self._lock:
            self._sweep()
            nsg = self._groups.get(_key(args["sub"], args["rg"], args["nsg"]))
            if nsg is None:
                return self._not_found(args)
            return json_response(self._json(nsg))

    def list_groups(self, request: Request, args: dict[str, str]) -> Response:
        with self._lock:
            self._sweep()
            groups = sorted(
                (n for k, n in self._groups.items() if k[:2] == (args["sub"].lower(), args["rg"].lower())),
                key=lambda n: n.name.lower(),
            )
            values = [self._json(n) for n in groups]
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        result: dict[str, Any] = {"value": values[offset : offset + PAGE_SIZE]}
        if offset + PAGE_SIZE < len(values):
            query = "&".join(
                f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in request.args.items() if k != "$skiptoken"
            )
            result["nextLink"] = f"{request.host_url.rstrip('/')}{request.path}?{query}&$skiptoken={offset + PAGE_SIZE}"
        return json_response(result)

    def delete(self, request: Request, args: dict[str, str]) -> Response:
        key = _key(args["sub"], args["rg"], args["nsg"])
        with self._lock:
            self._sweep()
            nsg = self._groups.get(key)
            if nsg is None:
                return Response(status=204)  # ARM answers a delete of a missing resource with 204
            resource_id = nsg.resource_id
        users = self.users(resource_id)
        if users:
            return arm_error(
                "InUseNetworkSecurityGroupCannotBeDeleted",
                f"Network security group {resource_id} cannot be deleted because it is in use by the following "
                f"resources: {', '.join(users)}. In order to delete the Network security group, remove the "
                "association with the resource(s). To learn how to do this, see aka.ms/deletensg.",
                400,
            )
        with self._lock:
            nsg = self._groups.get(key)
            if nsg is None:
                return Response(status=204)
            if nsg.deleting is None:
                nsg.deleting = self.operations.new(nsg.location, self.delete_seconds)
            url = self._operation_url(request, args["sub"], nsg.deleting)
        response = Response(status=202)
        response.headers["Azure-AsyncOperation"] = url
        response.headers["Location"] = url + "&monitor=true"
        return response

    # -- wire shapes

    def _operation_url(self, request: Request, subscription: str, operation: Operation) -> str:
        api_version = request.args.get("api-version", "")
        return self.operations.url(request.host_url, subscription, NETWORK, operation, api_version)

    @staticmethod
    def _not_found(args: dict[str, str]) -> Response:
        return arm_error(
            "ResourceNotFound",
            f"The Resource '{NSG_TYPE}/{args['nsg']}' under resource group '{args['rg']}' was not found. For more "
            "details please go to https://aka.ms/ARMResourceNotFoundFix",
            404,
        )

    def _json(self, nsg: SandboxNsg, provisioning: str | None = None) -> dict[str, Any]:
        if provisioning is None:
            done = nsg.operation is None or time.monotonic() >= nsg.operation.done_at
            provisioning = "Deleting" if nsg.deleting is not None else "Succeeded" if done else "Updating"
        rules = []
        for rule in nsg.rules:
            name = str(rule.get("name", ""))
            rules.append(
                {
                    "name": name,
                    "id": f"{nsg.resource_id}/securityRules/{name}",
                    "etag": f'W/"{nsg.etag}"',
                    "type": f"{NSG_TYPE}/securityRules",
                    "properties": {**(rule.get("properties") or {}), "provisioningState": provisioning},
                }
            )
        defaults = [
            {
                "name": name,
                "id": f"{nsg.resource_id}/defaultSecurityRules/{name}",
                "etag": f'W/"{nsg.etag}"',
                "type": f"{NSG_TYPE}/defaultSecurityRules",
                "properties": {
                    "provisioningState": "Succeeded",
                    "description": name,
                    "protocol": "*",
                    "sourcePortRange": "*",
                    "destinationPortRange": "*",
                    "sourceAddressPrefix": source,
                    "destinationAddressPrefix": destination,
                    "access": access,
                    "priority": priority,
                    "direction": direction,
                },
            }
            for name, direction, access, priority, source, destination in _DEFAULT_RULES
        ]
        properties: dict[str, Any] = {
            "provisioningState": provisioning,
            "resourceGuid": nsg.guid,
            "securityRules": rules,
            "defaultSecurityRules": defaults,
        }
        return {
            "name": nsg.name,
            "id": nsg.resource_id,
            "etag": f'W/"{nsg.etag}"',
            "type": NSG_TYPE,
            "location": nsg.location,
            "tags": dict(nsg.tags),
            "properties": properties,
        }

    @staticmethod
    def _invalid_rules(rules: list[Any]) -> Response | None:
        """The first thing ARM refuses in a group's rules, as ARM refuses it; None when all parse."""
        if len(rules) > RULES_MAX:
            return arm_error(
                "SecurityRuleCountLimitReached",
                f"A security group cannot have more than {RULES_MAX} security rules.",
                400,
            )
        seen: dict[tuple[int, str], str] = {}
        for rule in rules:
            if not isinstance(rule, dict) or not rule.get("name"):
                return arm_error("InvalidRequestFormat", "Cannot parse the request: a security rule has no name.", 400)
            name = str(rule["name"])
            properties = rule.get("properties") or {}
            priority = properties.get("priority")
            if not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
                return arm_error(
                    "SecurityRuleInvalidPriority",
                    f"Security rule has invalid Priority. Value provided: {priority} Allowed range "
                    f"{PRIORITY_MIN}-{PRIORITY_MAX}.",
                    400,
                )
            direction, access = properties.get("direction"), properties.get("access")
            if direction not in ("Inbound", "Outbound") or access not in ("Allow", "Deny"):
                return arm_error(
                    "InvalidRequestFormat", f"Cannot parse the request: rule {name} direction/access.", 400
                )
            if properties.get("protocol") not in _PROTOCOLS:
                return arm_error("InvalidRequestFormat", f"Cannot parse the request: rule {name} protocol.", 400)
            if (priority, direction) in seen:
                return arm_error(
                    "SecurityRuleConflict",
                    f"Security rule {name} conflicts with rule {seen[(priority, direction)]}. Rules cannot have the "
                    "same Priority and Direction. To learn more, see aka.ms/nsgrules.",
                    400,
                )
            seen[(priority, direction)] = name
            for prefix_field in ("sourceAddressPrefix", "destinationAddressPrefix"):
                prefixes = _many(properties, prefix_field)
                bad = next((p for p in prefixes if not _prefix_ok(p)), None)
                if bad is not None or not prefixes:
                    return arm_error(
                        "SecurityRuleInvalidAddressPrefix",
                        f"Security rule {name} has invalid Address prefix. Value provided: {bad}.",
                        400,
                    )
            for port_field in ("sourcePortRange", "destinationPortRange"):
                ranges = _many(properties, port_field)
                bad = next((r for r in ranges if not _port_range_ok(r)), None)
                if bad is not None or not ranges:
                    return arm_error(
                        "SecurityRuleInvalidPortRange",
                        f"Security rule has invalid Port range. Value provided: {bad}. Value should be an integer OR "
                        "integer range with '-' delimiter. Valid range 0-65535.",
                        400,
                    )
        return None


def _many(properties: dict[str, Any], singular: str) -> list[str]:
    """A rule field that ARM takes either singly (``sourceAddressPrefix``) or as a list (``...Prefixes``)."""
    one = properties.get(singular)
    many = properties.get(singular + ("es" if singular.endswith("Prefix") else "s")) or []
    return [str(v) for v in ([one] if one else []) + list(many)]


def _prefix_ok(prefix: str) -> bool:
    if prefix.lower() in _SERVICE_TAGS:
        return True
    try:
        ipaddress.ip_network(prefix, strict=False)
    except ValueError:
        return False
    return True


def _port_range_ok(value: str) -> bool:
    if value == "*":
        return True
    parts = value.split("-")
    if len(parts) > 2 or not all(p.isdigit() for p in parts):
        return False
    numbers = [int(p) for p in parts]
    return all(0 <= n <= 65535 for n in numbers) and numbers == sorted(numbers)


def ingress_pairs(nsg: SandboxNsg) -> set[tuple[int, str]]:
    """Each (port, source prefix) an Inbound Allow rule of the group lets in (single ports only)."""
    pairs: set[tuple[int, str]] = set()
    for rule in nsg.rules:
        properties = rule.get("properties") or {}
        if properties.get("direction") != "Inbound" or properties.get("access") != "Allow":
            continue
        for port in _many(properties, "destinationPortRange"):
            if port.isdigit():
                pairs.update((int(port), prefix) for prefix in _many(properties, "sourceAddressPrefix"))
    return pairs
