"""The ECS catalogue -> broker offers: the GPU each instance family carries, the instance types, the stock
each zone has of them, and their on-demand and spot prices in the currency the answer states. Pure functions
over plain dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from providers import gpu_names
from providers.alibaba.errors import malformed
from providers.types import PricingModel

# The currency of an ECS price is the account's site, and the answer states it: DescribePrice's
# PriceInfo.Price.Currency and DescribeSpotPriceHistory's top-level Currency are CNY on the China site and USD on the
# International site. The broker converts; the adapter only passes on what the answer says, and never guesses.
SITE_CURRENCIES = frozenset({"CNY", "USD"})

# ECS instance family -> GPU. CAVEAT: GPU-SPECS.md section 5 lists these families but their GPU models were
# NOT verified against an Alibaba-authored page; the table follows the shared price list's gpu_model column.
# Every offer says so in ``extra["gpu_model_source"]``. GPUSpec and GPUMemorySize must agree with the table,
# otherwise the provider's own name is kept so ingestion quarantines the row.
FAMILY_GPU: dict[str, str] = {
    "gn6i": gpu_names.T4,
    "gn6v": gpu_names.V100_16_SXM2,
    "gn6e": gpu_names.V100_32_SXM2,
    "gn7i": gpu_names.A10,
    "gn7": gpu_names.A100_40_SXM,
    "gn7e": gpu_names.A100_80_SXM,
    "ebmgn7e": gpu_names.A100_80_SXM,
}
GPU_MODEL_SOURCE = "ECS family table (family->GPU not verified, GPU-SPECS.md section 5)"

# The word GPUSpec must contain for each key ("NVIDIA A100" must not satisfy A10, so words, not substrings).
GPU_SPEC_WORD: dict[str, str] = {
    gpu_names.T4: "T4",
    gpu_names.A10: "A10",
    gpu_names.V100_16_SXM2: "V100",
    gpu_names.V100_32_SXM2: "V100",
    gpu_names.A100_40_SXM: "A100",
    gpu_names.A100_80_SXM: "A100",
}
NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.A10: 24,
    gpu_names.V100_16_SXM2: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_SXM: 40,
    gpu_names.A100_80_SXM: 80,
}
MEMORY_TOLERANCE = Decimal("0.10")
NVLINK_FAMILIES = frozenset({"gn6v", "gn6e", "gn7", "gn7e", "ebmgn7e"})
_FAMILY_SPLIT = re.compile(r"[-.]")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary."""

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    memory_gib_reported: Decimal


def instance_family(instance_type: str, family_field: str = "") -> str:
    """``ecs.gn6i-c4g1.xlarge`` (or its InstanceTypeFamily ``ecs.gn6i``) -> ``gn6i``.

    Bare-metal names keep their prefix: ``ecs.ebmgn7e.32xlarge`` -> ``ebmgn7e``.
    """
    source = family_field or instance_type
    return _FAMILY_SPLIT.split(source.removeprefix("ecs."), maxsplit=1)[0]


def _near(value: Decimal, nominal: Decimal) -> bool:
    return abs(value - nominal) <= nominal * MEMORY_TOLERANCE


def gpu_spec(instance_type: str, family: str, spec: str, amount: int, memory_gib: Decimal) -> GpuSpec:
    """Map GPUSpec/GPUAmount/GPUMemorySize. The docs do not say whether GPUMemorySize is per GPU or per
    instance, so both readings are accepted when they match the family's nominal size."""
    key = FAMILY_GPU.get(family)
    per_gpu: Decimal | None = None
    if key is not None and GPU_SPEC_WORD[key] in spec.upper().split():
        nominal = Decimal(NOMINAL_MEMORY_GB[key])
        if _near(memory_gib, nominal):
            per_gpu = memory_gib
        elif amount > 1 and _near(memory_gib, nominal * amount):
            per_gpu = memory_gib / amount
    nvlink = amount > 1 and family in NVLINK_FAMILIES
    if key is not None and per_gpu is not None:
        model, memory_gb = key, NOMINAL_MEMORY_GB[key]
    else:
        model, memory_gb = spec or f"unknown GPU ({instance_type})", int(memory_gib)
    return GpuSpec(
        model=model,
        count=amount,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=spec,
        memory_gib_reported=memory_gib,
    )


# ------------------------------------------------------------------------------------------- catalogue


