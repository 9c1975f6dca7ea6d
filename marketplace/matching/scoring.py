"""The columnar offer book and the vectorised feasibility and score of one demand against every offer.

Ranking 100,000 offers for a demand is a few dozen numpy operations over columns built once per book,
not a Python loop per offer; only the handful of quotes returned are turned back into Decimal breakdowns.

Offers sharing a capacity pool (``OfferView.capacity_pool``) carry its code in the ``pool`` column (-1 for
none) and its free GPUs in ``pool_free`` (inf for none), so the capacity rule and the batch assignment see
one stock per pool.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# The restart costs live with the completion-time model; re-exported here, where callers found them.
from marketplace.matching.interruptions import MAX_SLOWDOWN, expected_completion_hours
from marketplace.matching.interruptions import RESTART_HOURS as RESTART_HOURS
from marketplace.matching.interruptions import STATELESS_RESTART_HOURS as STATELESS_RESTART_HOURS
from marketplace.matching.profiles import amount_of, defaults_for, effective_requirements, work
from marketplace.matching.types import Amount, Demand, Exclusion, GpuSpec, OfferView, Tolerance

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# Rule names, in the order a person reads them; a near miss lists the ones it breaks.
RULES = (
    "stale price",
    "no datasheet",
    "gpu model",
    "gpu memory",
    "size",
    "nodes",
    "whole cards",
    "region",
    "jurisdiction",
    "pricing model",
    "interconnect",
    "rdma",
    "placement group",
    "fp64",
    "ecc",
    "video encoders",
    "throughput",
    "interruption",
    "deadline",
    "price cap",
    "job price cap",
    "capacity",
)
_RULE_INDEX = {name: i for i, name in enumerate(RULES)}


class _Vocabulary:
    """Strings to small integer codes, so set membership is one ``np.isin`` over an int column."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def code(self, value: str) -> int:
        return self.codes.setdefault(value, len(self.codes))

    def member(self, column: IntArray, values: Iterable[str]) -> BoolArray:
        """Which rows of ``column`` (codes of this vocabulary) hold one of ``values``."""
        table = np.zeros(len(self.codes) + 1, dtype=np.bool_)
        table[[self.codes[v] for v in values if v in self.codes]] = True
        return table[column]


@dataclass(frozen=True, eq=False)
class OfferBook:
    """Every offer as columns. Build it once (``from_views``) and rank any number of demands against it."""

    views: tuple[OfferView, ...]
    specs: dict[str, GpuSpec]
    columns: dict[str, npt.NDArray[Any]]
    vocabularies: dict[str, _Vocabulary]

    def __len__(self) -> int:
        return len(self.views)

    def col(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]

    def member(self, column: str, values: Iterable[str]) -> BoolArray:
        """Which offers' ``column`` (model, region, jurisdiction, pricing) is one of ``values``."""
        return self.vocabularies[column].member(self.columns[column], values)

    @property
    def n_pools(self) -> int:
        return len(self.vocabularies["pool"].codes)

    @classmethod
    def from_views(cls, views: Iterable[OfferView]) -> OfferBook:
        """The book of ``views``. ``ValueError`` names the offer when a capacity pool is half set (a pool
        without its capacity, or the reverse) or its offers disagree on the pool's capacity."""
        views = tuple(views)
        vocab = {name: _Vocabulary() for name in ("model", "region", "jurisdiction", "pricing", "pool")}
        pool_free = _pool_capacities(views)
        specs: dict[str, GpuSpec] = {}
        for v in views:
            if v.spec is not None:
                specs.setdefault(v.gpu_model, v.spec)

        def floats(values: Iterable[float]) -> FloatArray:
            return np.fromiter(values, dtype=np.float64, count=len(views))

        def spec_figure(v: OfferView, name: str) -> float:
            value = None if v.spec is None else getattr(v.spec, name)
            return 0.0 if value is None else float(value)

        columns: dict[str, npt.NDArray[Any]] = {
            "price": floats(float(v.price_usd_per_hour) for v in views),
            "gpu_count": floats(v.gpu_count for v in views),
            "gpu_memory": floats(v.gpu_memory_gb for v in views),
            "fraction": floats(v.gpu_fraction for v in views),
            "divisible": np.array([v.divisible for v in views], dtype=np.bool_),
            "capacity": floats(math.inf if v.capacity is None else v.capacity for v in views),
            "observed": floats(v.observed_at.timestamp() for v in views),
            "model": np.array([vocab["model"].code(v.gpu_model) for v in views], dtype=np.int64),
            "region": np.array([vocab["region"].code(v.region) for v in views], dtype=np.int64),
            "jurisdiction": np.array([vocab["jurisdiction"].code(v.jurisdiction) for v in views], dtype=np.int64),
            "pricing": np.array([vocab["pricing"].code(v.pricing_model) for v in views], dtype=np.int64),
            "rdma": np.array([v.rdma for v in views], dtype=np.bool_),
            "placement_groups": np.array([v.placement_groups for v in views], dtype=np.bool_),
            "reliability": floats(min(max(v.reliability, 1e-3), 1.0) for v in views),
            "interruption": floats(v.interruption_rate_per_hour for v in views),
            "has_spec": np.array([v.spec is not None for v in views], dtype=np.bool_),
            "ecc": np.array([v.spec is not None and v.spec.ecc for v in views], dtype=np.bool_),
            "pool": np.array(
                [-1 if v.capacity_pool is None else vocab["pool"].code(v.capacity_pool) for v in views],
                dtype=np.int64,
            ),
            "pool_free": floats(math.inf if v.capacity_pool is None else pool_free[v.capacity_pool] for v in views),
        }
        for figure in (
            "memory_bandwidth_gbs",
            "fp16_dense_tflops",
            "fp64_tflops",
            "fp32_tflops",
            "fp8_dense_tflops",
            "int8_dense_tops",
            "interconnect_gbs",
            "video_encoders",
        ):
            columns[figure] = floats(spec_figure(v, figure) for v in views)
        return cls(views=views, specs=specs, columns=columns, vocabularies=vocab)


