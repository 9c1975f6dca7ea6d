"""The GCP sandbox's price seed: machine rows from the shared price list, and the per-resource SKU rates
derived from them.

GCP does not sell a machine at a price; Cloud Billing lists one SKU per resource (a GPU card-hour, a vCPU-hour,
a GiB-hour of RAM, per region and usage type) and a machine costs the sum. The shared list
(``../shared/data/gpu-list-prices.csv``, beside the project's folder) gives per-machine totals computed as
``host + GPU`` and names both inputs in its ``source`` column. ``derive_skus`` turns those into SKU rates such
that, for every machine row,
``round_half_up(sum of SKU rate x quantity, 5 decimals)`` equals the row's on-demand and spot totals exactly:

- GPU rate per card (per region, accelerator and usage type): the simplest decimal inside every row's rounding
  interval for its GPU component (``round5(count x rate) == component``), nearest the mean per-card value;
- vCPU and RAM rates (per region, host family and usage type): the CSV has one machine shape per family and
  region (or proportional shapes), so only the host total is observable, not its split. The split uses GCP's
  N1 us-central1 ratio (0.031611 USD per vCPU-hour to 0.004237 per GiB-hour, which reproduce the CSV's
  n1-standard-4 and n1-standard-64 host prices), scaled per family and region so every machine total lands
  inside its rounding interval (and, where possible, the host component inside its own).

Rounding is unavoidable, not a choice: a2-highgpu-8g is exactly 8 x a2-highgpu-1g in vCPUs, RAM and GPUs, yet
the CSV's totals are 29.38708 and 3.67339 (8 x 3.67339 = 29.38712), because the source rounded each component to
5 decimals. No linear per-unit price reproduces both without the final rounding step.

``python -m sandboxes.gcp.seed [shared_csv]`` rewrites ``prices.csv``; the sandbox only reads it.
"""

from __future__ import annotations

import csv
import hashlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

SEED_PATH = Path(__file__).parent / "prices.csv"
SHARED_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "gpu-list-prices.csv"
BILLING_SERVICE = "services/6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog

PRICE_PLACES = Decimal("0.00001")  # the precision of the shared list's totals (and of the adapter's quotes)
HALF_STEP = PRICE_PLACES / 2
MARGIN = Decimal("0.0000001")  # keep each composed total this far inside its rounding interval
NANO = Decimal("0.000000001")  # Money.nanos: the finest price the Billing API can state
N1_VCPU_RATE = Decimal("0.031611")
N1_RAM_RATE = Decimal("0.004237")

ON_DEMAND = "OnDemand"
PREEMPTIBLE = "Preemptible"

# Real zone names per region; the first two of each list (after the source's own zone) carry the seeded types.
REGION_ZONES: dict[str, tuple[str, ...]] = {
    "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
    "us-east1": ("us-east1-b", "us-east1-c", "us-east1-d"),
    "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
    "me-west1": ("me-west1-a", "me-west1-b", "me-west1-c"),
    "europe-west1": ("europe-west1-b", "europe-west1-c", "europe-west1-d"),
    "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
    "asia-northeast1": ("asia-northeast1-a", "asia-northeast1-b", "asia-northeast1-c"),
    "asia-south1": ("asia-south1-a", "asia-south1-b", "asia-south1-c"),
    "asia-southeast1": ("asia-southeast1-a", "asia-southeast1-b", "asia-southeast1-c"),
}
# The location word GCP puts at the end of a regional SKU description.
REGION_LOCATIONS: dict[str, str] = {
    "us-central1": "Iowa",
    "us-east1": "South Carolina",
    "us-east4": "Virginia",
    "me-west1": "Tel Aviv",
    "europe-west1": "Belgium",
    "europe-west4": "Netherlands",
    "asia-northeast1": "Tokyo",
    "asia-south1": "Mumbai",
    "asia-southeast1": "Singapore",
}


