"""Offers from a cluster's nodes (interface point 7): each schedulable node's NVIDIA resources, priced by the
seller's ``gpu_prices`` rules, with what pods the broker did not make already hold subtracted. Pure.

* ``nvidia.com/gpu`` (whole GPUs): ``k8s-gpu-<n>`` for n in 1, 2, 4, 8 up to what the node has, like an
  independent host's lease sizes;
* ``nvidia.com/mig-<profile>`` (MIG, mixed strategy), or ``nvidia.com/gpu`` under the single strategy:
  ``k8s-mig-<profile>``, one slice, ``gpu_fraction`` its compute slices / 7 and its memory ("Supported MIG
  Profiles", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/);
* ``nvidia.com/gpu.shared`` (time-sliced, renamed), or ``nvidia.com/gpu`` time-sliced without renaming (GFD's
  product then ends in ``-SHARED``): ``k8s-shared-1``, only when the account's ``shared_gpus`` is ``allow`` and
  ``nvidia.com/gpu.replicas`` says how many share a card (``gpu_fraction`` 1/replicas).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any

from providers.community.mig import COMPUTE_SLICES, MIG_PROFILE, mig_profile
from providers.errors import MalformedProviderResponse
from providers.gpu_specs import gpu_spec_get
from providers.kubernetes import mapping, pricing
from providers.kubernetes.pricing import PriceRule, price_for
from providers.types import GPU_FRACTION, GPU_TIME_SLICED, NODE_RESOURCE, NODE_UNITS_FREE, OfferQuote, PricingModel

SIZES = (1, 2, 4, 8)
DEFAULT_POOL_LABEL = "broker.example/pool"
GIB = Decimal(2**30)
_CENT = Decimal("0.000001")


@dataclass(frozen=True, slots=True)
class OfferSettings:
    region: str
    rules: Sequence[PriceRule]
    shared_gpus: bool = False
    pool_label: str = DEFAULT_POOL_LABEL


def instance_resource(instance_type: str) -> tuple[str, int] | None:
    """The resource and count an instance type names when the offer's ``extra`` is not at hand:
    ``k8s-gpu-4`` -> (nvidia.com/gpu, 4), ``k8s-mig-3g.40gb`` -> (nvidia.com/mig-3g.40gb, 1), ``k8s-shared-1``
    -> (nvidia.com/gpu.shared, 1). None for anything else."""
    if instance_type.startswith("k8s-gpu-") and instance_type[8:].isdigit():
        count = int(instance_type[8:])
        return (mapping.GPU_RESOURCE, count) if count in SIZES else None
    if instance_type.startswith("k8s-mig-") and mapping.MIG_PROFILE_NAME.fullmatch(instance_type[8:]):
        return mapping.MIG_RESOURCE_PREFIX + instance_type[8:], 1
    if instance_type == "k8s-shared-1":
        return mapping.SHARED_RESOURCE, 1
    return None


def offers(
    nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], settings: OfferSettings
) -> list[OfferQuote]:
    """Every offer of the cluster, sorted by (zone, instance type)."""
    views = []
    for item in nodes:
        try:
            views.append(mapping.node_view(item))
        except MalformedProviderResponse:
            continue  # a node the API server describes nonsensically is not sold; the others still are
    resources = sorted({r for v in views for r in v.allocatable if _gpu_resource(r)})
    used = mapping.foreign_requests(pods, resources)
    quotes: list[OfferQuote] = []
    for node in views:
        if node.schedulable:
            quotes.extend(_node_offers(node, used, settings))
    return sorted(quotes, key=lambda q: (q.zone, q.instance_type))


def _gpu_resource(name: str) -> bool:
    return name in (mapping.GPU_RESOURCE, mapping.SHARED_RESOURCE) or name.startswith(mapping.MIG_RESOURCE_PREFIX)


def _node_offers(node: mapping.NodeView, used: Mapping[tuple[str, str], Decimal], s: OfferSettings) -> list[OfferQuote]:
    model = mapping.node_gpu_model(node)
    if model is None:
        return []
    per_gpu = price_for(s.rules, model, node.labels)
    if per_gpu is None:
        return []
    quotes: list[OfferQuote] = []
    for resource, allocatable in sorted(node.allocatable.items()):
        if not _gpu_resource(resource) or allocatable < 1:
            continue
        units = int(allocatable)
        free = max(0, units - int(used.get((node.name, resource), Decimal(0))))
        kind = _kind(node, resource)
        if kind is None:
            continue
        base = {
            "node": node.name,
            NODE_RESOURCE: resource,
            NODE_UNITS_FREE: free,
            "units_allocatable": units,
            "pool": pool if pricing.label_value_problem(pool := node.labels.get(s.pool_label, "")) is None else "",
            "node_selector": {mapping.HOSTNAME_LABEL: node.labels.get(mapping.HOSTNAME_LABEL, node.name)},
            "ephemeral_storage_gb": int(node.allocatable.get("ephemeral-storage", Decimal(0)) / GIB),
        }
        if kind == "whole":
            for n in SIZES:
                if n <= units and free // n >= 1:
                    quotes.append(
                        _quote(node, s, model, f"k8s-gpu-{n}", n, Fraction(n, units), per_gpu * n, free // n, base)
                    )
        elif kind == "shared":
            if not s.shared_gpus or (count := mapping.replicas(node)) is None or count < 2 or free < 1:
                continue
            share = Fraction(1, count)
            extra = {**base, GPU_FRACTION: float(share), GPU_TIME_SLICED: True, "replicas": count}
            quotes.append(
                _quote(node, s, model, "k8s-shared-1", 1, Fraction(1, units), per_gpu * _dec(share), free, extra)
            )
        else:
            slice_ = _slice(model, kind)
            if slice_ is None or free < 1:
                continue
            share, memory_gb = slice_
            extra = {**base, GPU_FRACTION: float(share), MIG_PROFILE: kind}
            physical = mapping.label_int(node.labels.get(mapping.COUNT_LABEL)) or 1
            quotes.append(
                _quote(
                    node,
                    s,
                    model,
                    f"k8s-mig-{kind}",
                    1,
                    share / physical,
                    per_gpu * _dec(share),
                    free,
                    extra,
                    memory_gb,
                )
            )
    return quotes


def _kind(node: mapping.NodeView, resource: str) -> str | None:
    """ "whole", "shared", or the MIG profile the resource's units are."""
    if resource == mapping.SHARED_RESOURCE:
        return "shared"
    if resource.startswith(mapping.MIG_RESOURCE_PREFIX):
        profile = resource.removeprefix(mapping.MIG_RESOURCE_PREFIX)
        return profile if mapping.MIG_PROFILE_NAME.fullmatch(profile) else None
    single = mapping.single_strategy_profile(node)
    if single:
        return single
    # Time-sliced without renaming: nvidia.com/gpu counts shares, not cards.
    shared = node.labels.get(mapping.PRODUCT_LABEL, "").endswith("-SHARED") or (mapping.replicas(node) or 1) > 1
    return "shared" if shared else "whole"


