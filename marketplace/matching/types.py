"""The engine's inputs and outputs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal


@dataclass(frozen=True, slots=True)
class OfferView:
    """What the engine knows of an offer. Prices are USD per hour for the whole instance."""

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


@dataclass(frozen=True, slots=True)
class Demand:
    """What a buyer asks for. Empty sets mean "any"."""

    gpu_count: int
    gpu_models: frozenset[str] = frozenset()
    min_gpu_memory_gb: int = 0
    regions: frozenset[str] = frozenset()
    pricing_models: frozenset[str] = frozenset()
    max_price_per_hour: Decimal | None = None


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
    offer: OfferView
    price_per_gpu_hour: Decimal
    reason: str


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Feasible offers best first, and how many offers each rule turned away."""

    ranked: tuple[RankedOffer, ...]
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> RankedOffer | None:
        return self.ranked[0] if self.ranked else None