@dataclass(frozen=True, slots=True)
class Accelerator:
    """A GPU as Compute Engine names it (accelerator type) and as Cloud Billing names its SKU."""

    name: str
    description: str
    sku_name: str
    max_cards: int


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("nvidia-tesla-t4", "NVIDIA T4", "Tesla T4", 4),
        Accelerator("nvidia-tesla-v100", "NVIDIA V100", "Tesla V100", 8),
        Accelerator("nvidia-tesla-a100", "NVIDIA A100 40GB", "Tesla A100", 16),
        Accelerator("nvidia-l4", "NVIDIA L4", "L4", 8),
        Accelerator("nvidia-h100-80gb", "NVIDIA H100 80GB", "H100 80GB", 8),
        Accelerator("nvidia-h100-mega-80gb", "NVIDIA H100 80GB MEGA", "H100 80GB Mega", 8),
        Accelerator("nvidia-h200-141gb", "NVIDIA H200 141GB", "H200 141GB", 8),
    )
}
# The shared list's GPU row labels ("A100x8", "H100-MEGAx8") -> accelerator type.
GPU_LABELS: dict[str, str] = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "A100": "nvidia-tesla-a100",
    "L4": "nvidia-l4",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
}
# Machine type prefix -> the family word of its vCPU/RAM SKUs ("A2 Instance Core running in ..."), longest first.
HOST_FAMILIES: tuple[tuple[str, str], ...] = (
    ("a3-ultragpu-", "A3 Ultra"),
    ("a3-megagpu-", "A3 Mega"),
    ("a3-", "A3"),
    ("a2-", "A2"),
    ("g2-", "G2"),
    ("n1-", "N1 Predefined"),
)

_SOURCE_INPUTS = re.compile(
    r"host row '(?P<host>\S+) (?P<host_zone>\S+)' (?P<host_od>[\d.]+)/(?P<host_spot>[\d.]+) \+ "
    r"GPU row '(?P<label>[A-Z0-9-]+)x(?P<count>\d+) (?P<gpu_zone>\S+)' (?P<gpu_od>[\d.]+)/(?P<gpu_spot>[\d.]+)"
)

MACHINE_FIELDS = (
    "record",
    "region",
    "name",
    "machine_type",
    "family",
    "accelerator",
    "gpu_model",
    "gpu_count",
    "vcpus",
    "memory_gib",
    "on_demand_usd",
    "spot_usd",
    "host_on_demand_usd",
    "host_spot_usd",
    "gpu_on_demand_usd",
    "gpu_spot_usd",
    "zones",
    "resource",
    "usage_type",
    "unit_price_usd",
    "description",
    "derivation",
    "source",
    "source_date",
)


@dataclass(frozen=True, slots=True)
class SeedMachine:
    """One priced machine of the shared list. ``name`` is the broker's instance type (``n1-standard-8+1xT4``
    for an N1 host with attached GPUs); ``machine_type`` the Compute Engine machine type."""

    region: str
    name: str
    machine_type: str
    family: str
    accelerator: str
    gpu_model: str
    gpu_count: int
    vcpus: int
    memory_gib: int
    on_demand: Decimal
    spot: Decimal | None
    host_on_demand: Decimal
    host_spot: Decimal | None
    gpu_on_demand: Decimal
    gpu_spot: Decimal | None
    zones: tuple[str, ...]
    source: str
    source_date: str

    def total(self, usage_type: str) -> Decimal | None:
        return self.on_demand if usage_type == ON_DEMAND else self.spot


@dataclass(frozen=True, slots=True)
class SeedSku:
    """One Cloud Billing SKU: a unit price for a GPU card-hour (``resource="gpu"``, ``family`` = accelerator
    type), a vCPU-hour (``"core"``) or a GiB-hour of RAM (``"ram"``, ``family`` = host family) in one region."""

    sku_id: str
    region: str
    resource: str
    family: str
    usage_type: str
    unit_price: Decimal
    description: str
    derivation: str
    source: str
    source_date: str


# ------------------------------------------------------------------------------------------------ load


def load_seed(path: Path = SEED_PATH) -> tuple[list[SeedMachine], list[SeedSku]]:
    """The machine rows and SKU rows of the seed file."""
    machines: list[SeedMachine] = []
    skus: list[SeedSku] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["record"] == "machine":
                machines.append(
                    SeedMachine(
                        region=row["region"],
                        name=row["name"],
                        machine_type=row["machine_type"],
                        family=row["family"],
                        accelerator=row["accelerator"],
                        gpu_model=row["gpu_model"],
                        gpu_count=int(row["gpu_count"]),
                        vcpus=int(row["vcpus"]),
                        memory_gib=int(row["memory_gib"]),
                        on_demand=Decimal(row["on_demand_usd"]),
                        spot=_optional(row["spot_usd"]),
                        host_on_demand=Decimal(row["host_on_demand_usd"]),
                        host_spot=_optional(row["host_spot_usd"]),
                        gpu_on_demand=Decimal(row["gpu_on_demand_usd"]),
                        gpu_spot=_optional(row["gpu_spot_usd"]),
                        zones=tuple(row["zones"].split()),
                        source=row["source"],
                        source_date=row["source_date"],
                    )
                )
            elif row["record"] == "sku":
                skus.append(
                    SeedSku(
                        sku_id=row["name"],
                        region=row["region"],
                        resource=row["resource"],
                        family=row["family"],
                        usage_type=row["usage_type"],
                        unit_price=Decimal(row["unit_price_usd"]),
                        description=row["description"],
                        derivation=row["derivation"],
                        source=row["source"],
                        source_date=row["source_date"],
                    )
                )
            else:
                raise ValueError(f"{path}: unknown record kind {row['record']!r}")
    return machines, skus


