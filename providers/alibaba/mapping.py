"""Alibaba Cloud ECS instances -> broker DTOs: the state an instance reports, the order tag and client token
the broker gives a launch, and the handle read back from DescribeInstances.

Pure functions over plain dicts (the API's own PascalCase field names, as ``to_map()`` of the SDK's response
models gives them) and strings: nothing here (nor in ``errors``, ``catalog`` and ``launching`` beside it)
imports the SDK, so the tables can be tested without a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.alibaba.catalog import parse_time
from providers.alibaba.errors import PROVIDER, malformed
from providers.errors import (
    ProviderRequestRejected,
)
from providers.types import InstanceHandle, InstanceState

ORDER_TAG = "broker:order"
CLIENT_TOKEN_MAX_LENGTH = 64


def validate_client_token(token: str) -> None:
    """ECS accepts at most 64 ASCII characters; anything else would be rejected after a round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; ECS allows at most {CLIENT_TOKEN_MAX_LENGTH}",
            provider=PROVIDER,
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "Pending": InstanceState.PENDING,
    "Starting": InstanceState.PENDING,
    "Running": InstanceState.RUNNING,
    "Stopping": InstanceState.STOPPING,
    # Stopped with its disks kept: ``StartInstance`` brings it back (issue 36). Not released, and not in service.
    "Stopped": InstanceState.STOPPED,
}


def instance_state(status: str) -> InstanceState:
    return STATES.get(status, InstanceState.UNKNOWN)


def run_tags(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, str]]:
    """RunInstances ``Tag.N``; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    return [{"Key": k, "Value": v} for k, v in sorted(merged.items())]


def tags_dict(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(t["TagKey"]): str(t.get("TagValue", "")) for t in (tags or {}).get("Tag") or []}


def _first_ip(addresses: Mapping[str, Any] | None) -> str | None:
    values = (addresses or {}).get("IpAddress") or []
    return str(values[0]) if values else None


def instance_handle(item: Mapping[str, Any], region: str) -> InstanceHandle:
    """An ``Instances.Instance`` entry of ``DescribeInstances`` -> ``InstanceHandle``."""
    try:
        status = str(item["Status"])
        created = str(item.get("CreationTime") or "")
        vpc = item.get("VpcAttributes") or {}
        eip = (item.get("EipAddress") or {}).get("IpAddress") or None
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=str(item.get("RegionId") or region),
            zone=str(item["ZoneId"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(status),
            public_ip=_first_ip(item.get("PublicIpAddress")) or (str(eip) if eip else None),
            private_ip=_first_ip(vpc.get("PrivateIpAddress")) or _first_ip(item.get("InnerIpAddress")),
            launched_at=parse_time(created).isoformat() if created else None,
            tags=tags_dict(item.get("Tags")),
            extra={
                "status": status,
                "spot_strategy": str(item.get("SpotStrategy") or "NoSpot"),
                "charge_type": str(item.get("InstanceChargeType") or ""),
                "image_id": str(item.get("ImageId") or ""),
                "vswitch_id": str(vpc.get("VSwitchId") or ""),
                "stopped_mode": str(item.get("StoppedMode") or ""),
            },
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles_from_body(body: Mapping[str, Any], region: str) -> list[InstanceHandle]:
    """Every instance of one ``DescribeInstances`` page."""
    try:
        items = (body.get("Instances") or {}).get("Instance") or []
    except AttributeError as exc:
        raise malformed(f"unreadable DescribeInstances answer ({exc!r})") from None
    return [instance_handle(item, region) for item in items]
