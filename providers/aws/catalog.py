"""The EC2 catalogue -> broker offers: which GPU an instance type carries (family, identity, memory), the
instance types and the zones that offer them, and the on-demand (Price List) and spot prices of each.
Pure functions over plain dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from providers import gpu_names
from providers.aws.errors import malformed
from providers.types import GPU_FRACTION, NETWORK_GBPS
from untrusted.jsonbody import bounded_json

# The family fixes the form factor (SXM vs PCIe) that GpuInfo does not state.
FAMILY_GPU: dict[str, str] = {
    "p3": gpu_names.V100_16_SXM2,
    "p3dn": gpu_names.V100_32_SXM2,
    "p4d": gpu_names.A100_40_SXM,
    "p4de": gpu_names.A100_80_SXM,
    "p5": gpu_names.H100_SXM,
    "p5e": gpu_names.H200_SXM,
    "p5en": gpu_names.H200_SXM,
    "p6-b200": gpu_names.B200,
    "g4dn": gpu_names.T4,
    "g5": gpu_names.A10G,
    "g6": gpu_names.L4,
    "gr6": gpu_names.L4,
    "g6f": gpu_names.L4,  # partitions of one L4: see gpu_spec
    "gr6f": gpu_names.L4,
    "g6e": gpu_names.L40S,
}

# What GpuInfo must say for each key: (manufacturer, name). Used to confirm the family table and, for GPUs
# that exist in one form factor only, to map families the table does not list yet.
GPU_IDENTITY: dict[str, tuple[str, str]] = {
    gpu_names.T4: ("NVIDIA", "T4"),
    gpu_names.A10G: ("NVIDIA", "A10G"),
    gpu_names.L4: ("NVIDIA", "L4"),
    gpu_names.L40S: ("NVIDIA", "L40S"),
    gpu_names.V100_16_SXM2: ("NVIDIA", "V100"),
    gpu_names.V100_32_SXM2: ("NVIDIA", "V100"),
    gpu_names.A100_40_SXM: ("NVIDIA", "A100"),
    gpu_names.A100_80_SXM: ("NVIDIA", "A100"),
    gpu_names.H100_SXM: ("NVIDIA", "H100"),
    gpu_names.H200_SXM: ("NVIDIA", "H200"),
    gpu_names.B200: ("NVIDIA", "B200"),
}
SINGLE_FORM_FACTOR = frozenset({gpu_names.T4, gpu_names.A10G, gpu_names.L4, gpu_names.L40S, gpu_names.B200})

# Nominal per-GPU memory. AWS reports usable MiB (A10G and L4: 22888 MiB for a 24 GB card).
NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.A10G: 24,
    gpu_names.L4: 24,
    gpu_names.L40S: 48,
    gpu_names.V100_16_SXM2: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_SXM: 40,
    gpu_names.A100_80_SXM: 80,
    gpu_names.H100_SXM: 80,
    gpu_names.H200_SXM: 141,
    gpu_names.B200: 180,
}
MEMORY_TOLERANCE = Decimal("0.10")

NVLINK_FAMILIES = frozenset({"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en"})


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary.

    ``fraction`` < 1 marks GPU partitions: ``count`` slices, each that share of a ``model`` card, with
    ``memory_gb`` the slice's memory (the matching engine's ``OfferView.gpu_fraction``).
    """

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    manufacturer: str
    memory_mib: int
    fraction: Fraction = Fraction(1)


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _memory_matches(key: str, memory_mib: int, share: Fraction = Fraction(1)) -> bool:
    nominal_mib = Decimal(NOMINAL_MEMORY_GB[key] * 1024) * share.numerator / share.denominator
    return abs(Decimal(memory_mib) - nominal_mib) <= nominal_mib * MEMORY_TOLERANCE


def _identity_matches(key: str, manufacturer: str, name: str, memory_mib: int, share: Fraction) -> bool:
    return GPU_IDENTITY.get(key) == (manufacturer, name) and _memory_matches(key, memory_mib, share)


def gpu_model_key(
    instance_type: str, name: str, manufacturer: str, memory_mib: int, share: Fraction = Fraction(1)
) -> str | None:
    """The canonical key, or None when the GPU is unknown or the catalogue contradicts the family table.

    ``share`` is the GPU partition size: a slice's memory is checked against that share of the card's."""
    family_key = FAMILY_GPU.get(instance_family(instance_type))
    if family_key is not None:
        return family_key if _identity_matches(family_key, manufacturer, name, memory_mib, share) else None
    for key in SINGLE_FORM_FACTOR:
        if _identity_matches(key, manufacturer, name, memory_mib, share):
            return key
    return None


