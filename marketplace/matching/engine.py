"""First cut of the ranking: feasibility filters, then price per requested GPU-hour (the failover's ranking)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal

from marketplace.matching.types import Demand, Exclusion, MatchResult, OfferView, RankedOffer

_CENT = Decimal("0.0001")
_MONEY = Decimal("0.000001")  # as ``rank``'s breakdown rounds an hourly price


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
    if demand.max_price_per_hour is not None and price_per_hour(demand, offer) > demand.max_price_per_hour:
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


def price_per_hour(demand: Demand, offer: OfferView) -> Decimal:
    """What ``demand`` pays per hour on ``offer``, as ``rank`` prices it: the whole instance, or on a divisible
    listing (sold per GPU) only the GPUs asked for; times the nodes of a multi-node demand."""
    if offer.divisible:
        paid = offer.price_usd_per_hour / offer.gpu_count * demand.gpu_count
    else:
        paid = offer.price_usd_per_hour
    return (paid * demand.nodes).quantize(_MONEY)


def rank_offers(
    demand: Demand,
    offers: Iterable[OfferView],
    *,
    now: dt.datetime,
    max_age: dt.timedelta,
    exclusion: Exclusion | None = None,
) -> MatchResult:
    """Feasible offers for ``demand``, cheapest per requested GPU-hour first.

    Each offer is priced at what the demand pays for it (``price_per_hour``, the price ``rank`` quotes): a
    whole instance, or only the GPUs asked for of a divisible listing. That price, divided by the GPUs the
    buyer asked for, not the GPUs on the machine, orders the ranking, so an 8-GPU machine sold whole never
    looks cheap to a 1-GPU job; the price cap applies to it too. Ties go to the lower price, then to the
    offer id for a stable order. Offers older than ``max_age`` at ``now`` are not sold.
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
        paid = price_per_hour(demand, offer)
        per_gpu = (paid / (demand.gpu_count * demand.nodes)).quantize(_CENT)
        ranked.append(RankedOffer(offer=offer, price_per_gpu_hour=per_gpu, price_per_hour=paid, reason=""))
    ranked.sort(key=lambda r: (r.price_per_gpu_hour, r.price_per_hour, r.offer.offer_id))
    explained = tuple(
        RankedOffer(
            offer=r.offer,
            price_per_gpu_hour=r.price_per_gpu_hour,
            price_per_hour=r.price_per_hour,
            reason=_reason(i, r, demand, ranked[0] if ranked else None),
        )
        for i, r in enumerate(ranked)
    )
    return MatchResult(ranked=explained, rejected=dict(rejected))


def _reason(index: int, ranked: RankedOffer, demand: Demand, best: RankedOffer | None) -> str:
    offer = ranked.offer
    # A divisible listing rents the GPUs asked for, not the machine: name what the buyer gets.
    gpus = demand.gpu_count if offer.divisible else offer.gpu_count
    base = (
        f"{gpus}x {offer.gpu_model} {offer.pricing_model.replace('_', '-')} in {offer.zone} at "
        f"${ranked.price_per_gpu_hour} per GPU-hour (${ranked.price_per_hour.quantize(_CENT)}/h) "
        f"for {demand.gpu_count} GPU(s)"
    )
    if index == 0 or best is None:
        return "cheapest feasible: " + base
    extra = ranked.price_per_gpu_hour - best.price_per_gpu_hour
    return f"#{index + 1}: {base} (+${extra} per GPU-hour over the best)"
