"""Tencent CVM instances -> broker DTOs: the state an instance reports (and the error a failed launch
names), the order tag and client token the broker gives a launch, and the handle read back from
DescribeInstances.

Pure functions over plain dicts and strings: nothing here (nor in ``errors``, ``catalog`` and ``launching``
beside it) imports the Tencent SDK, so the tables can be tested without a network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from providers.errors import (
    CapacityUnavailable,
    ProviderError,
    ProviderRequestRejected,
)
from providers.tencent.errors import LAUNCH_FAILED_CODE, PROVIDER, error_class_for, is_known_code, malformed
from providers.types import InstanceHandle, InstanceState, PricingModel

ORDER_TAG = "broker:order"
CLIENT_TOKEN_MAX_LENGTH = 64
INSTANCE_NAME_MAX_LENGTH = 128

ON_DEMAND_CHARGE = "POSTPAID_BY_HOUR"
SPOT_CHARGE = "SPOTPAID"
CHARGE_TYPES: dict[str, PricingModel] = {ON_DEMAND_CHARGE: PricingModel.ON_DEMAND, SPOT_CHARGE: PricingModel.SPOT}
CHARGE_FOR_MODEL: dict[PricingModel, str] = {model: charge for charge, model in CHARGE_TYPES.items()}


def validate_client_token(token: str) -> None:
    """CVM accepts at most 64 ASCII characters (InvalidClientToken.TooLong otherwise); check before the round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; CVM allows at most {CLIENT_TOKEN_MAX_LENGTH}",
            code="InvalidClientToken.TooLong",
            provider=PROVIDER,
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "PENDING": InstanceState.PENDING,
    "LAUNCH_FAILED": InstanceState.FAILED,
    "RUNNING": InstanceState.RUNNING,
    # Stopped with its disks kept: ``StartInstances`` brings it back (issue 36). Not terminated, and not in service.
    "STOPPED": InstanceState.STOPPED,
    "STARTING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING,
    "REBOOTING": InstanceState.RUNNING,
    # SHUTDOWN is "stopped, waiting to be destroyed" (the recycle bin): the terminate has been carried out.
    "SHUTDOWN": InstanceState.TERMINATED,
    "TERMINATING": InstanceState.STOPPING,
    # A live migration keeps the guest running; that is its point.
    "ENTER_SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
    "SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
    "EXIT_SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
}

_CODE_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*")


def launch_failure(message: str) -> tuple[str, type[ProviderError]]:
    """The code and class of a LAUNCH_FAILED instance from its ``LatestOperationErrorMsg``.

    CVM reports an asynchronous failure only as free text; the first known error code in it decides. With none,
    the failure counts as capacity: the request was accepted and then could not be placed, so the broker should
    try elsewhere rather than retry the same placement or give up.
    """
    for token in _CODE_TOKEN.findall(message or ""):
        if is_known_code(token) and token != LAUNCH_FAILED_CODE:
            return token, error_class_for(token)
    return LAUNCH_FAILED_CODE, CapacityUnavailable


def instance_state(state_name: str) -> InstanceState:
    return STATES.get(state_name, InstanceState.UNKNOWN)


def tags_dict(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value") or "") for t in tags or ()}


def tag_specification(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """``TagSpecification`` for the instance; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    return [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in sorted(merged.items())]}]


def _first(values: Any) -> str | None:
    if isinstance(values, list) and values:
        return str(values[0]) or None
    return None


def instance_handle(item: Mapping[str, Any], region: str) -> InstanceHandle:
    """An ``InstanceSet`` entry of ``DescribeInstances`` -> ``InstanceHandle``.

    A LAUNCH_FAILED instance is ``FAILED`` with ``extra`` error_class / error_code / error_message.
    """
    try:
        state_name = str(item["InstanceState"])
        placement = item.get("Placement") or {}
        extra: dict[str, Any] = {
            "state_name": state_name,
            "charge_type": str(item.get("InstanceChargeType") or ""),
            "latest_operation": str(item.get("LatestOperation") or ""),
            "stop_charging_mode": str(item.get("StopChargingMode") or ""),
            "latest_operation_state": str(item.get("LatestOperationState") or ""),
            "latest_operation_request_id": str(item.get("LatestOperationRequestId") or ""),
            "image_id": str(item.get("ImageId") or ""),
            "uuid": str(item.get("Uuid") or ""),
            "instance_name": str(item.get("InstanceName") or ""),
        }
        if state_name == "LAUNCH_FAILED":
            message = str(item.get("LatestOperationErrorMsg") or "the instance failed to launch")
            code, cls = launch_failure(message)
            extra.update({"error_class": cls.error_class, "error_code": code, "error_message": message})
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=region,
            zone=str(placement["Zone"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(state_name),
            public_ip=_first(item.get("PublicIpAddresses")),
            private_ip=_first(item.get("PrivateIpAddresses")),
            launched_at=str(item.get("CreatedTime") or "") or None,
            tags=tags_dict(item.get("Tags")),
            extra=extra,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles(items: Iterable[Mapping[str, Any]], region: str) -> list[InstanceHandle]:
    try:
        return [instance_handle(item, region) for item in items]
    except TypeError as exc:
        raise malformed(f"unreadable InstanceSet ({exc!r})") from None