def gpu_spec(instance_type: str, gpu_info: Mapping[str, Any]) -> GpuSpec:
    """Map ``GpuInfo`` of ``describe_instance_types``. Unknown GPUs keep the provider's name for quarantine.

    A partitioned GPU (``GpuPartitionSize`` < 1, e.g. g6f's eighth of an L4) reports ``Count`` 0 whole GPUs
    and ``LogicalGpuCount`` slices, each with the slice's ``MemoryInfo``: it maps to the card's key with
    ``fraction`` set, ``count`` the slices and ``memory_gb`` that share of the card's nominal memory.
    """
    try:
        gpus = list(gpu_info["Gpus"])
        if not gpus:
            raise ValueError("empty Gpus")
        names = sorted({str(g["Name"]) for g in gpus})
        manufacturer = str(gpus[0].get("Manufacturer", ""))
        memory_mib = int(gpus[0]["MemoryInfo"]["SizeInMiB"])
        partition = Fraction(str(gpus[0].get("GpuPartitionSize", 1))).limit_denominator(64)
        if not 0 < partition <= 1:
            raise ValueError(f"GpuPartitionSize {partition} is outside (0, 1]")
        if partition == 1:
            count = sum(int(g["Count"]) for g in gpus)
        else:
            count = sum(int(g.get("LogicalGpuCount", g["Count"])) for g in gpus)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"{instance_type}: unreadable GpuInfo ({exc})") from None
    raw_name = "+".join(names)
    key: str | None = None
    if len(names) == 1:
        key = gpu_model_key(instance_type, names[0], manufacturer, memory_mib, partition)
    if key is not None:
        model = key
        memory_gb = int(NOMINAL_MEMORY_GB[key] * partition)
    else:
        # An unknown slice is not the whole card its name suggests; the suffix keeps it out of the known keys.
        model = raw_name if partition == 1 else f"{raw_name} ({partition} partition)"
        memory_gb = memory_mib // 1024
    family = instance_family(instance_type)
    nvlink = count > 1 and (family in NVLINK_FAMILIES or family.startswith("p6"))
    return GpuSpec(
        model=model,
        count=count,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=raw_name,
        manufacturer=manufacturer,
        memory_mib=memory_mib,
        fraction=partition if key is not None else Fraction(1),
    )


# ------------------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class InstanceTypeSpec:
    """One GPU instance type from ``describe_instance_types``."""

    instance_type: str
    gpu: GpuSpec
    vcpus: int
    memory_gib: Decimal
    extra: dict[str, Any]


def instance_type_spec(item: Mapping[str, Any]) -> InstanceTypeSpec | None:
    """None for types without ``GpuInfo``; raises ``MalformedProviderResponse`` for unreadable entries."""
    gpu_info = item.get("GpuInfo")
    if not gpu_info:
        return None
    try:
        name = str(item["InstanceType"])
        vcpus = int(item["VCpuInfo"]["DefaultVCpus"])
        memory_gib = Decimal(int(item["MemoryInfo"]["SizeInMiB"])) / Decimal(1024)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable instance type entry ({exc!r})") from None
    gpu = gpu_spec(name, gpu_info)
    network = item.get("NetworkInfo") or {}
    extra: dict[str, Any] = {
        "gpu_name": gpu.raw_name,
        "gpu_manufacturer": gpu.manufacturer,
        "gpu_memory_mib": gpu.memory_mib,
        "network_performance": str(network.get("NetworkPerformance", "")),
        "efa_supported": bool(network.get("EfaSupported", False)),
        "architectures": list((item.get("ProcessorInfo") or {}).get("SupportedArchitectures", [])),
    }
    gbps = network_gbps(extra["network_performance"])
    if gbps is not None:
        extra[NETWORK_GBPS] = gbps
    if gpu.fraction < 1:
        # Where the catalogue and the matching engine read a slice's share of the card (OfferView.gpu_fraction).
        extra[GPU_FRACTION] = float(gpu.fraction)
    return InstanceTypeSpec(instance_type=name, gpu=gpu, vcpus=vcpus, memory_gib=memory_gib, extra=extra)


# NetworkInfo.NetworkPerformance is text: "100 Gigabit", "Up to 25 Gigabit", "4x 100 Gigabit", or "High"
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_NetworkInfo.html).
_NETWORK = re.compile(r"^(?:up to )?(?:(?P<links>[0-9]{1,3})x )?(?P<gbit>[0-9]{1,5}(?:\.[0-9]{1,3})?) gigabit$")


def network_gbps(performance: str) -> float | None:
    """The Gbit/s a ``NetworkPerformance`` text names (the peak for "Up to N", all links for "Nx M"), or None
    for the words AWS uses without a figure ("Low", "High")."""
    match = _NETWORK.match(performance.strip().lower())
    if match is None:
        return None
    return int(match["links"] or 1) * float(match["gbit"])


