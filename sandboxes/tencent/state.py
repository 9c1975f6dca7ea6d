"""What the Tencent sandbox holds (its instances, requests and launch records) and the small helpers of CVM's
wire its handlers share: answers, errors, integer, list and ``Filters`` parameters, and the limits they check.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.faults import FaultKind
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.catalogue import SeedPrice

API_VERSION = "2017-03-12"  # CVM's and VPC's version alike
SERVICE = "cvm"
VPC_SERVICE = "vpc"
SERVICES = frozenset({SERVICE, VPC_SERVICE})
ORDERING_TIMEOUT = 30.0  # how long a same-token request waits for the first one before giving up
_INSTANCE_ID = re.compile(r"^ins-[a-z0-9]{8}$")
_IMAGE_ID = re.compile(r"^img-[a-z0-9]{8}$")
# RunInstances UserData: "base64-encoded, at most 16 KB" (https://cloud.tencent.com/document/api/213/15730),
# counted on the encoded field as the broker's pre-check counts it. Over it: InvalidParameterValue.TooLong.
USER_DATA_MAX_BYTES = 16 * 1024
# SystemDisk.DiskSize: the reference documents only the 50 GB default; an invalid size is answered
# InvalidParameterValue "The value `N` specified in the parameter `SystemDisk.DiskSize` is not valid", as the
# API answered in tencentcloud-sdk-python issue #7. The range kept here is the adapter's (20 GB public images).
SYSTEM_DISK_DEFAULT_GB = 50
SYSTEM_DISK_MAX_GB = 16384
DISK_TYPES = frozenset(
    {"LOCAL_BASIC", "LOCAL_SSD", "CLOUD_BASIC", "CLOUD_SSD", "CLOUD_PREMIUM", "CLOUD_BSSD", "CLOUD_HSSD", "CLOUD_TSSD"}
)
# "An instance can be bound to at most 5 security groups" (CVM error LimitExceeded.AssociateUSGLimitExceeded).
SECURITY_GROUPS_PER_INSTANCE = 5
DEFAULT_SECURITY_GROUP = "sg-sbx00001"
RELEASED_STATES = frozenset({"LAUNCH_FAILED", "SHUTDOWN"})  # no longer holding key pairs or security groups

# What each fault kind answers on the CVM wire: (code, message template).
FAULT_ERRORS: dict[FaultKind, tuple[str, str]] = {
    FaultKind.CAPACITY: (
        "ResourceInsufficient.SpecifiedInstanceType",
        "The specified instance type {instance_type} is out of stock in {zone}.",
    ),
    FaultKind.QUOTA: (
        "LimitExceeded.InstanceQuota",
        "The number of pay-as-you-go instances would exceed the quota of the account in {zone}.",
    ),
    FaultKind.THROTTLE: ("RequestLimitExceeded", "Your current request frequency is too high, please retry later."),
    FaultKind.CREDENTIALS: (
        "AuthFailure.UnauthorizedOperation",
        "The request has not been authorized by CAM for this operation.",
    ),
}


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as the sandbox holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    charge_type: str
    client_token: str
    tags: dict[str, str]

    @property
    def holds_resources(self) -> bool:
        """False once the instance holds no capacity and bills nothing: launch failed, or terminated."""
        return self.state not in ("LAUNCH_FAILED", "SHUTDOWN")


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    action: str
    region: str
    secret_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(slots=True)
class _Instance:
    instance_id: str
    uuid: str
    sequence: int
    region: str
    zone: str
    seed: SeedPrice
    charge_type: str
    image: dict[str, Any]
    name: str
    tags: dict[str, str]
    client_token: str
    created_at: datetime
    private_ip: str
    run_request_id: str
    ready_at: float
    failure: tuple[str, str] | None = None
    terminate_at: float | None = None
    terminate_request_id: str = ""
    user_data: str | None = None  # base64, as RunInstances received it
    system_disk: dict[str, Any] = field(default_factory=dict)
    key_ids: list[str] = field(default_factory=list)
    security_group_ids: list[str] = field(default_factory=list)
    booted: bool = False
    # The last stop, start or reboot (power.py): when it began, its request, and a stop's StoppedMode.
    power_action: str = ""
    power_at: float | None = None
    power_request_id: str = ""
    stopped_mode: str = ""


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """What a launch carried, as the sandbox keeps it in CVM's wire format (for tests reading it back)."""

    instance_id: str
    region: str
    image_id: str
    system_disk: dict[str, Any]
    user_data: str | None
    key_pairs: list[dict[str, Any]]
    security_groups: list[dict[str, Any]]


@dataclass(slots=True)
class _Request:
    action: str
    region: str
    secret_id: str
    params: dict[str, Any]
    request_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class _Carried:
    user_data: str | None
    system_disk: dict[str, Any]
    key_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]


@dataclass(slots=True)
class _Timing:
    launch_seconds: float
    terminate_seconds: float
    retention_seconds: float
    power_seconds: float = 0.2


def _request_id() -> str:
    return str(uuid.uuid4())


def _answer(payload: dict[str, Any], request_id: str) -> Response:
    body = json.dumps({"Response": {**payload, "RequestId": request_id}}, ensure_ascii=False)
    return Response(body, status=200, mimetype="application/json")


def _error(code: str, message: str, request_id: str) -> Response:
    # Tencent answers errors with HTTP 200; the SDK finds them by the Error key.
    return _answer({"Error": {"Code": code, "Message": message}}, request_id)


def _int(params: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError("InvalidParameterValue", f"{key} must be an integer")
    if not low <= value <= high:
        raise ApiError("InvalidParameterValue.Range", f"{key} must be between {low} and {high}")
    return value


def _string_list(params: dict[str, Any], key: str, limit: int) -> list[str]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ApiError("InvalidParameter", f"{key} must be a list of strings")
    if len(value) > limit:
        raise ApiError("InvalidParameterValue.LimitExceeded", f"{key} takes at most {limit} values")
    return value


def _filters(
    params: dict[str, Any], allowed: Sequence[str], *, max_filters: int, max_values: int, tags: bool = False
) -> list[tuple[str, set[str]]]:
    """``Filters`` as (name, values); AND across filters, OR within one, as the CVM API applies them."""
    raw = params.get("Filters") or []
    if not isinstance(raw, list):
        raise ApiError("InvalidParameter", "Filters must be a list")
    if len(raw) > max_filters:
        raise ApiError("InvalidParameterValue.LimitExceeded", f"at most {max_filters} Filters per request")
    result: list[tuple[str, set[str]]] = []
    for item in raw:
        name = str((item or {}).get("Name") or "")
        values = (item or {}).get("Values") or []
        if name not in allowed and not (tags and name.startswith("tag:") and len(name) > 4):
            raise ApiError("InvalidFilter", f"The filter {name!r} is not supported.")
        if not isinstance(values, list) or not values:
            raise ApiError("InvalidParameter", f"Filter {name!r} needs Values")
        if len(values) > max_values:
            raise ApiError("InvalidFilterValue.LimitExceeded", f"Filter {name!r} takes at most {max_values} values")
        result.append((name, {str(v) for v in values}))
    return result


def _matches(fields: Mapping[str, Iterable[str]], filters: list[tuple[str, set[str]]]) -> bool:
    return all(any(value in wanted for value in fields.get(name, ())) for name, wanted in filters)
