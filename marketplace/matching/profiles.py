"""Workload profiles: the throughput metric each one buys and the requirements a buyer gets by default.

The figures are the GpuModel table's dense per-card numbers; the defaults follow what the workloads need
in practice: large-model training holds its weights, gradients and optimiser state across fast NVLink,
real-time inference runs on cheap low-latency cards, scientific codes need double precision and ECC,
transcoding needs hardware encoders (the A100/H100 class has none).
"""

from __future__ import annotations

import dataclasses
import math

from marketplace.matching.types import Amount, Demand, GpuSpec, Profile, ProfileDefaults

# Dense FP16/BF16 of one A100 (312 TFLOPS) is the unit of work for the tensor-core profiles.
_A100_FP16 = 312.0
_A100 = "A100-80GB-SXM4"
_A10G = "A10G"

# What each profile holds fixed unless the demand says (``Amount``). A job with a given amount of work
# (training or fine-tuning to a number of steps, a simulation, a batch of frames or videos) is cheaper on
# faster hardware when the speed-up beats the price; a service (inference) or a bare rental (no profile)
# is bought by the hour: faster hardware than its throughput floor is only a dearer hour.

PROFILES: dict[Profile, ProfileDefaults] = {
    Profile.TRAINING: ProfileDefaults(
        profile=Profile.TRAINING,
        metric="fp16_dense_tflops",
        metric_unit="dense FP16/BF16 TFLOPS",
        description="Large-model training: 80 GB or more per GPU and 600 GB/s NVLink between the GPUs of a job.",
        reference_throughput=_A100_FP16,
        reference_unit="A100-hour",
        min_gpu_memory_gb=80,
        min_interconnect_gbs=600,
        amount=Amount.WORK,
        reference_gpu=_A100,
    ),
    Profile.FINE_TUNING: ProfileDefaults(
        profile=Profile.FINE_TUNING,
        metric="fp16_dense_tflops",
        metric_unit="dense FP16/BF16 TFLOPS",
        description="Fine-tuning (LoRA and full): 24 GB or more per GPU; NVLink not required.",
        reference_throughput=_A100_FP16,
        reference_unit="A100-hour",
        min_gpu_memory_gb=24,
        amount=Amount.WORK,
        reference_gpu=_A100,
    ),
    Profile.INFERENCE: ProfileDefaults(
        profile=Profile.INFERENCE,
        metric="memory_bandwidth_gbs",
        metric_unit="GB/s of memory bandwidth (token generation is bandwidth-bound)",
        description="Real-time inference: cheap low-latency cards of the T4, L4, A10 and A10G class.",
        reference_throughput=600.0,  # one A10G
        reference_unit="A10G-hour",
        preferred_models=frozenset({"T4", "L4", "A10", "A10G"}),
        amount=Amount.DURATION,  # a service kept up for hours, its throughput floor met by the card class
        reference_gpu=_A10G,
    ),
    Profile.SCIENTIFIC: ProfileDefaults(
        profile=Profile.SCIENTIFIC,
        metric="fp64_tflops",
        metric_unit="FP64 TFLOPS",
        description="Scientific computing: FP64 of 10 TFLOPS or more per GPU, with ECC memory.",
        reference_throughput=9.7,  # one A100
        reference_unit="A100-FP64-hour",
        min_fp64_tflops=10.0,
        needs_ecc=True,
        amount=Amount.WORK,
        reference_gpu=_A100,
    ),
    Profile.RENDERING: ProfileDefaults(
        profile=Profile.RENDERING,
        metric="fp32_tflops",
        metric_unit="FP32 TFLOPS",
        description="Rendering: single-precision throughput and 16 GB or more per GPU.",
        reference_throughput=35.0,  # one A10G
        reference_unit="A10G-FP32-hour",
        min_gpu_memory_gb=16,
        amount=Amount.WORK,
        reference_gpu=_A10G,
    ),
    Profile.TRANSCODING: ProfileDefaults(
        profile=Profile.TRANSCODING,
        metric="video_encoders",
        metric_unit="hardware video encoders (NVENC)",
        description="Video transcoding: GPUs with hardware encoders; throughput counts the encoders.",
        reference_throughput=1.0,
        reference_unit="encoder-hour",
        min_video_encoders=1,
        amount=Amount.WORK,
        reference_gpu="T4",  # one NVENC encoder
    ),
}

