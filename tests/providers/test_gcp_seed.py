"""The GCP price seed: every shared-list row is carried over, and the derived SKUs reproduce its totals exactly."""

from __future__ import annotations

import csv
from decimal import Decimal

import pytest

from sandboxes.gcp.seed import (
    ON_DEMAND,
    PREEMPTIBLE,
    SEED_PATH,
    SHARED_CSV,
    derive_skus,
    load_seed,
    machines_from_shared,
    round_price,
    seed_rows,
)

MACHINES, SKUS = load_seed()
RATES = {(s.region, s.usage_type, s.resource, s.family): s.unit_price for s in SKUS}
needs_shared = pytest.mark.skipif(not SHARED_CSV.exists(), reason="the shared price list is not on this machine")


def _composed(machine, usage_type):
    gpu = RATES[(machine.region, usage_type, "gpu", machine.accelerator)] * machine.gpu_count
    core = RATES[(machine.region, usage_type, "core", machine.family)] * machine.vcpus
    ram = RATES[(machine.region, usage_type, "ram", machine.family)] * machine.memory_gib
    return round_price(gpu + core + ram)


@pytest.mark.parametrize("machine", MACHINES, ids=[f"{m.region}/{m.name}" for m in MACHINES])
def test_composed_skus_reproduce_the_on_demand_and_spot_totals(machine):
    assert _composed(machine, ON_DEMAND) == machine.on_demand
    if machine.spot is None:
        assert (machine.region, PREEMPTIBLE, "gpu", machine.accelerator) not in RATES
    else:
        assert _composed(machine, PREEMPTIBLE) == machine.spot


def test_no_spot_rate_at_or_above_its_on_demand_rate():
    for (region, usage_type, resource, family), price in RATES.items():
        if usage_type == PREEMPTIBLE:
            assert price < RATES[(region, ON_DEMAND, resource, family)], (region, resource, family)
    assert all(m.spot is None or m.spot < m.on_demand for m in MACHINES)


def test_every_sku_rate_fits_in_nanos_and_records_its_derivation():
    for sku in SKUS:
        assert sku.unit_price > 0
        assert sku.unit_price == sku.unit_price.quantize(Decimal("0.000000001"))
        assert sku.derivation and sku.source.startswith("github:skypilot-org/skypilot-catalog") and sku.source_date


@needs_shared
def test_the_seed_carries_every_gcp_row_of_the_shared_list():
    with SHARED_CSV.open(newline="") as handle:
        shared = [r for r in csv.DictReader(handle) if r["provider"] == "GCP"]
    seeded = {(m.region, m.name): m for m in MACHINES}

    assert len(seeded) == len(shared) == 23
    for row in shared:
        machine = seeded[(row["region"], row["instance_type"])]
        assert machine.on_demand == Decimal(row["on_demand_price"])
        assert machine.spot == (Decimal(row["spot_price"]) if row["spot_price"] else None)
        assert (machine.gpu_count, machine.vcpus, machine.memory_gib) == (
            int(row["gpu_count"]),
            int(row["vcpus"]),
            int(row["memory_gib"]),
        )
        assert (machine.source, machine.source_date) == (row["source"], row["source_date"])


@needs_shared
def test_the_seed_file_is_what_the_derivation_produces():
    machines = machines_from_shared()
    with SEED_PATH.open(newline="") as handle:
        on_disk = list(csv.DictReader(handle))

    assert seed_rows(machines, derive_skus(machines)) == on_disk


def test_each_type_is_offered_in_two_zones_of_its_region():
    for machine in MACHINES:
        assert len(set(machine.zones)) == 2
        assert all(z.rsplit("-", 1)[0] == machine.region for z in machine.zones)
