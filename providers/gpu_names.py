"""Canonical GPU model keys shared by every adapter and by the broker's GpuModel spec table.

Adapters map a provider's own naming (``A100`` + 81920 MiB, ``Standard_ND96amsr_A100_v4``, ...) to one of
these keys; the ranking reads throughput from the spec table by key, never from a provider's name.
"""

from __future__ import annotations

import re

T4 = "T4"
A10 = "A10"
A10G = "A10G"
L4 = "L4"
L40S = "L40S"
V100_16_SXM2 = "V100-16GB-SXM2"
V100_32_SXM2 = "V100-32GB-SXM2"
V100_16_PCIE = "V100-16GB-PCIE"
A100_40_SXM = "A100-40GB-SXM4"
A100_40_PCIE = "A100-40GB-PCIE"
A100_80_SXM = "A100-80GB-SXM4"
A100_80_PCIE = "A100-80GB-PCIE"
H100_SXM = "H100-SXM5"
H100_PCIE = "H100-PCIE"
H100_NVL = "H100-NVL"
H200_SXM = "H200-SXM"
H200_NVL = "H200-NVL"
B200 = "B200"
GB200 = "GB200"
MI250X = "MI250X"
MI300X = "MI300X"
# Consumer and workstation cards that independent hosts list.
RTX_3090 = "RTX-3090"
RTX_4090 = "RTX-4090"
RTX_A6000 = "RTX-A6000"
RTX_6000_ADA = "RTX-6000-ADA"

ALL: frozenset[str] = frozenset(
    {
        T4,
        A10,
        A10G,
        L4,
        L40S,
        V100_16_SXM2,
        V100_32_SXM2,
        V100_16_PCIE,
        A100_40_SXM,
        A100_40_PCIE,
        A100_80_SXM,
        A100_80_PCIE,
        H100_SXM,
        H100_PCIE,
        H100_NVL,
        H200_SXM,
        H200_NVL,
        B200,
        GB200,
        MI250X,
        MI300X,
        RTX_3090,
        RTX_4090,
        RTX_A6000,
        RTX_6000_ADA,
    }
)
SORTED: tuple[str, ...] = tuple(sorted(ALL))  # one ordered choice list, so the API schema names it once

# How nvidia-smi names the consumer and workstation cards ("NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000",
# "NVIDIA RTX 6000 Ada Generation"). Their family is not the key's first token, and look-alikes differ in
# memory or clocks: a 3090 Ti, a 4090 D or a laptop 4090 is not the card listed, nor is the Turing
# "Quadro RTX 6000" an RTX 6000 Ada.
_REPORTED_NAMES: dict[str, re.Pattern[str]] = {
    RTX_3090: re.compile(r"\bRTX 3090\b(?! TI\b)(?!.*LAPTOP)"),
    RTX_4090: re.compile(r"\bRTX 4090\b(?! D\b)(?!.*LAPTOP)"),
    RTX_A6000: re.compile(r"\bRTX A6000\b"),
    RTX_6000_ADA: re.compile(r"\bRTX 6000 ADA\b"),
}


def reported_model_matches(reported_name: str, key: str) -> bool:
    """Is a GPU name a machine reports (nvidia-smi's, e.g. "NVIDIA A100-SXM4-80GB") the model ``key``? The
    family must appear as a whole token, so an A10G is not an A10 nor an L40S an L40; and a PCIe or NVL card is
    not the SXM part of the same family, nor the reverse."""
    name = " ".join(reported_name.upper().split())
    if key in _REPORTED_NAMES:
        # The way NVIDIA writes it ("RTX 4090") and the way our listing form offers it ("RTX-4090") both.
        return _REPORTED_NAMES[key].search(" ".join(name.replace("-", " ").split())) is not None
    variant = key.upper()
    family = variant.split("-")[0]
    if re.search(rf"(?<![A-Z0-9]){re.escape(family)}(?![A-Z0-9])", name) is None:
        return False
    if "PCIE" in variant and "PCIE" not in name:
        return False
    if "NVL" in variant and "NVL" not in name:
        return False
    sxm_only = "SXM" in variant or family in {"H200", "B200"}
    return not (sxm_only and "NVL" not in variant and ("PCIE" in name or "NVL" in name))


def reported_gpu_matches(reported_name: str, reported_memory_gb: float, key: str, memory_gb: float) -> bool:
    """``reported_model_matches``, and the memory is the model's: nvidia-smi reports a little less than the
    marketed figure (81559 MiB for 80 GB), so a 40 GB A100 is not an 80 GB one."""
    return reported_model_matches(reported_name, key) and reported_memory_gb >= 0.9 * memory_gb
