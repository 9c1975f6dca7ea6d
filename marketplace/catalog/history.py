"""Price history for buyers: how an instance type's on-demand and spot prices in a region moved, and what a
pricing model saves against on-demand."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from marketplace.models import Offer, OfferStatus, PricePoint


@dataclass(frozen=True)
class Series:
    """One offer's price over time (USD per hour), as a step line: each point holds until the next."""

    zone: str
    pricing_model: str
    points: list[tuple[dt.datetime, Decimal]]


def price_history(*, account_id: int, instance_type: str, region: str, since: dt.datetime) -> list[Series]:
    """Every offer of the type in the region with the prices it had since ``since`` (and the one in force
    then, so each line starts at the price of that moment): its earlier prices, then its current one."""
    offers = Offer.objects.filter(account_id=account_id, instance_type=instance_type, region=region).order_by(
        "pricing_model", "zone"
    )
    return [Series(offer.zone, offer.pricing_model, offer_prices(offer, since=since)) for offer in offers]


def offer_prices(offer: Offer, *, since: dt.datetime) -> list[tuple[dt.datetime, Decimal]]:
    """The offer's prices (USD per hour) since ``since``, each with when it took effect: the one in force at
    ``since`` first (dated ``since``), the current one last. An offer first seen later starts then."""
    points: list[tuple[dt.datetime, Decimal]] = []
    if offer.price_since > since:  # else the current price held all along
        earlier = PricePoint.objects.filter(offer=offer).values_list("observed_at", "price_usd")
        in_force = earlier.filter(observed_at__lte=since).order_by("-observed_at").first()
        after = earlier.filter(observed_at__gt=since).order_by("observed_at")
        points = ([in_force] if in_force else []) + list(after)
    points.append((offer.price_since, offer.price_usd))
    return [(max(moment, since), price) for moment, price in points]


def spot_savings(offers: Iterable[Offer]) -> dict[int, int]:
    """For each spot offer among ``offers``: the percentage it saves against the cheapest on-demand offer of the
    same account, region and instance type on sale now (no entry when there is none)."""
    spot = [o for o in offers if o.pricing_model == "spot"]
    if not spot:
        return {}
    keys = {(o.account_id, o.region, o.instance_type) for o in spot}
    on_demand: dict[tuple[int, str, str], Decimal] = {}
    rows = Offer.objects.filter(
        status=OfferStatus.AVAILABLE,
        pricing_model="on_demand",
        account_id__in={k[0] for k in keys},
        instance_type__in={k[2] for k in keys},
    ).values_list("account_id", "region", "instance_type", "price_usd")
    for account_id, region, instance_type, price in rows:
        key = (account_id, region, instance_type)
        if key in keys and (key not in on_demand or price < on_demand[key]):
            on_demand[key] = price
    savings = {}
    for offer in spot:
        reference = on_demand.get((offer.account_id, offer.region, offer.instance_type))
        if reference and reference > offer.price_usd:
            savings[offer.pk] = int((1 - offer.price_usd / reference) * 100)
    return savings
