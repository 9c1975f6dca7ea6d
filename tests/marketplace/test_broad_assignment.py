"""Broad demands (many GPU models and regions, thousands of feasible offers each): ``assign`` builds only each
demand's cheapest columns, and its certified gap must still bound the whole problem (issue 20, point 5).
Times are measured in bench/matching.py (section 3c), not here."""

from __future__ import annotations

import numpy as np
import pytest

from bench import market
from bench.matching import broad_demands
from marketplace.matching import OfferBook, assign
from marketplace.matching.assignment import KEEP_COLUMNS, build_problem
from marketplace.matching.optimize import exact, solve


def _instance(n_demands: int, n_offers: int, seed: int) -> tuple[list, OfferBook]:
    book = OfferBook.from_views(market.offers(n_offers, seed=seed, scarce=True))
    return broad_demands(n_demands, seed=seed + 1, book=book), book


def test_keep_builds_each_demands_cheapest_columns_and_records_the_floor() -> None:
    demands, book = _instance(30, 400, seed=5)
    full, _ = build_problem(demands, book, now=market.NOW)
    kept, _ = build_problem(demands, book, now=market.NOW, keep=4)
    assert np.array_equal(kept.unplaced, full.unplaced)  # penalties come from every feasible offer
    for d in range(full.n_demands):
        costs = full.cost[full.columns_of(d)]
        assert kept.cost[kept.columns_of(d)].tolist() == pytest.approx(costs[:4].tolist())
        assert kept.floor[d] == (costs[4] if costs.size > 4 else np.inf)


def test_keep_must_be_positive() -> None:
    demands, book = _instance(2, 20, seed=5)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        build_problem(demands, book, now=market.NOW, keep=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_bound_of_a_pruned_problem_holds_for_the_whole_one(seed: int) -> None:
    # Few columns kept per demand, so the ones left out matter: the bound must still be at most the
    # proven optimum over every column, and the answer (a feasible choice) at least it.
    demands, book = _instance(40, 300, seed=seed)
    full, _ = build_problem(demands, book, now=market.NOW)
    optimum = exact(full, time_limit=60)
    assert optimum.optimal
    for keep in (2, 5):
        pruned, _ = build_problem(demands, book, now=market.NOW, keep=keep)
        ours = solve(pruned, time_limit=10)
        assert pruned.fits(ours.choice)
        assert ours.lower_bound <= optimum.objective + 1e-6 * optimum.objective
        assert ours.objective >= optimum.objective - 1e-6 * optimum.objective


def test_a_broad_batch_is_within_one_percent_with_a_valid_bound() -> None:
    demands, book = _instance(200, 2_000, seed=21)
    full, _ = build_problem(demands, book, now=market.NOW)
    assert full.n_columns > 100 * KEEP_COLUMNS  # broad: far more columns than assign builds
    result = assign(demands, book, now=market.NOW, time_limit=30)
    assert result.gap <= 0.01
    assert result.lower_bound <= result.objective
    # The bound is on the whole problem: no feasible answer over every column is below it.
    whole = solve(full, time_limit=60)
    assert result.lower_bound <= whole.objective + 1e-9
    assert whole.lower_bound <= result.objective + 1e-9
