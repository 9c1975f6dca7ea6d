"""bench/fleets.py (issue 38): its load stream is fixed by its seed, its fleets keep to the book's capacity, and its
quick run, on offers synced from the sandboxes, prints figures that add up: fixed fleets of the stated size, GPU-hours
and dollars from the replicas held, under-served minutes from the load, and the ratios and goal from those."""

from __future__ import annotations

import datetime as dt
import io
import math
import re
from decimal import Decimal

import pytest

from bench import fleets as bf
from bench.market import specs
from marketplace.catalog.selectors import offer_book
from marketplace.fleets.policy import Action, RuleKind, ScalingRule
from marketplace.matching import OfferBook, OfferView
from providers import gpu_names as g

NOW = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _host_book(gpus: int) -> OfferBook:
    """One independent T4 machine of ``gpus`` GPUs, sold one GPU at a time from one pool."""
    return OfferBook.from_views(
        [
            OfferView(
                offer_id=1, account_id=1, provider_kind="community", region="us-tx", zone="host",
                pricing_model="on_demand", instance_type="community-1xT4", gpu_model=g.T4, gpu_count=1,
                gpu_memory_gb=16,
                price_usd_per_hour=Decimal("0.25"), observed_at=NOW, capacity=gpus, spec=specs()[g.T4],
                jurisdiction="US", reliability=0.95, capacity_pool="machine:1:host", pool_capacity=gpus,
            )
        ]
    )  # fmt: skip


def test_the_load_is_the_same_stream_for_a_seed_and_a_window_is_its_days_minutes():
    day = bf.load_curve(seed=38)
    assert len(day) == 1440
    assert bf.load_curve(seed=38) == day
    assert bf.load_curve(seed=39) != day
    assert bf.load_curve(seed=38, start=600, minutes=360) == day[600:960]
    # The diurnal shape: the night is quieter than the afternoon, whatever the bursts.
    assert sum(day[180:300]) < sum(day[900:1020])
    assert min(day) > 0


def test_an_autoscaled_fleet_never_holds_more_than_the_machine_has_and_counts_what_it_could_not_get():
    # Given a book of one 3-GPU machine and a load that needs 5 replicas at the target
    load = [200.0] * 30
    rule = ScalingRule(kind=RuleKind.UTILIZATION, target=bf.TARGET_UTILIZATION)

    fleet = bf.run_autoscaled(load, bf.Market(_host_book(3), now=NOW), start=0, rule=rule, maximum=10)

    assert len(fleet.replicas) == 3
    assert all(r.ended is None and r.kind == "community" and r.gpus == 1 for r in fleet.replicas)
    assert fleet.unplaced > 0
    assert fleet.under_served_minutes == 30  # 3 x 40 req/s never serves 200
    assert sum(fleet.decisions.values()) == 30
    assert fleet.dollars(30) == Decimal("0.38")  # 3 x 0.25 USD/h x 0.5 h


def test_a_scale_in_gives_the_capacity_back_for_the_next_scale_out():
    # Given a book of one 4-GPU machine and a load that falls then climbs
    load = [150.0] * 20 + [20.0] * 40 + [150.0] * 40
    rule = ScalingRule(kind=RuleKind.UTILIZATION, target=bf.TARGET_UTILIZATION)

    fleet = bf.run_autoscaled(load, bf.Market(_host_book(4), now=NOW), start=0, rule=rule, maximum=4)

    assert fleet.decisions[Action.SCALE_IN] >= 1 and fleet.decisions[Action.SCALE_OUT] >= 1
    for minute in range(len(load)):
        held = [r for r in fleet.replicas if r.ordered <= minute and (r.ended is None or r.ended > minute)]
        assert len(held) <= 4, minute
    assert fleet.unplaced == 0
    # The stopped replicas' GPUs were taken again: more replicas ordered than the machine holds at once.
    assert len(fleet.replicas) > 4


def _row(text: str, label: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if line.startswith(label)]
    return line[len(label) :].split()


