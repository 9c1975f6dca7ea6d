"""The Azure sandbox's virtual machines: create (with ARM's checks and long-running operation), get, list, delete,
and the first boot that starts a VM's lease agent."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from werkzeug.wrappers import Request, Response

from sandboxes.azure import launch as azure_launch
from sandboxes.azure.images import ImageCatalogue
from sandboxes.azure.network import NETWORK, NetworkSecurityGroups
from sandboxes.azure.seed import COMPUTE, ZONAL_REGIONS, SeedPrice, _family, _gpu_key
from sandboxes.azure.state import Call, _Vm
from sandboxes.azure.wire import Operation, Operations, arm_error, now_iso
from sandboxes.boot import Booter, simulated_gpus
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import json_response

DEFAULT_CREATE_SECONDS = 0.2
DEFAULT_POWER_SECONDS = 0.2
POWER_ACTIONS = {
    "VirtualMachines_Deallocate": "deallocate",
    "VirtualMachines_PowerOff": "powerOff",
    "VirtualMachines_Start": "start",
    "VirtualMachines_Restart": "restart",
}
VM_PAGE_SIZE = 50
_VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}[A-Za-z0-9_]$|^[A-Za-z0-9]$")
SYNC_CAPACITY_CODES = frozenset({"SkuNotAvailable"})


class VmHandlers:
    """The ``Microsoft.Compute/virtualMachines`` handlers, mixed into ``AzureSandbox``."""

    faults: FaultRegistry
    booter: Booter
    regions: list[str]
    _seed_by_key: dict[tuple[str, str], SeedPrice]
    _skus: list[dict[str, Any]]
    _lock: threading.Lock
    _vms: dict[tuple[str, str, str], _Vm]
    _operations: Operations
    network: NetworkSecurityGroups
    images: ImageCatalogue
    create_seconds: float
    delete_seconds: float
    power_seconds: float
    vm_page_size: int
    _link: Callable[[Request, dict[str, str]], str]
    _quota_refusal: Callable[[str, str, bool], Response | None]
    spot_price: Callable[[str, str], Decimal | None]

    def _boot_due(self) -> None:
        """Start the lease agent of each VM that has come to run, once, from the custom data it was created with
        (cloud-init's first boot on a real VM); the booter is called outside the sandbox's lock."""
        now = time.monotonic()
        due: list[_Vm] = []
        with self._lock:
            for vm in self._vms.values():
                if not vm.booted and vm.delete_op is None and vm.provisioning_state(now) == "Succeeded":
                    vm.booted = True
                    due.append(vm)
        for vm in due:
            os_profile = (vm.body.get("properties") or {}).get("osProfile") or {}
            seed = self._seed_by_key.get((vm.location, vm.size))
            gpus = simulated_gpus(_gpu_key(vm.size, seed), seed.gpu_count, seed.gpu_memory_gb) if seed else []
            self.booter.boot(
                instance_id=vm.name,
                user_data=azure_launch.custom_data(os_profile) or None,
                gpus=gpus,
                instance_type=vm.size,
                zone=f"{vm.location}-{vm.zones[0]}" if vm.zones else vm.location,
            )

    def _nsg_users(self, nsg_id: str) -> list[str]:
        """The NICs that use a network security group: each live VM's inline NICs that name it (a NIC made with
        ``deleteOption: Delete`` goes when its VM's delete finishes)."""
        users: list[str] = []
        with self._lock:
            self._sweep(time.monotonic())
            for vm in self._vms.values():
                properties = vm.body.get("properties") or {}
                configurations = (properties.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []
                for configuration in configurations:
                    named = ((configuration.get("properties") or {}).get("networkSecurityGroup") or {}).get("id")
                    if str(named or "").lower() == nsg_id.lower():
                        users.append(
                            f"/subscriptions/{vm.subscription}/resourceGroups/{vm.resource_group}/providers/{NETWORK}"
                            f"/networkInterfaces/{configuration.get('name', vm.name)}"
                        )
        return users

    def _operation_url(self, request: Request, vm: _Vm, op: Operation) -> str:
        api_version = request.args.get("api-version", "")
        return self._operations.url(request.host_url, vm.subscription, COMPUTE, op, api_version)

    def _new_operation(self, location: str, seconds: float, error: tuple[str, str] | None = None) -> Operation:
        return self._operations.new(location, seconds, error)

    def _sweep(self, now: float) -> None:
        """Forget VMs whose delete finished. Caller holds the lock."""
        for key, vm in list(self._vms.items()):
            if vm.delete_op is not None and now >= vm.delete_op.done_at:
                del self._vms[key]

    def _vm_json(self, vm: _Vm, now: float, *, instance_view: bool) -> dict[str, Any]:
        properties = json.loads(json.dumps(vm.body.get("properties") or {}))
        # ARM keeps customData for the VM's provisioning agent and never returns it.
        (properties.get("osProfile") or {}).pop("customData", None)
        state = vm.provisioning_state(now)
        properties.update(vmId=vm.vm_id, provisioningState=state, timeCreated=vm.created)
        if instance_view:
            properties["instanceView"] = self._instance_view(vm, now)
        result: dict[str, Any] = {
            "name": vm.name,
            "id": vm.resource_id,
            "type": f"{COMPUTE}/virtualMachines",
            "location": vm.location,
            "tags": dict(vm.body.get("tags") or {}),
            "etag": f'"{vm.etag}"',
            "properties": properties,
        }
        if vm.zones:
            result["zones"] = list(vm.zones)
        return result

    @staticmethod
    def _instance_view(vm: _Vm, now: float) -> dict[str, Any]:
        """The VM's run-time status as ARM reports it in ``properties.instanceView``: a ``ProvisioningState/...``
        status (``ProvisioningState/failed/<code>`` with the error's message for a failed create) and, unless the
        create failed, a ``PowerState/...`` one."""
        state = vm.provisioning_state(now)
        statuses: list[dict[str, Any]] = []
        if state == "Failed" and vm.create_op.error:
            code, message = vm.create_op.error
            statuses.append(
                {
                    "code": f"ProvisioningState/failed/{code}",
                    "level": "Error",
                    "displayStatus": "Provisioning failed",
                    "message": message,
                    "time": vm.created,
                }
            )
        else:
            statuses.append(
                {
                    "code": f"ProvisioningState/{state.lower()}",
                    "level": "Info",
                    "displayStatus": {"Succeeded": "Provisioning succeeded"}.get(state, state),
                }
            )
            power = vm.power_state(now)
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        computer_name = ((vm.body.get("properties") or {}).get("osProfile") or {}).get("computerName", vm.name)
        return {"computerName": computer_name, "hyperVGeneration": "V2", "statuses": statuses}

    def _status_json(self, vm: _Vm, now: float) -> dict[str, Any]:
        """One item of List All with ``statusOnly=true``: the VM's identity and its run-time status (the instance
        view, where a GET with ``$expand=instanceView`` puts it), none of its model (size, zones, tags)."""
        return {
            "name": vm.name,
            "id": vm.resource_id,
            "type": f"{COMPUTE}/virtualMachines",
            "location": vm.location,
            "properties": {"instanceView": self._instance_view(vm, now)},
        }

    def _list_all_vms(self, request: Request, sub: str) -> Response:
        """Virtual Machines - List All: every VM of the subscription, in every resource group, ``vm_page_size`` a
        page with a ``nextLink`` (``$skiptoken``) back here. ``statusOnly=true`` lists each VM's run-time status
        instead of its model. ``$expand=instanceView`` needs a scale set ``$filter``, and the sandbox holds no scale
        sets, so either is refused."""
        if request.args.get("$filter") is not None:
            return arm_error(
                "InvalidParameter",
                "The sandbox holds no virtual machine scale sets to filter by.",
                400,
                target="$filter",
            )
        if request.args.get("$expand") is not None:
            return arm_error(
                "InvalidParameter",
                "The $expand option 'instanceView' can only be specified if a valid $filter option is specified.",
                400,
                target="$expand",
            )
        status_only = request.args.get("statusOnly", "").lower() == "true"
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vms = sorted(
                (vm for (s, _, _), vm in self._vms.items() if s == sub.lower()),
                key=lambda v: (v.resource_group.lower(), v.name.lower()),
            )
            page = vms[offset : offset + self.vm_page_size]
            values = [
                self._status_json(vm, now) if status_only else self._vm_json(vm, now, instance_view=False)
                for vm in page
            ]
        result: dict[str, Any] = {"value": values}
        if offset + self.vm_page_size < len(vms):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + self.vm_page_size)})
        return json_response(result)

    def _list_vms(self, request: Request, sub: str, rg: str) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vms = sorted(
                (vm for (s, g, _), vm in self._vms.items() if s == sub.lower() and g == rg.lower()),
                key=lambda v: v.name.lower(),
            )
            values = [self._vm_json(vm, now, instance_view=False) for vm in vms]
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        result: dict[str, Any] = {"value": values[offset : offset + self.vm_page_size]}
        if offset + self.vm_page_size < len(values):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + self.vm_page_size)})
        return json_response(result)

    def _get_vm(self, request: Request, key: tuple[str, str, str]) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vm = self._vms.get(key)
            if vm is None:
                return self._not_found(key)
            expand = request.args.get("$expand", "").lower() == "instanceview"
            return json_response(self._vm_json(vm, now, instance_view=expand))

    @staticmethod
    def _not_found(key: tuple[str, str, str]) -> Response:
        return arm_error(
            "ResourceNotFound",
            f"The Resource '{COMPUTE}/virtualMachines/{key[2]}' under resource group '{key[1]}' was not found.",
            404,
        )

    def _delete_vm(self, request: Request, key: tuple[str, str, str]) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vm = self._vms.get(key)
            if vm is None:
                return Response(status=204)  # Azure answers a delete of a missing resource with 204
            if vm.delete_op is None:
                vm.delete_op = self._new_operation(vm.location, self.delete_seconds)
            url = self._operation_url(request, vm, vm.delete_op)
        self.booter.halt(vm.name)  # the VM stops as its delete begins
        response = Response(status=202)
        response.headers["Azure-AsyncOperation"] = url
        response.headers["Location"] = url + "&monitor=true"
        return response

    def _power_vm(self, request: Request, action: str, key: tuple[str, str, str], call: Call) -> Response:
        """Deallocate, Power Off, Start or Restart: 202 and an operation that ends with the VM in its new power
        state. As ARM: a VM being created or deleted, or a restart of a VM that is not running, is refused with 409
        ``OperationNotAllowed`` ("The operation requires the VM to be running (or set to run)"); a deallocate of a
        deallocated VM or a start of a running one succeeds and changes nothing. A start the region has no
        capacity for (a ``capacity`` fault) fails its operation with ``AllocationFailed`` (``ZonalAllocationFailed``
        for a zonal VM) and leaves the VM deallocated with its disk. The lease agent stops with the VM and starts
        again, re-attaching to its lease, when the VM runs again."""
        verb = POWER_ACTIONS[action]
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vm = self._vms.get(key)
            if vm is None:
                return self._not_found(key)
            provisioning = vm.provisioning_state(now)
            power = vm.power_state(now)
            if provisioning != "Succeeded" or (verb == "restart" and power != "running"):
                why = (
                    "the VM is marked for deletion"
                    if provisioning == "Deleting"
                    else ("the VM is not provisioned" if provisioning != "Succeeded" else "the VM is not running")
                )
                return arm_error(
                    "OperationNotAllowed",
                    f"Operation '{verb}' is not allowed on VM '{vm.name}' since {why}. The operation requires the VM "
                    "to be running (or set to run).",
                    409,
                )
        failure: tuple[str, str] | None = None
        if verb == "start" and power not in ("running", "starting"):
            fault = self.faults.take(action, (vm.size,), call.zone, kinds=OUTCOME_KINDS)
            if fault is not None:
                refusal, failure = self._fault_outcome(fault, vm.location, vm.zones, vm.size)
                if refusal is not None:
                    return refusal
        with self._lock:
            vm.power_before = power
            vm.power_action = verb
            vm.power_op = self._new_operation(vm.location, self.power_seconds, failure)
            url = self._operation_url(request, vm, vm.power_op)
        if failure is None:
            if verb in ("deallocate", "powerOff", "restart"):
                self.booter.power_off(vm.name)
            if verb in ("start", "restart"):
                self.booter.power_on(vm.name)
        response = Response(status=202)
        response.headers["Azure-AsyncOperation"] = url
        response.headers["Location"] = url + "&monitor=true"
        return response

    def _put_vm(
        self, request: Request, args: dict[str, str], key: tuple[str, str, str], body: dict[str, Any], call: Call
    ) -> Response:
        name = args["vm"]
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            existing = self._vms.get(key)
            if existing is not None:
                if request.headers.get("If-None-Match", "").strip() == "*":
                    return arm_error(
                        "PreconditionFailed",
                        "The condition specified using HTTP conditional header(s) is not met.",
                        412,
                    )
                # A plain PUT on an existing VM would be an update; the sandbox keeps the VM as it is.
                return json_response(self._vm_json(existing, now, instance_view=False), status=200)
        invalid = self._validate(name, body)
        if invalid is None:
            vm_id = (
                f"/subscriptions/{args['sub']}/resourceGroups/{args['rg']}/providers/{COMPUTE}/virtualMachines/{name}"
            )
            location = str(body["location"]).lower()
            invalid = azure_launch.nsg_refusal(vm_id, body["properties"], location, self.network)
        if invalid is not None:
            return invalid
        fault = self.faults.take(call.action, call.instance_types, call.zone, kinds=OUTCOME_KINDS)
        location = str(body["location"]).lower()
        zones = [str(z) for z in body.get("zones") or ()]
        size = str(body["properties"]["hardwareProfile"]["vmSize"])
        failure: tuple[str, str] | None = None
        if fault is not None:
            refusal, failure = self._fault_outcome(fault, location, zones, size)
            if refusal is not None:
                return refusal
        with self._lock:
            if key in self._vms:  # a concurrent PUT of the same name won the race
                return arm_error(
                    "PreconditionFailed", "The condition specified using HTTP conditional header(s) is not met.", 412
                )
            refusal = self._quota_refusal(location, size, body["properties"].get("priority") == "Spot")
            if refusal is not None:
                return refusal
            op = self._new_operation(location, self.create_seconds, failure)
            vm = _Vm(
                subscription=args["sub"],
                resource_group=args["rg"],
                name=name,
                location=location,
                zones=zones,
                size=size,
                body=json.loads(json.dumps(body)),
                vm_id=str(uuid.uuid4()),
                created=now_iso(),
                create_op=op,
            )
            self._vms[key] = vm
            result = self._vm_json(vm, now, instance_view=False)
            url = self._operation_url(request, vm, op)
        response = json_response(result, status=201)
        response.headers["Azure-AsyncOperation"] = url
        return response

    def _fault_outcome(
        self, fault: Fault, location: str, zones: list[str], size: str
    ) -> tuple[Response | None, tuple[str, str] | None]:
        """(a synchronous refusal, or the error the create's operation will end with)."""
        if fault.kind is FaultKind.QUOTA:
            family = _family(size)
            vcpus = self._seed_by_key[(location, size)].vcpus if (location, size) in self._seed_by_key else 0
            message = (
                f"Operation could not be completed as it results in exceeding approved {family} Cores quota. "
                f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: 0, "
                f"Current Usage: 0, Additional Required: {vcpus}, (Minimum) New Limit Required: {vcpus}."
            )
            return arm_error(fault.code or "OperationNotAllowed", message, 409), None
        code = fault.code or ("ZonalAllocationFailed" if zones else "AllocationFailed")
        if code in SYNC_CAPACITY_CODES:
            return self._sku_not_available(location, zones, size), None
        message = (
            "Allocation failed. We do not have sufficient capacity for the requested VM size in this "
            f"{'zone' if zones else 'region'}. Read more about improving likelihood of allocation success at "
            "http://aka.ms/allocation-guidance"
        )
        return None, (code, message)

    @staticmethod
    def _sku_not_available(location: str, zones: list[str], size: str) -> Response:
        return arm_error(
            "SkuNotAvailable",
            f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' is "
            f"currently not available in location '{location}' zones '{','.join(zones)}'. Please try another size "
            "or deploy to a different location or zones. See https://aka.ms/azureskunotavailable for details.",
            409,
        )

    def _validate(self, name: str, body: dict[str, Any]) -> Response | None:
        """What ARM checks synchronously before accepting a create."""
        if not _VM_NAME.match(name):
            return arm_error("InvalidResourceName", f"The resource name '{name}' is invalid.", 400)
        location = str(body.get("location") or "").lower()
        if location not in self.regions:
            return arm_error(
                "LocationNotAvailableForResourceType",
                f"The provided location '{location}' is not available for resource type '{COMPUTE}/virtualMachines'.",
                400,
            )
        properties = body.get("properties") or {}
        size = str((properties.get("hardwareProfile") or {}).get("vmSize") or "")
        if not size:
            return arm_error("InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing (null).", 400)
        zones = [str(z) for z in body.get("zones") or ()]
        if zones and location not in ZONAL_REGIONS:
            return arm_error("InvalidParameter", f"Availability zones are not supported in location '{location}'.", 400)
        sku = next((s for s in self._skus if s["name"] == size and location in s["locations"]), None)
        if sku is None or any(r["type"] == "Location" for r in sku["restrictions"]):
            return self._sku_not_available(location, zones, size)
        closed = {z for r in sku["restrictions"] if r["type"] == "Zone" for z in r["restrictionInfo"]["zones"]}
        offered = set(sku["locationInfo"][0]["zones"])
        if any(z not in offered or z in closed for z in zones):
            return self._sku_not_available(location, zones, size)
        storage = properties.get("storageProfile") or {}
        if not storage.get("imageReference"):
            return arm_error(
                "InvalidParameter", "Required parameter 'storageProfile.imageReference' is missing (null).", 400
            )
        os_profile = properties.get("osProfile") or {}
        if not os_profile.get("computerName") or not os_profile.get("adminUsername"):
            return arm_error("InvalidParameter", "Required parameter 'osProfile' is missing (null).", 400)
        linux = os_profile.get("linuxConfiguration") or {}
        keys = (linux.get("ssh") or {}).get("publicKeys") or []
        if not os_profile.get("adminPassword") and not any(k.get("keyData") for k in keys):
            return arm_error(
                "InvalidParameter",
                "Authentication using either SSH or by user name and password must be enabled in Linux profile.",
                400,
            )
        refusal = (
            azure_launch.custom_data_refusal(os_profile)
            or azure_launch.key_refusal(os_profile)
            or azure_launch.disk_refusal(storage, location, self.images)
        )
        if refusal is not None:
            return refusal
        network = properties.get("networkProfile") or {}
        configurations = network.get("networkInterfaceConfigurations") or []
        if not network.get("networkInterfaces") and not configurations:
            return arm_error("InvalidParameter", "Required parameter 'networkProfile' is missing (null).", 400)
        if configurations:
            if not network.get("networkApiVersion"):
                return arm_error(
                    "InvalidParameter", "networkApiVersion is required with networkInterfaceConfigurations.", 400
                )
            for configuration in configurations:
                ip_configs = (configuration.get("properties") or {}).get("ipConfigurations") or []
                if not ip_configs or not all(
                    ((c.get("properties") or {}).get("subnet") or {}).get("id") for c in ip_configs
                ):
                    return arm_error("InvalidParameter", "Every ipConfiguration needs a subnet id.", 400)
        if str(properties.get("priority") or "Regular") == "Spot":
            return self._validate_spot(location, size, properties)
        return None

    def _validate_spot(self, location: str, size: str, properties: dict[str, Any]) -> Response | None:
        if properties.get("evictionPolicy") not in ("Deallocate", "Delete"):
            return arm_error("InvalidParameter", "evictionPolicy must be Deallocate or Delete for a Spot VM.", 400)
        current = self.spot_price(location, size)
        if current is None:
            return arm_error(
                "SkuNotAvailable",
                f"The requested VM size '{size}' is not available for Azure Spot in '{location}'.",
                409,
            )
        max_price = (properties.get("billingProfile") or {}).get("maxPrice", -1)
        try:
            max_price_value = Decimal(str(max_price))
        except ArithmeticError:
            return arm_error("InvalidParameter", f"maxPrice {max_price!r} is not a number.", 400)
        if max_price_value != -1 and max_price_value < current:
            return arm_error(
                "OperationNotAllowed",
                f"Unable to perform operation 'Create VM' since the provided max price '{max_price_value} USD' is "
                f"lower than the current spot price '{current} USD' for Azure Spot VM size '{size}'. For more "
                "information, see http://aka.ms/AzureSpot/errormessages.",
                409,
            )
        return None
