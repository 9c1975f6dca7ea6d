"""Capacity pools: an independent machine sold once per lease size is one stock of free GPUs, in a batch
(``assign`` over every solver path) and for one demand (``rank``, ``rank_offers``)."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from decimal import Decimal

import numpy as np
import pytest

from bench import host_market as hm
from marketplace.matching import Demand, OfferBook, OfferView, assign, rank, rank_offers
from marketplace.matching.assignment import build_problem
from marketplace.matching.assignment_problem import Problem, greedy
from marketplace.matching.optimize import _make_room, exact, solve
from providers import gpu_names as g
from providers.community.adapter import MachineListing, lease_instance_type
from tests.marketplace.test_ranking import NOW, SPECS, offer

CAPACITY_LEFT_OVER = "its feasible offers' capacity went to demands of the batch that gain more"


def machine_offers(
    first_id: int,
    name: str,
    *,
    gpus: int,
    min_gpus: int,
    free: int,
    per_gpu: str,
    model: str = g.L40S,
    pooled: bool = True,
) -> list[OfferView]:
    """A machine's offers as the catalogue holds them: one per lease size (the adapter's sizes), each with
    the leases of its size that fit in the ``free`` GPUs (what the reservations keep), sharing one pool."""
    listing = MachineListing(
        name=name, url="", key_id="", secret="", region="eu-de", country="DE", gpu_model=model, gpu_count=gpus,
        gpu_memory_gb=SPECS[model].memory_gb, vcpus=16 * gpus, memory_gib=64 * gpus,
        price_per_gpu_hour=Decimal(per_gpu), min_bid_per_gpu_hour=None, availability=[], min_gpus_per_lease=min_gpus,
    )  # fmt: skip
    pool = {"capacity_pool": f"machine:7:{name}", "pool_capacity": free} if pooled else {}
    return [
        offer(
            first_id + i,
            model,
            size,
            str(Decimal(per_gpu) * size),
            account_id=7,
            provider_kind="community",
            region="eu-de",
            zone=name,
            instance_type=lease_instance_type(size, model),
            jurisdiction="EU",
            capacity=min(gpus // size, free // size),
            **pool,
        )
        for i, size in enumerate(listing.lease_sizes())
    ]


def gpus_per_machine(result: object) -> Counter[str]:
    """GPUs the assignment plans on each independent machine (its zone)."""
    planned: Counter[str] = Counter()
    for placed in result.demands:  # type: ignore[attr-defined]
        if placed.quote is not None and placed.quote.offer.provider_kind == "community":
            planned[placed.quote.offer.zone] += placed.quote.offer.gpu_count
    return planned


def _batch() -> list[Demand]:
    singles = [Demand(demand_id=f"one{i}", gpu_count=1, gpu_models=frozenset({g.L40S})) for i in range(4)]
    pairs = [Demand(demand_id=f"two{i}", gpu_count=2, gpu_models=frozenset({g.L40S})) for i in range(2)]
    # The long job gains most from the cheap machine, so the optimum is unique: it takes the whole of it.
    whole = Demand(demand_id="four", gpu_count=4, gpu_models=frozenset({g.L40S}), duration_hours=10)
    return [*singles, *pairs, whole]


# A cloud sells L40S at three times the machine's price per GPU-hour, without limit, in ones and twos.
CLOUD = [offer(101, g.L40S, 1, "3.00"), offer(102, g.L40S, 2, "6.00")]


@pytest.mark.parametrize("method", ["auto", "exact"])
def test_a_batch_plans_no_more_gpus_on_a_machine_than_it_has_free(method: str) -> None:
    # Given a 4 x L40S machine rented from one GPU (offers of 1, 2 and 4 GPUs), all free
    machine = machine_offers(1, "host-a", gpus=4, min_gpus=1, free=4, per_gpu="1.00")
    assert [(o.gpu_count, o.capacity) for o in machine] == [(1, 4), (2, 2), (4, 1)]

    # When seven demands for 12 GPUs are assigned jointly
    result = assign(_batch(), [*machine, *CLOUD], now=NOW, time_limit=5, method=method)

    # Then the machine carries its four GPUs (the long job), and the rest go to the dearer cloud
    chosen = {a.demand.demand_id: a.quote.offer.offer_id for a in result.demands if a.quote}
    assert chosen == {"one0": 101, "one1": 101, "one2": 101, "one3": 101, "two0": 102, "two1": 102, "four": 3}
    assert gpus_per_machine(result) == {"host-a": 4}
    assert result.optimal


def test_without_pools_each_lease_size_is_its_own_stock_as_before() -> None:
    # The same offers without a pool keep the per-offer rows: 4 x 1 + 2 x 2 + 1 x 4 GPUs of a 4-GPU machine.
    machine = machine_offers(1, "host-a", gpus=4, min_gpus=1, free=4, per_gpu="1.00", pooled=False)
    result = assign(_batch(), [*machine, *CLOUD], now=NOW, time_limit=5)
    assert gpus_per_machine(result) == {"host-a": 12}


def test_a_partly_held_machine_places_what_its_free_gpus_hold_and_says_why_the_rest_waits() -> None:
    # Given one GPU of the machine held by a running lease: 3 free, so no 4-GPU lease and one pair
    machine = machine_offers(1, "host-a", gpus=4, min_gpus=1, free=3, per_gpu="1.00")
    assert [(o.gpu_count, o.capacity) for o in machine] == [(1, 3), (2, 1), (4, 0)]
    singles = [Demand(demand_id=f"one{i}", gpu_count=1) for i in range(3)]
    pair = Demand(demand_id="pair", gpu_count=2, duration_hours=5)

    result = assign([*singles, pair], machine, now=NOW, time_limit=5)

    # Then the pair and one single fill the three GPUs; two singles are left out, with the reason
    placed = {a.demand.demand_id: a.quote.offer.gpu_count for a in result.demands if a.quote}
    assert sorted(placed.values()) == [1, 2] and placed["pair"] == 2
    assert gpus_per_machine(result) == {"host-a": 3}
    assert [a.reason for a in result.demands if a.quote is None] == [CAPACITY_LEFT_OVER] * 2


def test_an_on_demand_and_an_interruptible_listing_of_one_machine_share_its_gpus() -> None:
    # Given one 4-GPU machine sold per GPU (divisible) on demand and as spot: two listings, one stock
    pool = {"capacity_pool": "machine:7:host-b", "pool_capacity": 4, "capacity": 4, "divisible": True}
    on_demand = offer(1, g.A100_80_SXM, 4, "8.00", zone="host-b", provider_kind="community", **pool)
    spot = offer(2, g.A100_80_SXM, 4, "4.00", zone="host-b", provider_kind="community", pricing_model="spot", **pool)
    demands = [Demand(demand_id=f"d{i}", gpu_count=2) for i in range(3)]

    result = assign(demands, [on_demand, spot], now=NOW, time_limit=5)

    # Then two pairs fit its four GPUs, whichever listing each takes; the third waits
    taken = [a.quote.units for a in result.demands if a.quote]
    assert taken == [2.0, 2.0]
    assert sum(1 for a in result.demands if a.quote is None) == 1


def _market(seed: int) -> tuple[list[OfferView], list[Demand], dict[str, int]]:
    """Twelve machines of 2, 4 or 8 GPUs, rented from one or two, partly held, and a dear unlimited cloud;
    forty demands of 1, 2 or 4 GPUs for 1 to 20 hours. Also each pool's free GPUs."""
    rng = random.Random(seed)
    offers: list[OfferView] = []
    free: dict[str, int] = {}
    for m in range(12):
        gpus = rng.choice([2, 4, 8])
        name = f"host{m}"
        free[name] = rng.randint(0, gpus)
        offers += machine_offers(
            len(offers) + 1,
            name,
            gpus=gpus,
            min_gpus=rng.choice([1, 2]),
            free=free[name],
            per_gpu=f"{rng.uniform(0.6, 1.2):.2f}",
        )
    offers += [offer(1000 + k, g.L40S, k, str(Decimal("2.5") * k)) for k in (1, 2, 4)]
    demands = [
        Demand(demand_id=f"d{i}", gpu_count=rng.choice([1, 1, 2, 4]), duration_hours=rng.uniform(1, 20))
        for i in range(40)
    ]
    return offers, demands, free


