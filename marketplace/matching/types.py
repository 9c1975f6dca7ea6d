"""The engine's inputs and outputs: frozen DTOs, no ORM, no I/O."""

from __future__ import annotations

import datetime as dt
import enum
import math
from dataclasses import dataclass, field
from decimal import Decimal

# The most machines one demand may span: a few hundred GPUs, well past any single listing's stock.
MAX_NODES = 64


class Profile(enum.StrEnum):
    """What the buyer's workload is; it picks the throughput metric and the default requirements."""

    TRAINING = "training"
    FINE_TUNING = "fine_tuning"
    INFERENCE = "inference"
    SCIENTIFIC = "scientific"
    RENDERING = "rendering"
    TRANSCODING = "transcoding"


class Amount(enum.StrEnum):
    """What a demand holds fixed, and so what the buyer pays for.

    DURATION: the hours (a rental, a service with a throughput floor): the job costs price x
    ``duration_hours`` on every offer, and faster hardware only costs more. WORK: the amount of work
    (``work_hours`` on a reference GPU): on each offer it takes work / the offer's throughput relative to
    that card, and costs price x those hours, so a faster card can be the cheaper one.
    """

    DURATION = "duration"
    WORK = "work"


class Tolerance(enum.StrEnum):
    """How a job bears an interruption (spot preemption, host loss).

    NONE: it must not be interrupted (spot offers are infeasible). CHECKPOINTED: it restarts from its last
    checkpoint, losing up to ``Demand.checkpoint_interval_hours`` of work plus a restart. STATELESS: it
    restarts elsewhere at once and loses almost nothing (a batch of independent items, a replica).
    """

    NONE = "none"
    CHECKPOINTED = "checkpointed"
    STATELESS = "stateless"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model's datasheet figures, dense, per full card (the GpuModel table as the engine sees it)."""

    key: str
    memory_gb: int
    memory_bandwidth_gbs: int
    fp16_dense_tflops: float
    fp64_tflops: float
    fp32_tflops: float | None = None
    fp8_dense_tflops: float | None = None
    int8_dense_tops: float | None = None
    interconnect: str = "pcie"  # nvlink, pcie, infinity-fabric
    interconnect_gbs: int = 0  # GPU-to-GPU inside one machine, total bidirectional GB/s per GPU
    video_encoders: int = 0
    ecc: bool = True
    verified: bool = True


