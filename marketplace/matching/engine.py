"""First cut of the ranking: feasibility filters, then price per requested GPU-hour."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal

from marketplace.matching.types import Demand, Exclusion, MatchResult, OfferView, RankedOffer

_CENT = Decimal("0.0001")


def _infeasible(demand: Demand, offer: OfferView, now: dt.datetime, max_age: dt.timedelta) -> str:
    if demand.gpu_models and offer.gpu_model not in demand.gpu_models:
        return "gpu model"
    if offer.gpu_count < demand.gpu_count:
        return "gpu count"
    if demand.nodes > 1 and (offer.divisible or offer.capacity_pool is not None):
        return "nodes"  # an independent host is one machine
    if offer.gpu_memory_gb < demand.min_gpu_memory_gb:
        return "gpu memory"
    if demand.regions and offer.region not in demand.regions:
        return "region"
    if demand.pricing_models and offer.pricing_model not in demand.pricing_models:
        return "pricing model"
    if demand.max_price_per_hour is not None and offer.price_usd_per_hour > demand.max_price_per_hour:
        return "price cap"
    # Capacity counts instances, or GPUs of a divisible listing (OfferView's contract).
    if offer.capacity is not None and offer.capacity < (demand.gpu_count if offer.divisible else demand.nodes):
        return "capacity"
    # A pool (one machine's lease sizes) counts the GPUs the lease occupies.
    if offer.pool_capacity is not None and offer.pool_capacity < (
        demand.gpu_count if offer.divisible else offer.gpu_count
    ):
        return "capacity"
    if now - offer.observed_at > max_age:
        return "stale price"
    return ""


def rank_offers(
    demand: Demand,
    offers: Iterable[OfferView],
    *,
    now: dt.datetime,
    max_age: dt.timedelta,
    exclusion: Exclusion | None = None,
) -> MatchResult:
    """Feasible offers for ``demand``, cheapest per requested GPU-hour first.

    The price is divided by the GPUs the buyer asked for, not the GPUs on the machine, so an 8-GPU machine
    never looks cheap to a 1-GPU job. Ties go to the lower total price, then to the offer id for a stable
    order. Offers older than ``max_age`` at ``now`` are not sold.
    """
    rejected: Counter[str] = Counter()
    ranked: list[RankedOffer] = []
    for offer in offers:
        reason = _infeasible(demand, offer, now, max_age)
        if not reason and exclusion is not None:
            reason = exclusion.excludes(offer)
        if reason:
            rejected[reason] += 1
            continue
        per_gpu = (offer.price_usd_per_hour / demand.gpu_count).quantize(_CENT)
        ranked.append(RankedOffer(offer=offer, price_per_gpu_hour=per_gpu, reason=""))
    ranked.sort(key=lambda r: (r.price_per_gpu_hour, r.offer.price_usd_per_hour, r.offer.offer_id))
    explained = tuple(
        RankedOffer(
            offer=r.offer,
            price_per_gpu_hour=r.price_per_gpu_hour,
            reason=_reason(i, r, demand, ranked[0] if ranked else None),
        )
        for i, r in enumerate(ranked)
    )
    return MatchResult(ranked=explained, rejected=dict(rejected))


def _reason(index: int, ranked: RankedOffer, demand: Demand, best: RankedOffer | None) -> str:
    offer = ranked.offer
    base = (
        f"{offer.gpu_count}x {offer.gpu_model} {offer.pricing_model.replace('_', '-')} in {offer.zone} at "
        f"${ranked.price_per_gpu_hour} per GPU-hour for {demand.gpu_count} GPU(s)"
    )
    if index == 0 or best is None:
        return "cheapest feasible: " + base
    extra = ranked.price_per_gpu_hour - best.price_per_gpu_hour
    return f"#{index + 1}: {base} (+${extra} per GPU-hour over the best)"
