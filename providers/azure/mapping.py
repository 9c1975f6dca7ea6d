"""Azure response dicts -> broker DTOs, and Azure error codes -> broker error classes.

Pure functions over plain dicts (the SDK models' ``as_dict()`` wire shape) and strings: nothing here imports
an Azure package, so the tables can be tested without a network.

Zone convention: an Azure zone is a number within a region ("1", "2", "3"); the broker names it
``<region>-<number>`` (``eastus-1``). A size that is not zonal in a region (or a region without zones, such as
``westus``) is offered once with the region name itself as its zone (``westus``), and launched without zones.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ImageUnavailable,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.launch import IngressRule, LaunchLimits, OrderResource, UserDataMeasure
from providers.types import InstanceHandle, InstanceState, LaunchSpec, PricingModel, QuotaUse

PROVIDER = "azure"
ORDER_TAG = "broker:order"
TOKEN_TAG = "broker:client-token"  # noqa: S105 - a tag name, not a secret
VM_NAME_MAX_LENGTH = 64
VM_NAME_PREFIX = "vm-"
NETWORK_API_VERSION = "2024-05-01"  # Microsoft.Network version the inline NIC is created with
DEFAULT_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"  # a bare launch (no boot): the account's plain image
# A launch with a boot runs Microsoft's Ubuntu-HPC image, which "come[s] preconfigured with the NVIDIA GPU drivers
# and GPU compute software stack (CUDA, NCCL)" for the NC and ND sizes ("Configure and optimize VMs",
# https://learn.microsoft.com/azure/virtual-machines/configure); the URN is the one github.com/Azure/azhpc-images
# lists. "latest" lets Azure pick the newest version at create time, so no dated version is named here.
DEFAULT_GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
DEFAULT_ADMIN_USERNAME = "azureuser"
DEFAULT_OS_DISK_TYPE = "StandardSSD_LRS"  # every GPU size takes it; Premium_LRS needs an "s" size
SPOT_ANY_PRICE = -1  # Azure's "pay up to the on-demand price, never evict for price"

# --------------------------------------------------------------------------------------------- errors

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, size or provider. The four allocation codes arrive on a FAILED
    # asynchronous operation (HTTP 200 on the operation); SkuNotAvailable is a synchronous 409.
    "AllocationFailed": CapacityUnavailable,
    "ZonalAllocationFailed": CapacityUnavailable,
    "OverconstrainedAllocationRequest": CapacityUnavailable,
    "OverconstrainedZonalAllocationRequest": CapacityUnavailable,
    "SkuNotAvailable": CapacityUnavailable,
    "AllocationFailedVMSeriesNotAvailable": CapacityUnavailable,
    # the image is not in this region: another region or provider may have it
    "ImageNotFound": ImageUnavailable,
    "GalleryImageNotFound": ImageUnavailable,
    # quota: skip the region or account
    "QuotaExceeded": QuotaExceeded,
    # transient: retry with backoff
    "TooManyRequests": TransientProviderError,
    "RetryableError": TransientProviderError,
    "InternalServerError": TransientProviderError,
    "InternalExecutionError": TransientProviderError,
    "InternalOperationError": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "GatewayTimeout": TransientProviderError,
    "OperationPreempted": TransientProviderError,
    # credentials: block the account
    "AuthenticationFailed": CredentialsRejected,
    "InvalidAuthenticationToken": CredentialsRejected,
    "InvalidAuthenticationTokenTenant": CredentialsRejected,
    "InvalidAuthenticationTokenAudience": CredentialsRejected,
    "ExpiredAuthenticationToken": CredentialsRejected,
    "AuthorizationFailed": CredentialsRejected,
    "LinkedAuthorizationFailed": CredentialsRejected,
    "ClientAuthenticationError": CredentialsRejected,
    "SubscriptionNotFound": CredentialsRejected,
    "InvalidSubscriptionId": CredentialsRejected,
    "ReadOnlyDisabledSubscription": CredentialsRejected,
}

# Azure answers both a cores-quota refusal and a spot max price below the market with 409 OperationNotAllowed
# (and uses the same code for unrelated refusals), so this one code is split by its message.
OPERATION_NOT_ALLOWED = "OperationNotAllowed"
_QUOTA_MESSAGE = re.compile(r"quota", re.IGNORECASE)
_SPOT_PRICE_MESSAGE = re.compile(r"max(imum)? price|spot price", re.IGNORECASE)

# Exceptions raised below the HTTP layer (azure-core class names): the request may not have reached Azure.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        "IncompleteReadError",
        "ConnectionError",
        "SSLError",
    }
)


def error_class_for(code: str, message: str = "", http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an Azure error code. Unknown codes are final unless the status says otherwise.

    A 429 is throttling whatever its code: Compute throttles with ``OperationNotAllowed`` ("too many requests",
    details ``TooManyRequests``), which must not be read as a final refusal by its message."""
    if http_status == 429:
        return TransientProviderError
    if code == OPERATION_NOT_ALLOWED:
        if _QUOTA_MESSAGE.search(message):
            return QuotaExceeded
        if _SPOT_PRICE_MESSAGE.search(message):
            return CapacityUnavailable
        return ProviderRequestRejected
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if http_status == 429 or (http_status is not None and http_status >= 500):
        return TransientProviderError
    if http_status in (401, 403):
        return CredentialsRejected
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an Azure ``error.code``; the code and message are kept on the exception."""
    cls = error_class_for(code, message, http_status)
    return cls(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the SDK exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


def rejected(message: str, code: str = "") -> ProviderRequestRejected:
    return ProviderRequestRejected(message, code=code, provider=PROVIDER)


# ------------------------------------------------------------------------------------------------ GPUs


@dataclass(frozen=True, slots=True)
class SizeGpu:
    """What the size name says about its GPUs (Azure's SKU API gives a count, never a model)."""

    key: str
    fixed_count: int | None = None  # full-node sizes: the count the size always has
    interconnect: str = "pcie"


# Azure names the accelerator in the size; the form factor and memory follow from the series, not from any API.
SIZE_GPUS: list[tuple[re.Pattern[str], SizeGpu]] = [
    (re.compile(r"^Standard_NC\d+as_T4_v3$"), SizeGpu(gpu_names.T4)),
    (re.compile(r"^Standard_NC\d+ads_A10_v4$"), SizeGpu(gpu_names.A10)),
    (re.compile(r"^Standard_NC\d+r?s_v3$"), SizeGpu(gpu_names.V100_16_PCIE)),
    (re.compile(r"^Standard_ND40rs_v2$"), SizeGpu(gpu_names.V100_32_SXM2, 8, "nvlink")),
    (re.compile(r"^Standard_NC\d+ads_A100_v4$"), SizeGpu(gpu_names.A100_80_PCIE)),
    (re.compile(r"^Standard_ND96asr_v4$"), SizeGpu(gpu_names.A100_40_SXM, 8, "nvlink")),
    (re.compile(r"^Standard_ND96amsr_A100_v4$"), SizeGpu(gpu_names.A100_80_SXM, 8, "nvlink")),
    (re.compile(r"^Standard_NCC?\d+adi?s_H100_v5$"), SizeGpu(gpu_names.H100_NVL)),
    # Some catalogues list 12 GPUs for this size; Azure's documentation says 8 (one HGX board).
    (re.compile(r"^Standard_ND96isr_H100_v5$"), SizeGpu(gpu_names.H100_SXM, 8, "nvlink")),
]

# NC A10 v4 sizes below 32 vCPUs get a slice of one A10, not a whole card.
GPU_PARTITIONS: dict[str, Fraction] = {
    "Standard_NC8ads_A10_v4": Fraction(1, 3),
    "Standard_NC16ads_A10_v4": Fraction(1, 2),
}
# Two H100 NVL cards joined by an NVLink bridge.
NVLINK_BRIDGED = frozenset({"Standard_NC80adis_H100_v5"})

NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.A10: 24,
    gpu_names.V100_16_PCIE: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_80_PCIE: 80,
    gpu_names.A100_40_SXM: 40,
    gpu_names.A100_80_SXM: 80,
    gpu_names.H100_NVL: 94,
    gpu_names.H100_SXM: 80,
}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    count: int
    memory_gb: int
    interconnect: str
    reported_count: int | None


