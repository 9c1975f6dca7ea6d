"""Frozen DTOs that cross the adapter boundary. Nothing from an SDK appears here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.launch import BootSpec


class PricingModel(enum.StrEnum):
    ON_DEMAND = "on_demand"
    SPOT = "spot"
    RESERVED = "reserved"


class InstanceState(enum.StrEnum):
    """Provider states mapped to the broker's common states at the edge."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    # Stopped by the broker's ``stop`` with its disk kept; ``start`` brings it back (issue 36).
    STOPPED = "stopped"
    TERMINATED = "terminated"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What an adapter needs to authenticate; ``secret`` fields never leave the process."""

    kind: str
    values: dict[str, str]
    endpoint_url: str | None = None

    def __repr__(self) -> str:  # secrets must never reach a log line
        return f"Credentials(kind={self.kind!r}, keys={sorted(self.values)}, endpoint_url={self.endpoint_url!r})"


GPU_FRACTION = "gpu_fraction"  # OfferQuote.extra key: the share of a card each GPU of the offer is
# OfferQuote.extra keys of a Kubernetes node's offers: the extended resource the offer's units are of
# (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ...), and how many of them the node has free of pods the
# broker did not place; the broker holds its own orders' units (marketplace/orders/reservations.py).
NODE_RESOURCE = "resource"
NODE_UNITS_FREE = "units_free"
# OfferQuote.extra key: True for a time-sliced share of a card (NVIDIA's device plugin time-slicing): its
# ``GPU_FRACTION`` is a share of the card's time, not of its memory, which every share sees whole (and shares).
GPU_TIME_SLICED = "time_sliced"
NETWORK_GBPS = "network_gbps"  # OfferQuote.extra key: the instance's network bandwidth in Gbit/s, where published


@dataclass(frozen=True, slots=True)
class OfferQuote:
    """One purchasable thing as the provider describes it, before the broker validates it.

    ``gpu_model`` is the broker's GpuModel key (e.g. ``A100-80GB-SXM``) or the provider's raw name when the
    adapter could not map it; ingestion quarantines unknown models. ``price`` is per hour for the whole
    instance, in ``currency``. A partitioned GPU (a share of one card) sets ``extra[GPU_FRACTION]`` to that
    share in (0, 1): ``gpu_count`` then counts slices and ``gpu_memory_gb`` is one slice's memory.
    """

    region: str
    zone: str
    instance_type: str
    pricing_model: PricingModel
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: Decimal
    price: Decimal
    currency: str
    capacity: int | None = None
    interconnect: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def natural_key(self) -> tuple[str, str, str, str]:
        return (self.region, self.zone, self.instance_type, self.pricing_model.value)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to launch. ``client_token`` is derived from (order, attempt) by the caller and is the
    provider-side idempotency key: the same token in the same region returns the same instance.
    ``gpu_count``, ``vcpus`` and ``offer_extra`` repeat what the adapter's own ``list_offers`` said of the offer
    (0 and empty when unknown), so a quota pre-check needs no second catalogue read. ``gpu_indexes`` are the
    GPUs the broker reserved on an independent machine (empty elsewhere). ``boot`` is what makes
    the machine usable (keys, firewall, disk, image, the boot script; ``providers.launch``); None launches
    a bare machine, as the reconciler's tests and the quota pre-check do. ``placement_group`` names a
    cluster placement group to launch into (made by the adapter if missing; only where the adapter's
    ``placement_groups`` is True); None launches without one."""

    region: str
    zone: str
    instance_type: str
    pricing_model: PricingModel
    client_token: str
    order_ref: str
    max_price: Decimal | None = None
    image: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    gpu_count: int = 0
    vcpus: int = 0
    offer_extra: dict[str, Any] = field(default_factory=dict)
    boot: BootSpec | None = None
    gpu_indexes: tuple[int, ...] = ()  # the GPUs the broker holds for this launch on a listed machine
    placement_group: str | None = None


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """One published quota as the provider reports it: its name, limit and current usage in a region."""

    name: str
    limit: float
    usage: float


@dataclass(frozen=True, slots=True)
class InstanceHandle:
    """A provider instance as the broker tracks it."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: InstanceState
    public_ip: str | None = None
    private_ip: str | None = None
    launched_at: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
