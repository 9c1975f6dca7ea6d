"""The GPUs a host agent hands its leases: ``NvidiaDevices`` reads ``nvidia-smi`` and makes and destroys MIG
instances; ``FakeDevices`` stands in for them under ``--simulate``. Nothing else differs between a real host
and a simulated one. ``visible_devices`` names what a lease's ``CUDA_VISIBLE_DEVICES`` holds.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Any

from providers.community.executor_base import ExecutorError, GpuSeen, telemetry_sample

_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[0-9A-Za-z-]+)\)")
_GPU_LINE = re.compile(r"^GPU (\d+):")
# What ``nvidia-smi mig -cgi ... -C`` prints: "Successfully created GPU instance ID  5 on GPU  0 using profile
# MIG 3g.40gb (ID  9)", then "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  5 ...".
_GI_CREATED = re.compile(r"created GPU instance ID\s+(\d+)")
_CI_CREATED = re.compile(r"created compute instance ID\s+(\d+)")


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance the agent created for one lease: the GPU it is on, its UUID (what the lease's
    ``CUDA_VISIBLE_DEVICES`` names), and the GPU and compute instance ids it is destroyed by."""

    gpu_index: int
    uuid: str
    gpu_instance: int
    compute_instance: int


class NvidiaDevices:
    """The host's GPUs through ``nvidia-smi``."""

    def _smi(self, *args: str) -> str:
        binary = shutil.which("nvidia-smi")
        if binary is None:
            raise ExecutorError("nvidia-smi not found: the NVIDIA driver is not installed")
        out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
        if out.returncode != 0:
            raise ExecutorError(f"nvidia-smi failed: {' '.join(out.stderr.split())[:200]}")
        return out.stdout

    def _query(self, fields: str) -> list[list[str]]:
        text = self._smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
        return [[part.strip() for part in line.split(",")] for line in text.strip().splitlines()]

    def gpus(self, indexes: tuple[int, ...]) -> list[GpuSeen]:
        rows = self._query("index,name,memory.total")
        return [GpuSeen(int(i), name, round(float(mib) / 1024)) for i, name, mib in rows if int(i) in indexes]

    def telemetry(self, indexes: tuple[int, ...], busy: bool) -> list[dict[str, Any]]:
        rows = self._query("index,utilization.gpu,temperature.gpu,power.draw,memory.used")
        return [
            telemetry_sample(int(i), float(u), float(t), float(p), float(m) / 1024)
            for i, u, t, p, m in rows
            if int(i) in indexes
        ]

    def mig_instances(self) -> dict[int, list[str]]:
        """GPU index -> the UUIDs of the MIG instances the host created on it (none where MIG is off)."""
        found: dict[int, list[str]] = {}
        current = -1
        for line in self._smi("-L").splitlines():
            if gpu := _GPU_LINE.match(line):
                current = int(gpu.group(1))
            elif (mig := _MIG_LINE.match(line)) and current >= 0:
                found.setdefault(current, []).append(mig.group(1))
        return found

    def mig_create(self, index: int, profile: str) -> MigDevice:
        """A GPU instance of ``profile`` on GPU ``index`` (in MIG mode) with its default compute instance, as
        NVIDIA's MIG User Guide creates one ("Creating GPU Instances": ``nvidia-smi mig -cgi <profile> -C``,
        here with ``-i <index>``). Its UUID is the one MIG device ``nvidia-smi -L`` lists on that GPU that it
        did not before, so callers serialise creations on the host (the agent's lock). ``ExecutorError`` when
        the driver refuses (no room, MIG mode off), with nothing left behind."""
        before = set(self.mig_instances().get(index, []))
        out = self._smi("mig", "-i", str(index), "-cgi", profile, "-C")
        gi, ci = _GI_CREATED.search(out), _CI_CREATED.search(out)
        new = [found for found in self.mig_instances().get(index, []) if found not in before]
        if gi is None or ci is None or len(new) != 1:
            if gi is not None:
                # Half made (no compute instance, or no device to name): take the GPU instance away again.
                with contextlib.suppress(ExecutorError):
                    self._smi("mig", "-i", str(index), "-gi", gi.group(1), "-dci")
                    self._smi("mig", "-i", str(index), "-gi", gi.group(1), "-dgi")
            raise ExecutorError(
                f"nvidia-smi made no {profile} MIG device on GPU {index}: {' '.join(out.split())[:200]}"
            )
        return MigDevice(index, new[0], int(gi.group(1)), int(ci.group(1)))

    def mig_destroy(self, device: MigDevice) -> None:
        """Destroy the lease's MIG instance: its compute instances, then its GPU instance, in the order the
        MIG User Guide's "Destroying GPU Instances" gives (``nvidia-smi mig -dci``, then ``-dgi``), with
        ``-i`` and ``-gi`` naming only this one. ``ExecutorError`` when the driver refuses (a process still
        on it)."""
        gpu, gi = str(device.gpu_index), str(device.gpu_instance)
        self._smi("mig", "-i", gpu, "-gi", gi, "-dci")
        self._smi("mig", "-i", gpu, "-gi", gi, "-dgi")