def size_gpu(size: str) -> SizeGpu | None:
    for pattern, gpu in SIZE_GPUS:
        if pattern.match(size):
            return gpu
    return None


def gpu_spec(size: str, reported_count: int | None) -> GpuSpec | None:
    """The GPUs of a size from its name and the SKU's ``GPUs`` capability; None for a size without GPUs.

    An unknown GPU size keeps its size name as the model so ingestion can quarantine it.
    """
    known = size_gpu(size)
    if known is None:
        if not reported_count:
            return None
        return GpuSpec(size, reported_count, 0, "pcie" if reported_count == 1 else "", reported_count)
    count = known.fixed_count or reported_count or 1
    partition = GPU_PARTITIONS.get(size)
    if partition is not None:
        memory_gb = int(NOMINAL_MEMORY_GB[known.key] * partition)
        return GpuSpec(f"{known.key} ({partition} partition)", 1, memory_gb, "pcie", reported_count)
    interconnect = "nvlink" if size in NVLINK_BRIDGED else known.interconnect
    return GpuSpec(known.key, count, NOMINAL_MEMORY_GB[known.key], interconnect, reported_count)


# ------------------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class SkuSpec:
    """One GPU VM size as ``resource_skus.list`` describes it in one region."""

    name: str
    gpu: GpuSpec
    vcpus: int
    memory_gib: Decimal
    zones: list[str]  # broker zone names still open to this subscription, or [region] for a regional size
    spot_capable: bool
    extra: dict[str, Any] = field(default_factory=dict)