def _slice(model: str, profile: str) -> tuple[Fraction, int] | None:
    """(share of the card, memory GB) of a MIG profile: NVIDIA's table where the broker has it for the model,
    else the profile's name (``<N>g.<M>gb``: N of 7 compute slices, M GB)."""
    known = mig_profile(model, profile)
    if known is not None:
        return known.share, known.memory_gb
    match = mapping.MIG_PROFILE_NAME.fullmatch(profile)
    if match is None:
        return None
    return Fraction(int(match.group(1)), COMPUTE_SLICES), int(match.group(2))


def _quote(
    node: mapping.NodeView,
    s: OfferSettings,
    model: str,
    instance_type: str,
    gpu_count: int,
    node_share: Fraction,
    price: Decimal,
    capacity: int,
    extra: dict[str, Any],
    memory_gb: int | None = None,
) -> OfferQuote:
    """One offer; vCPUs and memory are the node's allocatable in proportion to the share of its GPUs sold."""
    cpu = node.allocatable.get("cpu", Decimal(0))
    memory = node.allocatable.get("memory", Decimal(0))
    spec = gpu_spec_get(model) or {}
    gpu_memory = memory_gb if memory_gb is not None else int(spec.get("memory_gb") or 0) or _label_memory_gb(node)
    return OfferQuote(
        region=s.region,
        zone=node.name,
        instance_type=instance_type,
        pricing_model=PricingModel.ON_DEMAND,
        gpu_model=model,
        gpu_count=gpu_count,
        gpu_memory_gb=gpu_memory,
        vcpus=max(1, int(cpu * _dec(node_share))),
        memory_gib=(memory * _dec(node_share) / GIB).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP),
        price=price.quantize(_CENT, rounding=ROUND_HALF_UP),
        currency="USD",
        capacity=capacity,
        interconnect=str(spec.get("interconnect") or ""),
        extra=extra,
    )


def _label_memory_gb(node: mapping.NodeView) -> int:
    mib = mapping.label_int(node.labels.get(mapping.MEMORY_LABEL))
    return round(mib / 1024) if mib else 0


def _dec(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)
