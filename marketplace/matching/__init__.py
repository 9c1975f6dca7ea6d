"""The pure matching engine: DTOs in, DTOs out; no ORM, no I/O, no clock (time is an argument).

Public functions (stable):

``rank(demand, offers, *, now, max_age=None, exclusion=None, limit=50) -> Ranking``
    One demand against an ``OfferBook`` (or any iterable of ``OfferView``). The demand's profile fills in
    the requirements the buyer left open (``effective_requirements``; ``PROFILES`` lists them). Each
    feasible offer is scored as dollars for the job: the price for the job's hours plus the expected
    cost of spot interruptions (for the job's tolerance) and of provider unreliability. The job's hours
    are the duration asked for when the demand fixes it (``Amount.DURATION``: a rental, a service), or
    its work over the throughput the profile's metric gives on the GPUs the demand uses when it fixes
    the work (``Amount.WORK``: hours on a reference GPU); each profile states its default (``amount``).
    The cost per unit of useful work is shown beside it (``unit_cost``). Paying for idle GPUs of a bigger
    machine is inside the price and shown as ``wasted_cost``. Quotes come best first, each with its
    ``ScoreBreakdown`` and a one-line reason; with none feasible, the nearest misses and what to relax.

``assign(demands, offers, *, now, time_limit=5.0, max_age=None) -> Assignment``
    Many demands against offers of finite capacity (instances, or GPUs of a divisible machine that
    several demands can share, or a pool of GPUs several offers draw on: an independent machine sold per
    lease size, ``OfferView.capacity_pool``). Minimises the dollars spent: the sum over demands of
    their job costs (as ``rank`` scores them), with a penalty for every demand left unplaced. Always
    returns a feasible assignment within the time limit, with a proven lower bound and the gap to it
    (``marketplace.matching.optimize`` explains the method).

``rank_offers(demand, offers, *, now, max_age, exclusion=None) -> MatchResult``
    The price-per-requested-GPU ranking the failover loop uses to pick its next candidate. Each offer
    costs what ``rank`` quotes for it (``RankedOffer.price_per_hour``): a whole instance, or only the GPUs
    asked for of a divisible listing; the price cap applies to that.
"""

from marketplace.matching.assignment import assign
from marketplace.matching.engine import rank_offers
from marketplace.matching.profiles import PROFILES, effective_requirements
from marketplace.matching.ranking import rank
from marketplace.matching.scoring import RULES, OfferBook, score_vectors
from marketplace.matching.types import (
    Amount,
    Assignment,
    Demand,
    DemandAssignment,
    Exclusion,
    GpuSpec,
    MatchResult,
    NearMiss,
    OfferView,
    Profile,
    ProfileDefaults,
    Quote,
    RankedOffer,
    Ranking,
    ScoreBreakdown,
    Tolerance,
)

__all__ = [
    "PROFILES",
    "RULES",
    "Amount",
    "Assignment",
    "Demand",
    "DemandAssignment",
    "Exclusion",
    "GpuSpec",
    "MatchResult",
    "NearMiss",
    "OfferBook",
    "OfferView",
    "Profile",
    "ProfileDefaults",
    "Quote",
    "RankedOffer",
    "Ranking",
    "ScoreBreakdown",
    "Tolerance",
    "assign",
    "effective_requirements",
    "rank",
    "rank_offers",
    "score_vectors",
]