def zone_name(region: str, zone: str) -> str:
    return f"{region}-{zone}"


def azure_zones(region: str, zone: str) -> list[str]:
    """A broker zone name -> the ``zones`` of a VM body ([] for a regional placement)."""
    if zone in ("", region):
        return []
    prefix = f"{region}-"
    number = zone[len(prefix) :] if zone.startswith(prefix) else ""
    if not number.isdigit():
        raise rejected(f"zone {zone!r} is not {region!r} or '{region}-<number>'", code="InvalidZone")
    return [number]


def _capabilities(item: Mapping[str, Any]) -> dict[str, str]:
    return {str(c.get("name", "")): str(c.get("value", "")) for c in item.get("capabilities") or ()}


def _restricted(item: Mapping[str, Any], region: str) -> tuple[bool, set[str], list[str]]:
    """(whole location restricted, restricted zone numbers, reason codes) for ``region``."""
    whole = False
    zones: set[str] = set()
    reasons: list[str] = []
    for restriction in item.get("restrictions") or ():
        info = restriction.get("restrictionInfo") or {}
        locations = {str(v).lower() for v in (info.get("locations") or restriction.get("values") or ())}
        if locations and region.lower() not in locations:
            continue
        reasons.append(str(restriction.get("reasonCode", "")))
        if str(restriction.get("type", "")) == "Zone":
            zones.update(str(z) for z in info.get("zones") or ())
        else:  # "Location": the size cannot be deployed in this region by this subscription
            whole = True
    return whole, zones, reasons


def sku_spec(item: Mapping[str, Any], region: str) -> SkuSpec | None:
    """A ``virtualMachines`` SKU with GPUs that this subscription may deploy in ``region``, else None.

    Restrictions (``NotAvailableForSubscription``, ``QuotaId``) remove the whole size or single zones.
    Raises ``MalformedProviderResponse`` for an entry whose numbers cannot be read.
    """
    if str(item.get("resourceType", "")) != "virtualMachines":
        return None
    name = str(item.get("name", ""))
    locations = {str(v).lower() for v in item.get("locations") or ()}
    if locations and region.lower() not in locations:
        return None
    capabilities = _capabilities(item)
    try:
        reported = int(capabilities["GPUs"]) if capabilities.get("GPUs") else None
        gpu = gpu_spec(name, reported)
        if gpu is None:
            return None
        vcpus = int(capabilities["vCPUs"])
        memory_gib = Decimal(capabilities["MemoryGB"])
    except (KeyError, ValueError, InvalidOperation) as exc:
        raise malformed(f"{name}: unreadable SKU capabilities ({exc!r})") from None
    whole, closed, reasons = _restricted(item, region)
    if whole:
        return None
    offered: list[str] = []
    for info in item.get("locationInfo") or ():
        if str(info.get("location", "")).lower() == region.lower():
            offered.extend(str(z) for z in info.get("zones") or ())
    if offered:
        open_zones = sorted(set(offered) - closed)
        if not open_zones:
            return None
        zones = [zone_name(region, z) for z in open_zones]
    else:
        zones = [region]
    extra: dict[str, Any] = {
        "family": str(item.get("family", "")),
        "rdma": capabilities.get("RdmaEnabled", "").lower() == "true",
        "hyperv_generations": capabilities.get("HyperVGenerations", ""),
    }
    if gpu.reported_count is not None and gpu.reported_count != gpu.count:
        extra["gpu_count_reported"] = gpu.reported_count
    if closed:
        extra["restricted_zones"] = sorted(closed)
        extra["restriction_reasons"] = sorted(set(reasons))
    return SkuSpec(
        name=name,
        gpu=gpu,
        vcpus=vcpus,
        memory_gib=memory_gib,
        zones=zones,
        spot_capable=capabilities.get("LowPriorityCapable", "").lower() == "true",
        extra=extra,
    )