@dataclass
class FakeDevices:
    """GPUs that are not there, for ``--simulate``: the models given, and MIG instances if the test says so.
    MIG instances made for leases (``mig_create``) get a fake UUID and are listed like the host's own."""

    models: list[tuple[str, int]] | list[tuple[str, int, int]]  # (name, memory GB[, rated power W])
    mig: dict[int, list[str]] = field(default_factory=dict)
    created: list[MigDevice] = field(default_factory=list)  # live ones this host made, oldest first

    def gpus(self, indexes: tuple[int, ...]) -> list[GpuSeen]:
        return [GpuSeen(i, *self.models[i]) for i in indexes if 0 <= i < len(self.models)]

    def telemetry(self, indexes: tuple[int, ...], busy: bool) -> list[dict[str, Any]]:
        samples = []
        for gpu in self.gpus(indexes):
            util = random.uniform(88, 99) if busy else random.uniform(0, 4)  # noqa: S311 - a simulation
            power = gpu.power_limit_w * (0.1 + 0.8 * util / 100)
            samples.append(telemetry_sample(gpu.index, util, 36 + util * 0.4, power, gpu.memory_gb * 0.7 * busy))
        return samples

    def mig_instances(self) -> dict[int, list[str]]:
        return {index: list(uuids) for index, uuids in self.mig.items()}

    def mig_create(self, index: int, profile: str) -> MigDevice:
        """``NvidiaDevices.mig_create`` without the driver: a fake UUID on GPU ``index``."""
        if not 0 <= index < len(self.models):
            raise ExecutorError(f"no GPU {index} to make a {profile} MIG device on")
        gpu_instance = 1 + max((d.gpu_instance for d in self.created if d.gpu_index == index), default=0)
        device = MigDevice(index, f"MIG-{uuid.uuid4()}", gpu_instance, 0)
        self.mig.setdefault(index, []).append(device.uuid)
        self.created.append(device)
        return device

    def mig_destroy(self, device: MigDevice) -> None:
        if device in self.created:
            self.created.remove(device)
            self.mig[device.gpu_index].remove(device.uuid)
            if not self.mig[device.gpu_index]:
                del self.mig[device.gpu_index]


def visible_devices(indexes: tuple[int, ...], mig: dict[int, list[str]], own: tuple[str, ...] = ()) -> list[str]:
    """What ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` name: a GPU's MIG instances where the host
    enabled MIG on it (CUDA sees only those), else the GPU's index. ``own``: the MIG devices the agent made for
    this lease alone (a MIG slice), which are then all it sees, whatever else runs on that GPU."""
    if own:
        return list(own)
    devices: list[str] = []
    for index in indexes:
        devices.extend(mig.get(index) or [str(index)])
    return devices
