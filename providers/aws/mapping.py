"""EC2 instances -> broker DTOs: the state an instance reports (and the launch failures it stands for), the
order tag and client token the broker gives a launch, and the handle read back from a reservation.

Pure functions over plain dicts and strings: nothing here (nor in ``errors``, ``catalog`` and ``launching``
beside it) imports boto3 or botocore, so the tables can be tested without a network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from providers.aws.errors import PROVIDER, malformed
from providers.errors import (
    ProviderRequestRejected,
)
from providers.types import InstanceHandle, InstanceState

ORDER_TAG = "broker:order"
CLIENT_TOKEN_MAX_LENGTH = 64


def validate_client_token(token: str) -> None:
    """EC2 accepts at most 64 printable ASCII characters; anything else would be rejected after a round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; EC2 allows at most {CLIENT_TOKEN_MAX_LENGTH}", provider=PROVIDER
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    # Stopped with its EBS volumes kept: ``start`` brings it back (issue 36). Not terminated, and not in service.
    "stopped": InstanceState.STOPPED,
    "shutting-down": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}

# StateReason codes of an instance that died during launch rather than being terminated on request.
LAUNCH_FAILURE_REASONS = frozenset(
    {
        "Server.InternalError",
        "Server.InsufficientInstanceCapacity",
        "Client.InternalError",
        "Client.VolumeLimitExceeded",
        "Client.InvalidSnapshot.NotFound",
    }
)


def instance_state(state_name: str, state_reason_code: str = "") -> InstanceState:
    state = STATES.get(state_name, InstanceState.UNKNOWN)
    if state is InstanceState.TERMINATED and state_reason_code in LAUNCH_FAILURE_REASONS:
        return InstanceState.FAILED
    return state


def tags_dict(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in tags or ()}


def tag_specifications(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """Tags for the instance and its volumes; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(merged.items())]
    return [{"ResourceType": kind, "Tags": tag_list} for kind in ("instance", "volume")]


def instance_handle(item: Mapping[str, Any], region: str, reservation_id: str = "") -> InstanceHandle:
    """An ``Instances[]`` entry of ``run_instances``/``describe_instances`` -> ``InstanceHandle``."""
    try:
        state = item["State"]
        state_name = str(state["Name"])
        reason = item.get("StateReason") or {}
        launch_time = item.get("LaunchTime")
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=region,
            zone=str(item["Placement"]["AvailabilityZone"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(state_name, str(reason.get("Code", ""))),
            public_ip=item.get("PublicIpAddress") or None,
            private_ip=item.get("PrivateIpAddress") or None,
            launched_at=launch_time.isoformat() if isinstance(launch_time, datetime) else None,
            tags=tags_dict(item.get("Tags")),
            extra={
                "state_name": state_name,
                "state_reason": str(reason.get("Code", "")),
                "lifecycle": str(item.get("InstanceLifecycle") or "on-demand"),
                "client_token": str(item.get("ClientToken", "")),
                "image_id": str(item.get("ImageId", "")),
                "reservation_id": reservation_id,
            },
        )
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles_from_reservations(reservations: Iterable[Mapping[str, Any]], region: str) -> list[InstanceHandle]:
    handles: list[InstanceHandle] = []
    try:
        for reservation in reservations:
            reservation_id = str(reservation.get("ReservationId", ""))
            handles.extend(instance_handle(i, region, reservation_id) for i in reservation["Instances"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable reservation ({exc!r})") from None
    return handles
