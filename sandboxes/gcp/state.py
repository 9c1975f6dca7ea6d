"""What the GCP sandbox holds between requests: its instances and their operations, the global (firewall)
operations, the snapshot tests read, the calls it logged and the request being served; and the launch action and
fault codes both the app and its handlers use."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from sandboxes.faults import FaultKind
from sandboxes.gcp.wire import ApiError

LAUNCH_ACTION = "compute.instances.insert"
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# The code each fault kind produces unless the fault names its own.
KIND_CODES = {
    FaultKind.CAPACITY: "ZONE_RESOURCE_POOL_EXHAUSTED",
    FaultKind.QUOTA: "QUOTA_EXCEEDED",
    FaultKind.THROTTLE: "RATE_LIMIT_EXCEEDED",
    FaultKind.CREDENTIALS: "PERMISSION_DENIED",
}


@dataclass(slots=True)
class _Instance:
    project: str
    zone: str
    body: dict[str, Any]
    request_id: str
    staged_seen: bool = False
    booted: bool = False
    since: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return str(self.body["name"])


@dataclass(slots=True)
class _Operation:
    project: str
    zone: str
    body: dict[str, Any]
    kind: str  # insert | delete | stop | start | reset
    target: str  # instance name
    failure: tuple[str, int, str, str] | None = None  # (code, http status, http message, message)
    created: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _GlobalOperation:
    """A firewall insert or delete: the rule appears (or goes) when the operation completes, as in GCP."""

    project: str
    body: dict[str, Any]
    kind: str  # insert | delete
    target: str  # firewall name
    firewall: dict[str, Any] | None = None  # the rule an insert creates
    created: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance the sandbox holds (for tests asserting what was, or was not, launched)."""

    instance_id: str  # <zone>/<name>, as the adapter names it
    project: str
    zone: str
    name: str
    instance_type: str  # the broker's name: n1-standard-8+1xT4 for attached GPUs
    state: str  # the GCP status
    provisioning_model: str
    labels: dict[str, str]
    request_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    service: str
    action: str
    project: str = ""
    zone: str | None = None
    instance_types: tuple[str, ...] = ()


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes
    authorization: str
    service: str = "compute"
    action: str = ""
    project: str = ""
    zone: str | None = None
    instance_types: tuple[str, ...] = ()
    route: dict[str, str] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received.", "parseError") from None
        if not isinstance(value, dict):
            raise ApiError(400, "Invalid JSON payload received.", "parseError")
        return value