# ---------------------------------------------------------------------------------------------- prices


@dataclass(frozen=True, slots=True)
class SkuPrices:
    """Linux pay-as-you-go prices of one size in one region, per hour."""

    on_demand: Decimal | None
    spot: Decimal | None
    currency: str
    on_demand_meter: str = ""
    spot_meter: str = ""


def prices_filter(region: str, size: str) -> str:
    """The Retail Prices API ``$filter`` for one size's pay-as-you-go rows in one region."""
    for value in (region, size):
        if "'" in value:
            raise rejected(f"{value!r} cannot be quoted in a price filter")
    return (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
        f"and armSkuName eq '{size}' and priceType eq 'Consumption'"
    )


def _price_rank(item: Mapping[str, Any]) -> tuple[bool, str]:
    # Newest effective price first; a primary meter region row beats its duplicates elsewhere.
    return (bool(item.get("isPrimaryMeterRegion", True)), str(item.get("effectiveStartDate", "")))


def sku_prices(items: Iterable[Mapping[str, Any]], region: str, size: str, currency: str = "USD") -> SkuPrices:
    """Pick the Linux on-demand and spot hourly prices of ``size`` from Retail Prices ``Items``.

    Windows rows (``productName`` ends in "Windows"), Low Priority, DevTest and reservation rows are skipped.
    """
    best: dict[PricingModel, tuple[tuple[bool, str], Decimal, str]] = {}
    try:
        for item in items:
            if str(item.get("armSkuName", "")).lower() != size.lower():
                continue
            if str(item.get("armRegionName", "")).lower() != region.lower():
                continue
            if str(item.get("type", "")) != "Consumption" or str(item.get("unitOfMeasure", "")) != "1 Hour":
                continue
            if str(item.get("currencyCode", "")) != currency or "windows" in str(item.get("productName", "")).lower():
                continue
            sku_name = str(item.get("skuName", ""))
            if sku_name.endswith(" Low Priority"):
                continue
            model = PricingModel.SPOT if sku_name.endswith(" Spot") else PricingModel.ON_DEMAND
            price = Decimal(str(item["retailPrice"]))
            rank = _price_rank(item)
            if model not in best or rank > best[model][0]:
                best[model] = (rank, price, str(item.get("meterId", "")))
    except (KeyError, TypeError, InvalidOperation) as exc:
        raise malformed(f"unreadable Retail Prices item ({exc!r})") from None
    on_demand = best.get(PricingModel.ON_DEMAND)
    spot = best.get(PricingModel.SPOT)
    return SkuPrices(
        on_demand=on_demand[1] if on_demand else None,
        spot=spot[1] if spot else None,
        currency=currency,
        on_demand_meter=on_demand[2] if on_demand else "",
        spot_meter=spot[2] if spot else "",
    )


# ----------------------------------------------------------------------------------------------- launch

_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}[a-z0-9]$")


def validate_client_token(token: str) -> None:
    if not token:
        raise rejected("client_token is required for an idempotent launch")
    if not all(" " < ch <= "~" for ch in token):
        raise rejected("client_token must be printable ASCII without spaces")


