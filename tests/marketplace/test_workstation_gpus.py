"""Consumer and workstation GPUs in the spec table (issue 19, item 6, specs): hosts with an RTX 3090, RTX 4090,
RTX A6000 or RTX 6000 Ada can list, their nvidia-smi names map to the right key, and the table holds dense
figures with their sources.

Sources: NVIDIA Ada GPU Architecture whitepaper v2.01, Appendix A
(https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf); NVIDIA Ampere GA102
GPU Architecture whitepaper v2.0, Appendix A and the RTX A6000 appendix
(https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf); the RTX A6000 and
RTX 6000 Ada datasheets (https://www.nvidia.com/en-us/design-visualization/rtx-a6000/,
https://www.nvidia.com/en-us/design-visualization/rtx-6000/)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.models import GpuModel
from providers import gpu_names
from providers.community.services import machine_list, machine_register
from providers.gpu_specs import WORKSTATION_SOURCES
from tests.hosts import LISTING

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("reported", "key"),
    [
        ("NVIDIA GeForce RTX 4090", gpu_names.RTX_4090),
        ("GeForce RTX 4090", gpu_names.RTX_4090),  # the reference agent drops the "NVIDIA " prefix
        ("NVIDIA GeForce RTX 3090", gpu_names.RTX_3090),
        ("NVIDIA RTX A6000", gpu_names.RTX_A6000),
        ("NVIDIA RTX 6000 Ada Generation", gpu_names.RTX_6000_ADA),
        # The listing form's own names, which an agent may echo (issue 36: "found 0, it reports 2x RTX-4090").
        ("RTX-4090", gpu_names.RTX_4090),
        ("RTX-3090", gpu_names.RTX_3090),
        ("RTX-A6000", gpu_names.RTX_A6000),
        ("RTX-6000-ADA", gpu_names.RTX_6000_ADA),
    ],
)
def test_nvidia_smi_names_map_to_exactly_their_key(reported, key):
    assert [k for k in sorted(gpu_names.ALL) if gpu_names.reported_model_matches(reported, k)] == [key]


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA GeForce RTX 4090 D",  # fewer cores, sold in China
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # 16 GB, a fraction of the power
        "NVIDIA GeForce RTX 3090 Ti",
        "RTX-4090-D",
        "Quadro RTX 6000",  # Turing, 24 GB
        "NVIDIA A10",
    ],
)
def test_look_alikes_are_not_the_listed_card(reported):
    listed = (gpu_names.RTX_4090, gpu_names.RTX_3090, gpu_names.RTX_A6000, gpu_names.RTX_6000_ADA)
    assert not any(gpu_names.reported_model_matches(reported, key) for key in listed)


def test_the_spec_table_holds_dense_figures_and_ratings_for_the_four_cards():
    rows = {
        m.key: (m.memory_gb, m.memory_bandwidth_gbs, m.fp16_dense_tflops, m.tdp_w, m.ecc)
        for m in GpuModel.objects.filter(key__in=WORKSTATION_SOURCES)
    }

    # FP16 is dense with FP32 accumulate: a GeForce card's headline FP16-accumulate figure is twice this, and
    # the RTX 6000 Ada datasheet's 1,457 TFLOPS is FP8 with sparsity, four times it.
    assert rows == {
        "RTX-3090": (24, 936, Decimal("71.000"), 350, False),
        "RTX-4090": (24, 1008, Decimal("165.200"), 450, False),
        "RTX-A6000": (48, 768, Decimal("154.800"), 300, True),
        "RTX-6000-ADA": (48, 960, Decimal("364.200"), 300, True),
    }
    assert all(any("https://www.nvidia.com" in s or "https://images.nvidia.com" in s for s in sources)
               for sources in WORKSTATION_SOURCES.values())  # fmt: skip
    assert all("src:" in m.notes for m in GpuModel.objects.filter(key__in=WORKSTATION_SOURCES))


def test_the_seed_is_safe_to_run_again():
    assert gpu_models_upsert(GpuModel, keys=frozenset(WORKSTATION_SOURCES)) == 4
    assert GpuModel.objects.filter(key__in=WORKSTATION_SOURCES).count() == 4


def test_a_host_with_rtx_a6000s_lists_and_passes_its_self_test(fleet):
    listing = {**LISTING, "gpu_model": gpu_names.RTX_A6000, "gpu_count": 2, "gpu_memory_gb": 48}
    machine = machine_list(account=fleet, name="studio-a6000", listing=listing).machine
    found = {"ok": True, "gpus": [{"model": "RTX A6000", "memory_gb": 48}] * 2, "h2d_bandwidth_gbs": 24.5}

    machine = machine_register(machine=machine, agent_url="http://127.0.0.1:7070", hardware={}, self_test=found)

    assert (machine.self_test_ok, machine.self_test["problem"]) == (True, "")


def test_migration_0024_seeds_the_four_cards_on_a_database_seeded_before_them(migrate_to):
    old = migrate_to([("marketplace", "0023_gpu_holds")])
    OldGpuModel = old.get_model("marketplace", "GpuModel")
    OldGpuModel.objects.filter(key__in=WORKSTATION_SOURCES).delete()  # as a database from before they existed

    new = migrate_to([("marketplace", "0024_workstation_gpus")])

    seeded = new.get_model("marketplace", "GpuModel").objects.filter(key__in=WORKSTATION_SOURCES)
    assert sorted(seeded.values_list("key", "tdp_w")) == [
        ("RTX-3090", 350), ("RTX-4090", 450), ("RTX-6000-ADA", 300), ("RTX-A6000", 300)
    ]  # fmt: skip
