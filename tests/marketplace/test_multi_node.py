"""Jobs that span machines (issue 20, point 4), in the engine: N nodes x G GPUs of one offer, priced and
placed as one unit.

Datasheet figures come from bench/market.py's spec table (NVIDIA's data sheets); the interruption model is
``marketplace/matching/interruptions.py`` (Daly 2006).
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import pytest

from marketplace.matching import Demand, Profile, Tolerance, assign, rank
from marketplace.matching.interruptions import expected_completion_hours
from marketplace.matching.scoring import OfferBook, score_vectors
from providers import gpu_names as g
from tests.marketplace.test_ranking import NOW, ids, offer


def test_sixteen_gpus_are_told_to_span_two_nodes_then_placed_as_two_eight_gpu_machines() -> None:
    # Given only 8-GPU machines and a demand for 16 GPUs on one machine
    offers = [offer(1, g.H100_SXM, 8, "98.32", capacity=5)]
    alone = rank(Demand(gpu_count=16, duration_hours=10), offers, now=NOW)

    # Then nothing fits, and the near miss says how to ask across machines
    assert not alone.quotes
    assert alone.near_misses[0].failed == ("size",)
    assert "2 nodes x 8 GPUs" in alone.near_misses[0].relax

    # When the buyer asks for 2 nodes x 8 GPUs
    ranking = rank(Demand(gpu_count=8, nodes=2, duration_hours=10), offers, now=NOW)

    # Then the group is one quote: two instances' price, the job's dollars for both, all 16 GPUs used
    quote = ranking.best
    assert quote is not None and quote.units == 2
    b = quote.breakdown
    assert b.price_per_hour == Decimal("196.640000")
    assert b.job_cost == Decimal("1966.400000")
    assert (b.gpus_used, b.gpus_paid, b.wasted_cost) == (16, 16, 0)
    assert quote.reason.startswith("2 nodes x 8x H100-SXM5 on-demand")


def test_a_group_needs_as_many_instances_left_as_it_has_nodes() -> None:
    offers = [offer(1, g.H100_SXM, 8, "98.32", capacity=3), offer(2, g.H100_SXM, 8, "120.00", capacity=4)]

    ranking = rank(Demand(gpu_count=8, nodes=4), offers, now=NOW)

    # The cheaper listing has 3 instances left: a 4-node job cannot run a node short
    assert ids(ranking) == [2]
    assert ranking.rejected == {"capacity": 1}
    only_cheap = rank(Demand(gpu_count=8, nodes=4), offers[:1], now=NOW)
    assert "ask for at most 3 nodes" in only_cheap.near_misses[0].relax


def test_an_independent_host_is_one_machine_and_serves_one_node() -> None:
    host = offer(1, g.RTX_4090, 8, "3.20", divisible=True, provider_kind="community")
    pooled = offer(2, g.RTX_4090, 2, "0.80", provider_kind="community", capacity_pool="m-1", pool_capacity=8)
    cloud = offer(3, g.RTX_4090, 2, "1.40", capacity=10)

    ranking = rank(Demand(gpu_count=2, nodes=3), [host, pooled, cloud], now=NOW)

    assert ids(ranking) == [3]
    assert ranking.rejected["nodes"] == 2
    miss = rank(Demand(gpu_count=2, nodes=3), [host], now=NOW).near_misses[0]
    assert miss.failed == ("nodes",) and "one machine" in miss.relax
    # One node on the same host is fine: the rule is about spanning machines
    assert ids(rank(Demand(gpu_count=2), [host], now=NOW)) == [1]


def test_any_nodes_interruption_stops_the_group_so_the_rates_add() -> None:
    spot = offer(1, g.A100_80_SXM, 8, "10.00", pricing_model="spot", interruption_rate_per_hour=0.1, capacity=20)
    demand = Demand(
        gpu_count=8, duration_hours=10, interruption_tolerance=Tolerance.CHECKPOINTED, checkpoint_interval_hours=1
    )
    book = OfferBook.from_views([spot])

    one = score_vectors(demand, book, now=NOW)
    eight = score_vectors(dataclasses.replace(demand, nodes=8), book, now=NOW)

    group = dataclasses.replace(demand, nodes=8)
    assert eight.expected_hours[0] == pytest.approx(expected_completion_hours(group, [0.8], 10.0)[0])
    assert one.expected_hours[0] == pytest.approx(expected_completion_hours(demand, [0.1], 10.0)[0])
    # Eight nodes lose more than eight times one node's interruption cost: the model is not linear in the rate
    assert eight.interruption_cost[0] > 8 * one.interruption_cost[0] * 1.2


def test_a_group_launches_only_if_every_node_does() -> None:
    flaky = offer(1, g.A100_80_SXM, 8, "10.00", reliability=0.9, capacity=10)
    demand = Demand(gpu_count=8, nodes=4, duration_hours=2)

    b = rank(demand, [flaky], now=NOW).quotes[0].breakdown

    assert float(b.reliability_cost) == pytest.approx(80.0 * (1 / 0.9**4 - 1), abs=1e-5)


def test_fixed_work_spreads_over_every_nodes_gpus() -> None:
    # A training job of 100 hours on 8 A100s; on 4 nodes of 8 H100s the work is 4x as large (32 cards) and
    # spread over 32 H100s: the hours are those of one node's job, the dollars four nodes'.
    h100 = offer(1, g.H100_SXM, 8, "98.32", capacity=10)
    one = rank(Demand(profile=Profile.TRAINING, gpu_count=8, work_hours=100), [h100], now=NOW).quotes[0]
    four = rank(Demand(profile=Profile.TRAINING, gpu_count=8, nodes=4, work_hours=100), [h100], now=NOW).quotes[0]

    assert one.breakdown.job_hours == pytest.approx(100 * 312 / 989.4)
    assert four.breakdown.job_hours == pytest.approx(one.breakdown.job_hours)
    assert four.breakdown.job_cost == pytest.approx(4 * one.breakdown.job_cost, abs=Decimal("0.00001"))


def test_the_batch_places_a_group_whole_on_one_offer() -> None:
    # Given two 3-node jobs and listings of 4 and 5 instances: each job fits one listing, not both the cheap one
    offers = [offer(1, g.A100_80_SXM, 8, "10.00", capacity=4), offer(2, g.A100_80_SXM, 8, "12.00", capacity=5)]
    jobs = [Demand(gpu_count=8, nodes=3, demand_id=name) for name in ("a", "b")]

    result = assign(jobs, offers, now=NOW, time_limit=5)

    # Then one job takes 3 of the cheap listing's 4 instances and the other goes whole to the dearer one
    placed = sorted(d.quote.offer.offer_id for d in result.demands if d.quote is not None)
    assert placed == [1, 2]
    assert float(result.total_cost) == pytest.approx(30.0 + 36.0)
    assert result.optimal


def test_a_group_asking_for_a_placement_group_goes_only_where_the_provider_packs_nodes() -> None:
    # Given the same listing from a provider that makes cluster placement groups and from one that does not
    packs = offer(1, g.H100_SXM, 8, "98.32", capacity=4, placement_groups=True)
    cannot = offer(2, g.H100_SXM, 8, "90.00", capacity=4, provider_kind="tencent")
    packed = Demand(gpu_count=8, nodes=2, placement_group=True)

    ranking = rank(packed, [packs, cannot], now=NOW)

    # Then only the packing provider serves the group, and the cheaper one is turned away by that rule alone
    assert ids(ranking) == [1]
    assert ranking.rejected == {"placement group": 1}
    miss = rank(packed, [cannot], now=NOW).near_misses[0]
    assert miss.failed == ("placement group",)
    assert miss.relax == "drop the placement-group requirement (this provider cannot pack nodes)"
    # Without the requirement the cheaper listing wins again
    assert ids(rank(dataclasses.replace(packed, placement_group=False), [packs, cannot], now=NOW)) == [2, 1]


def test_one_node_needs_no_placement_group() -> None:
    cannot = offer(2, g.H100_SXM, 8, "90.00", capacity=4, provider_kind="tencent")

    ranking = rank(Demand(gpu_count=8, placement_group=True), [cannot], now=NOW)

    assert ids(ranking) == [2]
    assert ranking.rejected == {}


def test_the_batch_keeps_a_packed_group_off_providers_that_cannot_pack() -> None:
    offers = [
        offer(1, g.A100_80_SXM, 8, "10.00", capacity=4, provider_kind="tencent"),
        offer(2, g.A100_80_SXM, 8, "12.00", capacity=4, placement_groups=True),
    ]
    jobs = [Demand(gpu_count=8, nodes=3, demand_id="packed", placement_group=True), Demand(gpu_count=8, nodes=3)]

    result = assign(jobs, offers, now=NOW, time_limit=5)

    placed = {d.demand.demand_id: d.quote.offer.offer_id for d in result.demands if d.quote is not None}
    assert placed == {"packed": 2, "": 1}


@pytest.mark.parametrize("nodes", [0, -1, 65])
def test_node_counts_outside_one_to_sixty_four_are_refused(nodes: int) -> None:
    with pytest.raises(ValueError, match="nodes must be from 1 to 64"):
        Demand(nodes=nodes)


def test_a_job_cap_counts_the_hours_interruptions_are_expected_to_add() -> None:
    # 10 hours at $10/h is $100 on paper; at one interruption an hour with hourly checkpoints the job is
    # expected to run longer, so a $105 cap would stop it before it finishes.
    spot = offer(1, g.A100_80_SXM, 1, "10.00", pricing_model="spot", interruption_rate_per_hour=1.0)
    demand = Demand(duration_hours=10, checkpoint_interval_hours=1, max_price_per_job=Decimal("105"))
    expected = expected_completion_hours(demand, [1.0], 10.0)[0]
    assert 10.5 < expected < 10.0 * 3

    ranking = rank(demand, [spot], now=NOW)

    assert not ranking.quotes
    miss = ranking.near_misses[0]
    assert miss.failed == ("job price cap",)
    assert miss.relax == f"raise the job cap to ${math.ceil(expected * 10 * 100) / 100:.2f}"
    assert ids(
        rank(dataclasses.replace(demand, max_price_per_job=Decimal(str(expected * 10 + 0.01))), [spot], now=NOW)
    ) == [1]


def test_a_spot_quote_says_when_the_job_is_expected_to_finish() -> None:
    spot = offer(1, g.A100_80_SXM, 1, "10.00", pricing_model="spot", interruption_rate_per_hour=0.5)
    demand = Demand(duration_hours=10, checkpoint_interval_hours=1)

    quote = rank(demand, [spot], now=NOW).quotes[0]

    expected = expected_completion_hours(demand, [0.5], 10.0)[0]
    assert quote.breakdown.expected_hours == pytest.approx(expected)
    assert f"expected to finish in {expected:.3g} h" in quote.reason