def _pool_capacities(views: Sequence[OfferView]) -> dict[str, float]:
    """Each capacity pool's free GPUs, checked to be stated once and alike by every offer of the pool."""
    free: dict[str, tuple[float, int]] = {}
    for v in views:
        if (v.capacity_pool is None) != (v.pool_capacity is None):
            raise ValueError(
                f"offer {v.offer_id}: capacity_pool and pool_capacity are set together or not at all "
                f"(got {v.capacity_pool!r} and {v.pool_capacity!r})"
            )
        if v.capacity_pool is None or v.pool_capacity is None:
            continue
        if v.pool_capacity < 0:
            raise ValueError(f"offer {v.offer_id}: pool_capacity must be at least 0, not {v.pool_capacity}")
        seen = free.setdefault(v.capacity_pool, (float(v.pool_capacity), v.offer_id))
        if seen[0] != v.pool_capacity:
            raise ValueError(
                f"offer {v.offer_id}: capacity pool {v.capacity_pool!r} has {v.pool_capacity} GPUs free, "
                f"but offer {seen[1]} says {seen[0]:g}"
            )
    return {pool: capacity for pool, (capacity, _) in free.items()}


def as_book(offers: OfferBook | Iterable[OfferView]) -> OfferBook:
    return offers if isinstance(offers, OfferBook) else OfferBook.from_views(offers)


@dataclass(frozen=True, eq=False)
class ScoreVectors:
    """One demand against every offer of a book: which rules each offer breaks, and its score terms.

    ``failures`` is a (rules x offers) boolean matrix in ``RULES`` order. Money is USD for the whole job:
    ``job_hours`` on each offer (the demand's ``duration_hours``, or its work over the offer's throughput).
    ``score`` is ``job_cost`` (= ``effective``), dollars for the job, inf where the offer gives this
    profile no throughput; ``unit_cost`` is it over the useful work (USD per metric-hour), the throughput
    reasoning beside it.
    """

    demand: Demand  # with the profile's defaults filled in
    failures: npt.NDArray[np.bool_]
    feasible: BoolArray
    gpus: FloatArray  # GPUs (or slices) of the offer the demand takes
    units: FloatArray  # capacity consumed: 1 instance, or GPUs of a divisible listing
    pool_units: FloatArray  # GPUs (or slices) taken from the offer's capacity pool, if it has one
    gpus_used: FloatArray  # card equivalents doing the work
    gpus_paid: FloatArray  # card equivalents paid for
    price_per_hour: FloatArray
    price_cost: FloatArray
    wasted_cost: FloatArray
    interruption_cost: FloatArray
    reliability_cost: FloatArray
    effective: FloatArray
    throughput: FloatArray
    score: FloatArray
    expected_hours: FloatArray  # wall-clock hours to finish the work, interruptions included
    job_hours: FloatArray  # hours paid for on each offer, interruptions aside
    job_cost: FloatArray  # dollars for the job: the ranking and the batch objective
    unit_cost: FloatArray  # job_cost per metric-hour of useful work

    def failed_rules(self, index: int) -> tuple[str, ...]:
        return tuple(RULES[r] for r in np.flatnonzero(self.failures[:, index]))