def vm_name(client_token: str) -> str:
    """The VM name for a client token: the same token always names the same VM (Azure's idempotency).

    A token that is already a valid lowercase name (letters, digits, hyphens, at most 64) is used as is;
    any other is hashed. Resource names are case-insensitive in Azure, so names are kept lowercase.
    """
    validate_client_token(client_token)
    if _NAME_OK.match(client_token) and not client_token.startswith(VM_NAME_PREFIX):
        return client_token
    return VM_NAME_PREFIX + hashlib.sha256(client_token.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image as a launch names it: a marketplace URN (``publisher:offer:sku:version``, version ``latest``
    meaning the newest at create time) or the resource id of an image the account holds."""

    publisher: str = ""
    offer: str = ""
    sku: str = ""
    version: str = ""
    resource_id: str = ""

    @property
    def marketplace(self) -> bool:
        return not self.resource_id

    def reference(self) -> dict[str, str]:
        """The VM body's ``storageProfile.imageReference``."""
        if self.resource_id:
            return {"id": self.resource_id}
        return {"publisher": self.publisher, "offer": self.offer, "sku": self.sku, "version": self.version}

    def __str__(self) -> str:
        return self.resource_id or f"{self.publisher}:{self.offer}:{self.sku}:{self.version}"


def parse_image(image: str) -> ImageRef:
    """``publisher:offer:sku:version`` or a full image resource id; raises ``ProviderRequestRejected`` otherwise."""
    if image.startswith("/subscriptions/"):
        return ImageRef(resource_id=image)
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise rejected(f"image {image!r} is neither publisher:offer:sku:version nor an image resource id")
    publisher, offer, sku, version = parts
    return ImageRef(publisher=publisher, offer=offer, sku=sku, version=version)


def image_reference(image: str) -> dict[str, str]:
    """``publisher:offer:sku:version`` (a marketplace URN) or a full image resource id -> ``imageReference``."""
    return parse_image(image).reference()


_MANAGED_IMAGE = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/images/(?P<name>[^/]+)$",
    re.IGNORECASE,
)


def managed_image_parts(resource_id: str) -> tuple[str, str, str] | None:
    """(subscription, resource group, name) of a managed image id; None for any other resource id."""
    match = _MANAGED_IMAGE.match(resource_id)
    return (match["sub"], match["rg"], match["name"]) if match else None


def vm_tags(spec: LaunchSpec) -> dict[str, str]:
    """The caller's tags plus the broker's; the broker's order and token tags win over a caller tag."""
    return {**spec.tags, ORDER_TAG: spec.order_ref, TOKEN_TAG: spec.client_token}


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """Account options a VM body needs beyond the spec. ``gpu_image`` is what a launch with a boot runs when the
    buyer names no image of their own; ``image`` is what a bare launch (no boot) runs."""

    subnet_id: str
    ssh_public_key: str
    admin_username: str = DEFAULT_ADMIN_USERNAME
    image: str = DEFAULT_IMAGE
    os_disk_type: str = DEFAULT_OS_DISK_TYPE
    public_ip: bool = True
    gpu_image: str = DEFAULT_GPU_IMAGE


@dataclass(frozen=True, slots=True)
class BootParts:
    """What a launch with a boot adds to the VM body, in Azure's own fields: the image it was checked to run,
    ``osProfile.customData`` (the boot script, base64), the login user and the keys ARM installs for it, the
    order's network security group on the NIC, and the OS disk size."""

    image: ImageRef
    custom_data: str
    admin_username: str
    public_keys: tuple[str, ...]
    nsg_id: str
    disk_gb: int | None = None


