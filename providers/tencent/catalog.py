"""The CVM catalogue -> broker offers: the GPU each instance family carries, which rows of a zone's instance
configurations are GPU offers on sale, and their hourly prices in the currency of the account's site. Pure
functions over plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from providers import gpu_names
from providers.tencent.errors import malformed
from providers.tencent.mapping import CHARGE_TYPES
from providers.types import OfferQuote

# CVM's price answers (ItemPrice, in DescribeZoneInstanceConfigInfos and InquiryPriceRunInstances) state no currency:
# an account is billed in the currency of the site it signed up on, CNY on the China site (cloud.tencent.com) and
# USD on the International site (tencentcloud.com). Only the account can say which, so it is an account option.
SITE_CURRENCIES: dict[str, str] = {"china": "CNY", "international": "USD"}
DEFAULT_SITE = "china"

# The family fixes the GPU; DescribeInstanceTypeConfigs' GpuType only confirms it. Sources: the price page of
# the shared list-price table (GT4 = A100 40 GB, GN10X/GN10Xp = V100 32 GB, GN7/GI3X = T4) and TI-ONE specs.
FAMILY_GPU: dict[str, str] = {
    # The A100's form factor in GT4 is not sourced. PCIe is the conservative key: the broker ranks the PCIe
    # card at or below the SXM4 one, so an unverified SXM claim can never overstate the offer.
    "GT4": gpu_names.A100_40_PCIE,
    "GN10X": gpu_names.V100_32_SXM2,
    "GN10Xp": gpu_names.V100_32_SXM2,
    "GN7": gpu_names.T4,
    "GI3X": gpu_names.T4,
}

# The token GpuType must contain (case-insensitive) for a family's key to be trusted.
GPU_TYPE_TOKEN: dict[str, str] = {
    gpu_names.T4: "T4",
    gpu_names.V100_32_SXM2: "V100",
    gpu_names.A100_40_PCIE: "A100",
}

NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_PCIE: 40,
}
MEMORY_TOLERANCE = Decimal("0.10")

# SXM2 boards: the GPUs of a multi-GPU GN10X/GN10Xp instance share an NVLink mesh.
NVLINK_FAMILIES = frozenset({"GN10X", "GN10Xp"})


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary."""

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    physical_count: Decimal
    raw_memory_gib: Decimal | None


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _decimal(value: Any, what: str) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise malformed(f"{what}: {value!r} is not a number ({exc!r})") from None


def gpu_model_key(instance_type: str, gpu_type: str, gpu_memory_gib: Decimal | None) -> str | None:
    """The canonical key, or None when the family is unknown or the catalogue contradicts the family table.

    An empty ``gpu_type`` or memory does not contradict: the family alone is then trusted.
    """
    key = FAMILY_GPU.get(instance_family(instance_type))
    if key is None:
        return None
    if gpu_type and GPU_TYPE_TOKEN[key] not in gpu_type.upper():
        return None
    if gpu_memory_gib is not None and gpu_memory_gib > 0:
        nominal = Decimal(NOMINAL_MEMORY_GB[key])
        if abs(gpu_memory_gib - nominal) > nominal * MEMORY_TOLERANCE:
            return None
    return key


def gpu_spec(instance_type: str, gpu: Any, gpu_count: Any, gpu_type: str, gpu_memory_gib: Any) -> GpuSpec | None:
    """Map the GPU fields of a catalogue row; None for a type without GPUs.

    ``gpu_count`` (physical cards, below 1 for a vGPU slice) wins over the integer ``gpu``. Unknown or
    fractional GPUs keep the provider's name so that ingestion quarantines them.
    """
    physical = _decimal(gpu_count, f"{instance_type} GpuCount")
    if physical is None:
        physical = _decimal(gpu, f"{instance_type} Gpu")
    if physical is None or physical <= 0:
        return None
    memory = _decimal(gpu_memory_gib, f"{instance_type} GpuMemory")
    whole = physical >= 1 and physical == physical.to_integral_value()
    family = instance_family(instance_type)
    raw_name = gpu_type or f"{family} GPU"
    key = gpu_model_key(instance_type, gpu_type, memory) if whole else None
    if key is not None:
        model, memory_gb = key, NOMINAL_MEMORY_GB[key]
    elif whole:
        model, memory_gb = raw_name, int(memory or 0)
    else:
        # A vGPU slice is not the whole card its name suggests; keep it out of the canonical keys.
        share = Fraction(str(physical)).limit_denominator(64)
        model, memory_gb = f"{raw_name} ({share} partition)", int(memory or 0)
    count = int(physical) if whole else 1
    nvlink = count > 1 and family in NVLINK_FAMILIES
    return GpuSpec(
        model=model,
        count=count,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=raw_name,
        physical_count=physical,
        raw_memory_gib=memory,
    )


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """``GpuType``/``GpuMemory`` of one instance type from ``DescribeInstanceTypeConfigs``."""

    gpu_type: str
    gpu_memory_gib: Any


