"""The GCP sandbox's regional GPU quotas: the limits (tests may set their own), the usage the live instances make,
and an insert's refusal when it would go over."""

from __future__ import annotations

import threading
from typing import Any

from sandboxes.gcp.seed import SeedMachine
from sandboxes.gcp.state import _Instance, _Request
from sandboxes.gcp.wire import SYNC_ERRORS, ApiError, last_segment

GPU_QUOTA_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
}
DEFAULT_GPU_QUOTA = 64.0  # per GPU metric and region, unless a test sets its own with ``set_quota``


class QuotaHandlers:
    """GPU quotas and usage, mixed into ``GcpSandbox``."""

    _lock: threading.Lock
    _instances: dict[tuple[str, str, str], _Instance]
    _quota_limits: dict[str, float]
    _seed_by_name: dict[tuple[str, str], SeedMachine]

    def set_quota(self, metric: str, limit: float | None) -> None:
        """Set a regional quota's limit in every region (None restores the default). ``regions.get`` reports it
        beside the live usage, and an insert that would exceed it is refused with QUOTA_EXCEEDED."""
        with self._lock:
            if limit is None:
                self._quota_limits.pop(metric, None)
            else:
                self._quota_limits[metric] = float(limit)

    def _gpu_use(self, body: dict[str, Any]) -> tuple[str, int] | None:
        """The GPU quota metric an instance body counts against, and how many GPUs."""
        attached = [a for a in body.get("guestAccelerators") or [] if a]
        if not attached:
            return None
        accelerator = last_segment(str(attached[0].get("acceleratorType", "")))
        metric = GPU_QUOTA_METRICS.get(accelerator, "GPUS_ALL_REGIONS")
        if body.get("scheduling", {}).get("provisioningModel") == "SPOT":
            metric = f"PREEMPTIBLE_{metric}"
        return metric, sum(int(a.get("acceleratorCount") or 0) for a in attached)

    def _gpu_usage(self, project: str, region: str) -> dict[str, float]:
        """GPUs in use per quota metric in ``region``, from the live instances. Caller holds the lock."""
        usage: dict[str, float] = {}
        for inst in self._instances.values():
            live = inst.body.get("status") != "TERMINATED"
            if live and inst.project == project and inst.zone.rsplit("-", 1)[0] == region:
                use = self._gpu_use(inst.body)
                if use is not None:
                    usage[use[0]] = usage.get(use[0], 0.0) + use[1]
        return usage

    def _quota_limit(self, metric: str) -> float:
        return self._quota_limits.get(metric, DEFAULT_GPU_QUOTA)

    def _quota_metric(self, request: _Request) -> str:
        for name in request.instance_types:
            for (_region, instance_type), row in self._seed_by_name.items():
                if instance_type == name or row.machine_type == name:
                    return GPU_QUOTA_METRICS.get(row.accelerator, "GPUS_ALL_REGIONS")
        return "CPUS"

    def _check_gpu_quota(self, request: _Request, zone: str, body: dict[str, Any]) -> None:
        """GCP refuses an insert that would take the region past a GPU quota. Caller holds the lock."""
        use = self._gpu_use(body)
        if use is None:
            return
        metric, count = use
        region = zone.rsplit("-", 1)[0]
        limit = self._quota_limit(metric)
        if self._gpu_usage(request.project, region).get(metric, 0.0) + count > limit:
            status, reason, info_reason, _template = SYNC_ERRORS["QUOTA_EXCEEDED"]
            message = f"Quota '{metric}' exceeded.  Limit: {limit} in region {region}."
            metadata = {"quota_metric": f"compute.googleapis.com/{metric.lower()}", "region": region}
            raise ApiError(status, message, reason, info_reason, metadata)
