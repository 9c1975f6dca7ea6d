"""Counts mean cards (issue 20, point 3): a demand for N GPUs is served by N whole cards, never by N slices of one
(AWS g6f, a MIG profile), unless it asks for slices or is sized by memory; and the engine refuses a free or
negative price, a count below one and a cap of zero at its boundary, whatever the database allows."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from marketplace.matching import Demand, rank
from providers import gpu_names as g
from tests.marketplace.test_ranking import NOW, offer

# A whole A100 80 GB at 4.10 an hour, two 3g.40gb slices (3/7 of one each) at 1.80 for the pair.
WHOLE = offer(1, g.A100_80_SXM, 2, "8.20")
SLICES = offer(2, g.A100_80_SXM, 2, "3.60", gpu_fraction=3 / 7, gpu_memory_gb=40, instance_type="mig-3g.40gb")


def _ids(ranking) -> list[int]:
    return [q.offer.offer_id for q in ranking.quotes]


def test_a_demand_for_two_gpus_is_never_served_by_two_slices():
    ranking = rank(Demand(gpu_count=2), [SLICES, WHOLE], now=NOW)

    assert _ids(ranking) == [1]
    assert ranking.rejected == {"whole cards": 1}


def test_slices_serve_a_demand_that_asks_for_them_or_is_sized_by_memory():
    assert set(_ids(rank(Demand(gpu_count=2, fractions=True), [SLICES, WHOLE], now=NOW))) == {1, 2}
    by_memory = rank(Demand(total_gpu_memory_gb=80), [SLICES, WHOLE], now=NOW)
    assert 2 in _ids(by_memory)


def test_a_slice_alone_is_a_near_miss_that_says_how_to_get_it():
    ranking = rank(Demand(gpu_count=2), [SLICES], now=NOW)

    assert list(ranking.quotes) == []
    (miss,) = ranking.near_misses
    assert miss.failed == ("whole cards",) and "ask for slices" in miss.relax


@pytest.mark.parametrize("price", ["0", "-1.50", "NaN", "Infinity"])
def test_an_offer_without_a_positive_price_is_refused_at_the_boundary(price):
    with pytest.raises(ValueError, match=r"offer 9: price_usd_per_hour must be above zero"):
        offer(9, g.L4, 1, price)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"gpu_count": 0}, "gpu_count must be at least 1"),
        ({"max_price_per_hour": Decimal(0)}, "max_price_per_hour must be above zero"),
        ({"max_price_per_job": Decimal("-5")}, "max_price_per_job must be above zero"),
        ({"duration_hours": 0.0}, "duration_hours must be above zero"),
        ({"duration_hours": math.nan}, "duration_hours must be above zero"),
    ],
)
def test_a_demand_out_of_range_is_refused_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        Demand(demand_id="d1", **fields)


def test_an_offer_of_no_gpus_or_an_impossible_share_is_refused():
    with pytest.raises(ValueError, match="gpu_count must be at least 1"):
        offer(9, g.L4, 0, "1.00")
    with pytest.raises(ValueError, match=r"gpu_fraction must be in \(0, 1\]"):
        offer(9, g.L4, 1, "1.00", gpu_fraction=1.5)
