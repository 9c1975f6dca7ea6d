"""What the Azure sandbox holds between requests: its VMs (and the snapshot tests read) and the calls it logged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandboxes.azure.seed import COMPUTE
from sandboxes.azure.wire import Operation


@dataclass(frozen=True, slots=True)
class SandboxVm:
    """A VM as the sandbox holds it (for tests asserting what was, or was not, launched).

    ``state`` is ``creating``, ``running``, ``failed`` or ``deleting``; a deleted VM is no longer listed.
    """

    instance_id: str
    resource_group: str
    region: str
    zone: str
    instance_type: str
    state: str
    priority: str
    tags: dict[str, str]


@dataclass(frozen=True, slots=True)
class Call:
    """One request the sandbox received, before faults were applied."""

    action: str
    region: str = ""
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


# Each power action's power state while its operation runs, and once it is done ("States and billing status of
# Azure Virtual Machines", https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing). A restart
# keeps the VM on its host: it stays running.
POWER_TRANSITIONS: dict[str, tuple[str, str]] = {
    "deallocate": ("deallocating", "deallocated"),
    "powerOff": ("stopping", "stopped"),
    "start": ("starting", "running"),
    "restart": ("running", "running"),
}


@dataclass(slots=True)
class _Vm:
    subscription: str
    resource_group: str
    name: str
    location: str
    zones: list[str]
    size: str
    body: dict[str, Any]
    vm_id: str
    created: str
    create_op: Operation
    delete_op: Operation | None = None
    etag: int = 1
    booted: bool = False  # the sandbox has started its lease agent (once, when it first ran)
    # The last power action (deallocate, powerOff, start, restart), its operation and the power state before it.
    power_action: str = ""
    power_op: Operation | None = None
    power_before: str = "running"

    def power_state(self, now: float) -> str:
        """The ``PowerState/<state>`` of the instance view: the create's and delete's, else the last power
        action's, in progress (``deallocating``, ``stopping``, ``starting``) or done (``deallocated``, ``stopped``,
        ``running``); a power action that failed (a start without capacity) leaves the state it found."""
        state = self.provisioning_state(now)
        if state == "Creating":
            return "starting"
        if state == "Deleting":
            return "stopping"
        op = self.power_op
        if op is None:
            return "running"
        if now < op.done_at:
            return POWER_TRANSITIONS[self.power_action][0]
        if op.error:
            return self.power_before
        return POWER_TRANSITIONS[self.power_action][1]

    def provisioning_state(self, now: float) -> str:
        if self.delete_op is not None:
            return "Deleting"
        if now < self.create_op.done_at:
            return "Creating"
        return "Failed" if self.create_op.error else "Succeeded"

    @property
    def resource_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/{COMPUTE}"
            f"/virtualMachines/{self.name}"
        )
