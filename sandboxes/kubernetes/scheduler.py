"""The default scheduler's filters and its ``FailedScheduling`` message, for extended resources as the device plugin
accounts them.

A node is filtered in kube-scheduler's default plugin order, each node reporting the first plugin that rejects it
("Scheduling Framework", https://kubernetes.io/docs/concepts/scheduling-eviction/scheduling-framework/):
NodeUnschedulable (``spec.unschedulable`` without a toleration -> ``node(s) were unschedulable``), TaintToleration
(an untolerated NoSchedule/NoExecute taint -> ``node(s) had untolerated taint {key: value}``), NodeAffinity
(``nodeSelector`` and required ``nodeAffinity`` -> ``node(s) didn't match Pod's node affinity/selector``), then
NodeResourcesFit (each short resource -> ``Insufficient <resource>``). Extended resources are requested through
limits, requests defaulting to (and having to equal) them, and are never overcommitted ("Schedule GPUs",
https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/; "Device Plugins",
https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/): a node fits when its
allocatable less the requests of its non-terminated pods covers the pod's.

The message is the scheduler's FitError: ``0/<n> nodes are available: <count> <reason>, ...`` with the
``<count> <reason>`` strings sorted, then the preemption post-filter's own summary, e.g. (NVIDIA/k8s-device-plugin
issue 430) ``0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No
preemption victims found for incoming pod..``.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from sandboxes.kubernetes.seed import GPU, MIG_PREFIX, SHARED, UNSCHEDULABLE_TAINT, NodeSeed
from sandboxes.kubernetes.state import Device
from sandboxes.kubernetes.wire import parse_quantity

GPU_RESOURCES = (GPU, SHARED)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RESOURCE_REASON = "Insufficient"
UNRESOLVABLE = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(MIG_PREFIX)


def container_requests(container: dict[str, Any]) -> dict[str, Decimal]:
    """A container's effective requests: its requests, each missing one defaulted from its limit."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    merged = {**limits, **requests}
    return {name: parse_quantity(value) for name, value in merged.items()}


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """The pod's requests: the sum over its containers (init containers run first, so their maximum counts)."""
    total: dict[str, Decimal] = {}
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or []:
        for name, value in container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def node_allocatable(node: dict[str, Any]) -> dict[str, Decimal]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {name: parse_quantity(value) for name, value in allocatable.items()}


def _tolerates(pod: dict[str, Any], taint: dict[str, Any]) -> bool:
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key = str(expression.get("key") or "")
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        try:
            left, right = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def matches_affinity(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    # Terms are ORed; a term's expressions are ANDed.
    return any(all(_expression_holds(e, labels) for e in term.get("matchExpressions") or []) for term in terms)


def node_rejections(
    pod: dict[str, Any], node: dict[str, Any], used: dict[str, Decimal], *, capacity_fault: bool = False
) -> list[str]:
    """Why ``node`` cannot take ``pod`` (the first rejecting filter's reasons), [] when it fits. ``used`` is what
    the node's non-terminated pods request; ``capacity_fault`` makes every GPU resource the pod asks for short."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    unschedulable_taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if spec.get("unschedulable") and not _tolerates(pod, unschedulable_taint):
        return ["node(s) were unschedulable"]
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"]
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not matches_affinity(pod, labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = node_allocatable(node)
    reasons = []
    if used.get("pods", Decimal(0)) + 1 > allocatable.get("pods", Decimal(110)):
        reasons.append("Too many pods")
    for name, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        free = allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
        if free < amount or (capacity_fault and is_gpu_resource(name)):
            reasons.append(f"{RESOURCE_REASON} {name}")
    return reasons


def failure_message(rejections: dict[str, list[str]]) -> str:
    """The FitError message over every node, with the preemption post-filter's summary after it."""
    total = len(rejections)
    counts: Counter[str] = Counter(reason for reasons in rejections.values() for reason in reasons)
    preemption: Counter[str] = Counter(
        NO_VICTIMS if any(r.startswith(RESOURCE_REASON) or r == "Too many pods" for r in reasons) else UNRESOLVABLE
        for reasons in rejections.values()
    )
    found = ", ".join(sorted(f"{count} {reason}" for reason, count in counts.items()))
    preempt = ", ".join(sorted(f"{count} {reason}" for reason, count in preemption.items()))
    if total == 0:
        return "no nodes available to schedule pods"
    return f"0/{total} nodes are available: {found}. preemption: 0/{total} nodes are available: {preempt}.."


def allocate_devices(seed: NodeSeed, requests: dict[str, Decimal], held: list[Device]) -> list[Device]:
    """The devices a bound pod gets on its node: the lowest free GPUs, time-sliced replicas or MIG devices of each
    GPU resource it requests (the device plugin's Allocate; the sandbox picks in index order)."""
    devices: list[Device] = []
    for resource, amount in sorted(requests.items()):
        count = int(amount)
        if count <= 0 or not is_gpu_resource(resource):
            continue
        if resource == GPU:
            taken = {d.index for d in held if d.resource == GPU}
            free = [i for i in range(seed.gpus) if i not in taken]
            devices += [Device(GPU, i) for i in free[:count]]
        elif resource == SHARED:
            taken_units = {d.mig_instance for d in held if d.resource == SHARED}
            units = [u for u in range(seed.gpus * seed.replicas) if u not in taken_units][:count]
            # A replica is a share of GPU unit // replicas; ``mig_instance`` keeps the replica's unit number.
            devices += [Device(SHARED, u // seed.replicas, mig_instance=u) for u in units]
        else:
            profile = resource[len(MIG_PREFIX) :]
            taken_mig = {(d.index, d.mig_instance) for d in held if d.resource == resource}
            free_mig = [m for m in seed.mig if m.profile == profile and (m.gpu, m.instance_id) not in taken_mig]
            devices += [Device(resource, m.gpu, m.instance_id, profile) for m in free_mig[:count]]
    return devices
