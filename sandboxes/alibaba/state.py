"""What the ECS sandbox holds: its regions, seeded prices and synthetic stock, the limits ECS documents, the faults
as ECS answers them, and the records of instances, spot prices and requests its handlers share.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from providers import gpu_names
from sandboxes.faults import FaultKind

SEED_PATH = Path(__file__).parent / "prices.csv"
# The demo account's key pair: registered at start-up (and after every reset), so its signatures are verified.
DEMO_CREDENTIALS: dict[str, str] = {"access_key_id": "LTAI5tDemoSandbox0001", "access_key_secret": "sandbox-secret"}
NONCE_MEMORY = 10_000

# Regions the sandbox knows: (local name, zones, instance id prefix). Only cn-shanghai is seeded with prices
# and stock; cn-beijing exists so multi-region reads (find_by_order) have a second, empty region.
REGIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cn-shanghai": ("East China 2 (Shanghai)", ("cn-shanghai-e", "cn-shanghai-f", "cn-shanghai-g"), "uf6"),
    "cn-beijing": ("North China 2 (Beijing)", ("cn-beijing-h", "cn-beijing-i", "cn-beijing-j"), "2ze"),
}

# SYNTHETIC stock (no source has Alibaba stock data): every seeded type is WithStock in every seeded zone except
# these, chosen to exercise each category. None = the zone does not sell the type at all.
DEFAULT_STOCK: dict[tuple[str, str, str], str | None] = {
    ("cn-shanghai", "cn-shanghai-e", "ecs.ebmgn7e.32xlarge"): "WithoutStock",
    ("cn-shanghai", "cn-shanghai-g", "ecs.gn7-c13g1.26xlarge"): "ClosedWithStock",
    ("cn-shanghai", "cn-shanghai-f", "ecs.gn6v-c8g1.16xlarge"): None,
}
STOCK_CATEGORIES = frozenset({"WithStock", "ClosedWithStock", "WithoutStock"})

# The seed's gpu_model column -> the broker's GPU key, for the GPUs a booted machine shows.
SEED_GPU_KEYS: dict[str, str] = {
    "T4": gpu_names.T4,
    "V100": gpu_names.V100_16_SXM2,
    "V100-32GB": gpu_names.V100_32_SXM2,
    "A10": gpu_names.A10,
    "A100": gpu_names.A100_40_SXM,
    "A100-80GB": gpu_names.A100_80_SXM,
}
# RunInstances reference: UserData "cannot exceed 32 KB before Base64 encoding"; SystemDisk.Size 20 to 2048 GiB for
# the default categories, at least the image's size, and max{40, image size} when not given.
USER_DATA_MAX_BYTES = 32 * 1024
SYSTEM_DISK_MIN_GB = 20
SYSTEM_DISK_MAX_GB = 2048
SYSTEM_DISK_DEFAULT_GB = 40

# The seed's gpu_model column -> the GPUSpec string ECS reports.
GPU_SPECS: dict[str, str] = {
    "T4": "NVIDIA T4",
    "V100": "NVIDIA V100",
    "V100-32GB": "NVIDIA V100",
    "A10": "NVIDIA A10",
    "A100": "NVIDIA A100",
    "A100-80GB": "NVIDIA A100",
}
# CPU-only types, so the catalogue read has something to filter out: (type, family, vCPUs, GiB).
CPU_TYPES: tuple[tuple[str, str, int, float], ...] = (
    ("ecs.g7.large", "ecs.g7", 2, 8.0),
    ("ecs.c7.xlarge", "ecs.c7", 4, 8.0),
    ("ecs.r7.2xlarge", "ecs.r7", 8, 64.0),
)
INSTANCE_TYPES_MAX_RESULTS = 1600
INSTANCE_TYPES_DEFAULT_RESULTS = 250
INSTANCES_MAX_RESULTS = 100
STATUS_MAX_PAGE = 50
SPOT_STRATEGIES = frozenset({"NoSpot", "SpotAsPriceGo", "SpotWithPriceLimit"})
# The currency each Alibaba Cloud site bills in, as DescribePrice (PriceInfo.Price.Currency) and
# DescribeSpotPriceHistory (Currency) state it: "China site: CNY. International site: USD." (ECS API reference).
SITE_CURRENCIES: dict[str, str] = {"china": "CNY", "international": "USD"}
DEFAULT_SITE = "china"

# What each fault kind looks like on the ECS wire: (Code, HTTP status, Message).
ECS_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.CAPACITY: (
        "OperationDenied.NoStock",
        403,
        "The requested resource is sold out in the specified zone; try other types of resources or other regions "
        "and zones.",
    ),
    FaultKind.QUOTA: (
        "QuotaExceed.ElasticQuota",
        403,
        "No additional quota is available for the specified ECS instance type.",
    ),
    # ECS throttles with HTTP 400: only the code says it is transient.
    FaultKind.THROTTLE: ("Throttling.User", 400, "Request was denied due to user flow control."),
    FaultKind.CREDENTIALS: ("InvalidAccessKeyId.NotFound", 404, "Specified access key is not found."),
}
CODE_STATUS: dict[str, int] = {
    "OperationDenied.NoStock": 403,
    "Zone.NotOnSale": 403,
    "InvalidResourceType.NotSupported": 403,
    "InstanceType.Offline": 403,
    "QuotaExceed.ElasticQuota": 403,
    "Throttling": 400,
    "Throttling.User": 400,
    "Throttling.Api": 400,
    "ServiceUnavailable": 503,
    "InternalError": 500,
    "InvalidAccessKeyId.NotFound": 404,
    "InvalidAccessKeyId.Inactive": 400,
    "SignatureDoesNotMatch": 400,
    "Forbidden.RAM": 403,
}
_STATUS_READS = frozenset({"DescribeInstances", "DescribeInstanceStatus"})


# ------------------------------------------------------------------------------------------------ seed


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: an hourly list price for a (region, instance type), with source."""

    region: str
    instance_type: str
    family: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: Decimal
    on_demand: Decimal
    spot: Decimal | None
    currency: str
    source: str
    source_date: str
    note: str = ""


