"""The Compute Engine catalogue -> broker offers: the GPU each machine series carries and the bundles the
broker quotes, a zone's machine types, accelerator limits and GPU quotas, and each offer's hourly price composed
from Cloud Billing SKUs. Pure functions over plain dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from providers import gpu_names
from providers.errors import (
    ProviderRequestRejected,
)
from providers.gcp.errors import PROVIDER, malformed
from providers.types import QuotaUse

PRICE_PLACES = Decimal("0.00001")


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One Compute Engine accelerator type. ``key`` is None for GPUs without a canonical broker key."""

    name: str
    key: str | None
    memory_gb: int
    sku_name: str  # how Cloud Billing names its SKU: "Nvidia <sku_name> GPU running in ..."
    short: str  # how the broker writes it after an N1 host: n1-standard-8+1xT4
    nvlink: bool


ACCELERATORS: dict[str, AcceleratorSpec] = {
    a.name: a
    for a in (
        AcceleratorSpec("nvidia-tesla-t4", gpu_names.T4, 16, "Tesla T4", "T4", nvlink=False),
        AcceleratorSpec("nvidia-tesla-p4", None, 8, "Tesla P4", "P4", nvlink=False),
        AcceleratorSpec("nvidia-tesla-p100", None, 16, "Tesla P100", "P100", nvlink=False),
        # GCP's V100 is the 16 GB SXM2 board; its 8-card N1 hosts are NVLink-connected.
        AcceleratorSpec("nvidia-tesla-v100", gpu_names.V100_16_SXM2, 16, "Tesla V100", "V100", nvlink=True),
        AcceleratorSpec("nvidia-tesla-a100", gpu_names.A100_40_SXM, 40, "Tesla A100", "A100", nvlink=True),
        AcceleratorSpec("nvidia-a100-80gb", gpu_names.A100_80_SXM, 80, "Tesla A100 80GB", "A100-80GB", nvlink=True),
        AcceleratorSpec("nvidia-l4", gpu_names.L4, 24, "L4", "L4", nvlink=False),
        AcceleratorSpec("nvidia-h100-80gb", gpu_names.H100_SXM, 80, "H100 80GB", "H100", nvlink=True),
        AcceleratorSpec("nvidia-h100-mega-80gb", gpu_names.H100_SXM, 80, "H100 80GB Mega", "H100-MEGA", nvlink=True),
        AcceleratorSpec("nvidia-h200-141gb", gpu_names.H200_SXM, 141, "H200 141GB", "H200", nvlink=True),
        AcceleratorSpec("nvidia-b200", gpu_names.B200, 180, "B200", "B200", nvlink=True),
    )
}
ACCELERATOR_BY_SKU_NAME: dict[str, str] = {a.sku_name: a.name for a in ACCELERATORS.values()}
ACCELERATOR_BY_SHORT: dict[str, str] = {a.short.lower(): a.name for a in ACCELERATORS.values()}

# Machine series with bundled GPUs -> the accelerator the series must carry (GPU-SPECS section 5). A catalogue
# entry that contradicts this keeps the raw accelerator name, so ingestion quarantines it.
SERIES_GPU: tuple[tuple[str, str], ...] = (
    ("a2-ultragpu-", "nvidia-a100-80gb"),
    ("a2-", "nvidia-tesla-a100"),
    ("a3-ultragpu-", "nvidia-h200-141gb"),
    ("a3-megagpu-", "nvidia-h100-mega-80gb"),
    ("a3-", "nvidia-h100-80gb"),
    ("a4-", "nvidia-b200"),
    ("g2-", "nvidia-l4"),
)
# Machine type prefix -> the family word of its vCPU and RAM SKUs, longest prefix first.
HOST_FAMILIES: tuple[tuple[str, str], ...] = (
    ("a3-ultragpu-", "A3 Ultra"),
    ("a3-megagpu-", "A3 Mega"),
    ("a3-", "A3"),
    ("a2-", "A2"),
    ("a4-", "A4"),
    ("g2-", "G2"),
    ("n1-", "N1 Predefined"),
)
# Series whose GPUs are attached to the instance (guest_accelerators) rather than part of the machine type.
# The regional quota metric each accelerator type counts against (Compute Engine's GPU quota names).
GPU_QUOTA_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}