def _optional(raw: str) -> Decimal | None:
    return Decimal(raw) if raw else None


def round_price(value: Decimal) -> Decimal:
    """The rule the adapter applies to a composed machine price."""
    return value.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)


# ------------------------------------------------------------------------------------- shared list rows


def host_family(machine_type: str) -> str:
    for prefix, family in HOST_FAMILIES:
        if machine_type.startswith(prefix):
            return family
    raise ValueError(f"no host family for machine type {machine_type!r}")


def machines_from_shared(path: Path = SHARED_CSV) -> list[SeedMachine]:
    """Every GCP row of the shared price list, with the host and GPU inputs parsed from its ``source``."""
    machines: list[SeedMachine] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["provider"] != "GCP":
                continue
            match = _SOURCE_INPUTS.search(row["source"])
            if match is None:
                raise ValueError(f"GCP row {row['instance_type']} {row['region']}: source names no host + GPU rows")
            region = row["region"]
            count = int(match["count"])
            if count != int(row["gpu_count"]):
                raise ValueError(f"{row['instance_type']}: GPU row count {count} != gpu_count {row['gpu_count']}")
            zones = REGION_ZONES[region]
            first = match["host_zone"]
            # The zone the source priced in, and the next one of the region: every type is offered in two zones.
            second = zones[(zones.index(first) + 1) % len(zones)]
            spot = _optional(row["spot_price"])
            machines.append(
                SeedMachine(
                    region=region,
                    name=row["instance_type"],
                    machine_type=match["host"],
                    family=host_family(match["host"]),
                    accelerator=GPU_LABELS[match["label"]],
                    gpu_model=row["gpu_model"],
                    gpu_count=count,
                    vcpus=int(row["vcpus"]),
                    memory_gib=int(row["memory_gib"]),
                    on_demand=Decimal(row["on_demand_price"]),
                    spot=spot,
                    host_on_demand=Decimal(match["host_od"]),
                    host_spot=Decimal(match["host_spot"]) if spot is not None else None,
                    gpu_on_demand=Decimal(match["gpu_od"]),
                    gpu_spot=Decimal(match["gpu_spot"]) if spot is not None else None,
                    zones=(first, second),
                    source=row["source"],
                    source_date=row["source_date"],
                )
            )
    return machines


# ------------------------------------------------------------------------------------------- derivation


@dataclass(frozen=True, slots=True)
class _Interval:
    low: Decimal
    high: Decimal  # exclusive

    def __and__(self, other: _Interval) -> _Interval:
        return _Interval(max(self.low, other.low), min(self.high, other.high))

    @property
    def empty(self) -> bool:
        return self.low >= self.high


def _rounds_to(target: Decimal, offset: Decimal, scale: Decimal) -> _Interval:
    """Values x with ``round5(offset + scale * x) == target``, kept ``MARGIN`` inside the rounding boundaries."""
    return _Interval((target - HALF_STEP + MARGIN - offset) / scale, (target + HALF_STEP - MARGIN - offset) / scale)


def _all(intervals: Iterable[_Interval]) -> _Interval:
    items = list(intervals)
    result = items[0]
    for item in items[1:]:
        result = result & item
    return result


def _simplest(interval: _Interval, preferred: Decimal) -> Decimal:
    """The decimal with the fewest places (at most nanos) inside ``interval``, nearest ``preferred``."""
    if interval.empty:
        raise ValueError(f"no price satisfies every row (empty interval {interval})")
    anchor = min(max(preferred, interval.low), interval.high)
    for places in range(10):
        step = Decimal(1).scaleb(-places)
        base = anchor.quantize(step, rounding=ROUND_HALF_UP)
        for candidate in sorted((base - step, base, base + step), key=lambda c: abs(c - anchor)):
            if interval.low <= candidate < interval.high:
                return candidate
    raise ValueError(f"no nano-precise price inside {interval}")