def load_seed(path: Path = SEED_PATH) -> list[SeedPrice]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            SeedPrice(
                region=row["region"],
                instance_type=row["instance_type"],
                family=row["instance_type_family"],
                gpu_model=row["gpu_model"],
                gpu_count=int(row["gpu_count"]),
                gpu_memory_gb=int(row["gpu_memory_gb_each"]),
                vcpus=int(row["vcpus"]),
                memory_gib=Decimal(row["memory_gib"]),
                on_demand=Decimal(row["on_demand_cny"]),
                spot=Decimal(row["spot_cny"]) if row["spot_cny"] else None,
                currency=row["currency"],
                source=row["source"],
                source_date=row["source_date"],
                note=row.get("note", ""),
            )
            for row in csv.DictReader(handle)
        ]


def _catalogue_entry(row: SeedPrice) -> dict[str, Any]:
    return {
        "InstanceTypeId": row.instance_type,
        "InstanceTypeFamily": row.family,
        "InstanceCategory": "GPU-accelerated",
        "InstanceFamilyLevel": "EnterpriseLevel",
        "CpuArchitecture": "X86",
        "CpuCoreCount": row.vcpus,
        "MemorySize": float(row.memory_gib),
        "GPUAmount": row.gpu_count,
        "GPUSpec": GPU_SPECS.get(row.gpu_model, row.gpu_model),
        "GPUMemorySize": float(row.gpu_memory_gb),  # per GPU, GiB
        "LocalStorageCategory": "",
        "EniQuantity": 8,
    }


def _cpu_entry(name: str, family: str, vcpus: int, memory: float) -> dict[str, Any]:
    return {
        "InstanceTypeId": name,
        "InstanceTypeFamily": family,
        "InstanceCategory": "General-purpose",
        "InstanceFamilyLevel": "EnterpriseLevel",
        "CpuArchitecture": "X86",
        "CpuCoreCount": vcpus,
        "MemorySize": memory,
        "GPUAmount": 0,
        "GPUSpec": "",
        "GPUMemorySize": 0.0,
        "LocalStorageCategory": "",
        "EniQuantity": 3,
    }


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as the sandbox holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    spot_strategy: str
    client_token: str
    image_id: str
    tags: dict[str, str]
    # What the launch carried, as RunInstances received it (UserData still Base64-encoded).
    user_data: str = ""
    system_disk_gb: int = SYSTEM_DISK_DEFAULT_GB
    key_pair_name: str = ""
    security_group_id: str = ""
    vswitch_id: str = ""


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before authentication and faults were applied."""

    action: str
    region: str
    access_key_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(slots=True)
class _Instance:
    instance_id: str
    region: str
    zone: str
    instance_type: str
    image_id: str
    spot_strategy: str
    spot_price_limit: float
    client_token: str
    tags: dict[str, str]
    created: datetime
    private_ip: str
    vswitch_id: str
    security_group_id: str
    vpc_id: str = ""
    user_data: str = ""
    system_disk_gb: int = SYSTEM_DISK_DEFAULT_GB
    key_pair_name: str = ""
    status: str = "Pending"
    observed: int = 0
    stopped_mode: str = ""  # StopInstance's StoppedMode, while the instance is stopping or stopped


@dataclass(frozen=True, slots=True)
class SpotPricePoint:
    """One point of a (region, instance type)'s spot price history, in the currency of the site it is shown to."""

    zone: str
    price: Decimal
    currency: str
    timestamp: datetime
    origin_price: Decimal | None = None


@dataclass(frozen=True, slots=True)
class _Stored:
    fingerprint: tuple[tuple[str, str], ...]
    body: dict[str, Any]


@dataclass(slots=True)
class _Request:
    action: str
    region: str
    params: dict[str, str]
    access_key_id: str = ""
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


def _spot_row(point: SpotPricePoint, instance_type: str, network_type: str) -> dict[str, Any]:
    """A ``SpotPrices.SpotPriceType`` entry of DescribeSpotPriceHistory."""
    row: dict[str, Any] = {
        "ZoneId": point.zone,
        "InstanceType": instance_type,
        "IoOptimized": "optimized",
        "NetworkType": network_type,
        "SpotPrice": float(point.price),
        "Timestamp": point.timestamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if point.origin_price is not None:
        row["OriginPrice"] = float(point.origin_price)
    return row


def _minutes(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")