def job_hours(demand: Demand, throughput: FloatArray, specs: dict[str, GpuSpec]) -> FloatArray:
    """Hours the buyer pays for on each offer. DURATION: ``duration_hours`` on every offer. WORK: the
    demand's work (``profiles.work``) over the offer's throughput on the GPUs the demand uses (slices
    scaled by their fraction): a card three times the reference's figure takes a third of the hours.
    An offer giving no throughput keeps ``duration_hours`` so its figures stay finite (its score is inf
    and the "throughput" or "no datasheet" rule rules it out)."""
    duration = max(demand.duration_hours, 1e-9)
    if amount_of(demand) == Amount.DURATION:
        return np.full(throughput.shape, duration)
    amount = work(demand, specs)
    return np.where(throughput > 0, amount / np.maximum(throughput, 1e-300), duration)


def _expected_hours(demand: Demand, rates: FloatArray, hours: FloatArray) -> FloatArray:
    """``expected_completion_hours`` where each offer has its own hours of work (a WORK demand): one call
    per distinct figure, a handful (one per GPU model and size), each vectorised over its offers' rates.
    Only interruptible offers are computed: at rate 0 the figure is the hours themselves (no checkpoint
    writes are priced), and most offers are not interruptible."""
    if hours.size and (hours.min() == hours.max() or not np.all(np.isfinite(rates) & (rates >= 0))):
        # One figure; or a bad rate, which expected_completion_hours names.
        return expected_completion_hours(demand, rates, float(hours[0]))
    out = hours.astype(np.float64, copy=True)
    live = np.flatnonzero(rates > 0)
    values, inverse = np.unique(hours[live], return_inverse=True)
    for k, value in enumerate(values):
        chosen = live[inverse == k]
        out[chosen] = expected_completion_hours(demand, rates[chosen], float(value))
    return out


def expected_price_cost(price_per_hour: FloatArray, hours: FloatArray, expected_hours: FloatArray) -> FloatArray:
    """The price of the hours a job is expected to run (interruptions and restarts included); the plain hours
    where it would never finish (those offers are dropped by the "deadline" rule)."""
    return price_per_hour * np.where(expected_hours <= hours * MAX_SLOWDOWN, expected_hours, hours)