def _gpu_component(machine: SeedMachine, usage_type: str) -> Decimal | None:
    return machine.gpu_on_demand if usage_type == ON_DEMAND else machine.gpu_spot


def _host_component(machine: SeedMachine, usage_type: str) -> Decimal | None:
    return machine.host_on_demand if usage_type == ON_DEMAND else machine.host_spot


def _sku_id(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).hexdigest().upper()
    return f"{digest[0:4]}-{digest[4:8]}-{digest[8:12]}"


def _describe(resource: str, family: str, usage_type: str, region: str) -> str:
    """The SKU description as Cloud Billing words it. Spot GPU cards are "attached to Spot Preemptible VMs";
    only the vCPU and RAM SKUs of spot VMs begin with "Spot Preemptible"."""
    spot = usage_type == PREEMPTIBLE
    location = REGION_LOCATIONS[region]
    if resource == "gpu":
        attached = "attached to Spot Preemptible VMs " if spot else ""
        return f"Nvidia {ACCELERATORS[family].sku_name} GPU {attached}running in {location}"
    word = "Core" if resource == "core" else "Ram"
    return f"{'Spot Preemptible ' if spot else ''}{family} Instance {word} running in {location}"


def _sources(machines: Sequence[SeedMachine]) -> tuple[str, str]:
    sources = sorted({m.source.split(" [", 1)[0] for m in machines})
    dates = sorted({m.source_date for m in machines})
    return "; ".join(sources), "; ".join(dates)


def _fmt(value: Decimal) -> str:
    return f"{value.normalize():f}"


def derive_skus(machines: Sequence[SeedMachine]) -> list[SeedSku]:
    """SKU rates reproducing every machine's totals (see the module docstring). Raises ``ValueError`` when a
    group of rows admits no rate, which would mean the shared list contradicts itself beyond rounding."""
    skus: list[SeedSku] = []
    for usage_type in (ON_DEMAND, PREEMPTIBLE):
        priced = [m for m in machines if m.total(usage_type) is not None]
        gpu_rates: dict[tuple[str, str], Decimal] = {}
        by_gpu: dict[tuple[str, str], list[SeedMachine]] = defaultdict(list)
        for m in priced:
            by_gpu[(m.region, m.accelerator)].append(m)
        for (region, accelerator), rows in sorted(by_gpu.items()):
            components = [(m, _gpu_component(m, usage_type) or Decimal(0)) for m in rows]
            interval = _all(_rounds_to(c, Decimal(0), Decimal(m.gpu_count)) for m, c in components)
            preferred = sum((c / m.gpu_count for m, c in components), Decimal(0)) / len(components)
            rate = _simplest(interval, preferred)
            gpu_rates[(region, accelerator)] = rate
            inputs = ", ".join(f"{m.name}: {_fmt(c)}/{m.gpu_count}" for m, c in components)
            source, source_date = _sources(rows)
            skus.append(
                SeedSku(
                    sku_id=_sku_id(region, "gpu", accelerator, usage_type),
                    region=region,
                    resource="gpu",
                    family=accelerator,
                    usage_type=usage_type,
                    unit_price=rate,
                    description=_describe("gpu", accelerator, usage_type, region),
                    derivation=f"per card: simplest decimal with round5(cards x rate) == each GPU component ({inputs})",
                    source=source,
                    source_date=source_date,
                )
            )

        by_host: dict[tuple[str, str], list[SeedMachine]] = defaultdict(list)
        for m in priced:
            by_host[(m.region, m.family)].append(m)
        for (region, family), rows in sorted(by_host.items()):
            skus.extend(_host_skus(region, family, usage_type, rows, gpu_rates))
    return skus


