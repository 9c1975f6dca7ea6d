from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from bench.market import specs
from marketplace.matching import Demand, Exclusion, OfferView, rank, rank_offers
from providers import gpu_names as g

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def offer(offer_id: int, *, price: str, gpus: int = 1, model: str = "A100-80GB-SXM4", **kw) -> OfferView:
    fields = {
        "account_id": 1,
        "provider_kind": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": f"type-{offer_id}",
        "pricing_model": "on_demand",
        "gpu_memory_gb": 80,
        "observed_at": NOW,
    }
    fields.update(kw)
    return OfferView(offer_id=offer_id, gpu_model=model, gpu_count=gpus, price_usd_per_hour=Decimal(price), **fields)


def test_it_ranks_by_price_per_requested_gpu_hour_not_per_machine_gpu():
    one_gpu = offer(1, price="3.67")
    eight_gpus = offer(2, price="21.96", gpus=8)  # cheaper per machine GPU, dearer for a 1-GPU job

    result = rank_offers(Demand(gpu_count=1), [eight_gpus, one_gpu], now=NOW, max_age=HOUR)

    assert [r.offer.offer_id for r in result.ranked] == [1, 2]
    assert result.ranked[0].price_per_gpu_hour == Decimal("3.6700")
    assert result.ranked[1].price_per_gpu_hour == Decimal("21.9600")
    assert result.ranked[0].reason.startswith("cheapest feasible: 1x A100-80GB-SXM4")


def test_it_filters_every_demand_term_and_counts_the_rejections():
    offers = [
        offer(1, price="2", model="H100-SXM5"),
        offer(2, price="2", gpus=1),  # fine
        offer(3, price="2", gpu_memory_gb=40),
        offer(4, price="2", region="eu-west-1"),
        offer(5, price="2", pricing_model="spot"),
        offer(6, price="9"),
        offer(7, price="2", observed_at=NOW - 2 * HOUR),
        offer(8, price="2", capacity=0),
    ]
    demand = Demand(
        gpu_count=1,
        gpu_models=frozenset({"A100-80GB-SXM4"}),
        min_gpu_memory_gb=80,
        regions=frozenset({"us-east-1"}),
        pricing_models=frozenset({"on_demand"}),
        max_price_per_hour=Decimal("5"),
    )

    result = rank_offers(demand, offers, now=NOW, max_age=HOUR)

    assert [r.offer.offer_id for r in result.ranked] == [2]
    assert result.rejected == {
        "gpu model": 1,
        "gpu memory": 1,
        "region": 1,
        "pricing model": 1,
        "price cap": 1,
        "stale price": 1,
        "capacity": 1,
    }


def test_exclusions_apply_at_the_scope_of_the_failure():
    offers = [
        offer(1, price="1", zone="us-east-1a", instance_type="p4de"),
        offer(2, price="2", zone="us-east-1b", instance_type="p4de"),
        offer(3, price="3", region="us-west-2", zone="us-west-2a"),
        offer(4, price="4", account_id=2),
        offer(5, price="5", account_id=3),
    ]
    exclusion = Exclusion(
        zone_types=frozenset({(1, "us-east-1a", "p4de")}),
        account_regions=frozenset({(1, "us-west-2")}),
        accounts=frozenset({2}),
        offer_ids=frozenset({5}),
    )

    result = rank_offers(Demand(gpu_count=1), offers, now=NOW, max_age=HOUR, exclusion=exclusion)

    assert [r.offer.offer_id for r in result.ranked] == [2]
    assert result.rejected == {
        "zone out of capacity": 1,
        "region quota exhausted": 1,
        "account blocked": 1,
        "already tried": 1,
    }


def test_ties_break_on_total_price_then_id():
    a = offer(5, price="8", gpus=2)
    b = offer(3, price="8", gpus=2)
    c = offer(4, price="4", gpus=1)

    result = rank_offers(Demand(gpu_count=1), [a, b, c], now=NOW, max_age=HOUR)

    assert [r.offer.offer_id for r in result.ranked] == [4, 3, 5]


def test_no_feasible_offer_gives_an_empty_ranking():
    result = rank_offers(Demand(gpu_count=16), [offer(1, price="1")], now=NOW, max_age=HOUR)

    assert result.best is None
    assert result.rejected == {"gpu count": 1}


