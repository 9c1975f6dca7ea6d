"""The host scheduler (marketplace/matching/host_scheduler.py): preemption, a bounded queue with EASY backfill,
best fit, price falls and moves of checkpointed jobs, each on a market small enough to follow by hand."""

from __future__ import annotations

import dataclasses
import random
from decimal import Decimal

import pytest

from marketplace.matching import host_scheduler as hs
from providers.community.pricing import PriceFallRule

ON_DEMAND, INTERRUPTIBLE = hs.LeaseKind.ON_DEMAND, hs.LeaseKind.INTERRUPTIBLE
CAP = Decimal("10")


def job(job_id: str, gpus: int, minutes: int = 60, *, kind: hs.LeaseKind = ON_DEMAND, **terms: object) -> hs.Job:
    fields: dict[str, object] = {"cap_per_gpu_hour": CAP, "submitted": 0, **terms}
    return hs.Job(job_id=job_id, gpus=gpus, minutes=minutes, kind=kind, **fields)  # type: ignore[arg-type]


def host(host_id: int, gpus: int = 8, *, running: tuple[hs.Running, ...] = (), **terms: object) -> hs.HostView:
    fields: dict[str, object] = {
        "gpu_model": "H100-SXM5",
        "gpu_memory_gb": 80,
        "min_gpus_per_lease": 1,
        "list_price": Decimal("2.00"),
        "min_bid": Decimal("1.00"),
        "idle_since": None if running else 0,
        **terms,
    }
    return hs.HostView(host_id=host_id, gpus=gpus, running=running, **fields)  # type: ignore[arg-type]


def lease(j: hs.Job, gpus: tuple[int, ...], *, started: int = 0, price: str = "2.00") -> hs.Running:
    return hs.Running(job=j, gpu_indexes=gpus, started=started, price_per_gpu_hour=Decimal(price))


def test_an_on_demand_job_preempts_the_lowest_bid_and_the_bid_comes_back_with_its_work() -> None:
    low = lease(job("low", 2, 100, kind=INTERRUPTIBLE), (0, 1), price="1.00")
    high = lease(job("high", 2, 100, kind=INTERRUPTIBLE), (2, 3), price="1.50")
    market = [host(1, 4, running=(low, high))]

    decision = hs.schedule(now=40, hosts=market, arrivals=[job("od", 2, submitted=40)])

    assert [(p.lease.job.job_id, p.host_id) for p in decision.preemptions] == [("low", 1)]
    # Not checkpointed: all its work is left, and with no wait and no room it is refused.
    assert decision.preemptions[0].resumed == dataclasses.replace(low.job, submitted=40)
    assert [(p.job.job_id, p.gpu_indexes, p.price_per_gpu_hour) for p in decision.placements] == [
        ("od", (0, 1), Decimal("2.00"))
    ]
    assert [(r.job.job_id, r.reason) for r in decision.refused] == [("low", "no host could take it on arrival")]
    assert decision.queued == () and decision.moves == ()


def test_a_checkpointed_bid_keeps_its_work_up_to_the_last_checkpoint() -> None:
    bid = lease(job("bid", 4, 100, kind=INTERRUPTIBLE, checkpointed=True, max_wait=60), (0, 1, 2, 3), price="1.00")
    settings = hs.SchedulerSettings(checkpoint_every=30, restart_minutes=5)

    decision = hs.schedule(
        now=70, hosts=[host(1, 4, running=(bid,))], arrivals=[job("od", 4, submitted=70)], settings=settings
    )

    resumed = decision.preemptions[0].resumed
    assert (resumed.minutes, resumed.restart_minutes, resumed.wait_until) == (40, 5, 130)  # 60 of 70 saved
    assert [j.job_id for j in decision.queued] == ["bid"]


def test_a_queued_large_job_gets_a_whole_machine_within_its_wait() -> None:
    small = lease(job("small", 2, 60), (0, 1))
    big = job("big", 8, 120, max_wait=90)

    first = hs.schedule(now=0, hosts=[host(1, running=(small,))], arrivals=[big])

    assert first.placements == () and first.queued == (big,)
    assert first.reservation == hs.Reservation(job_id="big", host_id=1, start=60, gpus=8)

    then = hs.schedule(now=60, hosts=[host(1, idle_since=60)], queue=first.queued)

    assert [(p.job.job_id, p.host_id, p.gpu_indexes) for p in then.placements] == [("big", 1, tuple(range(8)))]