def quota_uses(region: Mapping[str, Any]) -> dict[str, QuotaUse]:
    """The ``quotas[]`` of a regions.get answer by metric."""
    uses: dict[str, QuotaUse] = {}
    for item in region.get("quotas") or ():
        try:
            uses[str(item["metric"])] = QuotaUse(str(item["metric"]), float(item["limit"]), float(item.get("usage", 0)))
        except (KeyError, TypeError, ValueError):
            continue
    return uses


def quota_needs(
    quotas: Mapping[str, QuotaUse], accelerator: str, gpus: int, vcpus: int, spot: bool
) -> dict[str, float]:
    """What a launch adds to which metric. Spot VMs count against the PREEMPTIBLE_ quotas where the project has
    them (a limit above zero) and against the standard ones otherwise, as Compute Engine does."""

    def metric(standard: str) -> str:
        preemptible = quotas.get(f"PREEMPTIBLE_{standard}")
        return preemptible.name if spot and preemptible is not None and preemptible.limit > 0 else standard

    needs: dict[str, float] = {}
    gpu_metric = GPU_QUOTA_METRICS.get(accelerator)
    if gpu_metric and gpus:
        needs[metric(gpu_metric)] = gpus
    if vcpus:
        needs[metric("CPUS")] = vcpus
    return needs


ATTACHED_GPU_SERIES = ("n1-",)

# GCP attaches GPUs to any N1 shape; quoting every pairing would flood the catalogue with near-duplicates.
# The broker quotes these (option ``n1_bundles`` replaces the list).
DEFAULT_N1_BUNDLES: tuple[str, ...] = (
    "n1-standard-4+1xT4",
    "n1-standard-8+1xT4",
    "n1-standard-16+2xT4",
    "n1-standard-32+4xT4",
    "n1-standard-16+2xV100",
    "n1-standard-32+4xV100",
    "n1-standard-64+8xV100",
)

_BUNDLE = re.compile(r"^(?P<machine>[a-z][a-z0-9-]*[a-z0-9])\+(?P<count>[1-9]\d*)x(?P<gpu>[A-Za-z0-9-]+)$")


@dataclass(frozen=True, slots=True)
class InstanceTypeName:
    """The broker's instance type split into the machine type and, for N1, the attached GPUs."""

    machine_type: str
    accelerator: str | None = None
    count: int = 0

    def __str__(self) -> str:
        if self.accelerator is None:
            return self.machine_type
        spec = ACCELERATORS.get(self.accelerator)
        return f"{self.machine_type}+{self.count}x{spec.short if spec else self.accelerator}"


def parse_instance_type(name: str) -> InstanceTypeName:
    """``a2-highgpu-1g`` or ``n1-standard-8+1xT4`` (also ``+1xnvidia-tesla-t4``). Raises ProviderRequestRejected."""
    match = _BUNDLE.match(name)
    if match is None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", name):
            raise ProviderRequestRejected(f"not a GCP instance type: {name!r}", code="invalid", provider=PROVIDER)
        return InstanceTypeName(name)
    gpu = match["gpu"]
    accelerator = gpu if gpu in ACCELERATORS else ACCELERATOR_BY_SHORT.get(gpu.lower())
    if accelerator is None:
        raise ProviderRequestRejected(f"unknown GPU {gpu!r} in {name!r}", code="invalid", provider=PROVIDER)
    if not match["machine"].startswith(ATTACHED_GPU_SERIES):
        raise ProviderRequestRejected(
            f"{match['machine']} bundles its GPUs; attach GPUs only to {', '.join(ATTACHED_GPU_SERIES)} machines",
            code="invalid",
            provider=PROVIDER,
        )
    return InstanceTypeName(match["machine"], accelerator, int(match["count"]))


