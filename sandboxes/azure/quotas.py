"""The Azure sandbox's vCPU quotas: the limits per region (tests may set their own), the usage the VMs make, the
``Usage_List`` answer and a create's refusal when it would go over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from werkzeug.wrappers import Response

from sandboxes.azure.seed import SeedPrice, _family
from sandboxes.azure.state import _Vm
from sandboxes.azure.wire import arm_error
from sandboxes.server import json_response

# vCPU quota limits per region unless a test sets its own with ``set_quota`` (usage names as Azure spells them).
DEFAULT_CORE_QUOTAS = {"cores": 10000, "lowPriorityCores": 10000}
DEFAULT_FAMILY_CORES = 2000


class QuotaHandlers:
    """Core quotas and usages, mixed into ``AzureSandbox``."""

    seed: list[SeedPrice]
    regions: list[str]
    _seed_by_key: dict[tuple[str, str], SeedPrice]
    _lock: threading.Lock
    _vms: dict[tuple[str, str, str], _Vm]
    _quota_limits: dict[str, int]
    _sweep: Callable[[float], None]

    def set_quota(self, name: str, limit: int | None) -> None:
        """Set a vCPU quota's limit (``cores``, ``lowPriorityCores`` or a family such as
        ``standardNCADSH100v5Family``) in every region; None restores the default. The usages list reports it
        beside the live usage, and a create that would exceed it is refused with 409 OperationNotAllowed."""
        with self._lock:
            if limit is None:
                self._quota_limits.pop(name, None)
            else:
                self._quota_limits[name] = int(limit)

    def _quota_limit(self, name: str) -> int:
        return self._quota_limits.get(name, DEFAULT_CORE_QUOTAS.get(name, DEFAULT_FAMILY_CORES))

    def _core_needs(self, location: str, size: str, spot: bool) -> dict[str, int]:
        """The quotas a VM of ``size`` counts against, with its vCPUs: Spot VMs only against the regional
        low-priority quota, the others against their family's and the regional total."""
        seed = self._seed_by_key.get((location, size))
        vcpus = seed.vcpus if seed else 0
        return {"lowPriorityCores": vcpus} if spot else {_family(size): vcpus, "cores": vcpus}

    def _core_usage(self, location: str) -> dict[str, int]:
        """vCPUs in use per quota name in ``location``. Caller holds the lock."""
        usage: dict[str, int] = {}
        for vm in self._vms.values():
            if vm.location != location:
                continue
            spot = (vm.body.get("properties") or {}).get("priority") == "Spot"
            for name, vcpus in self._core_needs(vm.location, vm.size, spot).items():
                usage[name] = usage.get(name, 0) + vcpus
        return usage

    def _quota_refusal(self, location: str, size: str, spot: bool) -> Response | None:
        """Azure's 409 when the VM would take a vCPU quota past its limit. Caller holds the lock."""
        usage = self._core_usage(location)
        for name, vcpus in self._core_needs(location, size, spot).items():
            limit, used = self._quota_limit(name), usage.get(name, 0)
            if used + vcpus > limit:
                label = "LowPriorityCores" if name == "lowPriorityCores" else name
                message = (
                    f"Operation could not be completed as it results in exceeding approved {label} Cores quota. "
                    f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: "
                    f"{limit}, Current Usage: {used}, Additional Required: {vcpus}, (Minimum) New Limit Required: "
                    f"{used + vcpus}."
                )
                return arm_error("OperationNotAllowed", message, 409)
        return None

    def _usages(self, location: str) -> Response:
        if location.lower() not in self.regions:
            return arm_error(
                "NoRegisteredProviderFound", f"No registered resource provider found for location '{location}'.", 400
            )
        now = time.monotonic()
        location = location.lower()
        with self._lock:
            self._sweep(now)
            usage = self._core_usage(location)
            machines = sum(1 for vm in self._vms.values() if vm.location == location)
            families = sorted({_family(r.instance_type) for r in self.seed if r.region == location})
            names = [
                ("cores", "Total Regional vCPUs"),
                ("lowPriorityCores", "Total Regional Low-priority vCPUs"),
                *((family, family) for family in families),
            ]
            value = [
                {
                    "unit": "Count",
                    "currentValue": usage.get(name, 0),
                    "limit": self._quota_limit(name),
                    "name": {"value": name, "localizedValue": label},
                }
                for name, label in names
            ]
        value.append(
            {
                "unit": "Count",
                "currentValue": machines,
                "limit": 25000,
                "name": {"value": "virtualMachines", "localizedValue": "Virtual Machines"},
            }
        )
        return json_response({"value": value})