def zones_by_type(offerings: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """``describe_instance_type_offerings`` rows -> instance type -> sorted zone names."""
    zones: dict[str, set[str]] = {}
    try:
        for row in offerings:
            zones.setdefault(str(row["InstanceType"]), set()).add(str(row["Location"]))
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable instance type offering ({exc!r})") from None
    return {name: sorted(locations) for name, locations in zones.items()}


# A Price List item is one product's JSON text, a few KB nesting 7 deep (product -> terms -> OnDemand -> offer
# -> priceDimensions -> dimension -> pricePerUnit); parsed within these bounds (a ValueError beyond them).
MAX_PRICE_ITEM_BYTES = 1024 * 1024
MAX_PRICE_ITEM_DEPTH = 16


def _price_item(raw: Any) -> Any:
    if isinstance(raw, str | bytes):
        return bounded_json(raw, max_bytes=MAX_PRICE_ITEM_BYTES, max_depth=MAX_PRICE_ITEM_DEPTH)
    return raw


# What the broker reads a price in: US dollars per instance-hour. Each price dimension states its "unit"
# ("the usage measurement unit for the price") and keys "pricePerUnit" by currency code ("Reading the service
# price list file for an AWS service", https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/
# reading-service-price-list-file-for-services.html); a price in anything else is refused by name, never
# read as if it were USD per hour.
HOURLY_UNIT = "Hrs"
PRICE_CURRENCY = "USD"


@dataclass(frozen=True, slots=True)
class PriceRefusal:
    """A Price List product the broker would not read a price from, and why."""

    instance_type: str
    sku: str
    reason: str


def _hourly_usd(product: Mapping[str, Any]) -> tuple[Decimal, str] | str:
    """(hourly USD price, SKU) of one parsed product, or the reason it states none in USD per hour."""
    terms = product.get("terms", {}).get("OnDemand", {})
    sku = str(product.get("product", {}).get("sku", ""))
    stated: list[str] = []
    for term in terms.values():
        for dimension in term.get("priceDimensions", {}).values():
            unit = str(dimension.get("unit", ""))
            per_unit = dimension.get("pricePerUnit", {})
            if unit == HOURLY_UNIT and PRICE_CURRENCY in per_unit:
                return Decimal(str(per_unit[PRICE_CURRENCY])), sku
            stated.append(f"{'/'.join(sorted(per_unit)) or 'no currency'} per {unit or 'unstated unit'!r}")
    if not stated:
        return "no on-demand price dimension"
    return f"on-demand price in {', '.join(stated)}; only {PRICE_CURRENCY} per {HOURLY_UNIT!r} is read"


def on_demand_usd(price_list: Iterable[Any]) -> tuple[Decimal, str] | None:
    """The hourly USD price and SKU from Price List items (each a JSON string), or None if none is stated.

    With the exact TERM_MATCH filters one product matches; the first priced one wins.
    """
    for raw in price_list:
        try:
            priced = _hourly_usd(_price_item(raw))
        except (ValueError, TypeError, AttributeError, InvalidOperation) as exc:
            raise malformed(f"unreadable Price List item ({exc!r})") from None
        if not isinstance(priced, str):
            return priced
    return None


@dataclass(slots=True)
class OnDemandPrices:
    """Price List items read per instance type: the usable prices and the products refused, with reasons."""

    prices: dict[str, tuple[Decimal, str]] = field(default_factory=dict)
    refused: list[PriceRefusal] = field(default_factory=list)


def on_demand_usd_by_type(price_list: Iterable[Any]) -> OnDemandPrices:
    """Price List items for many instance types -> instance type -> (hourly USD, SKU); the first priced wins.

    A product whose on-demand price is not in USD per hour is refused (listed with its reason), so a type with
    no other priced product goes unquoted instead of quoted in the wrong unit or currency.
    """
    result = OnDemandPrices()
    for raw in price_list:
        try:
            product = _price_item(raw)
            instance_type = str(product.get("product", {}).get("attributes", {}).get("instanceType", ""))
            priced = _hourly_usd(product) if instance_type and instance_type not in result.prices else None
        except (ValueError, TypeError, AttributeError, InvalidOperation) as exc:
            raise malformed(f"unreadable Price List item ({exc!r})") from None
        if isinstance(priced, str):
            sku = str(product.get("product", {}).get("sku", ""))
            result.refused.append(PriceRefusal(instance_type, sku, priced))
        elif priced is not None:
            result.prices[instance_type] = priced
    # A type refused in one product but priced by another is quoted: only its lasting refusals are reported.
    result.refused = [r for r in result.refused if r.instance_type not in result.prices]
    return result


@dataclass(frozen=True, slots=True)
class SpotPoint:
    price: Decimal
    timestamp: datetime


def newest_spot_prices(history: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], SpotPoint]:
    """``SpotPriceHistory`` rows -> (instance type, zone) -> the newest point."""
    newest: dict[tuple[str, str], SpotPoint] = {}
    try:
        for row in history:
            key = (str(row["InstanceType"]), str(row["AvailabilityZone"]))
            point = SpotPoint(price=Decimal(str(row["SpotPrice"])), timestamp=row["Timestamp"])
            if not isinstance(point.timestamp, datetime):
                raise TypeError("Timestamp is not a datetime")
            if key not in newest or point.timestamp > newest[key].timestamp:
                newest[key] = point
    except (KeyError, TypeError, InvalidOperation) as exc:
        raise malformed(f"unreadable spot price history row ({exc!r})") from None
    return newest