def _decimal(value: Any) -> Decimal:
    """A JSON number (float after the SDK's parsing) or numeric string as an exact Decimal of its shortest repr."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"not a number: {value!r}")
    return Decimal(str(value))


@dataclass(frozen=True, slots=True)
class InstanceTypeSpec:
    """One GPU instance type from ``DescribeInstanceTypes``."""

    instance_type: str
    family: str
    gpu: GpuSpec
    vcpus: int
    memory_gib: Decimal
    extra: dict[str, Any]


def instance_type_spec(item: Mapping[str, Any]) -> InstanceTypeSpec | None:
    """None for types without GPUs; raises ``MalformedProviderResponse`` for unreadable entries."""
    try:
        name = str(item["InstanceTypeId"])
        amount = int(item.get("GPUAmount") or 0)
        if amount <= 0:
            return None
        vcpus = int(item["CpuCoreCount"])
        memory_gib = _decimal(item["MemorySize"])
        gpu_memory = _decimal(item.get("GPUMemorySize") or 0)
        spec = str(item.get("GPUSpec") or "")
        family_field = str(item.get("InstanceTypeFamily") or "")
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable instance type entry ({exc!r})") from None
    family = instance_family(name, family_field)
    gpu = gpu_spec(name, family, spec, amount, gpu_memory)
    extra: dict[str, Any] = {
        "gpu_spec": spec,
        "gpu_memory_gib_reported": str(gpu_memory),
        "gpu_model_source": GPU_MODEL_SOURCE,
        "instance_type_family": family_field or f"ecs.{family}",
        "cpu_architecture": str(item.get("CpuArchitecture") or ""),
    }
    return InstanceTypeSpec(instance_type=name, family=family, gpu=gpu, vcpus=vcpus, memory_gib=memory_gib, extra=extra)


# ------------------------------------------------------------------------------------------ availability

# DescribeAvailableResource categories. ClosedWithStock = "little stock left, replenishment stopped": still buyable.
STOCK_BUYABLE = frozenset({"WithStock", "ClosedWithStock"})


def zone_stock(body: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``DescribeAvailableResource`` (DestinationResource=InstanceType) -> instance type -> zone -> StatusCategory."""
    stock: dict[str, dict[str, str]] = {}
    try:
        for zone in (body.get("AvailableZones") or {}).get("AvailableZone") or []:
            zone_id = str(zone["ZoneId"])
            for resource in (zone.get("AvailableResources") or {}).get("AvailableResource") or []:
                if resource.get("Type") != "InstanceType":
                    continue
                for supported in (resource.get("SupportedResources") or {}).get("SupportedResource") or []:
                    category = str(supported.get("StatusCategory") or supported.get("Status") or "")
                    stock.setdefault(str(supported["Value"]), {})[zone_id] = category
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable DescribeAvailableResource answer ({exc!r})") from None
    return stock


# ----------------------------------------------------------------------------------------------- prices


@dataclass(frozen=True, slots=True)
class Price:
    """``PriceInfo.Price`` of ``DescribePrice``: TradePrice is what the account pays after discounts."""

    trade: Decimal
    original: Decimal
    discount: Decimal
    currency: str


def answer_currency(value: Any, field: str) -> str:
    """The currency an ECS price answer states in ``field``.

    Raises ``MalformedProviderResponse`` when it is missing or not a site's currency: a price in an unknown
    currency converted at the wrong rate is worse than no price (a USD price read as CNY is about 7x too low).
    """
    currency = value if isinstance(value, str) else ""
    if not currency:
        raise malformed(f"{field} is missing: the currency of the prices is not assumed")
    if currency not in SITE_CURRENCIES:
        known = ", ".join(sorted(SITE_CURRENCIES))
        raise malformed(f"{field} is {currency!r}, not the currency of an Alibaba Cloud site ({known})")
    return currency


def price_from_body(body: Mapping[str, Any]) -> Price:
    """``DescribePrice``'s answer; its currency must be stated (``answer_currency``)."""
    try:
        price = body["PriceInfo"]["Price"]
        return Price(
            trade=_decimal(price["TradePrice"]),
            original=_decimal(price.get("OriginalPrice", price["TradePrice"])),
            discount=_decimal(price.get("DiscountPrice") or 0),
            currency=answer_currency(price.get("Currency"), "DescribePrice PriceInfo.Price.Currency"),
        )
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable DescribePrice answer ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class SpotPoint:
    price: Decimal
    origin_price: Decimal | None
    timestamp: datetime


def parse_time(value: str) -> datetime:
    """ECS timestamps: ``2017-09-20T15:00:00Z`` or, in DescribeInstances, minute precision ``2017-12-10T04:04Z``."""
    for pattern in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ"):
        try:
            return datetime.strptime(value, pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def newest_spot_prices(points: Iterable[Mapping[str, Any]]) -> dict[str, SpotPoint]:
    """``SpotPrices.SpotPriceType`` rows of one instance type -> zone -> the newest point."""
    newest: dict[str, SpotPoint] = {}
    try:
        for row in points:
            origin = row.get("OriginPrice")
            point = SpotPoint(
                price=_decimal(row["SpotPrice"]),
                origin_price=_decimal(origin) if origin is not None else None,
                timestamp=parse_time(str(row["Timestamp"])),
            )
            zone = str(row["ZoneId"])
            if zone not in newest or point.timestamp > newest[zone].timestamp:
                newest[zone] = point
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable spot price history row ({exc!r})") from None
    return newest


def spot_strategy(pricing_model: PricingModel, max_price: Decimal | None) -> tuple[str, Decimal | None]:
    """RunInstances' SpotStrategy (and SpotPriceLimit) for a pricing model."""
    if pricing_model is PricingModel.SPOT:
        return ("SpotWithPriceLimit", max_price) if max_price is not None else ("SpotAsPriceGo", None)
    return "NoSpot", None
