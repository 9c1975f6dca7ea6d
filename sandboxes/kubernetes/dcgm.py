"""NVIDIA's dcgm-exporter as the sandbox serves it (``GET /dcgm/metrics``): Prometheus text, one sample per GPU of
each GPU node for four of the default counters.

Metric names, types and help texts from dcgm-exporter's ``etc/default-counters.csv``
(https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv): ``DCGM_FI_DEV_GPU_UTIL`` (gauge, "GPU
utilization (in %)."), ``DCGM_FI_DEV_GPU_TEMP`` (gauge, "GPU temperature (in C)."), ``DCGM_FI_DEV_POWER_USAGE``
(gauge, "Power draw (in W).") and ``DCGM_FI_DEV_FB_USED`` (gauge, "Framebuffer memory used (in MiB)."). Labels as the
exporter writes them: ``gpu`` (index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``,
``Hostname``, and, with its Kubernetes pod mapping on, ``container``, ``namespace`` and ``pod`` for a GPU allocated to
a pod (README, "Kubernetes", https://github.com/NVIDIA/dcgm-exporter#kubernetes); a MIG device adds
``GPU_I_PROFILE`` and ``GPU_I_ID``. Text format: https://prometheus.io/docs/instrumenting/exposition_formats/.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sandboxes.boot import NVIDIA_SMI_NAMES, RATED_POWER_W
from sandboxes.kubernetes.seed import NodeSeed

METRICS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
)
IDLE_TEMP_C, BUSY_TEMP_C = 34, 67
DEFAULT_BUSY_UTIL = 87


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One allocation of (part of) a GPU to a running pod's container."""

    namespace: str
    pod: str
    container: str
    mig_profile: str = ""
    mig_instance: int | None = None


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{index}.{node}.gpu.sandbox"))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(
    nodes: list[NodeSeed], uses: dict[tuple[str, int], list[GpuUse]], utilization: dict[tuple[str, int], int]
) -> str:
    """The exporter's page: every GPU of every GPU node, one line per allocation (a time-sliced GPU shows each pod
    on it, a MIG GPU each allocated device), else one idle line. ``utilization`` overrides a busy GPU's default."""
    lines: dict[str, list[str]] = {name: [] for name, _ in METRICS}
    for node in nodes:
        model = NVIDIA_SMI_NAMES.get(node.model, node.model)
        for index in range(node.gpus):
            base = {
                "gpu": str(index),
                "UUID": gpu_uuid(node.name, index),
                "pci_bus_id": f"00000000:{0x07 + index * 0x10:02X}:00.0",
                "device": f"nvidia{index}",
                "modelName": model,
                "Hostname": node.name,
            }
            allocations = uses.get((node.name, index)) or []
            rated = RATED_POWER_W.get(node.model, 300)
            busy = bool(allocations)
            util = utilization.get((node.name, index), DEFAULT_BUSY_UTIL if busy else 0)
            values = {
                "DCGM_FI_DEV_GPU_UTIL": util,
                "DCGM_FI_DEV_GPU_TEMP": BUSY_TEMP_C if busy else IDLE_TEMP_C,
                "DCGM_FI_DEV_POWER_USAGE": round(rated * (0.2 + 0.75 * util / 100), 3),
                "DCGM_FI_DEV_FB_USED": int(node.memory_mib * 0.6) if busy else 0,
            }
            label_sets = []
            for use in allocations:
                labels = dict(base)
                if use.mig_profile:
                    labels.update(GPU_I_PROFILE=use.mig_profile, GPU_I_ID=str(use.mig_instance))
                labels.update(container=use.container, namespace=use.namespace, pod=use.pod)
                label_sets.append(labels)
            if not label_sets:
                label_sets.append(base)
            for labels in label_sets:
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                for name, _ in METRICS:
                    lines[name].append(f"{name}{{{text}}} {values[name]}")
    out = []
    for name, help_text in METRICS:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(lines[name])
    return "\n".join(out) + "\n"
