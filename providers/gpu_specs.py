"""Datacenter GPU specifications, dense figures per GPU, from the project's sourced spec table.

Source: the team's GPU specification report (vendor datasheets S1-S26 as listed there). Compute is dense
(sparse figures halved); interconnect is total bidirectional GB/s per GPU. Rows whose ranking-relevant
figures are derived or disputed carry ``verified=False`` and a note saying which.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from providers import gpu_names as g

D = Decimal

# key, vendor, name, memory GB, bandwidth GB/s, FP16/BF16 dense, BF16?, FP8 dense, FP32, FP64 (vector),
# INT8 dense, interconnect, interconnect GB/s, video encoders, ECC, TDP W, verified, notes
# fmt: off
_ROWS: list[tuple[Any, ...]] = [
    (g.T4, "NVIDIA", "T4", 16, 320, D("65"), False, None, D("8.1"), D("0.25"), D("130"), "pcie", 32, 1, True, 70,
     False, "FP64 derived (1/32 rate); encoder count unverified"),
    (g.A10, "NVIDIA", "A10", 24, 600, D("125"), True, None, D("31.2"), D("0.98"), D("250"), "pcie", 64, 1, True, 150,
     False, "FP64 derived (1/32 rate)"),
    (g.A10G, "NVIDIA", "A10G (AWS G5)", 24, 600, D("70"), True, None, D("35"), D("1.1"), D("140"), "pcie", 64, 1,
     True, 300, False, "datasheet read through citations; TF32, INT8, encoders, power derived"),
    (g.L4, "NVIDIA", "L4", 24, 300, D("121"), True, D("242.5"), D("30.3"), D("0.47"), D("242.5"), "pcie", 64, 2,
     True, 72, False, "FP64 derived (1/64 rate)"),
    (g.L40S, "NVIDIA", "L40S", 48, 864, D("362"), True, D("733"), D("91.6"), D("1.4"), D("733"), "pcie", 64, 3,
     True, 350, False, "FP64 derived (1/64 rate)"),
    (g.V100_16_SXM2, "NVIDIA", "V100 SXM2 16GB", 16, 900, D("125"), False, None, D("15.7"), D("7.8"), None,
     "nvlink", 300, 1, True, 300, True, "FP16 only; encoder count unverified"),
    (g.V100_32_SXM2, "NVIDIA", "V100 SXM2 32GB", 32, 900, D("125"), False, None, D("15.7"), D("7.8"), None,
     "nvlink", 300, 1, True, 300, True, "FP16 only; encoder count unverified"),
    (g.V100_16_PCIE, "NVIDIA", "V100 PCIe 16GB", 16, 900, D("112"), False, None, D("14"), D("7.0"), None, "pcie", 32,
     1, True, 250, True, "FP16 only"),
    (g.A100_40_SXM, "NVIDIA", "A100 40GB SXM4", 40, 1555, D("312"), True, None, D("19.5"), D("9.7"), D("624"),
     "nvlink", 600, 0, True, 400, True, ""),
    (g.A100_40_PCIE, "NVIDIA", "A100 40GB PCIe", 40, 1555, D("312"), True, None, D("19.5"), D("9.7"), D("624"),
     "pcie", 64, 0, True, 250, False, "TDP and NVLink bridge (pairs, 600) unverified"),
    (g.A100_80_SXM, "NVIDIA", "A100 80GB SXM4", 80, 2039, D("312"), True, None, D("19.5"), D("9.7"), D("624"),
     "nvlink", 600, 0, True, 400, True, ""),
    (g.A100_80_PCIE, "NVIDIA", "A100 80GB PCIe", 80, 1935, D("312"), True, None, D("19.5"), D("9.7"), D("624"),
     "pcie", 64, 0, True, 300, True, "NVLink bridge links 2 cards (600)"),
    (g.H100_SXM, "NVIDIA", "H100 SXM5 80GB", 80, 3350, D("989.4"), True, D("1979"), D("67"), D("34"), D("1979"),
     "nvlink", 900, 0, True, 700, True, ""),
    (g.H100_PCIE, "NVIDIA", "H100 PCIe 80GB", 80, 2000, D("756"), True, D("1513"), D("51"), D("26"), D("1513"),
     "pcie", 128, 0, True, 350, True, "NVLink bridge 600 for pairs"),
    (g.H100_NVL, "NVIDIA", "H100 NVL 94GB", 94, 3938, D("835.5"), True, D("1670.5"), D("60"), D("30"),
     D("1670.5"), "pcie", 128, 0, True, 400, True, "one card; NVLink bridge 600 for pairs"),
    (g.H200_SXM, "NVIDIA", "H200 SXM 141GB", 141, 4800, D("989.4"), True, D("1979"), D("67"), D("34"), D("1979"),
     "nvlink", 900, 0, True, 700, True, "compute identical to H100 SXM"),
    (g.H200_NVL, "NVIDIA", "H200 NVL 141GB", 141, 4800, D("835.5"), True, D("1670.5"), D("60"), D("30"),
     D("1670.5"), "pcie", 128, 0, True, 600, True, "NVLink bridge 900 for 2 or 4 cards"),
    (g.B200, "NVIDIA", "B200 SXM", 180, 7700, D("2250"), True, D("4500"), D("75"), D("37"), D("4500"), "nvlink",
     1800, 0, True, 1000, False, "HGX sheet: 180 GB, 7.7 TB/s, FP32 75, FP64 37 (GCP: 8 TB/s, 80/40)"),
    (g.GB200, "NVIDIA", "GB200 (per GPU)", 186, 8000, D("2500"), True, D("5000"), None, D("45"), D("5000"),
     "nvlink", 1800, 0, True, None, False, "rack figures / 72; FP32 unpublished; FP64 from GCP, unverified"),
    (g.MI250X, "AMD", "Instinct MI250X (2 GCDs)", 128, 3277, D("383"), True, None, D("47.9"), D("47.9"), D("383"),
     "infinity-fabric", 800, 0, True, 500, False, "one package = two 64 GB devices; link bandwidth and TDP unverified"),
    (g.MI300X, "AMD", "Instinct MI300X", 192, 5300, D("1307.4"), True, D("2614.9"), D("163.4"), D("81.7"),
     D("2614.9"), "infinity-fabric", 896, 0, True, 750, False, "per-link bandwidth unverified"),
    # Consumer and workstation cards (issue 19). FP16 is the dense tensor rate with FP32 accumulate, what
    # frameworks run: GeForce cards do that at half their FP16-accumulate rate (the headline figure), the
    # workstation cards at full rate. FP64 is derived (1/64 rate on GA10x and Ada); sources in WORKSTATION_SOURCES.
    (g.RTX_3090, "NVIDIA", "GeForce RTX 3090", 24, 936, D("71"), True, None, D("35.6"), D("0.56"), D("284"),
     "pcie", 64, 1, False, 350, False,
     "FP16 71 dense w/ FP32 acc (142 w/ FP16 acc, 284 sparse); FP64 derived; NVLink bridge 112.5 for pairs; "
     "src: GA102 whitepaper v2 App. A"),
    (g.RTX_4090, "NVIDIA", "GeForce RTX 4090", 24, 1008, D("165.2"), True, D("330.3"), D("82.6"), D("1.29"),
     D("660.6"), "pcie", 64, 2, False, 450, False,
     "FP16 165.2 dense w/ FP32 acc (330.3 w/ FP16 acc, 660.6 sparse); FP64 derived; "
     "src: Ada GPU architecture whitepaper v2.01 App. A"),
    (g.RTX_A6000, "NVIDIA", "RTX A6000", 48, 768, D("154.8"), True, None, D("38.7"), D("0.6"), D("309.7"), "pcie",
     64, 1, True, 300, False,
     "FP16 154.8 dense (309.7 sparse); FP64 derived; NVLink bridge 112.5 for pairs; "
     "src: RTX A6000 datasheet, GA102 whitepaper v2 App. C"),
    (g.RTX_6000_ADA, "NVIDIA", "RTX 6000 Ada Generation", 48, 960, D("364.2"), True, D("728.5"), D("91.1"),
     D("1.42"), D("728.5"), "pcie", 64, 3, True, 300, False,
     "FP16 364.2 dense (728.5 sparse; datasheet's 1,457 is FP8 sparse); FP64 derived; "
     "src: RTX 6000 Ada datasheet, Ada whitepaper v2.01"),
]
# fmt: on

# Where the consumer and workstation rows come from (NVIDIA's own documents). The GPU-SPECS report covers
# datacenter parts only; these were read through verbatim copies of the documents below.
WORKSTATION_SOURCES: dict[str, tuple[str, ...]] = {
    g.RTX_3090: (
        "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, Appendix A (GeForce RTX 3090): "
        "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
    ),
    g.RTX_4090: (
        "NVIDIA Ada GPU Architecture whitepaper v2.01, Appendix A (GeForce RTX 4090): "
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    ),
    g.RTX_A6000: (
        "NVIDIA RTX A6000 datasheet (48 GB GDDR6 ECC, 768 GB/s, 300 W, NVLink 112.5 GB/s): "
        "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
        "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, appendix on RTX A6000 performance: "
        "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
    ),
    g.RTX_6000_ADA: (
        "NVIDIA RTX 6000 Ada Generation datasheet (48 GB GDDR6 ECC, 960 GB/s, 91.1 TFLOPS FP32, 1,457 TFLOPS "
        "FP8 with sparsity, 300 W): https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
        "NVIDIA Ada GPU Architecture whitepaper v2.01: "
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    ),
}

FIELDS = (
    "key",
    "vendor",
    "name",
    "memory_gb",
    "memory_bandwidth_gbs",
    "fp16_dense_tflops",
    "bf16_supported",
    "fp8_dense_tflops",
    "fp32_tflops",
    "fp64_tflops",
    "int8_dense_tops",
    "interconnect",
    "interconnect_gbs",
    "video_encoders",
    "ecc",
    "tdp_w",
    "verified",
    "notes",
)

GPU_SPECS: list[dict[str, Any]] = [dict(zip(FIELDS, row, strict=True)) for row in _ROWS]


def gpu_spec_get(key: str) -> dict[str, Any] | None:
    """The spec row of GPU model ``key``, or None for a model the table does not know."""
    return _BY_KEY.get(key)


_BY_KEY = {spec["key"]: spec for spec in GPU_SPECS}
