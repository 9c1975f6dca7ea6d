"""Kubernetes API objects -> the broker's DTOs, and the API's ``Status`` errors -> the broker's error classes.
Pure: plain dicts in (the JSON the API server answers, https://kubernetes.io/docs/reference/kubernetes-api/),
DTOs and errors out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.gpu_specs import gpu_spec_get
from providers.types import InstanceHandle, InstanceState

PROVIDER = "kubernetes"

# Labels the broker puts on everything it creates (Kubernetes' recommended labels,
# https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/, plus its own).
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "broker"
ORDER_LABEL = "broker.order"
ATTEMPT_LABEL = "broker.attempt"
INSTANCE_TYPE_LABEL = "broker.instance-type"
POD_NAME = "lease"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# NVIDIA's device plugin resources (https://github.com/NVIDIA/k8s-device-plugin, "Configuration Option Details":
# MIG_STRATEGY mixed adds ``nvidia.com/mig-<slice_count>g.<memory_size>gb``; "With CUDA Time-Slicing":
# renameByDefault advertises ``<resource-name>.shared``) and GPU Feature Discovery's labels (docs/gpu-feature-
# discovery/README.md, "Generated Labels").
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB ("Memory of the GPU in Mb")
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_PROFILE_NAME = re.compile(r"([1-7])g\.(\d{1,3})gb")
# GFD writes the product with spaces as '-', adds "-MIG-<profile>" under the single strategy, and "-SHARED" when
# the resource is time-sliced without being renamed (internal/lm/resource.go, productLabel).
_PRODUCT_SUFFIX_SHARED = "-SHARED"
_PRODUCT_MIG = re.compile(r"-MIG-(\d+g\.\d+gb)$")

_QUANTITY = re.compile(
    r"([0-9]{1,20}(?:\.[0-9]{1,20})?|\.[0-9]{1,20})(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3), "M": Decimal(10**6),
            "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}  # fmt: skip


def quantity(text: Any) -> Decimal:
    """A resource quantity (``8``, ``500m``, ``64Gi``, ``1e3``; https://kubernetes.io/docs/reference/kubernetes-
    api/common-definitions/quantity/) as a number. Raises ``MalformedProviderResponse`` for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        return Decimal(text)
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise MalformedProviderResponse(f"{str(text)[:40]!r} is not a resource quantity", provider=PROVIDER)
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    if suffix:
        try:
            return number.scaleb(int(suffix[1:]))
        except InvalidOperation:
            raise MalformedProviderResponse(f"{text[:40]!r} is out of range", provider=PROVIDER) from None
    return number


# ---------------------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the catalogue needs of one node."""

    name: str
    labels: dict[str, str]
    schedulable: bool  # not cordoned, Ready, and no taint the broker's pods do not tolerate
    allocatable: dict[str, Decimal]
    external_ip: str | None = None
    internal_ip: str | None = None

    @property
    def address(self) -> str | None:
        return self.external_ip or self.internal_ip


# A node's name is a DNS subdomain: at most 253 characters of lower-case letters, digits, '-' and '.'
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# The taint GPU node pools commonly carry (NVIDIA's README example tolerates it; GKE adds it to GPU nodes): the
# broker's pods tolerate it, and only it.
GPU_TAINT_KEY = "nvidia.com/gpu"