# With no profile the engine ranks by dense FP16 and imposes nothing: the buyer's filters are the whole demand.
GENERIC = ProfileDefaults(
    profile=Profile.TRAINING,
    metric="fp16_dense_tflops",
    metric_unit="dense FP16/BF16 TFLOPS",
    description="No profile: only the buyer's own requirements apply.",
    reference_throughput=_A100_FP16,
    reference_unit="A100-hour",
    amount=Amount.DURATION,  # a bare rental: the buyer pays for the hours they asked for
    reference_gpu=_A100,
)

# Memory of the reference card for sizing demands given as total GPU memory.
_REFERENCE_MEMORY_GB = 80


def defaults_for(demand: Demand) -> ProfileDefaults:
    return GENERIC if demand.profile is None else PROFILES[demand.profile]


def effective_requirements(demand: Demand, specs: dict[str, GpuSpec] | None = None) -> Demand:
    """``demand`` with every requirement the buyer left open filled from its profile's defaults.

    A value the buyer gave always wins. The profile's preferred models become the allowed models only
    when the buyer named none and, given ``specs``, at least one preferred card meets the memory asked
    for (an inference job needing 80 GB per GPU is not forced onto 24 GB cards).
    """
    if demand.profile is None:
        return demand if demand.amount is not None else dataclasses.replace(demand, amount=GENERIC.amount)
    d = PROFILES[demand.profile]
    models = demand.gpu_models
    min_memory = demand.min_gpu_memory_gb or d.min_gpu_memory_gb
    if not models and d.preferred_models:
        fits = specs is None or any(s.memory_gb >= min_memory for key, s in specs.items() if key in d.preferred_models)
        if fits:
            models = d.preferred_models
    return dataclasses.replace(
        demand,
        gpu_models=models,
        min_gpu_memory_gb=min_memory,
        min_interconnect_gbs=(
            d.min_interconnect_gbs if demand.min_interconnect_gbs is None else demand.min_interconnect_gbs
        ),
        needs_rdma=d.needs_rdma if demand.needs_rdma is None else demand.needs_rdma,
        min_fp64_tflops=d.min_fp64_tflops if demand.min_fp64_tflops is None else demand.min_fp64_tflops,
        needs_ecc=d.needs_ecc if demand.needs_ecc is None else demand.needs_ecc,
        min_video_encoders=(d.min_video_encoders if demand.min_video_encoders is None else demand.min_video_encoders),
        amount=d.amount if demand.amount is None else demand.amount,
    )


def reference_gpus(demand: Demand) -> float:
    """How many reference cards the demand's size amounts to: its GPU count (or its memory over 80 GB) on
    each of its nodes."""
    if demand.total_gpu_memory_gb is not None:
        return demand.nodes * max(1.0, math.ceil(demand.total_gpu_memory_gb / _REFERENCE_MEMORY_GB))
    return float(demand.gpu_count * demand.nodes)


def amount_of(demand: Demand) -> Amount:
    """What ``demand`` holds fixed: its own ``amount``, else its profile's default."""
    return defaults_for(demand).amount if demand.amount is None else demand.amount


def reference_figure(demand: Demand, specs: dict[str, GpuSpec] | None = None) -> float:
    """One ``work_reference_gpu`` card's figure in the profile's metric: the profile's own reference card
    unless the demand names another, whose datasheet ``specs`` must then hold (``ValueError`` otherwise)."""
    profile = defaults_for(demand)
    name = demand.work_reference_gpu
    if name is None or name == profile.reference_gpu:
        return profile.reference_throughput
    spec = (specs or {}).get(name)
    value = None if spec is None else getattr(spec, profile.metric)
    if value is None or not value > 0:
        raise ValueError(
            f"work_reference_gpu {name!r}: no datasheet figure for {profile.metric_unit} to measure work by"
        )
    return float(value)


def work(demand: Demand, specs: dict[str, GpuSpec] | None = None) -> float:
    """The demand's amount of work in its profile's metric-hours: its size in reference cards x one card's
    figure x the hours on them (``work_hours``, else ``duration_hours``). For a WORK demand each offer takes
    this over its throughput hours; a DURATION demand is the same size and hours on the reference card."""
    hours = demand.duration_hours if demand.work_hours is None else demand.work_hours
    return reference_gpus(demand) * reference_figure(demand, specs) * hours
