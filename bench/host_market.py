"""Benchmark (issue 19): independent hosts sold whole against sold per GPU with packing, over a simulated day.

    .venv/bin/python bench/host_market.py [--hosts 200] [--demands-per-hour 100] [--minutes 1440] [--seed 1]

One seeded population of independent machines (1 to 8 GPUs of H100, A100 80 GB, L40S or RTX 4090, each
host with its own per-GPU-hour price and minimum GPUs per lease) and one seeded stream of demands (Poisson
arrivals; each wants k GPUs of a set of models or with a memory floor, for a heavy-tailed duration, under a
price cap per GPU-hour). Every policy sells the SAME hosts to the SAME stream, online: a demand is placed
when it arrives, or refused (no queue).

Policies:

- ``whole``: a demand rents a whole free machine with at least k GPUs and pays for all of them (how the
  broker sold hosts before per-GPU listings).
- ``lease-sizes``: what the broker sells today (providers/community/adapter.py): a divisible machine is
  offered once per lease size (its minimum, doubling, and the whole machine), a machine listed whole only
  whole; a demand takes the smallest fitting lease it chooses, so a 3-GPU job pays for a 4-GPU lease.
- ``per-gpu``: exactly k GPUs of a divisible machine (k at least its minimum per lease, else the minimum).

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

Assumptions of this generator (not sourced facts): the model mix, GPU counts and price ranges of the hosts,
their reliability, their minimum GPUs per lease, and the demand mix (sizes, model sets, caps, durations).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
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

from bench.market import specs  # noqa: E402
from marketplace.matching import Demand, Exclusion, OfferBook, OfferView, Quote, rank  # noqa: E402
from providers import gpu_names as g  # noqa: E402
from providers.community.adapter import MachineListing, lease_instance_type  # noqa: E402

NOW = dt.datetime(2026, 12, 1, 0, 0, tzinfo=dt.UTC)  # minute 0 of the day; prices are observed then
POLICIES = ("whole", "lease-sizes", "per-gpu")
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


@dataclass(frozen=True)
class Lease:
    arrival: int
    host: int
    gpu_indexes: tuple[int, ...]
    start: int
    end: int  # exclusive, may pass the end of the day
    price_per_gpu_hour: Decimal


@dataclass
class Outcome:
    policy: str
    leases: list[Lease]
    refused: list[int]
    seconds: float  # placement only: building the capacity column, ranking, the tie-break


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


@dataclass(frozen=True)
class Figures:
    served: int
    refused: int
    offered_gpu_hours: float
    sold_gpu_hours: float  # paid for, idle or not
    useful_gpu_hours: float  # the GPUs demands asked for
    cost: Decimal

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


def figures(outcome: Outcome, machines: Sequence[Host], stream: Sequence[Arrival], minutes: int) -> Figures:
    """The outcome's totals over the day (leases running past its end count up to it)."""
    sold = useful = 0
    cost = Decimal(0)
    for lease in outcome.leases:
        inside = min(lease.end, minutes) - lease.start
        sold += len(lease.gpu_indexes) * inside
        useful += stream[lease.arrival].gpus * inside
        cost += lease.price_per_gpu_hour * len(lease.gpu_indexes) * inside / 60
    return Figures(
        served=len(outcome.leases),
        refused=len(outcome.refused),
        offered_gpu_hours=sum(h.gpus for h in machines) * minutes / 60,
        sold_gpu_hours=sold / 60,
        useful_gpu_hours=useful / 60,
        cost=cost.quantize(_CENT),
    )


def run(
    n_hosts: int, per_hour: float, minutes: int, seed: int, cap_rule: str, pack_tolerance: float
) -> dict[str, tuple[Outcome, Figures]]:
    machines = hosts(n_hosts, seed=seed)
    stream = arrivals(per_hour, minutes, seed=seed + 1)
    results = {}
    for policy in POLICIES:
        outcome = simulate(machines, stream, policy, cap_rule=cap_rule, pack_tolerance=pack_tolerance)
        results[policy] = (outcome, figures(outcome, machines, stream, minutes))
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
        ("GPU-hours idle on rented GPUs", "{f.idle_gpu_hours:,.0f}"),
        ("buyers' total cost (USD)", "{f.cost:,.2f}"),
        ("cost per useful GPU-hour (USD)", "{f.cost_per_useful_gpu_hour:.4f}"),
        ("placement wall time (s)", "{o.seconds:.2f}"),
        ("placement per demand (ms)", "{per_demand:.2f}"),
    ]
    print(f"\n{'':32}" + "".join(f"{p:>14}" for p in POLICIES))
    for label, fmt in rows:
        cells = []
        for policy in POLICIES:
            o, f = results[policy]
            cells.append(
                fmt.format(
                    f=f,
                    o=o,
                    sold_pct=f.sold_share * 100,
                    util_pct=f.utilization * 100,
                    per_demand=o.seconds / max(n_demands, 1) * 1000,
                )
            )
        print(f"{label:32}" + "".join(f"{c:>14}" for c in cells))
    print('\nAgainst "whole", same hosts and stream; the seed claims -20 % cost, +30 % utilization:')
    for policy in POLICIES[1:]:
        r = ratios(results, policy, minutes)
        print(
            f"  {policy:12} utilization x{r.utilization:.3f} ({(r.utilization - 1) * 100:+.1f} %), cost per useful "
            f"GPU-hour x{r.cost:.3f} ({(r.cost - 1) * 100:+.1f} %); on the {r.both_served} demands both served, "
            f"cost x{r.cost_same_jobs:.3f}; served x{r.served:.3f}: {'meets' if r.meets else 'does NOT meet'} the claim"
        )


