"""What the Tencent sandbox sells: seed prices, regions and zones, catalogue rows and public images.

Prices come from ``prices.csv``, which carries the shared list-price table's Tencent rows verbatim
(source, price range note, source date). That source quotes one mainland-China price per type and says its
prices are for mainland China, so the same price is served in each of the three mainland regions below. Which
zones sell which type, and which are sold out, are sandbox choices recorded in the CSV (not sourced).
"""

from __future__ import annotations

import csv
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from providers import gpu_names

SEED_PATH = Path(__file__).parent / "prices.csv"
ON_DEMAND = "POSTPAID_BY_HOUR"
SPOT = "SPOTPAID"
# The currency an account is billed in is its site's: CNY on the China site (the seed's prices), USD on the
# International site. CVM's answers never say which (ItemPrice has no currency field).
SITE_CURRENCIES: dict[str, str] = {"china": "CNY", "international": "USD"}
DEFAULT_SITE = "china"
SEED_CURRENCY = SITE_CURRENCIES[DEFAULT_SITE]


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    zone_id: str
    label: str


# Real CVM zone names and ids (region number * 100000 + zone number) of three mainland regions.
REGIONS: dict[str, tuple[Zone, ...]] = {
    "ap-guangzhou": (
        Zone("ap-guangzhou-3", "100003", "广州三区"),
        Zone("ap-guangzhou-4", "100004", "广州四区"),
        Zone("ap-guangzhou-6", "100006", "广州六区"),
    ),
    "ap-shanghai": (
        Zone("ap-shanghai-2", "200002", "上海二区"),
        Zone("ap-shanghai-4", "200004", "上海四区"),
        Zone("ap-shanghai-5", "200005", "上海五区"),
    ),
    "ap-beijing": (
        Zone("ap-beijing-5", "800005", "北京五区"),
        Zone("ap-beijing-6", "800006", "北京六区"),
        Zone("ap-beijing-7", "800007", "北京七区"),
    ),
}

# The CSV's gpu_model label -> the GpuType string served by DescribeInstanceTypeConfigs. The SDK documents the
# field but not its spelling; the sandbox uses "NVIDIA <model>" and the adapter only looks for the model token.
GPU_TYPES: dict[str, str] = {"T4": "NVIDIA T4", "V100-32GB": "NVIDIA V100", "A100": "NVIDIA A100"}
# The CSV's gpu_model label -> the broker's GPU key, for the GPUs a booted sandbox machine shows.
GPU_KEYS: dict[str, str] = {"T4": gpu_names.T4, "V100-32GB": gpu_names.V100_32_SXM2, "A100": gpu_names.A100_40_PCIE}
TYPE_NAMES: dict[str, str] = {
    "GT4": "GPU计算型GT4",
    "GN10X": "GPU计算型GN10X",
    "GN10Xp": "GPU计算型GN10Xp",
    "GN7": "GPU计算型GN7",
    "GI3X": "GPU推理型GI3X",
}


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: a type's list price in one region, with its source."""

    region: str
    zones: tuple[str, ...]
    sold_out_zones: tuple[str, ...]
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: int
    on_demand: Decimal
    spot: Decimal | None
    source_region: str
    source: str
    source_date: str
    note: str

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def gpu_type(self) -> str:
        return GPU_TYPES.get(self.gpu_model, self.gpu_model)

    @property
    def gpu_key(self) -> str:
        return GPU_KEYS.get(self.gpu_model, self.gpu_model)

    @property
    def all_zones(self) -> tuple[str, ...]:
        return self.zones + self.sold_out_zones


def load_seed(path: Path = SEED_PATH) -> list[SeedPrice]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            SeedPrice(
                region=row["region"],
                zones=tuple(row["zones"].split()),
                sold_out_zones=tuple(row["sold_out_zones"].split()),
                instance_type=row["instance_type"],
                gpu_model=row["gpu_model"],
                gpu_count=int(row["gpu_count"]),
                gpu_memory_gb=int(row["gpu_memory_gb_each"]),
                vcpus=int(row["vcpus"]),
                memory_gib=int(row["memory_gib"]),
                on_demand=Decimal(row["on_demand_cny"]),
                spot=Decimal(row["spot_cny"]) if row["spot_cny"] else None,
                source_region=row["source_region"],
                source=row["source"],
                source_date=row["source_date"],
                note=row["note"],
            )
            for row in csv.DictReader(handle)
        ]


def _price(amount: Decimal) -> dict[str, Any]:
    # No account discount in the sandbox: the discounted price is the list price and Discount is 100 (percent).
    return {"UnitPrice": float(amount), "ChargeUnit": "HOUR", "UnitPriceDiscount": float(amount), "Discount": 100.0}


