"""Batch assignment: capacity shared between demands, packing, the certified bound, and agreement with HiGHS."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bench import market
from marketplace.matching import Demand, OfferBook, Profile, assign
from marketplace.matching.assignment import build_problem
from marketplace.matching.assignment_problem import Problem, greedy
from marketplace.matching.optimize import exact, solve
from providers import gpu_names as g
from tests.marketplace.test_ranking import NOW, offer


def test_demands_share_a_divisible_machine() -> None:
    shared = offer(1, g.A100_80_SXM, 8, "16.00", divisible=True, capacity=5, provider_kind="independent")
    whole = offer(2, g.A100_80_SXM, 1, "4.00")
    demands = [Demand(demand_id=f"d{i}", gpu_count=1, duration_hours=2) for i in range(6)]
    result = assign(demands, [shared, whole], now=NOW, time_limit=2)
    placed = [a.quote.offer.offer_id for a in result.demands if a.quote]
    assert sorted(placed) == [1, 1, 1, 1, 1, 2]  # five share the machine at $2/GPU-hour, one pays $4
    assert result.total_cost == pytest.approx(5 * 2 * 2 * 1.0 + 4 * 2, rel=1e-9)
    assert result.optimal and result.gap == 0
    assert result.lower_bound == pytest.approx(result.objective)


def test_capacity_goes_where_it_saves_most() -> None:
    # One H100 left. The training job gains far more from it than the short fine-tune, whose next best
    # is nearly as good; placing the demands in arrival order would give it to the fine-tune.
    h100 = offer(1, g.H100_SXM, 8, "80.00", capacity=1)
    a100 = offer(2, g.A100_80_SXM, 8, "70.00", capacity=5)
    fine_tune = Demand(demand_id="ft", profile=Profile.FINE_TUNING, gpu_count=8, duration_hours=1)
    training = Demand(demand_id="tr", profile=Profile.TRAINING, gpu_count=8, duration_hours=100)
    result = assign([fine_tune, training], [h100, a100], now=NOW, time_limit=2)
    chosen = {a.demand.demand_id: a.quote.offer.offer_id for a in result.demands if a.quote}
    assert chosen == {"ft": 2, "tr": 1}
    arrival = greedy(*_problem([fine_tune, training], [h100, a100]), order=[0, 1])
    assert arrival.tolist()[0] >= 0  # the fine-tune took the H100 first
    assert "over the best" in next(a.reason for a in result.demands if a.demand.demand_id == "ft")


def _problem(demands: list[Demand], offers: list) -> tuple[Problem]:
    problem, _ = build_problem(demands, OfferBook.from_views(offers), now=NOW)
    return (problem,)


def test_a_demand_nothing_fits_says_why() -> None:
    demands = [Demand(demand_id="big", gpu_count=16), Demand(demand_id="one")]
    result = assign(demands, [offer(1, g.L4, 1, "0.8")], now=NOW)
    assert result.demands[0].quote is None
    assert result.demands[0].reason == "no offer fits: mostly size"
    assert result.demands[1].quote is not None


def test_unplaced_when_capacity_runs_out() -> None:
    demands = [Demand(demand_id=str(i), gpu_count=8) for i in range(3)]
    result = assign(demands, [offer(1, g.H100_SXM, 8, "98", capacity=2)], now=NOW)
    assert sum(1 for a in result.demands if a.quote) == 2
    unplaced = next(a for a in result.demands if a.quote is None)
    assert "capacity went to demands of the batch" in unplaced.reason


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_proven_milp_optimum(seed: int) -> None:
    """On small contended instances HiGHS proves the optimum; ours must reach it, and our bound must
    never exceed it (a bound above the optimum would be a false certificate)."""
    book = OfferBook.from_views(market.offers(150, seed=seed, scarce=True))
    problem, _ = build_problem(market.demands(60, seed=100 + seed), book, now=market.NOW)
    reference = exact(problem, time_limit=60)
    assert reference.optimal
    ours = solve(problem, time_limit=10)
    assert problem.fits(ours.choice)
    assert ours.lower_bound <= reference.objective + 1e-6
    assert ours.objective <= reference.objective * 1.01
    assert ours.gap == pytest.approx((ours.objective - ours.lower_bound) / ours.objective, abs=1e-12)


def test_answers_even_with_almost_no_time() -> None:
    book = OfferBook.from_views(market.offers(2000, seed=7, scarce=True))
    problem, _ = build_problem(market.demands(300, seed=8), book, now=market.NOW)
    answer = solve(problem, time_limit=0.001)
    assert problem.fits(answer.choice)
    assert answer.objective == pytest.approx(problem.objective(answer.choice))
    assert answer.lower_bound <= answer.objective


def test_greedy_respects_capacity() -> None:
    problem = Problem.build(
        demand=[0, 0, 1, 1],
        row=[0, -1, 0, -1],
        units=[1, 1, 1, 1],
        cost=[1.0, 5.0, 1.0, 3.0],
        capacity=[1],
        unplaced=[100.0, 100.0],
    )
    choice = greedy(problem)
    assert problem.fits(choice)
    # Demand 0 loses 4 without the shared column, demand 1 only 2: demand 0 gets it.
    assert problem.objective(choice) == 4.0
    assert np.array_equal(problem.label[choice], [0, 3])


def test_solves_in_parallel_threads_and_after_an_abandoned_one() -> None:
    """Two requests may assign batches at once, and a MILP dropped at its deadline must not block the next
    (highspy's own threaded solve allows one per process)."""
    book = OfferBook.from_views(market.offers(3000, seed=9, scarce=True))
    problem, _ = build_problem(market.demands(300, seed=10), book, now=market.NOW)
    abandoned = exact(problem, time_limit=0.01)
    assert abandoned.optimal is False
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(solve(problem, time_limit=1.0))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 2
    for answer in answers:
        assert problem.fits(answer.choice)  # type: ignore[attr-defined]
        assert answer.lower_bound <= answer.objective  # type: ignore[attr-defined]


def test_a_batch_in_which_nothing_fits_any_demand_is_answered_not_crashed() -> None:
    # Found by schemathesis through POST /api/v1/procurements: no column at all reached the LP.
    demands = [Demand(demand_id="big", gpu_count=16), Demand(demand_id="bigger", gpu_count=64)]
    result = assign(demands, [offer(1, g.L4, 1, "0.8")], now=NOW)
    assert [d.quote for d in result.demands] == [None, None]
    assert result.demands[0].reason == "no offer fits: mostly size"