def score_vectors(
    demand: Demand,
    book: OfferBook,
    *,
    now: dt.datetime,
    max_age: dt.timedelta | None = None,
    exclusion: Exclusion | None = None,
) -> ScoreVectors:
    """Feasibility and score of ``demand`` against every offer in ``book`` (see ``ScoreVectors``)."""
    d = effective_requirements(demand, book.specs)
    profile = defaults_for(d)
    c = book.columns
    n_offers = len(book)
    fraction = c["fraction"]
    gpu_memory = c["gpu_memory"]
    gpu_count = c["gpu_count"]
    divisible = c["divisible"]

    if d.total_gpu_memory_gb is not None:
        with np.errstate(divide="ignore"):
            gpus = np.ceil(d.total_gpu_memory_gb / np.maximum(gpu_memory, 1e-9))
    else:
        gpus = np.full(n_offers, float(max(d.gpu_count, 1)))
    # A job over several nodes takes that many instances of the offer: every figure below is the group's.
    nodes = float(d.nodes)
    units = np.where(divisible, gpus, 1.0) * nodes
    pool_units = np.where(divisible, gpus, gpu_count) * nodes
    gpus_used = np.minimum(gpus, gpu_count) * fraction * nodes
    gpus_paid = np.where(divisible, gpus, gpu_count) * fraction * nodes
    per_card = c[profile.metric]
    throughput = gpus_used * per_card
    # From here on every cost is for the hours the buyer pays on each offer (an array).
    hours = job_hours(d, throughput, book.specs)
    per_gpu_price = c["price"] / np.maximum(gpu_count, 1.0)
    price_per_hour = np.where(divisible, per_gpu_price * gpus, c["price"]) * nodes
    price_cost = price_per_hour * hours
    with np.errstate(invalid="ignore", divide="ignore"):
        wasted_cost = np.where(gpus_paid > 0, price_cost * (1.0 - gpus_used / gpus_paid), 0.0)
    # Interruptions cost the extra hours paid while lost work is redone and the job restarts: expected
    # completion under Poisson interruptions with checkpoints (marketplace/matching/interruptions.py),
    # non-linear in the rate and the checkpoint interval. An offer that would not finish is dropped below.
    # A group stops when any of its nodes is interrupted: independent Poisson processes add their rates.
    expected_hours = _expected_hours(d, c["interruption"] * nodes, hours)
    never = ~(expected_hours <= hours * MAX_SLOWDOWN)
    interruption_cost = np.where(never, 0.0, expected_hours - hours) * price_per_hour
    # ... and it launches only if every node does.
    reliability_cost = price_cost * (1.0 / c["reliability"] ** nodes - 1.0)
    effective = price_cost + interruption_cost + reliability_cost
    with np.errstate(divide="ignore", invalid="ignore"):
        unit_cost = np.where(throughput > 0, effective / (throughput * hours), np.inf)
    # The buyer pays dollars for hours: the score is the job's dollars, whatever the amount kind.
    score = np.where(throughput > 0, effective, np.inf)

    failures = np.zeros((len(RULES), n_offers), dtype=np.bool_)

    def rule(name: str, broken: npt.ArrayLike) -> None:
        failures[_RULE_INDEX[name]] = broken

    if max_age is not None:
        rule("stale price", c["observed"] < (now - max_age).timestamp())
    rule("no datasheet", ~c["has_spec"])
    if d.gpu_models:
        rule("gpu model", ~book.member("model", d.gpu_models))
    rule("gpu memory", gpu_memory < d.min_gpu_memory_gb)
    rule("size", gpus > gpu_count)
    # An independent host (a divisible listing, a machine's pool of lease sizes) is one machine: one node.
    if d.nodes > 1:
        rule("nodes", divisible | (c["pool"] >= 0))
    # A count means cards: a slice serves only a demand sized by memory or one that says slices will do.
    rule("whole cards", (fraction < 1.0) & (d.total_gpu_memory_gb is None) & (not d.fractions))
    if d.regions:
        rule("region", ~book.member("region", d.regions))
    if d.jurisdictions:
        rule("jurisdiction", ~book.member("jurisdiction", d.jurisdictions))
    if d.pricing_models:
        rule("pricing model", ~book.member("pricing", d.pricing_models))
    if d.min_interconnect_gbs:
        # Slices of a card share no NVLink; one GPU needs no interconnect at all.
        link = np.where(fraction < 1.0, 0.0, c["interconnect_gbs"])
        rule("interconnect", (gpus > 1) & (link < d.min_interconnect_gbs))
    if d.needs_rdma:
        rule("rdma", ~c["rdma"])
    if d.nodes > 1 and d.placement_group:
        rule("placement group", ~c["placement_groups"])
    if d.min_fp64_tflops:
        rule("fp64", c["fp64_tflops"] * fraction < d.min_fp64_tflops)
    if d.needs_ecc:
        rule("ecc", ~c["ecc"])
    if d.min_video_encoders:
        rule("video encoders", c["video_encoders"] * fraction < d.min_video_encoders)
    rule("throughput", c["has_spec"] & (per_card <= 0))
    if d.interruption_tolerance == Tolerance.NONE:
        rule("interruption", c["interruption"] > 0)
    # Cannot finish: expected past the deadline, or (deadline or not) too slow to ever finish.
    deadline = math.inf if d.deadline_hours is None else d.deadline_hours
    rule("deadline", never | (expected_hours > deadline + 1e-9))
    if d.max_price_per_hour is not None:
        rule("price cap", price_per_hour > float(d.max_price_per_hour) + 1e-9)
    if d.max_price_per_job is not None:
        # What the job is expected to cost there, the hours interruptions add included: a cap met only if
        # nothing interrupts it would stop the job before it finishes.
        rule(
            "job price cap",
            expected_price_cost(price_per_hour, hours, expected_hours) > float(d.max_price_per_job) + 1e-9,
        )
    rule("capacity", (units > c["capacity"]) | (pool_units > c["pool_free"]))

    feasible: BoolArray = np.logical_not(failures.any(axis=0))
    if exclusion is not None:
        for i in np.flatnonzero(feasible):
            if exclusion.excludes(book.views[i]):
                feasible[i] = False
    return ScoreVectors(
        demand=d,
        failures=failures,
        feasible=feasible,
        gpus=gpus,
        units=units,
        pool_units=pool_units,
        gpus_used=gpus_used,
        gpus_paid=gpus_paid,
        price_per_hour=price_per_hour,
        price_cost=price_cost,
        wasted_cost=wasted_cost,
        interruption_cost=interruption_cost,
        reliability_cost=reliability_cost,
        effective=effective,
        throughput=throughput,
        score=score,
        expected_hours=expected_hours,
        job_hours=hours,
        job_cost=effective,
        unit_cost=unit_cost,
    )


def best_indices(vectors: ScoreVectors, limit: int, candidates: Sequence[int] | None = None) -> IntArray:
    """Indices of the ``limit`` best feasible offers, best first; ties go to the lower effective cost,
    then to the lower offer position (stable across runs)."""
    idx = np.flatnonzero(vectors.feasible) if candidates is None else np.asarray(candidates, dtype=np.int64)
    if idx.size == 0:
        return idx
    if idx.size > limit * 4:
        keep = np.argpartition(vectors.score[idx], limit - 1)[:limit]
        threshold = vectors.score[idx[keep]].max()
        idx = idx[vectors.score[idx] <= threshold]
    order = np.lexsort((idx, vectors.effective[idx], vectors.score[idx]))
    return idx[order][:limit]
