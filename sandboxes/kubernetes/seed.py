"""The sandbox cluster's nodes: a small GPU cluster as NVIDIA's device plugin and GPU Feature Discovery publish it.

Names from NVIDIA's documentation:

- extended resources from the k8s-device-plugin README (https://github.com/NVIDIA/k8s-device-plugin): whole GPUs as
  ``nvidia.com/gpu``; MIG devices under the ``mixed`` strategy as ``nvidia.com/mig-<profile>``; time-sliced GPUs with
  ``renameByDefault: true`` as ``nvidia.com/gpu.shared``, ``replicas`` units per GPU;
- labels from GPU Feature Discovery's "Generated Labels"
  (https://github.com/NVIDIA/k8s-device-plugin/blob/main/docs/gpu-feature-discovery/README.md):
  ``nvidia.com/gpu.product`` (``-SHARED`` appended for a renamed shared resource), ``nvidia.com/gpu.memory``
  (MiB), ``nvidia.com/gpu.count``, ``nvidia.com/gpu.replicas``, ``nvidia.com/mig.strategy`` and, under ``mixed``,
  ``nvidia.com/mig-<profile>.count`` / ``.memory`` / ``.multiprocessors`` / ``.slices.gi`` / ``.slices.ci``;
- MIG profiles legal on an A100-SXM4-40GB per the MIG user guide
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/#supported-profiles): seven ``1g.5gb`` instances fill a
  GPU, and two ``3g.20gb`` instances fit on one.

The Node object's shape (``status.capacity``, ``allocatable``, ``conditions``, ``addresses``, ``nodeInfo``,
``spec.taints``) is the core/v1 Node of https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from providers import gpu_names

REGION = "eu-central"
POOL_LABEL = "broker.example/pool"
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
# The taints the node lifecycle controller and ``kubectl cordon`` put on a node
# (https://kubernetes.io/docs/reference/labels-annotations-taints/).
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG device: the physical GPU it is on, its profile and its GPU instance id."""

    gpu: int
    profile: str
    instance_id: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    profile: str
    memory_mib: int
    multiprocessors: int
    slices: int


A100_40_PROFILES = {
    "1g.5gb": MigProfile("1g.5gb", 4864, 14, 1),
    "3g.20gb": MigProfile("3g.20gb", 20096, 42, 3),
}


@dataclass(frozen=True, slots=True)
class NodeSeed:
    """One node of the sandbox cluster.

    ``model`` is the broker's GPU key (``providers.gpu_names``), ``product`` GFD's ``gpu.product`` label,
    ``sharing`` "whole", "mig", "shared" or "" (no GPU); ``mig`` lists the MIG devices, ``replicas`` the time-slicing
    replicas per GPU.
    """

    name: str
    pool: str
    model: str = ""
    product: str = ""
    memory_mib: int = 0
    gpus: int = 0
    sharing: str = ""
    mig: tuple[MigSlice, ...] = ()
    replicas: int = 1
    family: str = ""
    cpu: int = 32
    memory_gi: int = 256
    storage_gi: int = 900
    ready: bool = True
    unschedulable: bool = False
    extra_labels: dict[str, str] = field(default_factory=dict)

    def extended(self) -> dict[str, int]:
        """The node's extended resources as the device plugin advertises them."""
        if self.sharing == "whole":
            return {GPU: self.gpus}
        if self.sharing == "shared":
            return {SHARED: self.gpus * self.replicas}
        if self.sharing == "mig":
            counts: dict[str, int] = {}
            for device in self.mig:
                counts[MIG_PREFIX + device.profile] = counts.get(MIG_PREFIX + device.profile, 0) + 1
            return counts
        return {}

    def labels(self) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/region": REGION,
            "topology.kubernetes.io/zone": f"{REGION}-a",
            POOL_LABEL: self.pool,
        }
        if self.gpus:
            labels.update(
                {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": self.product + ("-SHARED" if self.sharing == "shared" else ""),
                    "nvidia.com/gpu.memory": str(self.memory_mib),
                    "nvidia.com/gpu.count": str(self.gpus),
                    "nvidia.com/gpu.family": self.family,
                    "nvidia.com/gpu.replicas": str(self.replicas),
                    "nvidia.com/mig.strategy": "mixed" if self.sharing == "mig" else "none",
                    "nvidia.com/mig.capable": "true" if self.model.startswith("A100") else "false",
                }
            )
            if self.sharing == "shared":
                labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
            for resource, count in self.extended().items():
                if not resource.startswith(MIG_PREFIX):
                    continue
                profile = A100_40_PROFILES[resource[len(MIG_PREFIX) :]]
                prefix = resource.removeprefix("nvidia.com/")
                labels.update(
                    {
                        f"nvidia.com/{prefix}.count": str(count),
                        f"nvidia.com/{prefix}.memory": str(profile.memory_mib),
                        f"nvidia.com/{prefix}.multiprocessors": str(profile.multiprocessors),
                        f"nvidia.com/{prefix}.slices.gi": str(profile.slices),
                        f"nvidia.com/{prefix}.slices.ci": str(profile.slices),
                    }
                )
        labels.update(self.extra_labels)
        return labels


def _mig_layout() -> tuple[MigSlice, ...]:
    devices = [MigSlice(gpu, "1g.5gb", 7 + index) for gpu in (0, 1) for index in range(7)]
    devices += [MigSlice(2, "3g.20gb", 1), MigSlice(2, "3g.20gb", 2)]
    return tuple(devices)


SEED: tuple[NodeSeed, ...] = (
    NodeSeed(
        "gpu-a100-0",
        "a100",
        gpu_names.A100_80_SXM,
        "NVIDIA-A100-SXM4-80GB",
        81920,
        8,
        "whole",
        family="ampere",
        cpu=128,
        memory_gi=2048,
        storage_gi=7000,
    ),
    NodeSeed(
        "gpu-a100-mig-0",
        "a100-mig",
        gpu_names.A100_40_SXM,
        "NVIDIA-A100-SXM4-40GB",
        40960,
        3,
        "mig",
        mig=_mig_layout(),
        family="ampere",
        cpu=96,
        memory_gi=1024,
        storage_gi=3000,
    ),
    NodeSeed("gpu-t4-0", "t4", gpu_names.T4, "Tesla-T4", 15360, 4, "whole", family="turing", cpu=48, memory_gi=192),
    NodeSeed(
        "gpu-l4-shared-0",
        "l4-shared",
        gpu_names.L4,
        "NVIDIA-L4",
        23034,
        2,
        "shared",
        replicas=4,
        family="ada-lovelace",
        cpu=48,
        memory_gi=192,
    ),
    NodeSeed(
        "gpu-t4-cordoned-0",
        "t4",
        gpu_names.T4,
        "Tesla-T4",
        15360,
        4,
        "whole",
        family="turing",
        cpu=48,
        memory_gi=192,
        unschedulable=True,
    ),
    NodeSeed(
        "gpu-a100-notready-0",
        "a100",
        gpu_names.A100_80_SXM,
        "NVIDIA-A100-SXM4-80GB",
        81920,
        8,
        "whole",
        family="ampere",
        cpu=128,
        memory_gi=2048,
        storage_gi=7000,
        ready=False,
    ),
    NodeSeed("cpu-0", "cpu", cpu=16, memory_gi=64, storage_gi=200),
)
