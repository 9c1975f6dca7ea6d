"""``rank``: one demand against a book of offers, cheapest job first (dollars for the job), each quote explained."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from decimal import Decimal

import numpy as np

from marketplace.matching.interruptions import MAX_SLOWDOWN
from marketplace.matching.profiles import defaults_for
from marketplace.matching.scoring import (
    RULES,
    OfferBook,
    ScoreVectors,
    as_book,
    best_indices,
    expected_price_cost,
    score_vectors,
)
from marketplace.matching.types import (
    Demand,
    Exclusion,
    NearMiss,
    OfferView,
    ProfileDefaults,
    Quote,
    Ranking,
    ScoreBreakdown,
)

_MONEY = Decimal("0.000001")
_NEAR_MISSES = 5


def _money(value: float) -> Decimal:
    return Decimal(repr(float(value))).quantize(_MONEY)


def breakdown(vectors: ScoreVectors, index: int, offer: OfferView, metric: str) -> ScoreBreakdown:
    """The Decimal breakdown of ``offer`` (at ``index`` of the vectors): the price terms exact from the
    listing, the risk terms from the vectorised floats. The hours are the job's on this offer
    (``ScoreVectors.job_hours``): the duration asked for, or the time the fixed work takes on it."""
    hours = Decimal(repr(float(vectors.job_hours[index])))
    if offer.divisible:
        price_per_hour = offer.price_usd_per_hour / offer.gpu_count * Decimal(int(vectors.gpus[index]))
    else:
        price_per_hour = offer.price_usd_per_hour
    price_per_hour *= vectors.demand.nodes
    price_cost = price_per_hour * hours
    interruption = _money(vectors.interruption_cost[index])
    reliability = _money(vectors.reliability_cost[index])
    job_cost = (price_cost + interruption + reliability).quantize(_MONEY)
    return ScoreBreakdown(
        gpus_used=float(vectors.gpus_used[index]),
        gpus_paid=float(vectors.gpus_paid[index]),
        price_per_hour=price_per_hour.quantize(_MONEY),
        price_cost=price_cost.quantize(_MONEY),
        wasted_cost=_money(vectors.wasted_cost[index]),
        interruption_cost=interruption,
        reliability_cost=reliability,
        effective_cost=job_cost,
        useful_throughput=float(vectors.throughput[index]),
        metric=metric,
        score=float(vectors.score[index]),
        job_hours=float(vectors.job_hours[index]),
        job_cost=job_cost,
        unit_cost=float(vectors.unit_cost[index]),
        expected_hours=float(vectors.expected_hours[index]),
    )


def _size(offer: OfferView, gpus: float, nodes: int = 1) -> str:
    slice_note = f" ({offer.gpu_fraction:g} of a card each)" if offer.gpu_fraction < 1 else ""
    group = f"{nodes} nodes x " if nodes > 1 else ""
    return f"{group}{int(gpus)}x {offer.gpu_model}{slice_note}"


def quote_reason(
    offer: OfferView,
    b: ScoreBreakdown,
    gpus: float,
    defaults: ProfileDefaults,
    best: ScoreBreakdown | None,
    nodes: int = 1,
) -> str:
    """One line: what it is, the dollars and hours of the job on it, then what a reference card's worth of
    work costs on it (the throughput reasoning), and what weighs on it."""
    per_reference = b.unit_cost * defaults.reference_throughput
    head = (
        f"{_size(offer, gpus, nodes)} {offer.pricing_model.replace('_', '-')} on {offer.provider_kind} {offer.zone}: "
        f"${b.job_cost:.2f} for the job ({b.job_hours:.4g} h), ${per_reference:.3f} per {defaults.reference_unit}"
    )
    notes = []
    if best is None or best is b:
        notes.append("best value")
    elif best.score > 0:
        notes.append(f"+{(b.score / best.score - 1) * 100:.0f}% over the best")
    if b.wasted_cost > 0:
        idle = b.gpus_paid - b.gpus_used
        notes.append(f"pays for {idle:g} idle GPU(s), ${b.wasted_cost:.2f}")
    if b.interruption_cost > 0:
        notes.append(f"interruption risk ${b.interruption_cost:.2f}, expected to finish in {b.expected_hours:.3g} h")
    if b.reliability_cost >= Decimal("0.01"):
        notes.append(f"provider reliability ${b.reliability_cost:.2f}")
    return head + " (" + "; ".join(notes) + ")"


def _relax(rule: str, vectors: ScoreVectors, index: int, offer: OfferView) -> str:
    d = vectors.demand
    if rule == "price cap":
        return f"raise the hourly cap to ${math.ceil(vectors.price_per_hour[index] * 100) / 100:.2f}"
    if rule == "job price cap":
        expected = expected_price_cost(vectors.price_per_hour, vectors.job_hours, vectors.expected_hours)[index]
        return f"raise the job cap to ${math.ceil(expected * 100) / 100:.2f}"
    if rule == "region":
        return f"allow region {offer.region}"
    if rule == "jurisdiction":
        return f"allow jurisdiction {offer.jurisdiction or 'unknown'}"
    if rule == "gpu model":
        return f"allow {offer.gpu_model}"
    if rule == "gpu memory":
        return f"accept {offer.gpu_memory_gb} GB per GPU"
    if rule == "whole cards":
        return "it is a slice of a card: ask for slices (fractions), or size the demand by GPU memory"
    if rule == "size":
        per_node = offer.gpu_count
        if offer.divisible or offer.capacity_pool is not None or d.total_gpu_memory_gb is not None:
            return f"ask for at most {per_node} GPUs"
        spread = math.ceil(d.gpu_count / per_node) * d.nodes
        return f"ask for at most {per_node} GPUs per node, e.g. {spread} nodes x {per_node} GPUs"
    if rule == "nodes":
        return f"it is one machine: ask for one node of up to {offer.gpu_count} GPUs"
    if rule == "pricing model":
        return f"accept {offer.pricing_model.replace('_', '-')} pricing"
    if rule == "interconnect":
        link = 0 if offer.spec is None or offer.gpu_fraction < 1 else offer.spec.interconnect_gbs
        return f"accept {link} GB/s between GPUs"
    if rule == "rdma":
        return "drop the RDMA requirement"
    if rule == "placement group":
        return "drop the placement-group requirement (this provider cannot pack nodes)"
    if rule == "fp64":
        fp64 = 0.0 if offer.spec is None else offer.spec.fp64_tflops * offer.gpu_fraction
        return f"accept FP64 of {fp64:g} TFLOPS"
    if rule == "ecc":
        return "accept memory without ECC"
    if rule == "video encoders":
        return "accept GPUs without hardware encoders (software encoding)"
    if rule == "interruption":
        return "accept interruptions (checkpoint the job) to use spot capacity"
    if rule == "deadline":
        expected = float(vectors.expected_hours[index])
        rate = offer.interruption_rate_per_hour
        # Without a deadline the rule fires only for an offer too slow to ever finish (interruptions.MAX_SLOWDOWN).
        if d.deadline_hours is None or not expected <= d.deadline_hours * MAX_SLOWDOWN:
            return f"checkpoint more often: at {rate:g} interruptions/hour the job is not expected to finish"
        return (
            f"allow {math.ceil(expected * 10) / 10:g} h to finish (expected at {rate:g} interruptions/hour), "
            "or checkpoint more often"
        )
    if rule == "capacity":
        if offer.pool_capacity is not None and vectors.pool_units[index] > offer.pool_capacity:
            return f"ask for fewer GPUs or wait: {offer.pool_capacity} GPU(s) free on its machine"
        if d.nodes > 1 and not offer.divisible:
            return f"ask for at most {offer.capacity} nodes or wait: {offer.capacity} instance(s) left"
        return f"ask for fewer GPUs or wait: {offer.capacity} left"
    if rule == "stale price":
        return "wait for the next price sync"
    if rule == "throughput":
        return f"pick another profile: this card has no {defaults_for(d).metric_unit}"
    return "no datasheet for this GPU yet"


def near_misses(vectors: ScoreVectors, book: OfferBook, limit: int = _NEAR_MISSES) -> tuple[NearMiss, ...]:
    """Offers breaking the fewest rules (of the ones a buyer can relax), best score first."""
    hard = np.array([RULES.index(r) for r in ("no datasheet", "stale price", "throughput")])
    counts = vectors.failures.sum(axis=0)
    relaxable = ~vectors.failures[hard].any(axis=0) & (counts > 0)
    idx = np.flatnonzero(relaxable)
    if idx.size == 0:
        return ()
    order = np.lexsort((idx, vectors.effective[idx], vectors.score[idx], counts[idx]))
    misses = []
    seen: set[tuple[str, ...]] = set()
    for i in idx[order]:
        offer = book.views[i]
        failed = vectors.failed_rules(int(i))
        key = (*failed, offer.gpu_model, offer.region)
        if key in seen:
            continue
        seen.add(key)
        relax = "; ".join(_relax(rule, vectors, int(i), offer) for rule in failed)
        misses.append(NearMiss(offer=offer, failed=failed, relax=relax))
        if len(misses) == limit:
            break
    return tuple(misses)


def quotes_for(vectors: ScoreVectors, book: OfferBook, indices: Iterable[int]) -> tuple[Quote, ...]:
    defaults = defaults_for(vectors.demand)
    rows = [(int(i), breakdown(vectors, int(i), book.views[int(i)], defaults.metric)) for i in indices]
    best = rows[0][1] if rows else None
    return tuple(
        Quote(
            offer=book.views[i],
            units=float(vectors.units[i]),
            breakdown=b,
            reason=quote_reason(book.views[i], b, float(vectors.gpus[i]), defaults, best, vectors.demand.nodes),
        )
        for i, b in rows
    )


def rank(
    demand: Demand,
    offers: OfferBook | Iterable[OfferView],
    *,
    now: dt.datetime,
    max_age: dt.timedelta | None = None,
    exclusion: Exclusion | None = None,
    limit: int = 50,
) -> Ranking:
    """Feasible offers for ``demand``, fewest dollars for the job first (see the module docstring of
    ``marketplace.matching``), at most ``limit`` of them; with none feasible, the nearest misses."""
    book = as_book(offers)
    vectors = score_vectors(demand, book, now=now, max_age=max_age, exclusion=exclusion)
    indices = best_indices(vectors, max(limit, 1))
    counts = vectors.failures.sum(axis=1)
    rejected = {RULES[r]: int(n) for r, n in enumerate(counts) if n}
    excluded = int((~vectors.failures.any(axis=0)).sum() - vectors.feasible.sum())
    if excluded:
        rejected["excluded"] = excluded
    quotes = quotes_for(vectors, book, indices)
    misses = () if quotes else near_misses(vectors, book)
    return Ranking(
        demand=vectors.demand,
        quotes=quotes,
        rejected=rejected,
        near_misses=misses,
        defaults=None if demand.profile is None else defaults_for(demand),
    )
