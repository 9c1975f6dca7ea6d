"""Benchmark (issues 19, 39): independent hosts sold whole, per GPU, and scheduled, over a simulated day.

    .venv/bin/python bench/host_market.py [--hosts 200] [--demands-per-hour 100] [--minutes 1440] [--seed 1]
                                          [--sweep 0.5,2,4]

One seeded population of independent machines (1 to 8 GPUs of H100, A100 80 GB, L40S or RTX 4090, each
host with its own per-GPU-hour price and minimum GPUs per lease) and one seeded stream of demands (Poisson
arrivals; each wants k GPUs of a set of models or with a memory floor, for a heavy-tailed duration, under a
price cap per GPU-hour). Every policy sells the SAME hosts to the SAME stream. The first three are online: a
demand is placed when it arrives, or refused (no queue).

Policies:

- ``whole``: a demand rents a whole free machine with at least k GPUs and pays for all of them (how the
  broker sold hosts before per-GPU listings).
- ``lease-sizes``: what the broker sells today (providers/community/adapter.py): a divisible machine is
  offered once per lease size (its minimum, doubling, and the whole machine), a machine listed whole only
  whole; a demand takes the smallest fitting lease it chooses, so a 3-GPU job pays for a 4-GPU lease.
- ``per-gpu``: exactly k GPUs of a divisible machine (k at least its minimum per lease, else the minimum).
- ``scheduled`` (issue 39): per-GPU leases decided at every event (an arrival, a lease's end, a waiting
  demand's bound) by ``marketplace.matching.host_scheduler``: interruptible demands backfill idle GPUs at the
  machine's minimum bid and are preempted for on-demand work; demands that accept a wait queue for it, the
  first with a reservation that backfill never delays (EASY, as Slurm's backfill); best fit keeps machines
  whole; fragments and idle machines sell at the seller's fallen prices (``providers.community.pricing``);
  checkpointed on-demand jobs move to free a machine for a job that needs it. The budget cap rule always.
  ``BREAKDOWN`` runs it again with one part off at a time, to show what each earns.

Placement is the engine's online entry point, ``marketplace.matching.rank``, against an ``OfferBook`` whose
capacity column is the hosts' free GPUs at the arrival minute (the leases of each size that still fit, as
the reservations set them), and whose offers of one host share a capacity pool of its free GPUs, as the
catalogue builds them (marketplace/catalog/selectors.py). Packing is a tie-break on top: among the quotes
within ``--pack-tolerance`` of the best cost of useful work, the one leaving its host the fewest free GPUs
(best fit), so that whole machines stay free for the big jobs. Demands carry no profile, so the engine
scores dense FP16 per dollar with the host's reliability folded in, and the wasted cost of idle GPUs in a
bigger lease. The engine has an online entry point, so no batch window is used (``assign`` per window would
be the batch variant).
Every figure is clipped to the simulated day; the market starts empty at minute 0.

Utilization is useful GPU-hours (the GPUs a demand asked for, working) over GPU-hours offered; "sold" also
counts the idle GPUs a buyer pays for. Cost is what buyers pay at the hosts' prices. The ratios compare the
per-GPU policies to ``whole`` in this run, beside the seed's claim for "AI dynamic scheduling" (-20 % cost,
+30 % utilization). Cost per useful GPU-hour is over the demands each policy served, which differ; the cost
of the demands both served (the same useful GPU-hours) is printed beside it.

Honest accounting for ``scheduled``: a lease is paid for every minute it holds its GPUs; its work is useful
only while it ran and was kept. A preempted job without checkpoints loses all the work of that lease (paid,
not useful) and starts over if it is placed again; a checkpointed one keeps its work up to its last checkpoint
(every 30 minutes; a planned move checkpoints first) and pays a 5-minute relaunch that is not useful. A
preempted job not placed again within its wait is counted "preempted, never resumed". Buyers pay the fallen
prices and the bids, locked at placement. Waits (arrival to first start) are reported, mean and p95 of the
demands that waited, so no gain hides as delay; demands still waiting at the end of the day count as refused.

Assumptions of this generator (not sourced facts): the model mix, GPU counts and price ranges of the hosts,
their reliability, their minimum GPUs per lease, and the demand mix (sizes, model sets, caps, durations).
For ``scheduled`` only, drawn per demand from an RNG of their own (``with_terms``) so the draws above stay
those of the seed and every policy sees the same stream: 50 % of demands accept a wait of 30, 60, 120 or
240 minutes; 30 % are interruptible and order without a bid (so pay the machine's minimum bid, as
``marketplace.orders.bids.bid_resolve`` does); 40 % checkpoint. Sellers accept bids from half their list
price and these price falls: fragments 20 % off, and after 2 idle hours 10 % off per further hour, never
below 60 % of the list price. The scheduler's relaunch (5 min) and checkpoint interval (30 min) too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import heapq
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402
from django.apps import apps  # noqa: E402

if not apps.ready:  # the community adapter's module reaches the models; run as a script, set Django up
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    django.setup()

from bench.market import specs  # noqa: E402
from marketplace.matching import Demand, Exclusion, OfferBook, OfferView, Quote, rank  # noqa: E402
from marketplace.matching import host_scheduler as hs  # noqa: E402
from providers import gpu_names as g  # noqa: E402
from providers.community.adapter import MachineListing, lease_instance_type  # noqa: E402
from providers.community.pricing import NO_FALL, PriceFallRule  # noqa: E402

NOW = dt.datetime(2026, 12, 1, 0, 0, tzinfo=dt.UTC)  # minute 0 of the day; prices are observed then
POLICIES = ("whole", "lease-sizes", "per-gpu")  # online: a demand is placed on arrival or refused
SCHEDULED = "scheduled"  # marketplace.matching.host_scheduler at every event
COLUMNS = (*POLICIES, SCHEDULED)
CLAIM_COST, CLAIM_UTILIZATION = 0.80, 1.30  # the seed's "-20 % cost, +30 % utilization"
_CENT = Decimal("0.01")

# Model: (share of hosts, per-GPU-hour price range in USD, GPU counts with their weights).
HOST_MIX: dict[str, tuple[float, tuple[float, float], dict[int, float]]] = {
    g.RTX_4090: (0.35, (0.25, 0.50), {1: 0.35, 2: 0.25, 4: 0.20, 8: 0.20}),
    g.L40S: (0.20, (0.60, 1.00), {1: 0.20, 2: 0.25, 4: 0.35, 8: 0.20}),
    g.A100_80_SXM: (0.25, (0.90, 1.50), {1: 0.20, 2: 0.15, 4: 0.20, 8: 0.45}),
    g.H100_SXM: (0.20, (1.80, 2.60), {1: 0.15, 2: 0.10, 4: 0.15, 8: 0.60}),
}
# What demands accept: (share, models by name or empty, memory floor per GPU in GB).
DEMAND_CLASSES: tuple[tuple[float, frozenset[str], int], ...] = (
    (0.25, frozenset(), 24),
    (0.15, frozenset(), 48),
    (0.20, frozenset(), 80),
    (0.15, frozenset({g.H100_SXM}), 0),
    (0.15, frozenset({g.RTX_4090}), 0),
    (0.10, frozenset({g.L40S, g.RTX_4090}), 0),
)
DEMAND_SIZES = {1: 0.45, 2: 0.20, 3: 0.05, 4: 0.15, 6: 0.03, 8: 0.12}

# The terms only the scheduled policy reads, drawn per demand from an RNG of their own (assumptions, not facts).
TERMS_SEED = 39_000  # added to the stream's seed, so the arrivals' own draws are untouched
WAIT_SHARE, WAIT_BOUNDS = 0.50, (30, 60, 120, 240)  # accepts a wait, and how long (minutes)
INTERRUPTIBLE_SHARE = 0.30  # orders interruptible use without a bid: pays the machine's minimum bid
CHECKPOINTED_SHARE = 0.40  # saves its work every CHECKPOINT_EVERY minutes and can resume elsewhere
# What sellers accept (assumptions): a bid from half the list price, and price falls for fragments and idle hours.
MIN_BID_SHARE = Decimal("0.5")
PRICE_FALLS = PriceFallRule(
    fragment_discount_pct=Decimal(20), idle_after_hours=2, idle_step_pct=Decimal(10), floor_pct=Decimal(60)
)
SETTINGS = hs.SchedulerSettings(pack_tolerance=0.10, restart_minutes=5, checkpoint_every=30)


@dataclass(frozen=True)
class Host:
    """An independent machine as its owner lists it, and how often its launches succeed."""

    index: int
    listing: MachineListing
    reliability: float

    @property
    def gpus(self) -> int:
        return self.listing.gpu_count


@dataclass(frozen=True)
class Arrival:
    """A demand arriving at ``minute`` for ``minutes``; ``cap_per_gpu`` is the buyer's price limit."""

    index: int
    minute: int
    minutes: int
    gpus: int
    models: frozenset[str]
    min_memory_gb: int
    cap_per_gpu: Decimal
    max_wait: int = 0  # minutes it accepts to wait for a start (the scheduled policy only)
    interruptible: bool = False  # at the machine's minimum bid, preemptible (the scheduled policy only)
    checkpointed: bool = False