def node_view(item: Mapping[str, Any]) -> NodeView:
    """A Node (core/v1) as ``NodeView``. Cordoned (``spec.unschedulable``), not Ready (``status.conditions``
    Ready != True) or tainted NoSchedule/NoExecute with any taint but ``nvidia.com/gpu`` is not schedulable."""
    metadata = _dict(item.get("metadata"))
    spec, status = _dict(item.get("spec")), _dict(item.get("status"))
    name = metadata.get("name")
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
        raise MalformedProviderResponse(f"a node named {str(name)[:80]!r}, not a DNS subdomain", provider=PROVIDER)
    labels = {str(k): str(v) for k, v in _dict(metadata.get("labels")).items()}
    ready = any(
        _dict(c).get("type") == "Ready" and _dict(c).get("status") == "True" for c in _list(status.get("conditions"))
    )
    taints = [_dict(t) for t in _list(spec.get("taints")) if _dict(t).get("effect") in ("NoSchedule", "NoExecute")]
    untolerated = any(t.get("key") != GPU_TAINT_KEY for t in taints)
    allocatable: dict[str, Decimal] = {}
    for key, value in _dict(status.get("allocatable")).items():
        try:
            allocatable[str(key)] = quantity(value)
        except MalformedProviderResponse:
            continue  # one odd resource does not hide the node's GPUs
    addresses = {str(_dict(a).get("type")): str(_dict(a).get("address")) for a in _list(status.get("addresses"))}
    return NodeView(
        name=name,
        labels=labels,
        schedulable=ready and not spec.get("unschedulable") and not untolerated,
        allocatable=allocatable,
        external_ip=addresses.get("ExternalIP"),
        internal_ip=addresses.get("InternalIP"),
    )


def gpu_model_key(product: str, memory_mib: int | None) -> str | None:
    """The broker's model key for GFD's ``nvidia.com/gpu.product`` ("NVIDIA-A100-SXM4-80GB", "Tesla-T4",
    "NVIDIA-L4-SHARED", "A100-SXM4-40GB-MIG-1g.5gb"), using the GPU's memory (MiB) to tell sizes apart: the
    model whose name matches (``gpu_names.reported_model_matches``) with the most memory the GPU holds. Without
    a memory figure, the size written in the product name decides. None when no model matches."""
    name = _PRODUCT_MIG.sub("", product.removesuffix(_PRODUCT_SUFFIX_SHARED)).replace("-", " ")
    candidates = [k for k in gpu_names.SORTED if gpu_names.reported_model_matches(name, k)]
    if memory_mib is None:
        written = re.search(r"(\d+)\s*GB", name.upper())
        memory_mib = int(written.group(1)) * 1024 if written else None
    if memory_mib is None:
        return candidates[0] if len(candidates) == 1 else None
    fitting = [
        (int((gpu_spec_get(k) or {}).get("memory_gb") or 0), k)
        for k in candidates
        if gpu_names.reported_gpu_matches(name, memory_mib / 1024, k, (gpu_spec_get(k) or {}).get("memory_gb") or 0)
    ]
    return max(fitting)[1] if fitting else None


def node_gpu_model(node: NodeView) -> str | None:
    """The node's GPU model key from its GFD labels; under the MIG single strategy ``gpu.memory`` is a slice's,
    so the product name's size decides."""
    product = node.labels.get(PRODUCT_LABEL, "")
    if not product:
        return None
    single_mig = _PRODUCT_MIG.search(product.removesuffix(_PRODUCT_SUFFIX_SHARED)) is not None
    memory = None if single_mig else label_int(node.labels.get(MEMORY_LABEL))
    return gpu_model_key(product, memory)


def single_strategy_profile(node: NodeView) -> str | None:
    """The MIG profile ``nvidia.com/gpu`` stands for under the single strategy (GFD's product
    "A100-SXM4-40GB-MIG-1g.5gb"), else None."""
    if node.labels.get(MIG_STRATEGY_LABEL) != "single":
        return None
    match = _PRODUCT_MIG.search(node.labels.get(PRODUCT_LABEL, "").removesuffix(_PRODUCT_SUFFIX_SHARED))
    return match.group(1) if match else None


def replicas(node: NodeView) -> int | None:
    """Time-sliced replicas per GPU (``nvidia.com/gpu.replicas``), None when the label is absent or not a number."""
    value = label_int(node.labels.get(REPLICAS_LABEL))
    return value if value is not None and value >= 1 else None


# ----------------------------------------------------------------------------------------------------- pods