def gpu_identities(configs: Iterable[Mapping[str, Any]]) -> dict[str, GpuIdentity]:
    """``InstanceTypeConfigSet`` rows (one per zone) -> instance type -> its GPU identity (first non-empty wins)."""
    found: dict[str, GpuIdentity] = {}
    try:
        for row in configs:
            name = str(row["InstanceType"])
            gpu_type = str(row.get("GpuType") or "")
            current = found.get(name)
            if current is None or (not current.gpu_type and gpu_type):
                found[name] = GpuIdentity(gpu_type=gpu_type, gpu_memory_gib=row.get("GpuMemory"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance type config ({exc!r})") from None
    return found


# ------------------------------------------------------------------------------------------- catalogue

SELLING = "SELL"
WITHOUT_STOCK = "WithoutStock"


def is_gpu_row(item: Mapping[str, Any]) -> bool:
    """True for a ``InstanceTypeQuotaSet`` row that carries at least a slice of a GPU."""
    for key in ("GpuCount", "Gpu"):
        value = item.get(key)
        if value not in (None, ""):
            try:
                return Decimal(str(value)) > 0
            except InvalidOperation:
                raise malformed(f"{item.get('InstanceType')}: {key} {value!r} is not a number") from None
    return False


def hourly_price(price: Mapping[str, Any] | None) -> tuple[Decimal, Decimal] | None:
    """(price the account pays, list price) per hour from ``ItemPrice``; None when no hourly price is stated.

    ``UnitPriceDiscount`` is the account's price after its discount, ``UnitPrice`` the list price; both are the
    first pricing step (the first 96 hours when later steps are returned).
    """
    if not price:
        return None
    unit = str(price.get("ChargeUnit") or "HOUR").upper()
    if unit != "HOUR":
        return None
    listed = _decimal(price.get("UnitPrice"), "UnitPrice")
    paid = _decimal(price.get("UnitPriceDiscount"), "UnitPriceDiscount")
    if paid is None:
        paid = listed
    if paid is None:
        return None
    return paid, listed if listed is not None else paid


def site_currency(site: str) -> str:
    """The currency an account on ``site`` is priced in. Raises ``ValueError`` naming the option for another site."""
    try:
        return SITE_CURRENCIES[site]
    except KeyError:
        raise ValueError(f"options.site: {site!r} is not one of {', '.join(sorted(SITE_CURRENCIES))}") from None


def offer_from_quota_item(
    item: Mapping[str, Any], region: str, identities: Mapping[str, GpuIdentity], *, currency: str
) -> OfferQuote | None:
    """One ``InstanceTypeQuotaSet`` row -> an offer priced in ``currency`` (the account's site's, since the row
    states none), or None when it is not one the broker can buy.

    Left out: types without GPUs, charge types other than POSTPAID_BY_HOUR/SPOTPAID, rows without an hourly
    price, and sold-out rows (``Status`` SOLD_OUT or ``StatusCategory`` WithoutStock): CVM has no stock count,
    so the broker learns about stock only by the row's presence. Raises ``MalformedProviderResponse``.
    """
    try:
        name = str(item["InstanceType"])
        zone = str(item["Zone"])
        charge = str(item.get("InstanceChargeType") or "")
        status = str(item.get("Status") or "")
        category = str(item.get("StatusCategory") or "")
        vcpus = int(item["Cpu"])
        memory_gib = Decimal(str(item["Memory"]))
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable instance type quota row ({exc!r})") from None
    pricing_model = CHARGE_TYPES.get(charge)
    if pricing_model is None or status != SELLING or category == WITHOUT_STOCK or not is_gpu_row(item):
        return None
    prices = hourly_price(item.get("Price"))
    if prices is None:
        return None
    paid, listed = prices
    identity = identities.get(name, GpuIdentity("", None))
    gpu = gpu_spec(name, item.get("Gpu"), item.get("GpuCount"), identity.gpu_type, identity.gpu_memory_gib)
    if gpu is None:
        return None
    price_info = item.get("Price") or {}
    extra: dict[str, Any] = {
        "charge_type": charge,
        "status": status,
        "status_category": category,
        "list_price": str(listed),
        "discount": str(price_info.get("Discount", "")),
        "instance_family": str(item.get("InstanceFamily") or instance_family(name)),
        "type_name": str(item.get("TypeName") or ""),
        "cpu_type": str(item.get("CpuType") or ""),
        "gpu_type": gpu.raw_name,
        "gpu_count_physical": str(gpu.physical_count),
        "gpu_memory_gib": str(gpu.raw_memory_gib) if gpu.raw_memory_gib is not None else "",
        "network_card_gbps": item.get("NetworkCard"),
        "instance_bandwidth_gbps": item.get("InstanceBandwidth"),
    }
    return OfferQuote(
        region=region,
        zone=zone,
        instance_type=name,
        pricing_model=pricing_model,
        gpu_model=gpu.model,
        gpu_count=gpu.count,
        gpu_memory_gb=gpu.memory_gb,
        vcpus=vcpus,
        memory_gib=memory_gib,
        price=paid,
        currency=currency,
        capacity=None,
        interconnect=gpu.interconnect,
        extra=extra,
    )


def gpu_families(items: Iterable[Mapping[str, Any]]) -> list[str]:
    """The instance families of the GPU rows of ``InstanceTypeQuotaSet``, sorted."""
    families: set[str] = set()
    try:
        for item in items:
            if is_gpu_row(item):
                name = str(item["InstanceType"])
                families.add(str(item.get("InstanceFamily") or instance_family(name)))
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance type quota row ({exc!r})") from None
    return sorted(families)