@pytest.mark.parametrize("seed", range(4))
def test_every_solver_path_keeps_each_machine_within_its_free_gpus(seed: int) -> None:
    offers, demands, free = _market(seed)
    book = OfferBook.from_views(offers)
    problem, _ = build_problem(demands, book, now=NOW)
    reference = exact(problem, time_limit=60)
    assert reference.optimal
    ours = solve(problem, time_limit=10)
    for choice in (greedy(problem), ours.choice, reference.choice):
        assert problem.fits(choice)
        # Counted from the chosen offers themselves, not from the problem's rows.
        planned: Counter[str] = Counter()
        for j in choice[choice >= 0]:
            view = book.views[int(problem.label[j])]
            if view.capacity_pool is not None:
                planned[view.zone] += view.gpu_count
        assert all(planned[name] <= free[name] for name in planned), (planned, free)
    # The LP bound and the repair paths hold on GPU-weighted rows as on instance rows.
    assert ours.lower_bound <= reference.objective + 1e-6
    assert ours.objective <= reference.objective * 1.01


def test_rank_refuses_an_offer_whose_machine_has_too_few_gpus_free() -> None:
    # Given a pair lease whose own count says one is left, but only one GPU of its machine is free
    pair = offer(1, g.L40S, 2, "2.00", capacity=1, capacity_pool="machine:7:host-a", pool_capacity=1)
    single = offer(2, g.L40S, 1, "1.00", capacity=1, capacity_pool="machine:7:host-a", pool_capacity=1)

    two = rank(Demand(gpu_count=2), [pair, single], now=NOW)
    first_cut = rank_offers(Demand(gpu_count=2), [pair], now=NOW, max_age=dt.timedelta(hours=1))

    # Then the pair is refused for capacity, with what to do about it; one GPU still sells
    assert two.quotes == () and two.rejected == {"size": 1, "capacity": 1}
    assert [m.relax for m in two.near_misses if m.offer.offer_id == 1] == [
        "ask for fewer GPUs or wait: 1 GPU(s) free on its machine"
    ]
    assert first_cut.ranked == () and first_cut.rejected == {"capacity": 1}
    assert [q.offer.offer_id for q in rank(Demand(gpu_count=1), [pair, single], now=NOW).quotes] == [2]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"capacity_pool": "machine:7:host-a"}, "offer 2: capacity_pool and pool_capacity are set together"),
        ({"pool_capacity": 4}, "offer 2: capacity_pool and pool_capacity are set together"),
        (
            {"capacity_pool": "machine:7:host-a", "pool_capacity": 3},
            "offer 2: capacity pool 'machine:7:host-a' has 3 GPUs free, but offer 1 says 4",
        ),
        ({"capacity_pool": "machine:7:host-a", "pool_capacity": -1}, "offer 2: pool_capacity must be at least 0"),
    ],
)
def test_a_pool_stated_half_or_two_ways_is_refused_naming_the_offer(fields: dict[str, object], message: str) -> None:
    first = offer(1, g.L40S, 1, "1.00", capacity=4, capacity_pool="machine:7:host-a", pool_capacity=4)
    second = offer(2, g.L40S, 2, "2.00", capacity=2, **fields)
    with pytest.raises(ValueError, match=message):
        OfferBook.from_views([first, second])