def pod_requests(pod: Mapping[str, Any], resource: str) -> Decimal:
    """What a pod holds of ``resource`` as the scheduler counts it: the larger of its containers' sum and its
    largest init container (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-
    within-containers); an extended resource's request is its limit when no request is given."""
    spec = _dict(pod.get("spec"))

    def one(container: Any) -> Decimal:
        resources = _dict(_dict(container).get("resources"))
        value = _dict(resources.get("requests")).get(resource, _dict(resources.get("limits")).get(resource))
        try:
            return quantity(value) if value is not None else Decimal(0)
        except MalformedProviderResponse:
            return Decimal(0)

    containers = sum((one(c) for c in _list(spec.get("containers"))), Decimal(0))
    init = max((one(c) for c in _list(spec.get("initContainers"))), default=Decimal(0))
    return max(containers, init)


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node that has not ended (phase Succeeded or Failed frees what it held)."""
    return bool(_dict(pod.get("spec")).get("nodeName")) and _dict(pod.get("status")).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def is_broker_pod(pod: Mapping[str, Any]) -> bool:
    return _dict(_dict(pod.get("metadata")).get("labels")).get(MANAGED_BY) == MANAGED_BY_VALUE


def foreign_requests(pods: Sequence[Mapping[str, Any]], resources: Sequence[str]) -> dict[tuple[str, str], Decimal]:
    """(node, resource) -> what pods the broker did not make hold of it. The broker's own pods are left out: the
    broker counts them through its own holds."""
    used: dict[tuple[str, str], Decimal] = {}
    for pod in pods:
        if not holds_resources(pod) or is_broker_pod(pod):
            continue
        node = str(_dict(pod.get("spec")).get("nodeName"))
        for resource in resources:
            amount = pod_requests(pod, resource)
            if amount:
                used[(node, resource)] = used.get((node, resource), Decimal(0)) + amount
    return used


# ------------------------------------------------------------------------------------------------- handles


@dataclass(frozen=True, slots=True)
class PodState:
    """A pod's state in the broker's words, with the reason when it failed."""

    state: InstanceState
    extra: dict[str, Any] = field(default_factory=dict)


IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """Point 5 of the interface: Pending -> PENDING, unschedulable -> FAILED (capacity), an image that cannot be
    pulled -> FAILED (the buyer's error), Running -> RUNNING, Succeeded/Failed -> TERMINATED; a pod being deleted
    is TERMINATED too. Reasons are from the pod lifecycle reference
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/)."""
    metadata, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    phase = str(status.get("phase") or "Pending")
    if metadata.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
        return PodState(InstanceState.TERMINATED, {"phase": phase})
    if phase == "Running":
        return PodState(InstanceState.RUNNING, {"phase": phase})
    for condition in _list(status.get("conditions")):
        c = _dict(condition)
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return PodState(
                InstanceState.FAILED,
                {
                    "phase": phase,
                    "error_class": CapacityUnavailable.error_class,
                    "error_code": "FailedScheduling",
                    "error_message": str(c.get("message") or "no node fits the pod")[:1000],
                },
            )
    for container in _list(status.get("containerStatuses")):
        c = _dict(container)
        waiting = _dict(_dict(c.get("state")).get("waiting"))
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = str(c.get("image") or "")[:300]
            return PodState(
                InstanceState.FAILED,
                {
                    "phase": phase,
                    "error_class": ProviderRequestRejected.error_class,
                    "error_code": str(waiting["reason"]),
                    "error_message": f"the image {image} cannot be pulled: {str(waiting.get('message') or '')[:700]}",
                },
            )
    return PodState(InstanceState.PENDING, {"phase": phase})


def instance_handle(
    pod: Mapping[str, Any],
    region: str,
    *,
    node: NodeView | None = None,
    service: Mapping[str, Any] | None = None,
) -> InstanceHandle:
    """The pod as an ``InstanceHandle``: id ``<namespace>/<pod>``, zone the node it is bound to (else the node
    its selector names), the node's ExternalIP (else InternalIP) as public address, the Service's node ports in
    ``extra["ports"]``."""
    metadata, spec = _dict(pod.get("metadata")), _dict(pod.get("spec"))
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    labels = {str(k): str(v) for k, v in _dict(metadata.get("labels")).items()}
    zone = str(spec.get("nodeName") or _dict(spec.get("nodeSelector")).get(HOSTNAME_LABEL) or "")
    state = pod_state(pod)
    extra: dict[str, Any] = {"namespace": namespace, **state.extra}
    if service is not None:
        extra["ports"] = service_ports(service)
    return InstanceHandle(
        instance_id=f"{namespace}/{name}",
        region=region,
        zone=zone,
        instance_type=labels.get(INSTANCE_TYPE_LABEL, ""),
        state=state.state,
        public_ip=node.address if node is not None else None,
        private_ip=node.internal_ip if node is not None else None,
        launched_at=str(metadata.get("creationTimestamp") or "") or None,
        tags=labels,
        extra=extra,
    )


def service_ports(service: Mapping[str, Any]) -> dict[str, int]:
    """A NodePort Service's ``{"<port>": <nodePort>}``."""
    ports: dict[str, int] = {}
    for entry in _list(_dict(service.get("spec")).get("ports")):
        e = _dict(entry)
        if isinstance(e.get("port"), int) and isinstance(e.get("nodePort"), int):
            ports[str(e["port"])] = e["nodePort"]
    return ports