@dataclass(frozen=True)
class Lease:
    """GPUs held from ``start`` to ``end`` (paid); the demand's work ran from ``work_start`` to ``work_end``
    (None: the whole lease), which is less after a relaunch or a stop that lost work."""

    arrival: int
    host: int
    gpu_indexes: tuple[int, ...]
    start: int
    end: int  # exclusive, may pass the end of the day
    price_per_gpu_hour: Decimal
    work_start: int | None = None
    work_end: int | None = None


@dataclass
class Outcome:
    policy: str
    leases: list[Lease]
    refused: list[int]  # never started
    seconds: float  # placement only: building the capacity column, ranking, the tie-break
    waits: dict[int, int] = dataclasses.field(default_factory=dict)  # minutes to first start, per served demand
    preemptions: int = 0
    moves: int = 0
    abandoned: int = 0  # started, preempted, and not resumed within its wait


def _weighted(rng: random.Random, weights: dict[int, float]) -> int:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def hosts(n: int, *, seed: int) -> list[Host]:
    """``n`` machines: 1-GPU machines are sold whole; of the others 70 % rent from one GPU, 20 % (of four GPUs
    or more) from two, and 10 % are listed whole."""
    rng = random.Random(seed)
    spec = specs()
    models = list(HOST_MIX)
    out = []
    for i in range(n):
        model = rng.choices(models, weights=[HOST_MIX[m][0] for m in models])[0]
        _, (low, high), counts = HOST_MIX[model]
        count = _weighted(rng, counts)
        pick = rng.random()
        minimum = count if count == 1 or pick >= 0.9 else 2 if pick >= 0.7 and count >= 4 else 1
        listing = MachineListing(
            name=f"host{i}",
            url="",
            key_id="",
            secret="",
            region="us-east-1",
            country="US",
            gpu_model=model,
            gpu_count=count,
            gpu_memory_gb=spec[model].memory_gb,
            vcpus=16 * count,
            memory_gib=64 * count,
            price_per_gpu_hour=Decimal(str(rng.uniform(low, high))).quantize(_CENT),
            min_bid_per_gpu_hour=None,
            availability=[],
            min_gpus_per_lease=minimum,
        )
        out.append(Host(index=i, listing=listing, reliability=round(rng.uniform(0.9, 0.99), 3)))
    return out


