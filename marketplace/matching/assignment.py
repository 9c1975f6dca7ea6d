"""``assign``: many demands against offers of finite capacity, minimising the dollars spent on their jobs.

A capacity row is an offer's own stock (instances, or GPUs of a divisible listing), or a pool several
offers draw on (``OfferView.capacity_pool``: an independent machine's free GPUs, sold per lease size), in
which a column takes the GPUs its demand occupies. A pooled offer has no row of its own: the pool bounds it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal

import numpy as np

from marketplace.matching.assignment_problem import Problem, Solution
from marketplace.matching.optimize import exact, solve, trace
from marketplace.matching.ranking import quotes_for
from marketplace.matching.scoring import RULES, OfferBook, as_book, score_vectors
from marketplace.matching.types import Assignment, Demand, DemandAssignment, Exclusion, OfferView

# A demand left unplaced costs this many times its dearest feasible option, so the assignment places
# every demand it can before it saves money on the others.
UNPLACED_FACTOR = 3.0
# Columns ``assign`` builds per demand: its cheapest ones. Broad demands have thousands of feasible offers
# (millions of columns a batch); the LP and the solution use a few dozen of each, and the ones left out
# still count in the bound (``Problem.floor``), so the certified gap stays a bound on the whole problem.
KEEP_COLUMNS = 300


def build_problem(
    demands: Sequence[Demand],
    book: OfferBook,
    *,
    now: dt.datetime,
    max_age: dt.timedelta | None = None,
    exclusion: Exclusion | None = None,
    keep: int | None = None,
) -> tuple[Problem, list[str]]:
    """The assignment problem of ``demands`` over ``book``: a column per feasible (demand, offer), costing
    the demand's job on that offer in dollars (``ScoreVectors.job_cost``, what ``rank`` orders by); a
    capacity row per offer with finite stock outside any pool, then one per capacity pool, in GPUs. Also,
    per demand with no feasible offer, why. ``keep``: build only each demand's ``keep`` cheapest columns
    (None: all), recording the cheapest one left out as its ``Problem.floor``."""
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 column per demand, not {keep}")
    pool = book.columns["pool"]
    pooled = pool >= 0
    limited = np.isfinite(book.columns["capacity"]) & ~pooled
    n_own = int(limited.sum())
    row_of = np.full(len(book), -1, dtype=np.int64)
    row_of[limited] = np.arange(n_own)
    row_of[pooled] = n_own + pool[pooled]
    pool_capacity = np.zeros(book.n_pools)
    pool_capacity[pool[pooled]] = book.columns["pool_free"][pooled]
    capacity = np.concatenate([book.columns["capacity"][limited], pool_capacity]).astype(np.float64)
    parts_d, parts_j, parts_units, parts_cost = [], [], [], []
    penalties = np.ones(len(demands))
    floor = np.full(len(demands), np.inf)
    why_not: list[str] = []
    for d, demand in enumerate(demands):
        vectors = score_vectors(demand, book, now=now, max_age=max_age, exclusion=exclusion)
        idx = np.flatnonzero(vectors.feasible)
        if idx.size == 0:
            counts = vectors.failures.sum(axis=1)
            top = [RULES[r] for r in np.argsort(-counts, kind="stable")[:2] if counts[r]]
            why_not.append("no offer fits: mostly " + " and ".join(top) if top else "every fitting offer is blocked")
            continue
        why_not.append("")
        cost = vectors.job_cost[idx]
        penalties[d] = UNPLACED_FACTOR * float(cost.max())
        if keep is not None and idx.size > keep:
            # A selection, not a sort: every column after position ``keep`` costs at least the one there.
            part = np.argpartition(cost, keep)
            floor[d] = float(cost[part[keep]])
            chosen = np.sort(part[:keep])
            idx, cost = idx[chosen], cost[chosen]
        by_cost = np.argsort(cost, kind="stable")
        idx, cost = idx[by_cost], cost[by_cost]
        parts_d.append(np.full(idx.size, d, dtype=np.int64))
        parts_j.append(idx)
        parts_units.append(np.where(pooled[idx], vectors.pool_units[idx], vectors.units[idx]))
        parts_cost.append(cost)

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    offers = cat(parts_j, np.int64)
    problem = Problem.build(
        demand=cat(parts_d, np.int64),
        row=row_of[offers],
        units=cat(parts_units, np.float64),
        cost=cat(parts_cost, np.float64),
        capacity=capacity,
        unplaced=penalties,
        label=offers,
        presorted=True,
        floor=floor,
    )
    return problem, why_not


def to_assignment(
    demands: Sequence[Demand],
    book: OfferBook,
    problem: Problem,
    why_not: list[str],
    solution: Solution,
    *,
    now: dt.datetime,
    max_age: dt.timedelta | None,
    started: float,
) -> Assignment:
    offers = problem.label
    placed: list[DemandAssignment] = []
    total = Decimal(0)
    for d, demand in enumerate(demands):
        j = int(solution.choice[d])
        if j < 0:
            reason = why_not[d] or "its feasible offers' capacity went to demands of the batch that gain more"
            placed.append(DemandAssignment(demand=demand, quote=None, reason=reason))
            continue
        # Quoted beside the demand's own best offer (its first column: columns are in cost order), so the
        # reason says what sharing capacity cost it; scored on a two-offer book, not the whole book again.
        best, chosen = int(offers[problem.starts[d]]), int(offers[j])
        pair = OfferBook.from_views([book.views[best], book.views[chosen]] if best != chosen else [book.views[chosen]])
        vectors = score_vectors(demand, pair, now=now, max_age=max_age)
        quote = quotes_for(vectors, pair, range(len(pair)))[-1]
        total += quote.breakdown.effective_cost
        placed.append(DemandAssignment(demand=vectors.demand, quote=quote, reason=quote.reason))
    return Assignment(
        demands=tuple(placed),
        total_cost=total,
        objective=solution.objective,
        lower_bound=solution.lower_bound,
        gap=solution.gap,
        method=solution.method,
        optimal=solution.optimal,
        seconds=time.perf_counter() - started,
    )


def assign(
    demands: Iterable[Demand],
    offers: OfferBook | Iterable[OfferView],
    *,
    now: dt.datetime,
    time_limit: float = 5.0,
    max_age: dt.timedelta | None = None,
    method: str = "auto",
    exclusion: Exclusion | None = None,
) -> Assignment:
    """Place ``demands`` jointly on ``offers`` (see the module docstring of ``marketplace.matching``).

    ``method`` "auto" is the column-generation solver with a certified gap; "exact" is HiGHS's MILP on
    every column under the same time limit (slow on large contended batches; for checking).
    ``exclusion`` rules offers out (blocked zones, regions, accounts).

    ``time_limit`` counts from the call. Scoring every (demand, offer) pair comes first and is not cut
    short (about a second for 1,000 demands over 10,000 offers), so a limit below that is exceeded by it;
    the solver then uses what is left and always returns a feasible assignment.
    """
    started = time.perf_counter()
    demands = list(demands)
    book = as_book(offers)
    # "exact" is the reference: every column.
    keep = None if method == "exact" else KEEP_COLUMNS
    problem, why_not = build_problem(demands, book, now=now, max_age=max_age, exclusion=exclusion, keep=keep)
    trace(f"built {problem.n_columns} columns in {time.perf_counter() - started:.2f}s")
    # Leave time to turn the answer into quotes (about a third of a millisecond per demand).
    reserve = 0.1 + 0.0003 * len(demands)
    remaining = max(time_limit - (time.perf_counter() - started) - reserve, 0.01)
    solution = exact(problem, time_limit=remaining) if method == "exact" else solve(problem, time_limit=remaining)
    if method == "exact" and not np.isfinite(solution.objective):
        solution = solve(problem, time_limit=0.05)
    return to_assignment(demands, book, problem, why_not, solution, now=now, max_age=max_age, started=started)