@dataclass(frozen=True, slots=True)
class OfferView:
    """What the engine knows of an offer.

    ``price_usd_per_hour`` is for the whole listing: one instance, or, when ``divisible``, all ``gpu_count``
    GPUs of an independent provider's machine, which is then sold per GPU (price / gpu_count each) and
    whose ``capacity`` counts GPUs. Otherwise ``capacity`` counts instances; None means no known limit.
    ``gpu_fraction`` < 1 marks slices (MIG, vGPU): each of the ``gpu_count`` GPUs is that fraction of a
    card, ``gpu_memory_gb`` is the slice's memory, and throughput scales by the fraction.
    ``reliability`` is the probability a launch on this provider succeeds and runs to the end (1 = perfect),
    measured from provisioning outcomes; ``interruption_rate_per_hour`` is the expected preemptions per hour
    (spot), 0 for on-demand.

    Offers naming the same ``capacity_pool`` draw on one stock of ``pool_capacity`` GPUs: an independent
    machine sold once per lease size (and pricing model) has that many GPUs free, whichever offers sell
    them. A demand placed on such an offer takes the GPUs it occupies (the offer's ``gpu_count``, or its
    GPUs of a divisible listing; a slice counts as one) from the pool. Every offer of a pool states the
    same ``pool_capacity``. In a batch the pool alone bounds its offers, so it must imply each one's own
    ``capacity`` (as a machine's free GPUs imply how many leases of each size fit); for one demand both are
    checked.
    """

    offer_id: int
    account_id: int
    provider_kind: str
    region: str
    zone: str
    instance_type: str
    pricing_model: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    price_usd_per_hour: Decimal
    observed_at: dt.datetime
    capacity: int | None = None
    spec: GpuSpec | None = None
    gpu_fraction: float = 1.0
    divisible: bool = False
    jurisdiction: str = ""  # "US", "EU", "CN", "APAC", ... from the region
    rdma: bool = False  # InfiniBand / EFA / RDMA between machines
    # The provider can launch this offer's instances into a cluster placement group (packed close together).
    placement_groups: bool = False
    reliability: float = 1.0
    interruption_rate_per_hour: float = 0.0
    capacity_pool: str | None = None  # offers sharing one stock of GPUs, e.g. one machine's lease sizes
    pool_capacity: int | None = None  # GPUs free in ``capacity_pool``; set with it, never without

    def __post_init__(self) -> None:
        # The engine's boundary: a free or negative price would win every ranking it enters, whatever the
        # database allows (the catalogue's own check is not the only way in: benches, callers, tests).
        price = self.price_usd_per_hour
        if not (math.isfinite(price) and price > 0):
            raise ValueError(f"offer {self.offer_id}: price_usd_per_hour must be above zero, not {price!r}")
        if self.gpu_count < 1:
            raise ValueError(f"offer {self.offer_id}: gpu_count must be at least 1, not {self.gpu_count}")
        if not 0 < self.gpu_fraction <= 1:
            raise ValueError(f"offer {self.offer_id}: gpu_fraction must be in (0, 1], not {self.gpu_fraction}")


@dataclass(frozen=True, slots=True)
class Demand:
    """What a buyer asks for. Empty sets mean "any"; None means "the profile's default".

    Size is ``gpu_count`` GPUs, or, when ``total_gpu_memory_gb`` is set, as many GPUs (or slices) of an
    offer as it takes to hold that much memory. ``max_price_per_hour`` caps what the buyer pays per hour
    for what they occupy (the whole instance, or their GPUs of a divisible listing); ``max_price_per_job``
    caps that times the job's hours on the offer (``duration_hours``, or for fixed work the hours it takes).

    ``nodes`` > 1 asks for a job that spans machines: that many instances of one offer (one instance type in
    one zone, so every node shares the zone's network), each with the size above, priced and placed as one
    unit. The caps then apply to the whole group, its work is spread over every node's GPUs, and any node's
    interruption interrupts the group. An independent host is one machine and never serves more than one
    node; ``needs_rdma`` asks for InfiniBand/EFA/RDMA between the nodes, and ``placement_group`` for nodes
    packed close together in the zone's network (a cluster placement group: one hop apart, the lowest
    latency the provider offers), which only offers whose provider makes such groups serve. One node needs
    no group, so a single-node demand ignores it.
    """

    gpu_count: int = 1
    gpu_models: frozenset[str] = frozenset()
    min_gpu_memory_gb: int = 0
    regions: frozenset[str] = frozenset()
    pricing_models: frozenset[str] = frozenset()
    max_price_per_hour: Decimal | None = None
    profile: Profile | None = None
    demand_id: str = ""
    total_gpu_memory_gb: int | None = None
    jurisdictions: frozenset[str] = frozenset()
    min_interconnect_gbs: int | None = None
    needs_rdma: bool | None = None
    min_fp64_tflops: float | None = None
    needs_ecc: bool | None = None
    min_video_encoders: int | None = None
    max_price_per_job: Decimal | None = None
    duration_hours: float = 1.0
    interruption_tolerance: Tolerance = Tolerance.CHECKPOINTED
    checkpoint_interval_hours: float = 1.0
    fractions: bool = False  # slices of a card (MIG, vGPU) may serve ``gpu_count``; sized by memory, they always may
    # Wall-clock hours the job must finish within, interruptions and restarts included (None: no deadline).
    deadline_hours: float | None = None
    # What is fixed: the hours or the work (None: the profile's ``ProfileDefaults.amount``). For WORK, the
    # work is ``work_hours`` (default ``duration_hours``) on the demand's size in ``work_reference_gpu`` cards
    # (default the profile's reference card, ``ProfileDefaults.reference_gpu``).
    amount: Amount | None = None
    work_hours: float | None = None
    work_reference_gpu: str | None = None
    nodes: int = 1  # machines of one offer the job spans (``gpu_count`` GPUs each)
    placement_group: bool = False  # the nodes in one cluster placement group (see above)

    def __post_init__(self) -> None:
        if self.gpu_count < 1:
            raise ValueError(f"demand {self.demand_id!r}: gpu_count must be at least 1, not {self.gpu_count}")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"demand {self.demand_id!r}: nodes must be from 1 to {MAX_NODES}, not {self.nodes}")
        for name in ("max_price_per_hour", "max_price_per_job"):
            cap = getattr(self, name)
            if cap is not None and not (math.isfinite(cap) and cap > 0):
                raise ValueError(f"demand {self.demand_id!r}: {name} must be above zero, not {cap!r}")
        if not self.duration_hours > 0:
            raise ValueError(f"demand {self.demand_id!r}: duration_hours must be above zero")
        deadline = self.deadline_hours
        if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"demand {self.demand_id!r}: deadline_hours must be above zero, not {deadline!r}")
        if self.work_hours is not None and not (math.isfinite(self.work_hours) and self.work_hours > 0):
            raise ValueError(f"demand {self.demand_id!r}: work_hours must be above zero, not {self.work_hours!r}")