def arrivals(per_hour: float, minutes: int, *, seed: int) -> list[Arrival]:
    """Poisson arrivals over ``minutes``; durations log-normal (median an hour, a tail of days: a few long
    jobs hold most of the GPU-hours), 5 minutes to 48 hours. The cap per GPU-hour is 0.9 to 1.6 times the
    middle of the cheapest acceptable model's price range."""
    rng = random.Random(seed)
    spec = specs()
    out: list[Arrival] = []
    clock = rng.expovariate(per_hour / 60)
    while clock < minutes:
        _, models, floor = rng.choices(DEMAND_CLASSES, weights=[c[0] for c in DEMAND_CLASSES])[0]
        acceptable = [m for m in HOST_MIX if (not models or m in models) and spec[m].memory_gb >= floor]
        cheapest = min(sum(HOST_MIX[m][1]) / 2 for m in acceptable)
        out.append(
            Arrival(
                index=len(out),
                minute=int(clock),
                minutes=int(min(max(rng.lognormvariate(np.log(60), 1.3), 5), 48 * 60)),
                gpus=_weighted(rng, DEMAND_SIZES),
                models=models,
                min_memory_gb=floor,
                cap_per_gpu=Decimal(str(cheapest * rng.uniform(0.9, 1.6))).quantize(_CENT),
            )
        )
        clock += rng.expovariate(per_hour / 60)
    return with_terms(out, seed=seed)


def with_terms(stream: Sequence[Arrival], *, seed: int) -> list[Arrival]:
    """The stream with each demand's wait, kind and checkpointing drawn from an RNG of their own (the same four
    draws per demand, whatever they decide), so the arrivals, sizes, models, caps and durations stay those of
    the seed."""
    rng = random.Random(seed + TERMS_SEED)
    out = []
    for a in stream:
        waits, bound = rng.random() < WAIT_SHARE, rng.choice(WAIT_BOUNDS)
        interruptible = rng.random() < INTERRUPTIBLE_SHARE
        checkpointed = rng.random() < CHECKPOINTED_SHARE
        out.append(
            dataclasses.replace(
                a, max_wait=bound if waits else 0, interruptible=interruptible, checkpointed=checkpointed
            )
        )
    return out


def lease_sizes(listing: MachineListing, policy: str) -> list[int]:
    """The GPU counts one lease of ``listing`` may take under ``policy``."""
    if policy == "whole" or not listing.divisible:
        return [listing.gpu_count]
    if policy == "lease-sizes":
        return listing.lease_sizes()
    return list(range(listing.min_gpus_per_lease, listing.gpu_count + 1))


def _book(machines: Sequence[Host], policy: str) -> tuple[OfferBook, np.ndarray, np.ndarray]:
    """One offer per host and lease size, priced for its GPUs (as the community adapter quotes them);
    with the host and the size of each offer."""
    spec = specs()
    views: list[OfferView] = []
    host_of: list[int] = []
    size_of: list[int] = []
    for h in machines:
        m = h.listing
        for size in lease_sizes(m, policy):
            views.append(
                OfferView(
                    offer_id=len(views) + 1,
                    account_id=h.index,
                    provider_kind="independent",
                    region=m.region,
                    zone=m.name,
                    instance_type=lease_instance_type(size, m.gpu_model),
                    pricing_model="on_demand",
                    gpu_model=m.gpu_model,
                    gpu_count=size,
                    gpu_memory_gb=m.gpu_memory_gb,
                    price_usd_per_hour=m.price_per_gpu_hour * size,
                    observed_at=NOW,
                    capacity=m.gpu_count // size,
                    spec=spec[m.gpu_model],
                    jurisdiction="US",
                    reliability=h.reliability,
                    capacity_pool=m.name,
                    pool_capacity=m.gpu_count,
                )
            )
            host_of.append(h.index)
            size_of.append(size)
    return OfferBook.from_views(views), np.array(host_of), np.array(size_of)