def host_family(machine_type: str) -> str | None:
    return next((family for prefix, family in HOST_FAMILIES if machine_type.startswith(prefix)), None)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    count: int
    memory_gb: int
    interconnect: str
    accelerator: str


def gpu_spec(machine_type: str, accelerator: str, count: int) -> GpuSpec:
    """The canonical key for ``count`` x ``accelerator`` on ``machine_type``; unknown or contradictory -> raw name."""
    spec = ACCELERATORS.get(accelerator)
    expected = next((gpu for prefix, gpu in SERIES_GPU if machine_type.startswith(prefix)), None)
    consistent = expected is None or expected == accelerator
    if spec is None or spec.key is None or not consistent:
        return GpuSpec(accelerator, count, spec.memory_gb if spec else 0, "pcie", accelerator)
    interconnect = "nvlink" if count > 1 and spec.nvlink else "pcie"
    return GpuSpec(spec.key, count, spec.memory_gb, interconnect, accelerator)


# ------------------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class MachineType:
    """One ``machine_types.aggregated_list`` entry."""

    name: str
    zone: str
    vcpus: int
    memory_gib: Decimal
    accelerators: tuple[tuple[str, int], ...]
    description: str


def zone_of_scope(scope: str) -> str | None:
    """``zones/us-central1-a`` -> ``us-central1-a``; regional and global scopes -> None."""
    kind, _, name = scope.partition("/")
    return name if kind == "zones" and name else None