def test_backfill_never_delays_the_reservation_and_bids_fill_the_gap() -> None:
    running = lease(job("running", 4, 60), (0, 1, 2, 3))
    head = job("head", 8, 60, max_wait=120)
    long_job = job("long", 2, 120, submitted=5, max_wait=200)
    short_job = job("short", 2, 30, submitted=5)
    bid = job("bid", 2, 300, kind=INTERRUPTIBLE, submitted=5)

    decision = hs.schedule(
        now=5, hosts=[host(1, running=(running,))], queue=[head], arrivals=[long_job, short_job, bid]
    )

    assert decision.reservation == hs.Reservation(job_id="head", host_id=1, start=60, gpus=8)
    # The short job ends at 35, before the reservation; the long one would hold 2 GPUs past it, so it waits;
    # the bid runs on the last 2 GPUs, since preempting it at 60 delays nothing.
    assert [(p.job.job_id, p.gpu_indexes) for p in decision.placements] == [("short", (4, 5)), ("bid", (6, 7))]
    assert [j.job_id for j in decision.queued] == ["head", "long"]

    # At 60 the head takes the machine, stopping the bid.
    bid_lease = lease(bid, (6, 7), started=5, price="1.00")
    at_start = hs.schedule(now=60, hosts=[host(1, running=(bid_lease,))], queue=decision.queued)
    assert [(p.job.job_id, p.gpu_indexes) for p in at_start.placements] == [("head", tuple(range(8)))]
    assert [p.lease.job.job_id for p in at_start.preemptions] == ["bid"]
    assert [j.job_id for j in at_start.queued] == ["long"]
    assert [r.job.job_id for r in at_start.refused] == ["bid"]


@pytest.mark.parametrize("seed", range(30))
def test_on_random_markets_what_starts_now_never_pushes_the_reservation_later(seed: int) -> None:
    rng = random.Random(seed)
    hosts, queue, arrivals = [], [], []
    for h in range(4):
        gpus = rng.choice((4, 8))
        used, running = 0, []
        while used < gpus and rng.random() < 0.7:
            size = rng.randint(1, gpus - used)
            kind = rng.choice((ON_DEMAND, INTERRUPTIBLE))
            j = job(f"r{h}-{used}", size, rng.randint(10, 200), kind=kind)
            running.append(lease(j, tuple(range(used, used + size)), price="1.00"))
            used += size
        hosts.append(host(h, gpus, running=tuple(running)))
    queue = [job(f"q{i}", rng.choice((4, 8)), rng.randint(10, 200), max_wait=300) for i in range(2)]
    arrivals = [
        job(f"a{i}", rng.randint(1, 4), rng.randint(10, 300), kind=rng.choice((ON_DEMAND, INTERRUPTIBLE)), max_wait=50)
        for i in range(6)
    ]

    decision = hs.schedule(now=0, hosts=hosts, queue=queue, arrivals=arrivals)
    if decision.reservation is None:
        return
    # The market as the decision leaves it, asked again: the head's earliest start is no later.
    after = []
    for view in hosts:
        stopped = {p.lease.job.job_id for p in decision.preemptions if p.host_id == view.host_id}
        kept = tuple(r for r in view.running if r.job.job_id not in stopped)
        started = tuple(
            lease(p.job, p.gpu_indexes, price=str(p.price_per_gpu_hour))
            for p in decision.placements
            if p.host_id == view.host_id
        )
        after.append(dataclasses.replace(view, running=kept + started))
    head = next(j for j in decision.queued if j.job_id == decision.reservation.job_id)
    again = hs.schedule(now=0, hosts=after, queue=[head], arrivals=[], settings=hs.SchedulerSettings(move=False))
    if again.reservation is not None:
        assert again.reservation.start <= decision.reservation.start
    else:
        assert head.job_id in {p.job.job_id for p in again.placements}


def test_a_checkpointed_move_frees_a_whole_machine() -> None:
    movable = lease(job("ckpt", 2, 100, checkpointed=True), (0, 1))
    stuck = lease(job("stuck", 6, 100), tuple(range(6)))
    hosts = [host(1, running=(movable,)), host(2, running=(stuck,))]

    decision = hs.schedule(now=10, hosts=hosts, arrivals=[job("whole", 8, submitted=10)])

    (move,) = decision.moves
    assert (move.lease, move.from_host, move.to.host_id, move.to.gpu_indexes) == (movable, 1, 2, (6, 7))
    # Checkpointed on purpose before the move: only the relaunch is lost.
    assert (move.to.job.minutes, move.to.job.restart_minutes) == (90, 5)
    assert [(p.job.job_id, p.host_id, p.gpu_indexes) for p in decision.placements] == [("whole", 1, tuple(range(8)))]


def test_without_a_checkpoint_nothing_moves_and_the_job_is_refused() -> None:
    running = lease(job("plain", 2, 100), (0, 1))
    hosts = [host(1, running=(running,)), host(2, running=(lease(job("stuck", 6, 100), tuple(range(6))),))]

    decision = hs.schedule(now=10, hosts=hosts, arrivals=[job("whole", 8, submitted=10)])

    assert decision.moves == () and decision.placements == ()
    assert [r.job.job_id for r in decision.refused] == ["whole"]


def test_the_wait_bound_is_respected_then_the_job_is_refused() -> None:
    full = lease(job("full", 8, 500), tuple(range(8)))
    waiting = job("waits", 4, 60, max_wait=30)

    at_10 = hs.schedule(now=10, hosts=[host(1, running=(full,))], arrivals=[waiting])
    assert at_10.queued == (waiting,) and at_10.refused == ()

    at_bound = hs.schedule(now=30, hosts=[host(1, running=(full,))], queue=at_10.queued)
    assert [(r.job.job_id, r.reason) for r in at_bound.refused] == [
        ("waits", "no host could take it within its wait of 30 min")
    ]

    # Called late, with a machine free: the bound has passed, so it is refused, not placed.
    late = hs.schedule(now=31, hosts=[host(1)], queue=[waiting])
    assert late.placements == ()
    assert [(r.job.job_id, r.reason) for r in late.refused] == [("waits", "its wait bound passed at minute 30")]