def _host_skus(
    region: str, family: str, usage_type: str, rows: Sequence[SeedMachine], gpu_rates: dict[tuple[str, str], Decimal]
) -> list[SeedSku]:
    # Offsets: what the GPUs already contribute to each row's total.
    gpu_part = {m.name: gpu_rates[(m.region, m.accelerator)] * m.gpu_count for m in rows}
    base = {m.name: N1_VCPU_RATE * m.vcpus + N1_RAM_RATE * m.memory_gib for m in rows}
    scale = _all(_rounds_to(m.total(usage_type) or Decimal(0), gpu_part[m.name], base[m.name]) for m in rows)
    # Prefer also reproducing each host component; drop that wish where the totals alone leave no room.
    component = _all(_rounds_to(_host_component(m, usage_type) or Decimal(0), Decimal(0), base[m.name]) for m in rows)
    if not (scale & component).empty:
        scale = scale & component
    preferred_scale = sum(((_host_component(m, usage_type) or Decimal(0)) / base[m.name] for m in rows), Decimal(0))
    preferred_scale /= len(rows)
    core = _simplest(_Interval(scale.low * N1_VCPU_RATE, scale.high * N1_VCPU_RATE), preferred_scale * N1_VCPU_RATE)
    # With the core rate fixed, the RAM rate has an exact interval per row.
    ram_interval = _all(
        _rounds_to(m.total(usage_type) or Decimal(0), gpu_part[m.name] + core * m.vcpus, Decimal(m.memory_gib))
        for m in rows
    )
    ram = _simplest(ram_interval, core * N1_RAM_RATE / N1_VCPU_RATE)
    for m in rows:
        composed = round_price(core * m.vcpus + ram * m.memory_gib + gpu_part[m.name])
        if composed != m.total(usage_type):
            raise ValueError(f"{m.name} {region} {usage_type}: composed {composed} != {m.total(usage_type)}")
    shapes = ", ".join(
        f"{m.name} {m.vcpus} vCPU/{m.memory_gib} GiB host {_fmt(_host_component(m, usage_type) or Decimal(0))} "
        f"total {_fmt(m.total(usage_type) or Decimal(0))}"
        for m in rows
    )
    split = f"vCPU:RAM at the N1 ratio {N1_VCPU_RATE}:{N1_RAM_RATE}, scaled so round5(host + GPUs) == each total"
    source, source_date = _sources(rows)
    return [
        SeedSku(
            sku_id=_sku_id(region, resource, family, usage_type),
            region=region,
            resource=resource,
            family=family,
            usage_type=usage_type,
            unit_price=rate,
            description=_describe(resource, family, usage_type, region),
            derivation=f"{split} ({shapes})",
            source=source,
            source_date=source_date,
        )
        for resource, rate in (("core", core), ("ram", ram))
    ]


# -------------------------------------------------------------------------------------------------- write


def seed_rows(machines: Sequence[SeedMachine], skus: Sequence[SeedSku]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for m in sorted(machines, key=lambda m: (m.region, m.name)):
        rows.append(
            {
                "record": "machine",
                "region": m.region,
                "name": m.name,
                "machine_type": m.machine_type,
                "family": m.family,
                "accelerator": m.accelerator,
                "gpu_model": m.gpu_model,
                "gpu_count": str(m.gpu_count),
                "vcpus": str(m.vcpus),
                "memory_gib": str(m.memory_gib),
                "on_demand_usd": _fmt(m.on_demand),
                "spot_usd": _fmt(m.spot) if m.spot is not None else "",
                "host_on_demand_usd": _fmt(m.host_on_demand),
                "host_spot_usd": _fmt(m.host_spot) if m.host_spot is not None else "",
                "gpu_on_demand_usd": _fmt(m.gpu_on_demand),
                "gpu_spot_usd": _fmt(m.gpu_spot) if m.gpu_spot is not None else "",
                "zones": " ".join(m.zones),
                "derivation": "copied from the shared list; host/GPU inputs parsed from its source column",
                "source": m.source,
                "source_date": m.source_date,
            }
        )
    for s in sorted(skus, key=lambda s: (s.region, s.resource, s.family, s.usage_type)):
        rows.append(
            {
                "record": "sku",
                "region": s.region,
                "name": s.sku_id,
                "family": s.family,
                "resource": s.resource,
                "usage_type": s.usage_type,
                "unit_price_usd": f"{s.unit_price:f}",
                "description": s.description,
                "derivation": s.derivation,
                "source": s.source,
                "source_date": s.source_date,
            }
        )
    return [{field: row.get(field, "") for field in MACHINE_FIELDS} for row in rows]


def write_seed(path: Path, machines: Sequence[SeedMachine], skus: Sequence[SeedSku]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=MACHINE_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(seed_rows(machines, skus))


def main(argv: Sequence[str]) -> int:
    shared = Path(argv[0]) if argv else SHARED_CSV
    machines = machines_from_shared(shared)
    write_seed(SEED_PATH, machines, derive_skus(machines))
    print(f"wrote {SEED_PATH} ({len(machines)} machines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