@pytest.mark.django_db
def test_the_quick_run_on_synced_offers_prints_figures_that_add_up():
    running, now = bf.sync_world()
    try:
        day = bf.simulate(offer_book(now=now), now=now, quick=True)
    finally:
        bf.stop_world(running)
    out = io.StringIO()
    met = bf.report(day, out)
    text = out.getvalue()
    hours = bf.QUICK_MINUTES / 60

    # The stream and the sizes
    assert text.startswith(f"seed {bf.SEED}; {bf.QUICK_MINUTES} one-minute steps from 10:00 UTC;")
    assert len(day.load) == bf.QUICK_MINUTES
    peak, mean = max(day.load), sum(day.load) / len(day.load)
    assert day.sizes == {"fixed-peak": math.ceil(peak / 40), "fixed-mean": math.ceil(mean / 40)}
    assert set(day.kinds) >= {"aws", "azure", "gcp", "kubernetes", "community"}
    assert _row(text, " " * 34) == list(bf.FLEETS)

    # Fixed fleets: their replicas, all day, each one T4
    for name, size in day.sizes.items():
        fleet = day.fleets[name]
        assert len(fleet.replicas) == size == fleet.peak_replicas
        assert all(r.gpus == 1 and r.ordered == 0 and r.ended is None for r in fleet.replicas)
    gpu_hours = _row(text, "GPU-hours bought")
    assert float(gpu_hours[1]) == pytest.approx(day.sizes["fixed-peak"] * hours * 1, abs=0.05)
    assert float(gpu_hours[2]) == pytest.approx(day.sizes["fixed-mean"] * hours * 1, abs=0.05)

    # Dollars are the replicas' prices over the minutes held; under-served minutes are the load's
    end = len(day.load)
    for column, name in enumerate(bf.FLEETS):
        fleet = day.fleets[name]
        dollars = sum(r.price * Decimal(r.held(end)) / 60 for r in fleet.replicas)
        assert Decimal(_row(text, "dollars (USD)")[column]) == dollars.quantize(Decimal("0.01"))
        assert _row(text, "under-served minutes")[column] == str(fleet.under_served_minutes)
        mix = re.search(rf"^mix of {name} \(replica-hours by provider kind\): (.*)$", text, re.M)
        assert mix is not None
        shares = [float(part.rsplit(" ", 1)[1]) for part in mix.group(1).split(", ")]
        assert sum(shares) == pytest.approx(fleet.gpu_hours(end), abs=0.05 * len(shares))
    for name in ("fixed-peak", "fixed-mean"):
        size = day.sizes[name]
        assert day.fleets[name].under_served_minutes == sum(1 for v in day.load if v > size * 40)
    assert day.fleets["fixed-peak"].under_served_minutes == 0

    # The autoscaled fleet decided every minute and kept to every pooled offer's capacity
    auto = day.fleets["autoscaled"]
    assert sum(auto.decisions.values()) == end
    assert auto.peak_replicas >= 1
    book = offer_book(now=now)
    for minute in range(0, end, 5):
        held: dict[str, int] = {}
        for r in auto.replicas:
            if r.ordered <= minute and (r.ended is None or r.ended > minute):
                pool = book.views[r.offer].capacity_pool
                if pool is not None:
                    held[pool] = held.get(pool, 0) + r.gpus
        pools = {v.capacity_pool: v.pool_capacity for v in book.views if v.capacity_pool is not None}
        assert all(held[pool] <= pools[pool] for pool in held), minute

    # The ratios and the goal are read from those figures
    ratio = re.search(r"^autoscaled / fixed-peak: dollars ([0-9.]+), GPU-hours ([0-9.]+),", text, re.M)
    assert ratio is not None
    assert float(ratio.group(1)) == pytest.approx(
        float(auto.dollars(end) / day.fleets["fixed-peak"].dollars(end)), abs=0.005
    )
    goal = [line for line in text.splitlines() if line.startswith("goal (")]
    assert len(goal) == 1 and (": met: " in goal[0]) == met and (": not met: " in goal[0]) == (not met)
    cheaper = auto.dollars(end) < day.fleets["fixed-peak"].dollars(end)
    served = 0 < day.fleets["fixed-mean"].under_served_minutes and (
        auto.under_served_minutes <= 0.2 * day.fleets["fixed-mean"].under_served_minutes
    )
    assert met == (cheaper and served)