def test_a_job_placed_at_its_bound_is_placed() -> None:
    waiting = job("waits", 4, 60, max_wait=30)

    decision = hs.schedule(now=30, hosts=[host(1)], queue=[waiting])

    assert [p.job.job_id for p in decision.placements] == ["waits"] and decision.refused == ()


def test_best_fit_keeps_the_whole_machine_whole() -> None:
    fragment = host(1, running=(lease(job("busy", 7, 100), tuple(range(7))),))
    whole = host(2)

    decision = hs.schedule(now=0, hosts=[whole, fragment], arrivals=[job("one", 1)])

    assert [(p.host_id, p.gpu_indexes) for p in decision.placements] == [(1, (7,))]


def test_a_fragment_and_an_idle_machine_sell_at_the_seller_s_fallen_prices() -> None:
    rule = PriceFallRule(
        fragment_discount_pct=Decimal(20), idle_after_hours=1, idle_step_pct=Decimal(10), floor_pct=Decimal(60)
    )
    fragment = host(1, price_rule=rule, running=(lease(job("busy", 6, 500), tuple(range(6))),))
    idle = host(2, price_rule=rule, idle_since=0)

    decision = hs.schedule(
        now=240, hosts=[fragment, idle], arrivals=[job("two", 2, submitted=240), job("eight", 8, submitted=240)]
    )

    prices = {p.job.job_id: (p.host_id, p.price_per_gpu_hour) for p in decision.placements}
    # 20 % off on the fragment; 4 hours idle is 3 past the first: 30 % off.
    assert prices == {"two": (1, Decimal("1.6000")), "eight": (2, Decimal("1.4000"))}


def test_a_budget_or_a_bid_below_the_minimum_finds_no_host() -> None:
    tight = job("tight", 2, cap_per_gpu_hour=Decimal("1.99"))
    low_bid = job("lowbid", 2, kind=INTERRUPTIBLE, bid_per_gpu_hour=Decimal("0.99"))
    no_bid = job("nobid", 2, kind=INTERRUPTIBLE)

    decision = hs.schedule(now=0, hosts=[host(1)], arrivals=[tight, low_bid, no_bid])

    assert {r.job.job_id for r in decision.refused} == {"tight", "lowbid"}
    assert [(p.job.job_id, p.price_per_gpu_hour) for p in decision.placements] == [("nobid", Decimal("1.00"))]


def test_no_interruptible_lease_where_the_fallen_on_demand_price_reaches_the_bid() -> None:
    rule = PriceFallRule(idle_after_hours=0, idle_step_pct=Decimal(10), floor_pct=Decimal(50))
    long_idle = host(1, price_rule=rule, idle_since=0)  # 5 hours idle: 2.00 falls to its floor, 1.00

    decision = hs.schedule(now=300, hosts=[long_idle], arrivals=[job("nobid", 2, kind=INTERRUPTIBLE, submitted=300)])

    assert decision.placements == ()
    assert [r.job.job_id for r in decision.refused] == ["nobid"]


def test_a_host_sold_whole_only_rents_all_its_gpus() -> None:
    decision = hs.schedule(now=0, hosts=[host(1, 4, min_gpus_per_lease=4)], arrivals=[job("one", 1)])

    assert [p.gpu_indexes for p in decision.placements] == [(0, 1, 2, 3)]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: job("j", 0), "job j: gpus must be at least 1, not 0"),
        (lambda: job("j", 1, 0), "job j: minutes must be at least 1, not 0"),
        (lambda: job("j", 1, max_wait=-1), "job j: max_wait and restart_minutes cannot be negative"),
        (lambda: job("j", 1, bid_per_gpu_hour=Decimal(1)), "job j: bid_per_gpu_hour must be positive"),
        (lambda: host(1, 4, min_gpus_per_lease=5), "host 1: min_gpus_per_lease must be 1 to 4"),
        (
            lambda: host(1, 4, running=(lease(job("a", 1), (0,)), lease(job("b", 1), (0,)))),
            "host 1: running leases hold a GPU twice or beyond its 4",
        ),
        (lambda: host(1, 4, running=(lease(job("a", 1), (4,)),)), "host 1: running leases hold a GPU twice"),
        (
            lambda: hs.schedule(now=0, hosts=[host(1)], queue=[job("j", 1)], arrivals=[job("j", 1)]),
            "job ids must be unique",
        ),
        (lambda: hs.schedule(now=0, hosts=[host(1), host(1)]), "host ids must be unique"),
    ],
)
def test_malformed_input_is_refused_naming_what_is_wrong(build: object, message: str) -> None:
    with pytest.raises(hs.SchedulingError, match=message):
        build()  # type: ignore[operator]