@dataclass(frozen=True)
class Ratios:
    utilization: float
    cost: float  # per useful GPU-hour, each policy over the demands it served
    both_served: int
    cost_same_jobs: float  # total cost of the demands both policies served (same useful GPU-hours)
    served: float

    @property
    def meets(self) -> bool:
        return self.utilization >= CLAIM_UTILIZATION and self.cost <= CLAIM_COST


def _lease_costs(outcome: Outcome, minutes: int) -> dict[int, Decimal]:
    return {
        lease.arrival: lease.price_per_gpu_hour * len(lease.gpu_indexes) * (min(lease.end, minutes) - lease.start) / 60
        for lease in outcome.leases
    }


def ratios(results: dict[str, tuple[Outcome, Figures]], policy: str, minutes: int) -> Ratios:
    """``policy`` over ``whole`` in the same run."""
    (base_outcome, base), (outcome, f) = results["whole"], results[policy]
    ours, theirs = _lease_costs(outcome, minutes), _lease_costs(base_outcome, minutes)
    both = ours.keys() & theirs.keys()
    same_jobs = sum((theirs[i] for i in both), Decimal(0))
    return Ratios(
        utilization=f.utilization / base.utilization,
        cost=f.cost_per_useful_gpu_hour / base.cost_per_useful_gpu_hour,
        both_served=len(both),
        cost_same_jobs=float(sum((ours[i] for i in both), Decimal(0)) / same_jobs) if same_jobs else float("nan"),
        served=f.served / max(base.served, 1),
    )


def sweep(args: argparse.Namespace, factors: list[float]) -> None:
    """Per-GPU against whole at other demand rates: same hosts, streams of the same seed."""
    if not factors:
        return
    print("\nLoad sweep (same hosts; streams of the same seed at other rates), per-gpu against whole:")
    heads = ("demands/h", "util whole", "util per-gpu", "util x", "cost x", "same jobs x")
    print("  " + " ".join(f"{h:>12}" for h in heads))
    for factor in factors:
        rate = args.demands_per_hour * factor
        swept = run(args.hosts, rate, args.minutes, args.seed, args.cap_rule, args.pack_tolerance)
        r = ratios(swept, "per-gpu", args.minutes)
        cells = (
            f"{rate:g}",
            f"{swept['whole'][1].utilization * 100:.1f} %",
            f"{swept['per-gpu'][1].utilization * 100:.1f} %",
            f"{r.utilization:.3f}",
            f"{r.cost:.3f}",
            f"{r.cost_same_jobs:.3f}",
        )
        print("  " + " ".join(f"{c:>12}" for c in cells))


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
        help="budget: k x cap per hour on what is rented; per-gpu: cap on the host's price per GPU only",
    )
    parser.add_argument("--pack-tolerance", type=float, default=0.05, help="best fit among quotes this close")
    parser.add_argument(
        "--sweep", default="0.5,2,4", help="also these multiples of the rate (ratios only); '' for none"
    )
    args = parser.parse_args()
    machines = hosts(args.hosts, seed=args.seed)
    stream = arrivals(args.demands_per_hour, args.minutes, seed=args.seed + 1)
    print(
        f"{args.hosts} hosts, {sum(h.gpus for h in machines)} GPUs "
        f"({', '.join(f'{m} {sum(h.gpus for h in machines if h.listing.gpu_model == m)}' for m in HOST_MIX)}); "
        f"{len(stream)} demands over {args.minutes} min ({args.demands_per_hour:g}/h, seed {args.seed}); "
        f"cap rule {args.cap_rule}; pack tolerance {args.pack_tolerance:g}"
    )
    results = run(args.hosts, args.demands_per_hour, args.minutes, args.seed, args.cap_rule, args.pack_tolerance)
    report(results, len(stream), args.minutes)
    sweep(args, [float(x) for x in args.sweep.split(",") if x])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
