"""Azure virtual machines -> broker DTOs: the state a VM reports (provisioning and power states, and the
error it failed with), the handle read back from a listed VM, and the compute quota a launch counts against.

Pure functions over plain dicts (the SDK models' ``as_dict()`` wire shape) and strings: nothing here (nor in
``errors``, ``catalog`` and ``launching`` beside it) imports an Azure package, so the tables can be tested
without a network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.azure.catalog import zone_name
from providers.azure.errors import error_class_for, malformed
from providers.types import InstanceHandle, InstanceState, QuotaUse

ORDER_TAG = "broker:order"
TOKEN_TAG = "broker:client-token"  # noqa: S105 - a tag name, not a secret

# -------------------------------------------------------------------------------------------- instances

POWER_STATES: dict[str, InstanceState] = {
    "starting": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    # Stopped (still allocated, compute billed) or deallocated, with the disk kept: ``start`` brings the VM back
    # (issue 36). The broker's own stop deallocates.
    "stopped": InstanceState.STOPPED,
    "deallocating": InstanceState.STOPPING,
    "deallocated": InstanceState.STOPPED,
}


@dataclass(frozen=True, slots=True)
class ProvisioningError:
    code: str
    message: str
    error_class: str


def _statuses(vm: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    view = (vm.get("properties") or {}).get("instanceView") or {}
    return list(view.get("statuses") or ())


def power_state(vm: Mapping[str, Any]) -> str:
    for status in _statuses(vm):
        code = str(status.get("code", ""))
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1]
    return ""


def provisioning_error(vm: Mapping[str, Any]) -> ProvisioningError | None:
    """The error of a failed create, from the instance view's ``ProvisioningState/failed/<code>`` status."""
    for status in _statuses(vm):
        code = str(status.get("code", ""))
        if code.startswith("ProvisioningState/failed"):
            error_code = code.split("/", 2)[2] if code.count("/") >= 2 else "ProvisioningFailed"
            message = str(status.get("message") or status.get("displayStatus") or "provisioning failed")
            return ProvisioningError(error_code, message, error_class_for(error_code, message).error_class)
    return None


def _status_provisioning(vm: Mapping[str, Any]) -> str:
    """The provisioning state an instance view's ``ProvisioningState/<state>[/<code>]`` status names, spelt as the
    VM model's ``provisioningState`` (``Succeeded``); '' when it names none."""
    for status in _statuses(vm):
        code = str(status.get("code", ""))
        if code.startswith("ProvisioningState/"):
            return code.split("/")[1].capitalize()
    return ""


def _checked_instance_view(vm: Mapping[str, Any], name: str) -> None:
    """A status-only item's instance view, as the reference shapes it: ``properties.instanceView.statuses``, a list
    of objects with a string ``code``. Without it the item says nothing of the VM's state: malformed."""
    view = (vm.get("properties") or {}).get("instanceView")
    if not isinstance(view, Mapping):
        raise malformed(f"virtual machine {name!r}: a status-only item without properties.instanceView")
    statuses = view.get("statuses")
    if not isinstance(statuses, list) or not all(
        isinstance(status, Mapping) and isinstance(status.get("code"), str) for status in statuses
    ):
        raise malformed(f"virtual machine {name!r}: instanceView.statuses is not a list of statuses with a code")