def vm_body(spec: LaunchSpec, name: str, settings: LaunchSettings, boot: BootParts | None = None) -> dict[str, Any]:
    """The ``begin_create_or_update`` body: one VM with an inline NIC (deleted with it). Without ``boot`` the
    account's image and login key; with it the boot's image, custom data, keys, disk and firewall."""
    check_launchable(spec, settings, with_boot=boot is not None)
    ip_configuration: dict[str, Any] = {"subnet": {"id": settings.subnet_id}, "primary": True}
    if settings.public_ip:
        ip_configuration["publicIPAddressConfiguration"] = {
            "name": f"{name}-ip",
            "sku": {"name": "Standard"},
            "properties": {"deleteOption": "Delete"},
        }
    admin = boot.admin_username if boot is not None else settings.admin_username
    keys = boot.public_keys if boot is not None else (settings.ssh_public_key,)
    os_disk: dict[str, Any] = {
        "createOption": "FromImage",
        "deleteOption": "Delete",
        "managedDisk": {"storageAccountType": settings.os_disk_type},
    }
    os_profile: dict[str, Any] = {
        "computerName": name,
        "adminUsername": admin,
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            # ARM places each key at this path, the only one it accepts (the admin's authorized_keys).
            "ssh": {"publicKeys": [{"path": authorized_keys_path(admin), "keyData": key} for key in keys]},
        },
    }
    nic: dict[str, Any] = {
        "primary": True,
        "deleteOption": "Delete",
        "ipConfigurations": [{"name": "ipconfig1", "properties": ip_configuration}],
    }
    image = parse_image(spec.image or settings.image) if boot is None else boot.image
    if boot is not None:
        os_profile["customData"] = boot.custom_data
        nic["networkSecurityGroup"] = {"id": boot.nsg_id}
        if boot.disk_gb is not None:
            os_disk["diskSizeGB"] = boot.disk_gb
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": spec.instance_type},
        "storageProfile": {"imageReference": image.reference(), "osDisk": os_disk},
        "osProfile": os_profile,
        "networkProfile": {
            "networkApiVersion": NETWORK_API_VERSION,
            "networkInterfaceConfigurations": [{"name": f"{name}-nic", "properties": nic}],
        },
    }
    if spec.pricing_model is PricingModel.SPOT:
        properties["priority"] = "Spot"
        # Delete, not Deallocate: a deallocated spot VM keeps its quota and disk bills for a machine nobody runs.
        properties["evictionPolicy"] = "Delete"
        max_price = float(spec.max_price) if spec.max_price is not None else SPOT_ANY_PRICE
        properties["billingProfile"] = {"maxPrice": max_price}
    body: dict[str, Any] = {"location": spec.region, "tags": vm_tags(spec), "properties": properties}
    zones = azure_zones(spec.region, spec.zone)
    if zones:
        body["zones"] = zones
    return body


def check_launchable(spec: LaunchSpec, settings: LaunchSettings, *, with_boot: bool) -> None:
    """Raise ``ProviderRequestRejected`` for a launch the account's options cannot make, before any call."""
    if spec.pricing_model is PricingModel.RESERVED:
        raise rejected("reserved capacity cannot be launched on demand")
    if not settings.subnet_id:
        raise rejected("options.subnet_id is required to launch (the subnet the VM's NIC joins)")
    if not with_boot and not settings.ssh_public_key:
        raise rejected("options.ssh_public_key is required to launch (Linux VMs need a login key)")


def authorized_keys_path(admin_username: str) -> str:
    return f"/home/{admin_username}/.ssh/authorized_keys"


# ------------------------------------------------------------------------------------------------ boot
#
# Every figure below is from Microsoft's own reference; the tests repeat each source beside its assertion.

# "Specifies a base-64 encoded string of custom data. The base-64 encoded string is decoded to a binary array
# ... The maximum length of the binary array is 65535 bytes." (Virtual Machines - Create Or Update, OSProfile)
CUSTOM_DATA_MAX_BYTES = 65535
CUSTOM_DATA_SOURCE = (
    "Azure Compute REST API, Virtual Machines - Create Or Update, OSProfile.customData: at most 65535 bytes once "
    "decoded, https://learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update"
)
# "This disk has a maximum capacity of 4,095 GiB." (Introduction to Azure managed disks, "OS disk"). The REST
# reference's older "cannot be larger than 1023" is reported stale (Azure/azure-rest-api-specs#35664).
OS_DISK_MAX_GB = 4095
# "NSG rules per NSG: 1,000" (Azure subscription and service limits, Networking limits - Azure Resource
# Manager); the broker writes one rule per (port, address range), so that is also the most one launch may open.
NSG_RULES_MAX = 1000
# "Priority: a number between 100 and 4096" (Network security groups overview, Security rules).
NSG_PRIORITY_MIN = 100
NSG_PRIORITY_MAX = 4096
# "Azure currently supports following key types: SSH-2 RSA with a minimum length of 2048 bits; ED25519 keys
# with a fixed length of 256 bits" (Detailed steps: Create and manage SSH keys for authentication to a Linux VM
# in Azure). Other keys (ECDSA, security keys) reach the machine through the boot script alone.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519"})
RSA_MIN_BITS = 2048

LAUNCH_LIMITS = LaunchLimits(
    user_data_max_bytes=CUSTOM_DATA_MAX_BYTES,
    user_data_measure=UserDataMeasure.RAW,
    user_data_field="osProfile.customData",
    source=CUSTOM_DATA_SOURCE,
    disk_gb_min=1,
    disk_gb_max=OS_DISK_MAX_GB,
    ingress_rules_max=NSG_RULES_MAX,
    native_key_types=NATIVE_KEY_TYPES,
)

