"""The Azure catalogue -> broker offers: the GPU each VM size carries, the sizes a region offers and in which
zones (restrictions included), and each size's on-demand and spot prices from the Retail Prices API.

Zone convention: an Azure zone is a number within a region ("1", "2", "3"); the broker names it
``<region>-<number>`` (``eastus-1``). A size that is not zonal in a region (or a region without zones, such as
``westus``) is offered once with the region name itself as its zone (``westus``), and launched without zones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from providers import gpu_names
from providers.azure.errors import malformed, rejected
from providers.types import PricingModel


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