def quota_rows(
    seed: Iterable[SeedPrice],
    sold_out: Collection[tuple[str, str, str]],
    prices: Mapping[tuple[str, str, str], Decimal] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(region, ``InstanceTypeQuotaSet`` row) of every region: one per (zone, type, charge type) with a price.

    ``prices`` ((region, type, charge type) -> hourly price) replaces the seed's CNY prices, for an account on
    another site; a row without an entry there is left out rather than priced in the wrong currency."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for row in seed:
        charges = [(ON_DEMAND, row.on_demand)] + ([(SPOT, row.spot)] if row.spot is not None else [])
        if prices is not None:
            charges = [
                (c, prices[(row.region, row.instance_type, c)])
                for c in (ON_DEMAND, SPOT)
                if (row.region, row.instance_type, c) in prices
            ]
        for zone in row.all_zones:
            out = (row.region, zone, row.instance_type) in sold_out
            for charge, amount in charges:
                rows.append(
                    (
                        row.region,
                        {
                            "Zone": zone,
                            "InstanceType": row.instance_type,
                            "InstanceChargeType": charge,
                            "NetworkCard": 25,
                            "Externals": {},
                            "Cpu": row.vcpus,
                            "Memory": row.memory_gib,
                            "InstanceFamily": row.family,
                            "TypeName": TYPE_NAMES.get(row.family, row.family),
                            "LocalDiskTypeList": [],
                            "Status": "SOLD_OUT" if out else "SELL",
                            "Price": _price(amount),
                            "SoldOutReason": "Sold out in this zone (sandbox stock)." if out else "",
                            "InstanceBandwidth": 25.0,
                            "InstancePps": 500,
                            "StorageBlockAmount": 0,
                            "CpuType": "",
                            "Gpu": row.gpu_count,
                            "Fpga": 0,
                            "Remark": "",
                            "GpuCount": float(row.gpu_count),
                            "Frequency": "",
                            "StatusCategory": "WithoutStock" if out else "EnoughStock",
                        },
                    )
                )
    return rows


def type_config_rows(seed: Iterable[SeedPrice]) -> list[tuple[str, dict[str, Any]]]:
    """(region, ``InstanceTypeConfigSet`` row) of every region: one per (zone, type), sold out or not."""
    return [
        (
            row.region,
            {
                "Zone": zone,
                "InstanceType": row.instance_type,
                "InstanceFamily": row.family,
                "GPU": row.gpu_count,
                "CPU": row.vcpus,
                "Memory": row.memory_gib,
                "FPGA": 0,
                "GpuCount": float(row.gpu_count),
                "GpuType": row.gpu_type,
                "GpuMemory": float(row.gpu_memory_gb),
            },
        )
        for row in seed
        for zone in row.all_zones
    ]


def _image(image_id: str, os_name: str, platform: str, created: str, **extra: Any) -> dict[str, Any]:
    return {
        "ImageId": image_id,
        "OsName": os_name,
        "ImageType": "PUBLIC_IMAGE",
        "CreatedTime": created,
        "ImageName": os_name.replace("64bit", "64位"),
        "ImageDescription": os_name,
        "ImageSize": 20,
        "Architecture": extra.pop("Architecture", "x86_64"),
        "ImageState": "NORMAL",
        "Platform": platform,
        "ImageCreator": "",
        "ImageSource": "OFFICIAL",
        "SyncPercent": None,
        "IsSupportCloudinit": True,
        "SnapshotSet": [],
        "Tags": [],
        "LicenseType": "TencentCloud",
        "ImageFamily": "",
        "ImageDeprecated": extra.pop("ImageDeprecated", False),
    }


# Public images: the ids are the sandbox's own (real public image ids differ); names follow CVM's style.
PUBLIC_IMAGES: tuple[dict[str, Any], ...] = (
    _image("img-sbxu2004", "Ubuntu Server 20.04 LTS 64bit", "Ubuntu", "2024-03-01T00:00:00Z"),
    _image("img-sbxu2204", "Ubuntu Server 22.04 LTS 64bit", "Ubuntu", "2025-01-10T00:00:00Z"),
    _image("img-sbxu2404", "Ubuntu Server 24.04 LTS 64bit", "Ubuntu", "2025-03-20T00:00:00Z"),
    _image("img-sbxa2404", "Ubuntu Server 24.04 LTS 64bit", "Ubuntu", "2025-04-01T00:00:00Z", Architecture="arm"),
    _image("img-sbxu2410", "Ubuntu Server 24.10 64bit", "Ubuntu", "2025-02-01T00:00:00Z", ImageDeprecated=True),
    _image("img-sbxc7090", "CentOS 7.9 64bit", "CentOS", "2024-06-01T00:00:00Z"),
    _image("img-sbxts310", "TencentOS Server 3.1 (TK4)", "TencentOS", "2025-01-01T00:00:00Z"),
)
