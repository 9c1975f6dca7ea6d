"""What the Azure sandbox sells: the seed prices (``prices.csv``), the sizes' names as ARM and the Retail Prices
API spell them, and the regions' zones and restrictions that exercise the adapter."""

from __future__ import annotations

import csv
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from providers import gpu_names

SEED_PATH = Path(__file__).parent / "prices.csv"
COMPUTE = "Microsoft.Compute"
ZONAL_REGIONS = frozenset({"eastus", "southcentralus", "westus3"})  # westus has no availability zones
REGION_DISPLAY = {
    "eastus": "US East",
    "southcentralus": "US South Central",
    "westus": "US West",
    "westus3": "US West 3",
}


# Sandbox availability quirks, so the adapter's handling of zones and restrictions is exercised.
ZONE_OVERRIDES: dict[tuple[str, str], list[str]] = {("westus3", "Standard_NC32ads_A10_v4"): ["1", "2"]}
ZONE_RESTRICTIONS: dict[tuple[str, str], list[str]] = {("eastus", "Standard_ND96isr_H100_v5"): ["3"]}
LOCATION_RESTRICTIONS = frozenset({("eastus", "Standard_NC24rs_v3")})
RDMA_SIZES = re.compile(r"^Standard_(ND40rs_v2|NC24rs_v3|ND96asr_v4|ND96amsr_A100_v4|ND96isr_H100_v5)$")
WINDOWS_UPLIFT_PER_VCPU = Decimal("0.046")  # decoy Windows rows only: never a price the broker may use
RESERVATION_DISCOUNT = Decimal("0.62")  # decoy reservation rows only


# What the sandbox's "hardware" is (the GPUs nvidia-smi would list), from the size's series as Azure documents them.
GPU_KEYS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Standard_NC\d+as_T4_v3$"), gpu_names.T4),
    (re.compile(r"^Standard_NC\d+ads_A10_v4$"), gpu_names.A10),
    (re.compile(r"^Standard_NC\d+r?s_v3$"), gpu_names.V100_16_PCIE),
    (re.compile(r"^Standard_ND40rs_v2$"), gpu_names.V100_32_SXM2),
    (re.compile(r"^Standard_NC\d+ads_A100_v4$"), gpu_names.A100_80_PCIE),
    (re.compile(r"^Standard_ND96asr_v4$"), gpu_names.A100_40_SXM),
    (re.compile(r"^Standard_ND96amsr_A100_v4$"), gpu_names.A100_80_SXM),
    (re.compile(r"^Standard_NCC?\d+adi?s_H100_v5$"), gpu_names.H100_NVL),
    (re.compile(r"^Standard_ND96isr_H100_v5$"), gpu_names.H100_SXM),
)


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: a size in a region with its list prices and their source."""

    region: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: Decimal
    on_demand: Decimal
    spot: Decimal | None
    source: str
    source_date: str
    note: str = ""


def load_seed(path: Path = SEED_PATH) -> list[SeedPrice]:
    with path.open(newline="") as handle:
        return [
            SeedPrice(
                region=row["region"],
                instance_type=row["instance_type"],
                gpu_model=row["gpu_model"],
                gpu_count=int(row["gpu_count"]),
                gpu_memory_gb=int(row["gpu_memory_gb"]),
                vcpus=int(row["vcpus"]),
                memory_gib=Decimal(row["memory_gib"]),
                on_demand=Decimal(row["on_demand_usd"]),
                spot=Decimal(row["spot_usd"]) if row["spot_usd"] else None,
                source=row["source"],
                source_date=row["source_date"],
                note=row.get("note", ""),
            )
            for row in csv.DictReader(handle)
        ]


def _short(size: str) -> str:
    return size.removeprefix("Standard_")


def _meter(size: str) -> str:
    """``Standard_NC24ads_A100_v4`` -> ``NC24ads A100 v4``, the Retail Prices ``skuName``/``meterName`` form."""
    return _short(size).replace("_", " ")


def _series(size: str) -> str:
    head, _, rest = _short(size).partition("_")
    return re.sub(r"\d+", "", head, count=1) + (f"_{rest}" if rest else "")


def _family(size: str) -> str:
    return "standard" + _series(size).replace("_", "") + "Family"


def _gpu_key(size: str, seed: SeedPrice) -> str:
    return next((key for pattern, key in GPU_KEYS if pattern.match(size)), seed.gpu_model)


def _uuid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "sandbox-azure/" + "/".join(parts)))
