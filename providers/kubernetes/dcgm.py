"""Per-GPU utilization from NVIDIA's DCGM exporter, for clusters whose seller gives its address (``dcgm_url``).

dcgm-exporter serves Prometheus' text exposition format at ``/metrics`` (https://docs.nvidia.com/datacenter/
cloud-native/gpu-telemetry/latest/dcgm-exporter.html; format: https://prometheus.io/docs/instrumenting/
exposition_formats/#text-based-format): ``# HELP``/``# TYPE`` comments, then one sample a line,
``NAME{label="value",...} VALUE [TIMESTAMP]``. Each GPU's samples carry ``gpu`` (its index), ``UUID``,
``modelName``, ``Hostname``, and where the exporter maps GPUs to pods (its Kubernetes mode) ``namespace``,
``pod`` and ``container``. Read here: ``DCGM_FI_DEV_GPU_UTIL`` (percent), ``DCGM_FI_DEV_GPU_TEMP`` (C),
``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_FB_USED`` (MiB). A MIG slice's samples add ``GPU_I_ID``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_TEXT_BYTES = 4 * 1024 * 1024
MAX_LINES = 200_000
MAX_SAMPLES = 4096  # GPUs (or MIG slices) one exporter answer may describe
MAX_LABEL_CHARS = 256

UTIL = "DCGM_FI_DEV_GPU_UTIL"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
POWER = "DCGM_FI_DEV_POWER_USAGE"
FB_USED = "DCGM_FI_DEV_FB_USED"
_FIELDS = {UTIL: "utilization_pct", TEMP: "temperature_c", POWER: "power_w", FB_USED: "memory_used_mib"}

_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?")
# One label pair: a name, '=', a double-quoted value in which backslash escapes \\, \" and \n.
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class DcgmUnreadable(ValueError):
    """The exporter's answer is not the text format, or is over the bounds."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU (or MIG slice) as the exporter saw it; a figure the answer lacked is None."""

    hostname: str
    gpu: str
    uuid: str
    model_name: str = ""
    gpu_instance: str = ""  # GPU_I_ID of a MIG slice; "" for a whole GPU
    namespace: str = ""
    pod: str = ""
    container: str = ""
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    memory_used_mib: float | None = None


def parse_labels(text: str) -> dict[str, str]:
    """The ``{...}`` of a sample line as a dict. Raises ``DcgmUnreadable`` for a malformed label set."""
    inner = text[1:-1]
    labels: dict[str, str] = {}
    position = 0
    while position < len(inner):
        if not inner[position:].strip():
            break
        match = _LABEL.match(inner, position)
        if match is None:
            raise DcgmUnreadable(f"a malformed label set near {inner[position : position + 40]!r}")
        value = re.sub(r"\\.", lambda m: _ESCAPES.get(m.group(0), m.group(0)), match.group(2))
        labels[match.group(1)] = value[:MAX_LABEL_CHARS]
        position = match.end()
    return labels


def gpu_utilization(text: str | bytes) -> list[GpuSample]:
    """Every GPU the answer describes, one ``GpuSample`` per (Hostname, gpu, UUID, GPU_I_ID), with the four
    fields above where present, in the order first seen. Other metrics are skipped; a value that is not a
    finite number (the exporter writes a sentinel for a field the GPU lacks) leaves the field None. Raises
    ``DcgmUnreadable`` for an answer over ``MAX_TEXT_BYTES``, ``MAX_LINES`` or ``MAX_SAMPLES``, or a malformed
    line of a metric read here."""
    if len(text) > MAX_TEXT_BYTES:
        raise DcgmUnreadable(f"the exporter's answer is larger than {MAX_TEXT_BYTES} bytes")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    found: dict[tuple[str, str, str, str], tuple[dict[str, str], dict[str, float | None]]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if number > MAX_LINES:
            raise DcgmUnreadable(f"the exporter's answer has more than {MAX_LINES} lines")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        if name not in _FIELDS:
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise DcgmUnreadable(f"line {number} is not a sample: {line[:80]!r}")
        labels = parse_labels(match.group(2)) if match.group(2) else {}
        key = (labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
        if key not in found:
            if len(found) >= MAX_SAMPLES:
                raise DcgmUnreadable(f"the exporter's answer describes more than {MAX_SAMPLES} GPUs")
            found[key] = (labels, {})
        found[key][1][_FIELDS[name]] = _number(match.group(3))
    return [
        GpuSample(
            hostname=key[0],
            gpu=key[1],
            uuid=key[2],
            gpu_instance=key[3],
            model_name=labels.get("modelName", ""),
            namespace=labels.get("namespace", ""),
            pod=labels.get("pod", ""),
            container=labels.get("container", ""),
            utilization_pct=values.get("utilization_pct"),
            temperature_c=values.get("temperature_c"),
            power_w=values.get("power_w"),
            memory_used_mib=values.get("memory_used_mib"),
        )
        for key, (labels, values) in found.items()
    ]


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    # dcgm-exporter reports a field a GPU does not support as a sentinel near 2**63 ("blank" values).
    if not math.isfinite(value) or abs(value) >= 2**53:
        return None
    return value


def samples_of_namespace(samples: list[GpuSample], namespace: str) -> list[GpuSample]:
    """The samples of GPUs allocated to a pod of ``namespace``."""
    return [s for s in samples if s.namespace == namespace]