@dataclass(frozen=True, slots=True)
class ProfileDefaults:
    """A profile's visible defaults: the metric it buys and the requirements a buyer gets unless they say."""

    profile: Profile
    metric: str  # a GpuSpec field name: fp16_dense_tflops, fp64_tflops, fp32_tflops, memory_bandwidth_gbs, ...
    metric_unit: str  # how a person reads it: "dense FP16/BF16 TFLOPS", "FP64 TFLOPS", ...
    description: str
    # One reference GPU's figure in ``metric``: a demand's work is its GPUs x this x its hours, so that
    # the assignment weighs a big long job above a small short one.
    reference_throughput: float
    reference_unit: str = "reference-GPU-hour"  # how a score reads per reference card, e.g. "A100-hour"
    min_gpu_memory_gb: int = 0
    min_interconnect_gbs: int = 0  # applies when a demand spans more than one GPU
    needs_rdma: bool = False
    min_fp64_tflops: float = 0.0
    needs_ecc: bool = False
    min_video_encoders: int = 0
    preferred_models: frozenset[str] = frozenset()  # empty: any model that meets the rest
    amount: Amount = Amount.DURATION  # what a demand holds fixed unless it says (``Demand.amount``)
    reference_gpu: str = ""  # the GpuSpec key whose figure is ``reference_throughput``, e.g. "A100-80GB-SXM4"


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Offers the caller rules out, at the scope a failure implies: one offer, a zone's instance type,
    a region of an account, or a whole account."""

    offer_ids: frozenset[int] = frozenset()
    zone_types: frozenset[tuple[int, str, str]] = frozenset()  # (account, zone, instance type)
    account_regions: frozenset[tuple[int, str]] = frozenset()
    accounts: frozenset[int] = frozenset()

    def excludes(self, offer: OfferView) -> str:
        if offer.offer_id in self.offer_ids:
            return "already tried"
        if (offer.account_id, offer.zone, offer.instance_type) in self.zone_types:
            return "zone out of capacity"
        if (offer.account_id, offer.region) in self.account_regions:
            return "region quota exhausted"
        if offer.account_id in self.accounts:
            return "account blocked"
        return ""


@dataclass(frozen=True, slots=True)
class RankedOffer:
    """One feasible offer of ``rank_offers``: ``price_per_hour`` is what the demand pays for what it occupies
    (as ``ScoreBreakdown.price_per_hour``), ``price_per_gpu_hour`` that over the GPUs asked for."""

    offer: OfferView
    price_per_gpu_hour: Decimal
    price_per_hour: Decimal
    reason: str


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Feasible offers best first, and how many offers each rule turned away."""

    ranked: tuple[RankedOffer, ...]
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> RankedOffer | None:
        return self.ranked[0] if self.ranked else None


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    """Why an offer costs what it costs for this demand. Money in USD for the whole job.

    ``job_hours`` are the hours paid for on this offer: the demand's ``duration_hours`` when it fixes the
    duration, its work over this offer's throughput when it fixes the work. ``job_cost`` (=
    ``effective_cost``) = ``price_cost`` + ``interruption_cost`` + ``reliability_cost`` for those hours, and
    ``score`` is that figure as a float: dollars for the job, lower is better. ``wasted_cost`` is the part
    of ``price_cost`` paying for capacity the demand does not use (shown, already inside the price).
    ``unit_cost`` = ``job_cost`` / (``useful_throughput`` x ``job_hours``) is the throughput reasoning: USD
    per unit of useful work in the profile's metric (e.g. per dense-FP16 TFLOPS-hour).
    """

    gpus_used: float  # GPUs (or slices x fraction, in card equivalents) doing the demand's work
    gpus_paid: float  # card equivalents paid for
    price_per_hour: Decimal  # what the buyer pays per hour for what they occupy
    price_cost: Decimal
    wasted_cost: Decimal
    interruption_cost: Decimal
    reliability_cost: Decimal
    effective_cost: Decimal
    useful_throughput: float  # in the profile's metric, summed over the GPUs used
    metric: str
    score: float
    job_hours: float = 0.0
    job_cost: Decimal = Decimal(0)
    unit_cost: float = 0.0
    expected_hours: float = 0.0  # wall-clock hours to finish, interruptions and restarts included