def terminated_handle(instance_id: str, region: str) -> InstanceHandle:
    return InstanceHandle(
        instance_id=instance_id, region=region, zone="", instance_type="", state=InstanceState.TERMINATED
    )


# -------------------------------------------------------------------------------------------------- errors

_FORBIDDEN = re.compile(r'cannot (\w+) resource "([^"]+)" in API group "([^"]*)"')
MAX_STATUS_CHARS = 64 * 1024


def status_error(http_status: int, status: Mapping[str, Any] | None, fallback: str = "") -> ProviderError:
    """An API error answer (``Status``: https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/
    status/) as the broker's error. 401 credentials; 403 over a quota (the message says "exceeded quota") quota,
    any other 403 credentials naming the verb and resource; 404 final ``NotFound``; 409 final (its reason,
    ``AlreadyExists`` or ``Conflict``); 422 final ``Invalid``; 429, 5xx and 410 (an expired list) transient;
    anything else final."""
    body = status or {}
    reason = str(body.get("reason") or "")[:100]
    message = str(body.get("message") or fallback or f"HTTP {http_status}")[:1000]
    if http_status == 401:
        return CredentialsRejected(
            f"the API server refused the token: {message}", code="Unauthorized", provider=PROVIDER, http_status=401
        )
    if http_status == 403:
        if "exceeded quota" in message:
            return QuotaExceeded(message, code="ExceededQuota", provider=PROVIDER, http_status=403)
        found = _FORBIDDEN.search(message)
        if found:
            verb, resource, group = found.groups()
            message = f"the service account may not {verb} {resource} ({group or 'core'}): {message}"
        return CredentialsRejected(message, code=reason or "Forbidden", provider=PROVIDER, http_status=403)
    if http_status == 404:
        return ProviderRequestRejected(message, code="NotFound", provider=PROVIDER, http_status=404)
    if http_status == 409:
        return ProviderRequestRejected(message, code=reason or "Conflict", provider=PROVIDER, http_status=409)
    if http_status == 422:
        return ProviderRequestRejected(message, code="Invalid", provider=PROVIDER, http_status=422)
    if http_status in (410, 429) or http_status >= 500:
        code = reason or ("TooManyRequests" if http_status == 429 else f"HTTP{http_status}")
        return TransientProviderError(message, code=code, provider=PROVIDER, http_status=http_status)
    return ProviderRequestRejected(
        message, code=reason or f"HTTP{http_status}", provider=PROVIDER, http_status=http_status
    )


# --------------------------------------------------------------------------------------------------- helpers


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def label_int(value: Any) -> int | None:
    if isinstance(value, str) and value.isdigit() and len(value) <= 9:
        return int(value)
    return None