def test_capacity_counts_instances_unless_the_listing_is_divisible():
    whole_machine = offer(1, price="15.20", gpus=8, capacity=1)
    last_four_gpus = offer(2, price="15.20", gpus=8, capacity=4, divisible=True)
    taken = offer(3, price="15.20", gpus=8, capacity=0)

    result = rank_offers(Demand(gpu_count=8), [whole_machine, last_four_gpus, taken], now=NOW, max_age=HOUR)

    assert [r.offer.offer_id for r in result.ranked] == [1]
    assert result.rejected == {"capacity": 2}


# --- Per-GPU listings: priced by the GPUs asked for, as ``rank`` prices them (issue 39) ---------------------------

SPECS = specs()


def listing(offer_id: int, *, gpus: int, price: str, divisible: bool = False) -> OfferView:
    """An H100 listing with its datasheet, so ``rank`` can score it too."""
    return offer(
        offer_id, price=price, gpus=gpus, model=g.H100_SXM, spec=SPECS[g.H100_SXM], divisible=divisible,
        gpu_memory_gb=SPECS[g.H100_SXM].memory_gb,
    )  # fmt: skip


def test_a_one_gpu_demand_capped_below_the_machine_gets_one_gpu_of_a_per_gpu_listing_at_its_price():
    # Given an 8-GPU machine sold per GPU at $8.00/h for the whole machine: $1.00 a GPU
    per_gpu = listing(1, gpus=8, price="8.00", divisible=True)
    capped = Demand(gpu_count=1, max_price_per_hour=Decimal("1.50"))

    result = rank_offers(capped, [per_gpu], now=NOW, max_age=HOUR)
    uncapped = rank_offers(Demand(gpu_count=1), [per_gpu], now=NOW, max_age=HOUR)

    # Then the cap admits its one GPU, quoted at $1.00/h, capped or not
    assert result.rejected == {}
    assert [(r.offer.offer_id, r.price_per_hour, r.price_per_gpu_hour) for r in result.ranked] == [
        (1, Decimal("1.000000"), Decimal("1.0000"))
    ]
    assert result.ranked[0].reason == (
        f"cheapest feasible: 1x {g.H100_SXM} on-demand in us-east-1a at $1.0000 per GPU-hour ($1.0000/h) for 1 GPU(s)"
    )
    assert [r.price_per_hour for r in uncapped.ranked] == [Decimal("1.000000")]


def test_a_machine_sold_whole_still_costs_the_whole_machine_to_a_one_gpu_demand():
    whole = listing(1, gpus=8, price="8.00")

    capped = rank_offers(Demand(gpu_count=1, max_price_per_hour=Decimal("1.50")), [whole], now=NOW, max_age=HOUR)
    uncapped = rank_offers(Demand(gpu_count=1), [whole], now=NOW, max_age=HOUR)

    assert capped.ranked == () and capped.rejected == {"price cap": 1}
    assert [(r.price_per_hour, r.price_per_gpu_hour) for r in uncapped.ranked] == [
        (Decimal("8.000000"), Decimal("8.0000"))
    ]


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("cap_per_gpu", [None, "1.00", "1.30", "3.40"])
def test_rank_offers_and_rank_agree_on_what_each_listing_costs(gpus: int, cap_per_gpu: str | None):
    offers = [
        listing(1, gpus=8, price="8.00", divisible=True),  # $1.00 a GPU
        listing(2, gpus=8, price="10.00", divisible=True),  # $1.25 a GPU
        listing(3, gpus=8, price="7.00"),  # sold whole
        listing(4, gpus=2, price="3.00"),
        listing(5, gpus=1, price="1.40"),
        listing(6, gpus=3, price="10.00", divisible=True),  # $3.33... a GPU: rounding
    ]
    cap = None if cap_per_gpu is None else Decimal(cap_per_gpu) * gpus
    demand = Demand(gpu_count=gpus, max_price_per_hour=cap)

    first_cut = rank_offers(demand, offers, now=NOW, max_age=HOUR)
    scored = rank(demand, offers, now=NOW, max_age=HOUR)

    quoted = {q.offer.offer_id: q.breakdown.price_per_hour for q in scored.quotes}
    assert {r.offer.offer_id: r.price_per_hour for r in first_cut.ranked} == quoted
    assert 1 in quoted  # the $1.00 GPUs fit every cap: each case compares something