@dataclass(frozen=True, slots=True)
class Quote:
    """One feasible offer for a demand, with its breakdown and a one-line reason."""

    offer: OfferView
    units: float  # what the demand consumes of the offer's capacity: 1 instance, or GPUs of a divisible listing
    breakdown: ScoreBreakdown
    reason: str


@dataclass(frozen=True, slots=True)
class NearMiss:
    """An infeasible offer close to fitting: the rules it breaks and what the buyer could relax."""

    offer: OfferView
    failed: tuple[str, ...]  # rule names, e.g. ("price cap",)
    relax: str  # e.g. "raise the hourly cap to $12.40"


@dataclass(frozen=True, slots=True)
class Ranking:
    """``rank``'s answer: quotes best first; when none is feasible, the nearest misses and what to relax."""

    demand: Demand
    quotes: tuple[Quote, ...]
    rejected: dict[str, int] = field(default_factory=dict)
    near_misses: tuple[NearMiss, ...] = ()
    defaults: ProfileDefaults | None = None

    @property
    def best(self) -> Quote | None:
        return self.quotes[0] if self.quotes else None


@dataclass(frozen=True, slots=True)
class DemandAssignment:
    """One demand's place in a joint assignment: its quote, or why none fits."""

    demand: Demand
    quote: Quote | None
    reason: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """``assign``'s answer. ``total_cost`` sums the chosen quotes' effective costs; ``objective`` is what was
    minimised (the sum of the chosen quotes' job costs, i.e. dollars, plus the penalty for unplaced demands);
    ``lower_bound`` is a proven bound on it (the LP relaxation); ``gap`` = (objective - bound) / objective.
    ``method`` names what produced it ("milp", "lp-rounding", "greedy", ...); ``optimal`` is True only when
    the solver proved it."""

    demands: tuple[DemandAssignment, ...]
    total_cost: Decimal
    objective: float
    lower_bound: float
    gap: float
    method: str
    optimal: bool
    seconds: float
