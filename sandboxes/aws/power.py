"""The AWS sandbox's stop, start and reboot: moto changes the instance's state; this layer adds what EC2 does that
moto does not (refusing to stop a one-time spot instance, a start refused for capacity) and powers the sandbox's
booted machine off and on with it.

EC2 API reference: StopInstances (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html),
StartInstances (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StartInstances.html), RebootInstances
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RebootInstances.html).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandboxes.aws.launch import backend, indexed

ACTIONS = frozenset({"StopInstances", "StartInstances", "RebootInstances"})
Refusal = tuple[str, str, int]


def named(params: Mapping[str, str]) -> list[str]:
    return indexed(params, "InstanceId")


def _instance(region: str, instance_id: str) -> Any:
    for reservation in list(backend(region).reservations.values()):
        for instance in reservation.instances:
            if instance.id == instance_id:
                return instance
    return None


def placement(region: str, instance_ids: list[str]) -> tuple[tuple[str, ...], str | None]:
    """The instance types and the zone of the named instances, so a fault can match on them."""
    found = [i for i in (_instance(region, n) for n in instance_ids) if i is not None]
    zone = str(found[0].availability_zone) if found else None
    return tuple(str(i.instance_type) for i in found), zone


def refusal(action: str, region: str, params: Mapping[str, str]) -> Refusal | None:
    """EC2's refusals moto does not make: a one-time spot instance cannot be stopped ("You can only stop Spot
    Instances associated with persistent Spot Instance requests", UnsupportedOperation), and a terminated
    instance can be neither stopped, started nor rebooted (IncorrectInstanceState, Error codes for the Amazon
    EC2 API, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html)."""
    for instance_id in named(params):
        instance = _instance(region, instance_id)
        if instance is None:
            continue  # moto answers InvalidInstanceID.NotFound itself
        state = str(instance.state)
        if state in ("terminated", "shutting-down"):
            return (
                "IncorrectInstanceState",
                f"The instance '{instance_id}' is not in a state from which it can be {_verb(action)}.",
                400,
            )
        if action == "StopInstances" and (instance.lifecycle or "") == "spot":
            return (
                "UnsupportedOperation",
                f"You can't stop the Spot Instance '{instance_id}' because it is associated with a one-time Spot "
                "Instance request. You can only stop Spot Instances associated with persistent Spot Instance "
                "requests.",
                400,
            )
        if action == "RebootInstances" and state != "running":
            return (
                "IncorrectInstanceState",
                f"The instance '{instance_id}' is not in a state from which it can be rebooted.",
                400,
            )
    return None


def _verb(action: str) -> str:
    return {"StopInstances": "stopped", "StartInstances": "started"}.get(action, "rebooted")
