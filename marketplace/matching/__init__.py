"""The pure matching engine: DTOs in, DTOs out; no ORM, no I/O, no clock (time is an argument)."""

from marketplace.matching.engine import rank_offers
from marketplace.matching.types import Demand, Exclusion, MatchResult, OfferView, RankedOffer

__all__ = ["Demand", "Exclusion", "MatchResult", "OfferView", "RankedOffer", "rank_offers"]
