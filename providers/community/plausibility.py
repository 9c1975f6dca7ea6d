"""What a host's agent reports, checked against what the hardware can physically do (issue 19, item 5).

``protocol.telemetry_check`` refuses what is not telemetry at all (text, NaN, 5 kW). These checks are finer
and depend on the machine: a figure that is a number but that no GPU of the listed model could show. Such
samples are kept, flagged with the reason, and shown as "unverified", so a lying or broken agent is visible
to staff and buyers instead of being silently dropped. Pure functions: no ORM, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Boards briefly draw above their rated power before the firmware's power limiter, averaged over about a
# second, pulls them back; nvidia-smi's instantaneous reading can catch that. Beyond 10 % it is no GPU.
POWER_TOLERANCE = 1.10
# GPUs throttle from about 85-95 C and shut down before 100-105 C (memory junctions a little higher).
MAX_TEMPERATURE_C = 110.0
# A working GPU is warmer than the room it is in, and no room a host rents out is near freezing.
MIN_TEMPERATURE_C = 5.0
# An idle GPU reads a few per cent (the driver, the monitoring itself, a display); more than this is work.
IDLE_UTILIZATION_PCT = 5.0
REASON_MAX = 300  # ``MachineHeartbeat.unverified_reason``


@dataclass(frozen=True)
class CardLimits:
    """What one GPU of the listed model can physically report: ``tdp_w`` None when the spec table has no
    rating (then power is not judged); ``memory_gb`` the card's memory."""

    tdp_w: int | None
    memory_gb: float


def telemetry_problems(
    gpus: Sequence[dict[str, Any]], *, card: CardLimits, listed_gpus: int, leased: bool
) -> list[str]:
    """Every reason these per-GPU samples (already through ``protocol.telemetry_check``) are not physically
    plausible for ``listed_gpus`` cards like ``card``; empty when they are. ``leased``: the broker has an
    instance running on the machine (utilization with none is work nobody rented, or an invented figure)."""
    problems: list[str] = []
    if gpus and len(gpus) != listed_gpus:
        problems.append(f"telemetry for {len(gpus)} GPUs, the listing has {listed_gpus}")
    for position, sample in enumerate(gpus):
        gpu = f"GPU {sample.get('index', position)}"
        power = sample.get("power_w")
        if power is not None and card.tdp_w and power > card.tdp_w * POWER_TOLERANCE:
            problems.append(f"{gpu} draws {power:g} W, above the card's {card.tdp_w} W rating")
        temperature = sample.get("temperature_c")
        if temperature is not None and temperature > MAX_TEMPERATURE_C:
            problems.append(f"{gpu} at {temperature:g} °C, hotter than any GPU runs")
        if temperature is not None and temperature < MIN_TEMPERATURE_C:
            problems.append(f"{gpu} at {temperature:g} °C, colder than any room a GPU runs in")
        memory = sample.get("memory_used_gb")
        if memory is not None and memory > card.memory_gb:
            problems.append(f"{gpu} uses {memory:g} GB of memory, more than the card's {card.memory_gb:g} GB")
        utilization = sample.get("utilization_pct")
        if utilization is not None and utilization > IDLE_UTILIZATION_PCT and not leased:
            problems.append(f"{gpu} {utilization:g} % busy with no lease running")
    return problems


def reason_text(problems: Sequence[str]) -> str:
    """The problems as one reason for the heartbeat's row, cut to fit it."""
    text = "; ".join(problems)
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"