def test_a_book_without_pools_has_no_pool_rows() -> None:
    book = OfferBook.from_views([offer(1, g.L40S, 1, "1.00", capacity=2), offer(2, g.L40S, 2, "2.00")])
    assert book.n_pools == 0
    assert np.array_equal(book.columns["pool"], [-1, -1])
    problem, _ = build_problem([Demand(gpu_count=1)], book, now=NOW)
    assert problem.capacity.tolist() == [2.0]


def test_a_busy_day_on_two_hundred_machines_is_packed_within_one_percent_of_the_bound() -> None:
    # Given the bench's 200 machines (1 to 8 GPUs, sold per lease size), all free, and its first 600 demands
    machines = hm.hosts(200, seed=1)
    book, _, _ = hm._book(machines, "lease-sizes")
    demands = [hm.demand_of(a, "budget") for a in hm.arrivals(100, 1440, seed=2)[:600]]

    # When they are assigned as one batch in two seconds
    result = assign(demands, book, now=hm.NOW, time_limit=2)

    # Then no machine carries more GPUs than it has, and the answer is certified within 1 % of optimal:
    # pools make rows of several GPUs, which rounding the LP one demand at a time packs badly (about 10 %
    # over the bound for the greedy answer alone)
    gpus = {h.listing.name: h.gpus for h in machines}
    planned = gpus_per_machine(result)
    assert all(planned[name] <= gpus[name] for name in planned)
    assert sum(planned.values()) <= sum(gpus.values())
    assert result.gap <= 0.01, (result.method, result.gap)


def test_making_room_moves_two_pairs_elsewhere_for_a_job_that_needs_the_whole_machine() -> None:
    # Given a 4-GPU pool (row 0) held by two pairs that could run elsewhere for a little more, and a 4-GPU
    # job whose only place is that pool, left out at a penalty of 50
    problem = Problem.build(
        demand=[0, 1, 1, 2, 2],
        row=[0, 0, -1, 0, -1],
        units=[4, 2, 2, 2, 2],
        cost=[10.0, 3.0, 4.0, 3.0, 4.0],
        capacity=[4],
        unplaced=[50.0, 20.0, 20.0],
    )
    stuck = np.array([-1, 1, 3])
    assert problem.objective(stuck) == 56.0
    # No single move into free room helps: the pool is full.
    assert problem.objective(greedy(problem, order=[1, 2, 0])) == 56.0

    moved = _make_room(problem, stuck, deadline=float("inf"))

    # Then the job takes the pool and the pairs pay 1 more each elsewhere: 10 + 4 + 4
    assert problem.fits(moved)
    assert moved.tolist() == [0, 2, 4]
    assert problem.objective(moved) == 18.0