def region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def machine_type(item: Mapping[str, Any], zone: str) -> MachineType:
    try:
        accelerators = tuple(
            (str(a["guest_accelerator_type"]), int(a["guest_accelerator_count"]))
            for a in item.get("accelerators") or []
        )
        return MachineType(
            name=str(item["name"]),
            zone=zone,
            vcpus=int(item["guest_cpus"]),
            memory_gib=Decimal(int(item["memory_mb"])) / Decimal(1024),
            accelerators=accelerators,
            description=str(item.get("description", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable machine type entry ({exc!r})") from None


def accelerator_limits(scoped: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[tuple[str, str], int]:
    """``accelerator_types.aggregated_list`` items -> (zone, accelerator type) -> maximum cards per instance."""
    limits: dict[tuple[str, str], int] = {}
    try:
        for scope, item in scoped:
            zone = zone_of_scope(scope)
            if zone is not None:
                limits[(zone, str(item["name"]))] = int(item.get("maximum_cards_per_instance") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable accelerator type entry ({exc!r})") from None
    return limits


# ------------------------------------------------------------------------------------------------ prices

ON_DEMAND = "OnDemand"
PREEMPTIBLE = "Preemptible"  # Spot VMs are billed on the Preemptible SKUs
# Cloud Billing words spot SKUs differently per resource: a GPU card is "Nvidia Tesla T4 GPU attached to Spot
# Preemptible VMs running in Americas", while vCPU and RAM are "Spot Preemptible N1 Predefined Instance Core
# running in ...". Each pattern says which of the two forms it saw, so the usage type can be checked against it.
_GPU_SKU = re.compile(r"^Nvidia (?P<name>.+?) GPU (?P<spot>attached to Spot Preemptible VMs )?running in ")
_HOST_SKU = re.compile(r"^(?P<spot>Spot Preemptible )?(?P<family>.+?) Instance (?P<resource>Core|Ram) running in ")
UNITS = {"gpu": "h", "core": "h", "ram": "GiBy.h"}


@dataclass(frozen=True, slots=True)
class SkuRate:
    sku_id: str
    price: Decimal
    currency: str


# (region, usage type, resource, family or accelerator type) -> rate
SkuIndex = dict[tuple[str, str, str, str], SkuRate]


def money(value: Mapping[str, Any]) -> Decimal:
    """A ``google.type.Money`` dict -> Decimal (units may arrive as a string: it is an int64)."""
    return Decimal(int(value.get("units") or 0)) + Decimal(int(value.get("nanos") or 0)).scaleb(-9)


def _unit_price(sku: Mapping[str, Any]) -> tuple[Decimal, str, str] | None:
    """(price, currency, usage unit) of the newest pricing info's first tier."""
    infos = list(sku.get("pricing_info") or [])
    if not infos:
        return None
    info = max(infos, key=lambda i: str(i.get("effective_time") or ""))
    expression = info.get("pricing_expression") or {}
    tiers = sorted(expression.get("tiered_rates") or [], key=lambda t: float(t.get("start_usage_amount") or 0))
    if not tiers:
        return None
    price = tiers[0].get("unit_price") or {}
    return money(price), str(price.get("currency_code") or ""), str(expression.get("usage_unit") or "")


def sku_index(skus: Iterable[Mapping[str, Any]]) -> SkuIndex:
    """The GPU, vCPU and RAM rates of Compute Engine SKUs, by region. Other SKUs (disks, licences, commitments)
    are skipped; a SKU whose unit is not per hour (or per GiB-hour for RAM) is skipped too rather than misread."""
    index: SkuIndex = {}
    try:
        for sku in skus:
            category = sku.get("category") or {}
            usage_type = str(category.get("usage_type", ""))
            if category.get("resource_family") != "Compute" or usage_type not in (ON_DEMAND, PREEMPTIBLE):
                continue
            description = str(sku.get("description", ""))
            key: tuple[str, str] | None = None
            described = _GPU_SKU.match(description) or _HOST_SKU.match(description)
            if described is None or (PREEMPTIBLE if described["spot"] else ON_DEMAND) != usage_type:
                # A description and a usage type that disagree name no price we can trust: a spot rate
                # filed as on-demand (or the reverse) would be quoted at the wrong provisioning model.
                continue
            if described.re is _GPU_SKU:
                accelerator = ACCELERATOR_BY_SKU_NAME.get(described["name"])
                key = ("gpu", accelerator) if accelerator else None
            else:
                key = ("core" if described["resource"] == "Core" else "ram", described["family"])
            if key is None:
                continue
            priced = _unit_price(sku)
            if priced is None or priced[2] != UNITS[key[0]]:
                continue
            rate = SkuRate(str(sku.get("sku_id", "")), priced[0], priced[1])
            for region in sku.get("service_regions") or []:
                index.setdefault((str(region), usage_type, *key), rate)
    except (TypeError, ValueError, AttributeError, InvalidOperation) as exc:
        raise malformed(f"unreadable billing SKU ({exc!r})") from None
    return index


@dataclass(frozen=True, slots=True)
class ComposedPrice:
    """A machine's hourly price: the rounded quote, the exact SKU sum and the SKUs it came from."""

    price: Decimal
    exact: Decimal
    currency: str
    sku_ids: dict[str, str]


def compose_price(
    index: SkuIndex,
    region: str,
    usage_type: str,
    family: str,
    vcpus: int,
    memory_gib: Decimal,
    accelerator: str,
    gpu_count: int,
) -> ComposedPrice | None:
    """GPU + vCPU + RAM SKUs summed; None when any part has no SKU (never guess a missing part).

    The quote is rounded half-up to 0.00001 per hour: per-GiB RAM rates leave sub-cent noise in the sum, and five
    places is the precision GCP's own per-machine price tables use.
    """
    parts = (
        ("gpu", accelerator, Decimal(gpu_count)),
        ("core", family, Decimal(vcpus)),
        ("ram", family, memory_gib),
    )
    exact = Decimal(0)
    sku_ids: dict[str, str] = {}
    currencies: set[str] = set()
    for resource, key, quantity in parts:
        rate = index.get((region, usage_type, resource, key))
        if rate is None:
            return None
        exact += rate.price * quantity
        sku_ids[resource] = rate.sku_id
        currencies.add(rate.currency)
    if len(currencies) != 1:
        raise malformed(f"{region} {family}: SKUs in several currencies {sorted(currencies)}")
    price = exact.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)
    return ComposedPrice(price=price, exact=exact, currency=currencies.pop(), sku_ids=sku_ids)
