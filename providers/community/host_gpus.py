"""The host agent's view of its machine's GPUs, as it registers them and reports their telemetry to the broker:
read from ``nvidia-smi``, or simulated boards (``--simulate MODEL:GBxCOUNT``) drawing within their ratings.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from providers.community.executor_base import telemetry_sample


@dataclass(frozen=True)
class Gpu:
    model: str
    memory_gb: int


# Board power ratings (W) a simulated GPU draws within, from NVIDIA's datasheets (SXM boards where both exist):
# a simulated host's telemetry must pass the broker's plausibility check, which compares it with these ratings.
SIMULATED_RATING_W = {"B200": 1000, "H200": 700, "H100": 700, "A100": 400, "L40S": 350, "L40": 300, "A10G": 300,
                      "A10": 150, "L4": 72, "T4": 70, "V100": 300, "4090": 450, "3090": 350, "A6000": 300}  # fmt: skip


def simulated_rating_w(model: str) -> int:
    """The rating of the first known name ``model`` contains, longest names first ("L40S" before "L40"); 300 W
    for a model not in the table."""
    for name in sorted(SIMULATED_RATING_W, key=len, reverse=True):
        if name in model.upper():
            return SIMULATED_RATING_W[name]
    return 300


def parse_simulated(spec: str) -> list[Gpu]:
    """``H100:80x8`` -> eight 80 GB H100s."""
    model_memory, _, count = spec.partition("x")
    model, _, memory = model_memory.partition(":")
    if not model or not memory.isdigit() or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--simulate wants MODEL:GBxCOUNT, e.g. H100:80x8, not {spec!r}")
    return [Gpu(model, int(memory))] * int(count)


def read_nvidia_smi() -> tuple[list[Gpu], list[dict[str, Any]]]:
    """(GPUs, telemetry) from ``nvidia-smi``; raises ``RuntimeError`` when it is missing or fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise RuntimeError("nvidia-smi not found: no NVIDIA driver on this machine (use --simulate to test)")
    query = "name,memory.total,utilization.gpu,temperature.gpu,power.draw,memory.used"
    out = subprocess.run(  # noqa: S603 - a fixed binary and arguments
        [binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
    )
    if out.returncode != 0:
        # On one line: the broker refuses a self-test whose text holds control characters such as newlines.
        raise RuntimeError(f"nvidia-smi failed: {' '.join(out.stderr.split())[:200]}")
    gpus, telemetry = [], []
    for index, line in enumerate(out.stdout.strip().splitlines()):
        name, total, util, temp, power, used = (part.strip() for part in line.split(","))
        gpus.append(Gpu(name.removeprefix("NVIDIA "), round(float(total) / 1024)))
        telemetry.append(telemetry_sample(index, float(util), float(temp), float(power), float(used) / 1024))
    return gpus, telemetry