def demand_of(a: Arrival, cap_rule: str) -> Demand:
    """The engine's demand. With the ``budget`` cap rule the buyer pays at most k x cap an hour for what
    they rent (a 1-GPU buyer will not pay for an 8-GPU machine); with ``per-gpu`` only the host's price per
    GPU is capped (applied as an exclusion by the caller), whatever the lease's size."""
    return Demand(
        demand_id=f"d{a.index}",
        gpu_count=a.gpus,
        gpu_models=a.models,
        min_gpu_memory_gb=a.min_memory_gb,
        max_price_per_hour=a.cap_per_gpu * a.gpus if cap_rule == "budget" else None,
        duration_hours=a.minutes / 60,
    )


def _best_fit(quotes: Sequence[Quote], tolerance: float, position: dict[int, int], leftover: np.ndarray) -> int:
    """The book position of the quote, among those within ``tolerance`` of the best score, that leaves its
    host the fewest free GPUs; the engine's order breaks ties."""
    best = quotes[0].breakdown.score
    close = [position[q.offer.offer_id] for q in quotes if q.breakdown.score <= best * (1 + tolerance)]
    return min(close, key=lambda j: (int(leftover[j]), close.index(j)))


def simulate(
    machines: Sequence[Host],
    stream: Sequence[Arrival],
    policy: str,
    *,
    cap_rule: str = "budget",
    pack_tolerance: float = 0.05,
) -> Outcome:
    """Sell ``machines`` to ``stream`` in arrival order under ``policy``; see the module docstring."""
    book, host_of, size_of = _book(machines, policy)
    per_gpu_price = np.array([float(v.price_usd_per_hour) / v.gpu_count for v in book.views])
    widest = max(h.gpus for h in machines)
    # Minute each GPU is free from; a slot past a machine's GPU count is never free.
    free_from = np.full((len(machines), widest), np.iinfo(np.int64).max, dtype=np.int64)
    for h in machines:
        free_from[h.index, : h.gpus] = 0
    position = {v.offer_id: i for i, v in enumerate(book.views)}
    leases: list[Lease] = []
    refused: list[int] = []
    spent = 0.0
    for a in stream:
        started = time.perf_counter()
        free = free_from <= a.minute
        free_count = free.sum(axis=1)
        now_columns = {"capacity": free_count[host_of] // size_of, "pool_free": free_count[host_of].astype(np.float64)}
        now_book = dataclasses.replace(book, columns={**book.columns, **now_columns})
        exclusion = None
        if cap_rule == "per-gpu":
            over = np.flatnonzero(per_gpu_price > float(a.cap_per_gpu))
            exclusion = Exclusion(offer_ids=frozenset(book.views[i].offer_id for i in over))
        quotes = rank(demand_of(a, cap_rule), now_book, now=NOW, exclusion=exclusion, limit=10).quotes
        if not quotes:
            refused.append(a.index)
            spent += time.perf_counter() - started
            continue
        j = _best_fit(quotes, pack_tolerance, position, free_count[host_of] - size_of)
        host, size = int(host_of[j]), int(size_of[j])
        # The lowest free GPU indexes, as the broker's GPU holds take them.
        taken = tuple(int(i) for i in np.flatnonzero(free[host])[:size])
        free_from[host, list(taken)] = a.minute + a.minutes
        spent += time.perf_counter() - started
        leases.append(
            Lease(
                arrival=a.index,
                host=host,
                gpu_indexes=taken,
                start=a.minute,
                end=a.minute + a.minutes,
                price_per_gpu_hour=machines[host].listing.price_per_gpu_hour,
            )
        )
    return Outcome(policy=policy, leases=leases, refused=refused, seconds=spent)


def host_view(h: Host, *, price_rule: PriceFallRule) -> hs.HostView:
    """A machine as the scheduler sees it at minute 0: empty, idle since the market opened."""
    m = h.listing
    return hs.HostView(
        host_id=h.index,
        gpu_model=m.gpu_model,
        gpu_memory_gb=m.gpu_memory_gb,
        gpus=m.gpu_count,
        min_gpus_per_lease=m.min_gpus_per_lease if m.divisible else m.gpu_count,
        list_price=m.price_per_gpu_hour,
        min_bid=(m.price_per_gpu_hour * MIN_BID_SHARE).quantize(_CENT),
        # A demand without a profile is a bare rental (its hours are fixed, whatever the card): the engine
        # scores it by price x hours with the host's reliability folded in, and so does the scheduler.
        work_rate=h.reliability,
        price_rule=price_rule,
        idle_since=0,
    )


def job_of(a: Arrival, *, bids: bool = True) -> hs.Job:
    interruptible = bids and a.interruptible
    return hs.Job(
        job_id=str(a.index),
        gpus=a.gpus,
        minutes=a.minutes,
        kind=hs.LeaseKind.INTERRUPTIBLE if interruptible else hs.LeaseKind.ON_DEMAND,
        cap_per_gpu_hour=a.cap_per_gpu,
        submitted=a.minute,
        max_wait=a.max_wait,
        models=a.models,
        min_memory_gb=a.min_memory_gb,
        checkpointed=a.checkpointed,
    )


def simulate_scheduled(
    machines: Sequence[Host],
    stream: Sequence[Arrival],
    *,
    minutes: int,
    settings: hs.SchedulerSettings = SETTINGS,
    price_rule: PriceFallRule = PRICE_FALLS,
    bids: bool = True,
    queue: bool = True,
) -> Outcome:
    """The ``scheduled`` policy: per-GPU leases decided by ``marketplace.matching.host_scheduler`` at every
    event (an arrival, a lease's end, a waiting demand's bound) until the end of the day. ``bids``, ``queue``
    and ``price_rule`` switch its parts off for the breakdown (no bids: every demand on demand; no queue: no
    waits)."""
    views = {h.index: host_view(h, price_rule=price_rule) for h in machines}
    by_minute: dict[int, list[Arrival]] = {}
    for a in stream:
        by_minute.setdefault(a.minute, []).append(a if queue else dataclasses.replace(a, max_wait=0))
    arrival_minutes = sorted(by_minute)
    ends: list[tuple[int, int, str]] = []  # (end, host, job id), stale when the lease was stopped first
    deadlines: list[int] = []
    deadline_set: set[int] = set()
    open_lease: dict[str, int] = {}  # job id -> index in leases
    leases: list[Lease] = []
    waits: dict[int, int] = {}
    started: set[int] = set()
    refused: list[int] = []
    waiting: list[hs.Job] = []
    preemptions = moves = abandoned = 0
    spent = 0.0
    next_arrival = 0

    def close(host_id: int, lease: hs.Running, at: int, *, work_kept: int | None) -> None:
        """End ``lease`` at ``at``; ``work_kept``: minutes of its work that count (None: all it ran)."""
        view = views[host_id]
        running = tuple(r for r in view.running if r is not lease)
        views[host_id] = dataclasses.replace(view, running=running, idle_since=None if running else at)
        i = open_lease.pop(lease.job.job_id)
        begin = lease.started + lease.job.restart_minutes
        kept = at - begin if work_kept is None else work_kept
        leases[i] = dataclasses.replace(leases[i], end=at, work_start=begin, work_end=begin + max(0, kept))

    def open_(placement: hs.Placement, at: int) -> None:
        view = views[placement.host_id]
        lease = hs.Running(
            job=placement.job,
            gpu_indexes=placement.gpu_indexes,
            started=at,
            price_per_gpu_hour=placement.price_per_gpu_hour,
        )
        views[placement.host_id] = dataclasses.replace(view, running=(*view.running, lease), idle_since=None)
        arrival = int(placement.job.job_id)
        open_lease[placement.job.job_id] = len(leases)
        leases.append(
            Lease(
                arrival=arrival,
                host=placement.host_id,
                gpu_indexes=placement.gpu_indexes,
                start=at,
                end=lease.ends,
                price_per_gpu_hour=placement.price_per_gpu_hour,
                work_start=at + placement.job.restart_minutes,
                work_end=lease.ends,
            )
        )
        heapq.heappush(ends, (lease.ends, placement.host_id, placement.job.job_id))
        if arrival not in started:
            started.add(arrival)
            waits[arrival] = at - stream[arrival].minute

    while True:
        candidates = [m for m in (ends[0][0] if ends else None, deadlines[0] if deadlines else None) if m is not None]
        if next_arrival < len(arrival_minutes):
            candidates.append(arrival_minutes[next_arrival])
        if not candidates or min(candidates) >= minutes:
            break
        now = min(candidates)
        while deadlines and deadlines[0] <= now:
            deadline_set.discard(heapq.heappop(deadlines))
        while ends and ends[0][0] <= now:
            end, host_id, job_id = heapq.heappop(ends)
            lease = next((r for r in views[host_id].running if r.job.job_id == job_id and r.ends == end), None)
            if lease is not None:
                close(host_id, lease, end, work_kept=None)
        arriving: list[hs.Job] = []
        if next_arrival < len(arrival_minutes) and arrival_minutes[next_arrival] == now:
            arriving = [job_of(a, bids=bids) for a in by_minute[now]]
            next_arrival += 1
        clock = time.perf_counter()
        decision = hs.schedule(now=now, hosts=list(views.values()), queue=waiting, arrivals=arriving, settings=settings)
        spent += time.perf_counter() - clock
        for p in decision.preemptions:
            preemptions += 1
            close(p.host_id, p.lease, now, work_kept=p.lease.work_done(now, checkpoint_every=settings.checkpoint_every))
        for mv in decision.moves:
            moves += 1
            close(mv.from_host, mv.lease, now, work_kept=mv.lease.work_done(now, checkpoint_every=0))
            open_(mv.to, now)
        for placement in decision.placements:
            open_(placement, now)
        for refusal in decision.refused:
            arrival = int(refusal.job.job_id)
            if arrival in started:
                abandoned += 1
            else:
                refused.append(arrival)
        waiting = list(decision.queued)
        for bound in {job.wait_until for job in waiting} - deadline_set:
            deadline_set.add(bound)
            heapq.heappush(deadlines, bound)
    # Demands still waiting at the end of the day were not served within it.
    refused.extend(int(j.job_id) for j in waiting if int(j.job_id) not in started)
    return Outcome(
        policy="scheduled",
        leases=leases,
        refused=sorted(refused),
        seconds=spent,
        waits=waits,
        preemptions=preemptions,
        moves=moves,
        abandoned=abandoned,
    )


@dataclass(frozen=True)
class Figures:
    served: int  # started at least once
    refused: int  # never started
    offered_gpu_hours: float
    sold_gpu_hours: float  # paid for, idle or not
    useful_gpu_hours: float  # the GPUs demands asked for, while their work ran and was kept
    cost: Decimal  # what buyers paid
    list_cost: Decimal  # the same GPU-hours at the hosts' list prices
    waits: tuple[int, ...]  # minutes from arrival to first start, of the demands that waited
    asked_gpu_hours: float  # every demand of the stream run on arrival, clipped to the day: the ceiling

    @property
    def idle_gpu_hours(self) -> float:
        return self.sold_gpu_hours - self.useful_gpu_hours

    @property
    def utilization(self) -> float:
        return self.useful_gpu_hours / self.offered_gpu_hours

    @property
    def sold_share(self) -> float:
        return self.sold_gpu_hours / self.offered_gpu_hours

    @property
    def cost_per_useful_gpu_hour(self) -> float:
        return float(self.cost) / self.useful_gpu_hours if self.useful_gpu_hours else float("nan")

    @property
    def wait_mean(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0

    @property
    def wait_p95(self) -> float:
        return float(np.percentile(self.waits, 95)) if self.waits else 0.0


def _inside(lease: Lease, minutes: int) -> tuple[int, int]:
    """(paid, working) minutes of ``lease`` within the day."""
    work_start = lease.start if lease.work_start is None else lease.work_start
    work_end = lease.end if lease.work_end is None else lease.work_end
    paid = min(lease.end, minutes) - lease.start
    return paid, max(0, min(work_end, minutes) - min(work_start, minutes))


def figures(outcome: Outcome, machines: Sequence[Host], stream: Sequence[Arrival], minutes: int) -> Figures:
    """The outcome's totals over the day (leases running past its end count up to it). A lease's GPUs count
    as sold for all of it, as useful only for the GPUs the demand asked while its work ran and was kept: the
    relaunch of a resumed job and the work a preempted job lost since its last checkpoint (all of it without
    checkpoints) are paid and not useful."""
    sold = useful = 0
    cost = list_cost = Decimal(0)
    for lease in outcome.leases:
        paid, working = _inside(lease, minutes)
        sold += len(lease.gpu_indexes) * paid
        useful += stream[lease.arrival].gpus * working
        cost += lease.price_per_gpu_hour * len(lease.gpu_indexes) * paid / 60
        list_cost += machines[lease.host].listing.price_per_gpu_hour * len(lease.gpu_indexes) * paid / 60
    return Figures(
        served=len({lease.arrival for lease in outcome.leases}),
        refused=len(outcome.refused),
        offered_gpu_hours=sum(h.gpus for h in machines) * minutes / 60,
        sold_gpu_hours=sold / 60,
        useful_gpu_hours=useful / 60,
        cost=cost.quantize(_CENT),
        list_cost=list_cost.quantize(_CENT),
        waits=tuple(sorted(w for w in outcome.waits.values() if w > 0)),
        asked_gpu_hours=sum(a.gpus * (min(a.minute + a.minutes, minutes) - a.minute) for a in stream) / 60,
    )


# The scheduled policy with one part switched off at a time: what each part earns.
BREAKDOWN: dict[str, dict[str, object]] = {
    "no price falls": {"price_rule": NO_FALL},
    "no bids": {"bids": False},
    "no queue": {"queue": False},
    "no moves": {"settings": dataclasses.replace(SETTINGS, move=False)},
}


def run(
    n_hosts: int,
    per_hour: float,
    minutes: int,
    seed: int,
    cap_rule: str,
    pack_tolerance: float,
    *,
    policies: Sequence[str] = COLUMNS,
    breakdown: bool = False,
) -> dict[str, tuple[Outcome, Figures]]:
    machines = hosts(n_hosts, seed=seed)
    stream = arrivals(per_hour, minutes, seed=seed + 1)
    results = {}
    for policy in policies:
        if policy == SCHEDULED:
            outcome = simulate_scheduled(machines, stream, minutes=minutes)
        else:
            outcome = simulate(machines, stream, policy, cap_rule=cap_rule, pack_tolerance=pack_tolerance)
        results[policy] = (outcome, figures(outcome, machines, stream, minutes))
    if breakdown:
        for label, switches in BREAKDOWN.items():
            outcome = simulate_scheduled(machines, stream, minutes=minutes, **switches)  # type: ignore[arg-type]
            results[label] = (outcome, figures(outcome, machines, stream, minutes))
    return results


def report(results: dict[str, tuple[Outcome, Figures]], n_demands: int, minutes: int) -> None:
    rows: list[tuple[str, str]] = [
        ("demands served", "{f.served}"),
        ("demands refused", "{f.refused}"),
        ("GPU-hours offered", "{f.offered_gpu_hours:,.0f}"),
        ("GPU-hours sold (paid)", "{f.sold_gpu_hours:,.0f}"),
        ("  share of offered", "{sold_pct:.1f} %"),
        ("GPU-hours useful", "{f.useful_gpu_hours:,.0f}"),
        ("  utilization (useful/offered)", "{util_pct:.1f} %"),
        ("GPU-hours paid, not useful", "{f.idle_gpu_hours:,.0f}"),
        ("buyers' total cost (USD)", "{f.cost:,.2f}"),
        ("  the same at list prices", "{f.list_cost:,.2f}"),
        ("cost per useful GPU-hour (USD)", "{f.cost_per_useful_gpu_hour:.4f}"),
        ("demands that waited", "{waited}"),
        ("  wait mean / p95 (min)", "{f.wait_mean:.0f} / {f.wait_p95:.0f}"),
        ("preemptions / moves", "{o.preemptions} / {o.moves}"),
        ("preempted, never resumed", "{o.abandoned}"),
        ("placement wall time (s)", "{o.seconds:.2f}"),
        ("placement per demand (ms)", "{per_demand:.2f}"),
    ]
    print(f"\n{'':32}" + "".join(f"{p:>14}" for p in COLUMNS))
    for label, fmt in rows:
        cells = []
        for policy in COLUMNS:
            o, f = results[policy]
            cells.append(
                fmt.format(
                    f=f,
                    o=o,
                    sold_pct=f.sold_share * 100,
                    util_pct=f.utilization * 100,
                    per_demand=o.seconds / max(n_demands, 1) * 1000,
                    waited=len(f.waits),
                )
            )
        print(f"{label:32}" + "".join(f"{c:>14}" for c in cells))
    print(
        f'\nAgainst "whole", same hosts and stream. Goal (the seed\'s claim): utilization x{CLAIM_UTILIZATION:.2f} or '
        f"more (+30 %) and cost per useful GPU-hour x{CLAIM_COST:.2f} or less (-20 %)."
    )
    for policy in [*COLUMNS[1:], *(k for k in BREAKDOWN if k in results)]:
        r = ratios(results, policy, minutes)
        name = policy if policy in COLUMNS else f"scheduled, {policy}"
        print(
            f"  {name:28} utilization x{r.utilization:.3f} ({(r.utilization - 1) * 100:+.1f} %), cost per useful "
            f"GPU-hour x{r.cost:.3f} ({(r.cost - 1) * 100:+.1f} %) = cards x{r.card_mix:.3f} * paid-not-useful "
            f"x{r.waste:.3f} * price paid/list x{r.discount:.3f}; on the {r.both_served} demands both served, cost "
            f"x{r.cost_same_jobs:.3f}"
        )
    r = ratios(results, SCHEDULED, minutes)
    print(f"\nGoal for {SCHEDULED!r}: {verdict(r, results)}")


@dataclass(frozen=True)
class Ratios:
    utilization: float
    cost: float  # per useful GPU-hour, each policy over the demands it served
    card_mix: float  # list price per sold GPU-hour: which cards the served demands ran on
    waste: float  # sold over useful GPU-hours
    discount: float  # price paid over list price
    both_served: int
    cost_same_jobs: float  # total cost of the demands both policies served (same useful GPU-hours)
    served: float

    @property
    def meets(self) -> bool:
        return self.utilization >= CLAIM_UTILIZATION and self.cost <= CLAIM_COST


def _lease_costs(outcome: Outcome, minutes: int) -> dict[int, Decimal]:
    """What each served demand paid over the day, summed over its leases (a stopped and resumed job has several)."""
    costs: dict[int, Decimal] = {}
    for lease in outcome.leases:
        paid = lease.price_per_gpu_hour * len(lease.gpu_indexes) * (min(lease.end, minutes) - lease.start) / 60
        costs[lease.arrival] = costs.get(lease.arrival, Decimal(0)) + paid
    return costs


def ratios(results: dict[str, tuple[Outcome, Figures]], policy: str, minutes: int) -> Ratios:
    """``policy`` over ``whole`` in the same run. The cost ratio is the product of three: the list price per
    sold GPU-hour (the cards), sold over useful GPU-hours (paid idle or lost work), and paid over list."""
    (base_outcome, base), (outcome, f) = results["whole"], results[policy]
    ours, theirs = _lease_costs(outcome, minutes), _lease_costs(base_outcome, minutes)
    both = ours.keys() & theirs.keys()
    same_jobs = sum((theirs[i] for i in both), Decimal(0))

    def per_sold(x: Figures) -> float:
        return float(x.list_cost) / x.sold_gpu_hours

    def sold_per_useful(x: Figures) -> float:
        return x.sold_gpu_hours / x.useful_gpu_hours

    return Ratios(
        utilization=f.utilization / base.utilization,
        cost=f.cost_per_useful_gpu_hour / base.cost_per_useful_gpu_hour,
        card_mix=per_sold(f) / per_sold(base),
        waste=sold_per_useful(f) / sold_per_useful(base),
        discount=float(f.cost / f.list_cost) / float(base.cost / base.list_cost),
        both_served=len(both),
        cost_same_jobs=float(sum((ours[i] for i in both), Decimal(0)) / same_jobs) if same_jobs else float("nan"),
        served=f.served / max(base.served, 1),
    )


def verdict(r: Ratios, results: dict[str, tuple[Outcome, Figures]]) -> str:
    """ "met", or "NOT met" with the part that falls short and why, from this run's figures."""
    if r.meets:
        return f"met (utilization x{r.utilization:.3f}, cost x{r.cost:.3f})"
    base, ours = results["whole"][1], results[SCHEDULED][1]
    reasons = []
    if r.utilization < CLAIM_UTILIZATION:
        need = base.utilization * CLAIM_UTILIZATION
        ceiling = ours.asked_gpu_hours / ours.offered_gpu_hours
        if need > ceiling:
            why = (
                f"+30 % needs {need * 100:.1f} % of the GPU-hours, but the demands ask only {ceiling * 100:.1f} % "
                "(every one run on arrival): too little demand at this load"
            )
        elif ours.sold_share >= 0.85:
            why = (
                f"+30 % needs {need * 100:.1f} % of the GPU-hours; the hosts are nearly full "
                f"({ours.sold_share * 100:.0f} % sold) and the demands left ask for models and sizes they lack"
            )
        else:
            why = f"{ours.refused} demands still refused (caps and models the free GPUs do not meet)"
        reasons.append(f"utilization x{r.utilization:.3f} < x{CLAIM_UTILIZATION:.2f}: {why}")
    if r.cost > CLAIM_COST:
        why = (
            f"prices paid are x{r.discount:.3f} of list, but the cards sold cost x{r.card_mix:.3f} at list "
            f"(demands whole machines refused run on dearer cards); on the demands both served, x{r.cost_same_jobs:.3f}"
        )
        reasons.append(f"cost x{r.cost:.3f} > x{CLAIM_COST:.2f}: {why}")
    return "NOT met: " + "; ".join(reasons)


def sweep(args: argparse.Namespace, factors: list[float], default: dict[str, tuple[Outcome, Figures]]) -> None:
    """Scheduled against whole at other demand rates: same hosts, streams of the same seed."""
    if not factors:
        return
    print("\nLoad sweep (same hosts; streams of the same seed at other rates), against whole:")
    heads = (
        "demands/h",
        "util whole",
        "util sched",
        "util x",
        "cost x",
        "same jobs x",
        "per-gpu util x",
        "wait mean/p95",
    )
    print("  " + " ".join(f"{h:>14}" for h in heads) + "  goal")
    held, missed = [], []
    for factor in sorted({1.0, *factors}):
        rate = args.demands_per_hour * factor
        if factor == 1.0:
            swept = default
        else:
            policies = ("whole", "per-gpu", SCHEDULED)
            swept = run(
                args.hosts, rate, args.minutes, args.seed, args.cap_rule, args.pack_tolerance, policies=policies
            )
        r = ratios(swept, SCHEDULED, args.minutes)
        f = swept[SCHEDULED][1]
        cells = (
            f"{rate:g}",
            f"{swept['whole'][1].utilization * 100:.1f} %",
            f"{f.utilization * 100:.1f} %",
            f"{r.utilization:.3f}",
            f"{r.cost:.3f}",
            f"{r.cost_same_jobs:.3f}",
            f"{ratios(swept, 'per-gpu', args.minutes).utilization:.3f}",
            f"{f.wait_mean:.0f} / {f.wait_p95:.0f} min",
        )
        said = verdict(r, swept)
        print("  " + " ".join(f"{c:>14}" for c in cells) + f"  {'met' if r.meets else 'NOT met'}")
        (held if r.meets else missed).append((rate, said))
    print(f"  the claim holds at {', '.join(f'{rate:g}/h' for rate, _ in held) or 'no load swept'}")
    for rate, said in missed:
        print(f"  at {rate:g}/h: {said}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--demands-per-hour", type=float, default=100.0)
    parser.add_argument("--minutes", type=int, default=1440)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--cap-rule",
        choices=("budget", "per-gpu"),
        default="budget",
        help="budget: k x cap per hour on what is rented; per-gpu: cap on the host's price per GPU only "
        "(the online policies; the scheduled one always applies the budget)",
    )
    parser.add_argument(
        "--pack-tolerance",
        type=float,
        default=0.05,
        help="best fit among quotes this close (the online policies; the scheduled one uses SETTINGS' 0.10)",
    )
    parser.add_argument(
        "--sweep", default="0.5,2,4", help="also these multiples of the rate (ratios only); '' for none"
    )
    args = parser.parse_args()
    machines = hosts(args.hosts, seed=args.seed)
    stream = arrivals(args.demands_per_hour, args.minutes, seed=args.seed + 1)
    print(
        f"{args.hosts} hosts, {sum(h.gpus for h in machines)} GPUs "
        f"({', '.join(f'{m} {sum(h.gpus for h in machines if h.listing.gpu_model == m)}' for m in HOST_MIX)}); "
        f"{len(stream)} demands over {args.minutes} min ({args.demands_per_hour:g}/h, seed {args.seed}: "
        f"{sum(a.max_wait > 0 for a in stream)} accept a wait, {sum(a.interruptible for a in stream)} interruptible, "
        f"{sum(a.checkpointed for a in stream)} checkpointed); cap rule {args.cap_rule}; pack tolerance "
        f"{args.pack_tolerance:g}"
    )
    results = run(
        args.hosts, args.demands_per_hour, args.minutes, args.seed, args.cap_rule, args.pack_tolerance, breakdown=True
    )
    report(results, len(stream), args.minutes)
    sweep(args, [float(x) for x in args.sweep.split(",") if x], results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
