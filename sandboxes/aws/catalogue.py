"""The AWS sandbox's catalogue: the seed list prices (``prices.csv``) and what they become on AWS's wire, moto's
offering table extended so every seeded type is offered where its price was seen, and Price List items shaped
like AWS's. ``app`` serves them.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS, INSTANCE_TYPES

SEED_PATH = Path(__file__).parent / "prices.csv"
ON_DEMAND_TERM = "JRTCKXETXF"  # AWS's offer term code for on-demand
HOURLY_RATE = "6YS6EN2CT7"  # AWS's rate code for a per-hour price dimension
PRICE_LIST_VERSION = "20250601000000"  # a fixed sandbox publication, not a real AWS one
PRICE_LIST_PUBLISHED = "2025-06-01T00:00:00Z"

REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
    "eu-north-1": "EU (Stockholm)",
    "ap-south-1": "Asia Pacific (Mumbai)",
    "ap-southeast-2": "Asia Pacific (Sydney)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
    "ap-northeast-2": "Asia Pacific (Seoul)",
    "ap-east-1": "Asia Pacific (Hong Kong)",
}
USAGE_PREFIX = {
    "us-east-1": "",
    "us-west-2": "USW2-",
    "eu-west-1": "EU-",
    "eu-central-1": "EUC1-",
    "eu-north-1": "EUN1-",
    "ap-south-1": "APS3-",
    "ap-southeast-2": "APS2-",
    "ap-northeast-1": "APN1-",
    "ap-northeast-2": "APN2-",
    "ap-east-1": "APE1-",
}


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: list prices for a (region, instance type), with their source."""

    region: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    on_demand: Decimal
    spot: Decimal | None
    spot_zone_id: str
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
                on_demand=Decimal(row["on_demand_usd"]),
                spot=Decimal(row["spot_usd"]) if row["spot_usd"] else None,
                spot_zone_id=row["spot_az_id"],
                source=row["source"],
                source_date=row["source_date"],
                note=row.get("note", ""),
            )
            for row in csv.DictReader(handle)
        ]


def vary(base: Decimal, key: str, ceiling: Decimal, spread_pct: int) -> Decimal:
    """A deterministic price within ``spread_pct`` % of ``base``, kept below ``ceiling``."""
    step = zlib.crc32(key.encode()) % (2 * spread_pct + 1) - spread_pct
    price = base * (100 + step) / 100
    if price >= ceiling:
        price = base * (100 - abs(step)) / 100
    return price.quantize(Decimal("0.0001"))


def ensure_offered(seed: Iterable[SeedPrice]) -> dict[tuple[str, str], list[str]]:
    """Add moto offerings so each seeded type is offered in its spot zone and in at least two zones.

    Mutates moto's process-global offering table (idempotently): moto validates ``RunInstances`` placement
    against the same table, so launches into the added zones work too.
    """
    by_zone = INSTANCE_TYPE_OFFERINGS["availability-zone"]
    by_zone_id = INSTANCE_TYPE_OFFERINGS["availability-zone-id"]
    by_region = INSTANCE_TYPE_OFFERINGS["region"]
    result: dict[tuple[str, str], list[str]] = {}
    for row in seed:
        region_zones = RegionsAndZonesBackend.zones.get(row.region, [])
        zone_ids = {z.name: z.zone_id for z in region_zones}
        offered = {o["Location"] for o in by_zone.get(row.region, []) if o["InstanceType"] == row.instance_type}
        wanted = set(offered)
        wanted.update(name for name, zid in zone_ids.items() if zid == row.spot_zone_id)
        for name in sorted(zone_ids):
            if len(wanted) >= 2:
                break
            wanted.add(name)
        for name in sorted(wanted - offered):
            by_zone.setdefault(row.region, []).append(
                {"InstanceType": row.instance_type, "Location": name, "LocationType": "availability-zone"}
            )
            by_zone_id.setdefault(row.region, []).append(
                {"InstanceType": row.instance_type, "Location": zone_ids[name], "LocationType": "availability-zone-id"}
            )
        regional = by_region.setdefault(row.region, [])
        if not any(o["InstanceType"] == row.instance_type for o in regional):
            regional.append({"InstanceType": row.instance_type, "Location": row.region, "LocationType": "region"})
        result[(row.region, row.instance_type)] = sorted(wanted)
    return result


def _sku(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return base64.b32encode(digest).decode()[:16]


def price_product(row: SeedPrice, capacity_status: str, price: Decimal) -> dict[str, Any]:
    """A Price List item shaped like AWS's: product attributes plus on-demand terms."""
    catalogue = INSTANCE_TYPES.get(row.instance_type, {})
    memory_gib = Decimal(catalogue.get("MemoryInfo", {}).get("SizeInMiB", 0)) / 1024
    usage = {
        "Used": "BoxUsage",
        "UnusedCapacityReservation": "UnusedBox",
        "AllocatedCapacityReservation": "Reservation",
    }
    label = {"Used": "On Demand", "UnusedCapacityReservation": "Unused Reservation"}.get(capacity_status, "Reservation")
    sku = _sku(row.region, row.instance_type, capacity_status)
    term = f"{sku}.{ON_DEMAND_TERM}"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "sku": sku,
            "attributes": {
                "servicecode": "AmazonEC2",
                "servicename": "Amazon Elastic Compute Cloud",
                "location": REGION_NAMES.get(row.region, row.region),
                "locationType": "AWS Region",
                "regionCode": row.region,
                "instanceType": row.instance_type,
                "instanceFamily": "GPU instance",
                "currentGeneration": "Yes",
                "vcpu": str(catalogue.get("VCpuInfo", {}).get("DefaultVCpus", "")),
                "memory": f"{memory_gib.normalize():f} GiB",
                "gpu": str(row.gpu_count),
                "networkPerformance": str(catalogue.get("NetworkInfo", {}).get("NetworkPerformance", "")),
                "operatingSystem": "Linux",
                "licenseModel": "No License required",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": capacity_status,
                "marketoption": "OnDemand",
                "operation": "RunInstances",
                "usagetype": f"{USAGE_PREFIX.get(row.region, row.region.upper() + '-')}{usage[capacity_status]}:"
                f"{row.instance_type}",
            },
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                term: {
                    "priceDimensions": {
                        f"{term}.{HOURLY_RATE}": {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": (
                                f"${price.normalize():f} per {label} Linux {row.instance_type} Instance Hour"
                            ),
                            "appliesTo": [],
                            "rateCode": f"{term}.{HOURLY_RATE}",
                            "beginRange": "0",
                            "pricePerUnit": {"USD": f"{price:.10f}"},
                        }
                    },
                    "sku": sku,
                    "effectiveDate": PRICE_LIST_PUBLISHED,
                    "offerTermCode": ON_DEMAND_TERM,
                    "termAttributes": {},
                }
            }
        },
        "version": PRICE_LIST_VERSION,
        "publicationDate": PRICE_LIST_PUBLISHED,
    }