_RESOURCE_GROUP = re.compile(r"/resourceGroups/([^/]+)/", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ListedVm:
    """Where one VM of a subscription-wide list lives: its resource group (from its resource id), name, location."""

    resource_group: str
    name: str
    location: str


def listed_vm(vm: Mapping[str, Any]) -> ListedVm:
    """The place of one item of "Virtual Machines - List All". Raises ``MalformedProviderResponse`` naming what the
    item lacks: a name, a resource id naming a resource group, a location."""
    name, resource_id, location = vm.get("name"), vm.get("id"), vm.get("location")
    if not isinstance(name, str) or not name:
        raise malformed(f"a listed virtual machine without a name (id {str(resource_id)[:200]!r})")
    match = _RESOURCE_GROUP.search(resource_id) if isinstance(resource_id, str) else None
    if match is None:
        raise malformed(f"virtual machine {name!r}: resource id {str(resource_id)[:200]!r} names no resource group")
    if not isinstance(location, str) or not location:
        raise malformed(f"virtual machine {name!r}: no location")
    return ListedVm(resource_group=match.group(1), name=name, location=location)


def instance_state(provisioning_state: str, power: str) -> InstanceState:
    provisioning = provisioning_state.lower()
    if provisioning in ("failed", "canceled"):
        return InstanceState.FAILED
    if provisioning == "deleting":
        return InstanceState.STOPPING
    if power in POWER_STATES:
        return POWER_STATES[power]
    if provisioning in ("creating", "updating", "migrating", ""):
        return InstanceState.PENDING
    return InstanceState.UNKNOWN


def instance_handle(vm: Mapping[str, Any], *, resource_group: str, status_only: bool = False) -> InstanceHandle:
    """A VM (``virtual_machines.get``/``list``, ideally with ``expand="instanceView"``) -> ``InstanceHandle``.

    ``instance_id`` is the VM name, unique within the account's resource group.

    ``status_only``: ``vm`` is an item of "Virtual Machines - List All" with ``statusOnly=true``, which holds the
    VM's run-time status where a GET with ``$expand=instanceView`` does (``properties.instanceView``) but not its
    model. Its instance view is then required (``MalformedProviderResponse`` without one), the provisioning state is
    the view's ``ProvisioningState/...`` status where the model's is absent, and the size, zone and tags are empty
    unless the item carries them: the handle reports the state, not what a describe adds.
    """
    try:
        name = str(vm["name"])
        region = str(vm["location"])
        properties = vm.get("properties") or {}
        hardware = properties.get("hardwareProfile")
        size = "" if status_only and hardware is None else str((hardware or {})["vmSize"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable virtual machine ({exc!r})") from None
    if status_only:
        _checked_instance_view(vm, name)
    zones = [str(z) for z in vm.get("zones") or ()]
    provisioning = str(properties.get("provisioningState", ""))
    if status_only and not provisioning:
        provisioning = _status_provisioning(vm)
    power = power_state(vm)
    state = instance_state(provisioning, power)
    tags = {str(k): str(v) for k, v in (vm.get("tags") or {}).items()}
    extra: dict[str, Any] = {
        "provisioning_state": provisioning,
        "power_state": power,
        "priority": str(properties.get("priority") or ("" if status_only else "Regular")),
        "eviction_policy": str(properties.get("evictionPolicy") or ""),
        "vm_id": str(properties.get("vmId", "")),
        "resource_id": str(vm.get("id", "")),
        "resource_group": resource_group,
        "client_token": tags.get(TOKEN_TAG, ""),
    }
    if state is InstanceState.FAILED:
        error = provisioning_error(vm)
        if error is None:
            error = ProvisioningError(provisioning or "Failed", f"VM provisioning {provisioning.lower()}", "final")
        extra.update(error_class=error.error_class, error_code=error.code, error_message=error.message)
    created = properties.get("timeCreated")
    return InstanceHandle(
        instance_id=name,
        region=region,
        zone=zone_name(region, zones[0]) if zones else "" if status_only and "zones" not in vm else region,
        instance_type=size,
        state=state,
        public_ip=None,  # IPs live on the NIC resource, which only azure-mgmt-network reads
        private_ip=None,
        launched_at=str(created) if created else None,
        tags=tags,
        extra=extra,
    )


def gone_handle(region: str, name: str, resource_group: str) -> InstanceHandle:
    """A VM Azure no longer has, after a delete: terminated, with no size or zone left to report."""
    return InstanceHandle(
        instance_id=name,
        region=region,
        zone="",
        instance_type="",
        state=InstanceState.TERMINATED,
        extra={"provisioning_state": "Deleted", "resource_group": resource_group},
    )


def quota_uses(usages: Iterable[Mapping[str, Any]]) -> dict[str, QuotaUse]:
    """The usage list of a region (``usage.list``, as the SDK's ``as_dict`` spells it) by quota name."""
    uses: dict[str, QuotaUse] = {}
    for item in usages:
        name = (item.get("name") or {}).get("value")
        current = item.get("current_value", item.get("currentValue"))
        try:
            uses[str(name)] = QuotaUse(str(name), float(item["limit"]), float(current or 0))
        except (KeyError, TypeError, ValueError):
            continue
    return uses


def quota_needs(family: str, vcpus: int, spot: bool) -> dict[str, float]:
    """The vCPU quotas a VM counts against: a Spot VM only the regional low-priority quota, any other VM its
    size family's quota and the regional total."""
    if not vcpus:
        return {}
    if spot:
        return {"lowPriorityCores": vcpus}
    needs: dict[str, float] = {"cores": vcpus}
    if family:
        needs[family] = vcpus
    return needs