NSG_PREFIX = "nsg-"
NSG_NAME_MAX = 80
_NSG_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
RESOURCE_KIND_NSG = "network_security_group"


def nsg_name(order_ref: str, region: str) -> str:
    """The order's network security group in ``region``: one per (order, region), named so a repeat finds it.

    NSG names take letters, digits, ``_``, ``.`` and ``-`` up to 80 characters; an order reference outside that
    is hashed.
    """
    readable = f"{NSG_PREFIX}{order_ref}-{region}"
    if len(readable) <= NSG_NAME_MAX and _NSG_NAME_OK.match(readable):
        return readable
    return f"{NSG_PREFIX}{hashlib.sha256(order_ref.encode()).hexdigest()[:40]}-{region}"[:NSG_NAME_MAX]


def nsg_id(subscription_id: str, resource_group: str, name: str) -> str:
    return (
        f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}/providers/Microsoft.Network"
        f"/networkSecurityGroups/{name}"
    )


def security_rules(ingress: Iterable[IngressRule]) -> list[dict[str, Any]]:
    """One inbound Allow rule per (port, address range), prioritised in a stable order from 100 up."""
    pairs = sorted({(rule.protocol, rule.port, cidr) for rule in ingress for cidr in rule.cidrs})
    if len(pairs) > NSG_PRIORITY_MAX - NSG_PRIORITY_MIN + 1:
        raise rejected(f"{len(pairs)} inbound rules do not fit the priorities {NSG_PRIORITY_MIN}-{NSG_PRIORITY_MAX}")
    return [
        {
            "name": f"broker-{protocol}-{port}-{index}",
            "properties": {
                "description": f"gpu-broker: {protocol} {port} from {cidr}",
                "protocol": protocol.capitalize(),
                "sourceAddressPrefix": cidr,
                "sourcePortRange": "*",
                "destinationAddressPrefix": "*",
                "destinationPortRange": str(port),
                "access": "Allow",
                "priority": NSG_PRIORITY_MIN + index,
                "direction": "Inbound",
            },
        }
        for index, (protocol, port, cidr) in enumerate(pairs)
    ]


def nsg_body(spec: LaunchSpec) -> dict[str, Any]:
    """The order's network security group for ``spec.region``: the boot's ingress, tagged with the order."""
    ingress = spec.boot.ingress if spec.boot is not None else ()
    return {
        "location": spec.region,
        "tags": {ORDER_TAG: spec.order_ref},
        "properties": {"securityRules": security_rules(ingress)},
    }


_RULE_FIELDS = (
    "protocol",
    "sourceAddressPrefix",
    "sourcePortRange",
    "destinationAddressPrefix",
    "destinationPortRange",
    "access",
    "priority",
    "direction",
)


def nsg_matches(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Does an existing NSG already hold the wanted rules and order tag (so a repeat need not write it)?"""

    def rules(nsg: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        found = (nsg.get("properties") or {}).get("securityRules") or []
        return sorted(tuple(str((r.get("properties") or {}).get(f, "")) for f in _RULE_FIELDS) for r in found)

    tags = current.get("tags") or {}
    return tags.get(ORDER_TAG) == (wanted.get("tags") or {}).get(ORDER_TAG) and rules(current) == rules(wanted)


def order_resource(nsg: Mapping[str, Any]) -> OrderResource | None:
    """A network security group (``network_security_groups.list``) -> ``OrderResource``; None without an order tag."""
    order_ref = (nsg.get("tags") or {}).get(ORDER_TAG)
    if not order_ref:
        return None
    return OrderResource(
        kind=RESOURCE_KIND_NSG,
        resource_id=str(nsg.get("id", "")),
        region=str(nsg.get("location", "")),
        order_ref=str(order_ref),
        extra={
            "name": str(nsg.get("name", "")),
            "provisioning_state": str((nsg.get("properties") or {}).get("provisioningState", "")),
        },
    )


# -------------------------------------------------------------------------------------------- instances

POWER_STATES: dict[str, InstanceState] = {
    "starting": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    # Stopped or deallocated VMs run nothing for the buyer: out of service, not deleted (as AWS "stopped").
    "stopped": InstanceState.STOPPING,
    "deallocating": InstanceState.STOPPING,
    "deallocated": InstanceState.STOPPING,
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
