"""Benchmark (issue 38): an autoscaled fleet against two fixed fleets over a simulated day of load.

    .venv/bin/python bench/fleets.py [--quick] [--seed 38] [--database postgres://postgres@127.0.0.1:5432/broker_bench_fleets]

One seeded load stream (requests per second at one-minute steps: a diurnal curve, low at 04:00 and high at
16:00, with seeded bursts and a little noise) is defined before any fleet sees it, and the same stream is served
by three fleets of one-T4 replicas:

- ``autoscaled``: decides every minute with the broker's own scaling rule, ``marketplace.fleets.policy.decide``
  (mean GPU utilization against a 60 % target; the simulated clock is its ``now``), starting from what the first
  minute needs at that target. A replica's utilization is its share of the load over its capacity, capped at
  100 %; the rule reads its window's mean, as it would read the agents' telemetry.
- ``fixed-peak``: ``ceil(peak / capacity)`` replicas all day; ``fixed-mean``: ``ceil(mean / capacity)``. Both are
  running at minute 0, as is the autoscaled fleet's first set (every fleet starts warm).

Every placement, for every fleet, is the broker's matching engine (``marketplace.matching.rank``) against the
broker's own offer book (``marketplace.catalog.selectors.offer_book``) after the real offer sync
(``offers_sync``) of every sandbox cloud (AWS, Azure, GCP, Alibaba Cloud, Tencent Cloud), the Kubernetes
sandbox's cluster and two independent T4 hosts listed here with simulated agents: the fleet's demand (one T4,
on demand, within its price cap) goes to the best quote that still has capacity, so finite capacity (a host's
free GPUs, a cluster node's) fills up and the fleet spreads over provider kinds. A scale-in stops starting
replicas first, then the dearest running ones. Each fleet places against its own copy of the capacity: the
fleets are compared, they do not compete.

Figures per fleet: GPU-hours bought (every minute a replica is held, from its order, its boot included, to its
stop), dollars at the offers' prices, under-served minutes (load above the running replicas' capacity) and the
share of requests beyond it, the most replicas held at once, and the scaling decisions by action. Then the
autoscaled fleet's ratios against each fixed fleet and the goal: it costs less than the peak-sized fleet and is
under-served at most a fifth of the minutes the mean-sized fleet is.

Assumptions (not measured here): a replica serves ``REPLICA_RPS`` requests/s on one T4 (a small model's
inference); it is useful ``BOOT_MINUTES`` after it is ordered (a cloud GPU machine booting and its agent
reporting ready; the broker gives up on a boot after ``BROKER_BOOT_TIMEOUT_S``, 20 minutes); the load curve's
shape, bursts and noise; the hosts' prices. No replica is lost during the day (on-demand only).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import random
import sys
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from marketplace.fleets.policy import Action, FleetView, RuleKind, ScalingRule, decide  # noqa: E402
from marketplace.matching import Demand, OfferBook, Profile, rank  # noqa: E402
from providers import gpu_names as g  # noqa: E402

SEED = 38
REPLICA_RPS = 40.0
BOOT_MINUTES = 4
GPU_MODEL = g.T4
PRICE_CAP = Decimal("1.00")  # USD per replica-hour
TARGET_UTILIZATION = 60.0
DAY = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)  # the simulated day's midnight: decide()'s clock
QUICK_START, QUICK_MINUTES = 10 * 60, 6 * 60  # --quick: 10:00 to 16:00, the climb to the peak
FLEETS = ("autoscaled", "fixed-peak", "fixed-mean")
# Independent T4 hosts listed for the run: (name, GPUs, USD per GPU-hour); an assumption, below the clouds.
HOSTS = (("t4-host-1", 4, "0.2400"), ("t4-host-2", 2, "0.2600"))
IDLE_GPU = {"utilization_pct": 0, "temperature_c": 35, "power_w": 30}
# The goal: under-served at most this share of the mean-sized fleet's under-served minutes.
UNDER_SERVED_SHARE = 0.2


# --- The load --------------------------------------------------------------------------------------------------


def load_curve(*, seed: int, start: int = 0, minutes: int = 1440) -> list[float]:
    """Requests/s at each minute from ``start`` (minutes after midnight) for ``minutes``: 210 - 150 cos(2 pi
    (t - 04:00) / 24 h), so 60 at 04:00 and 360 at 16:00; bursts (Poisson, 8 a day) lasting 10 to 45 minutes
    that multiply the load by 1.3 to 2.0 after a 3-minute ramp; noise of +-5 %. Drawn for the whole day from
    ``seed``, so a window is the same minutes of the same day."""
    rng = random.Random(seed)
    day = np.arange(1440, dtype=np.float64)
    base = 210.0 - 150.0 * np.cos(2 * math.pi * (day - 240.0) / 1440.0)
    factor = np.ones(1440)
    clock = rng.expovariate(8 / 1440)
    while clock < 1440:
        begin, length, height = int(clock), rng.randint(10, 45), rng.uniform(1.3, 2.0)
        for i in range(length):
            if begin + i < 1440:
                ramp = min(1.0, (i + 1) / 3)
                factor[begin + i] = max(factor[begin + i], 1 + (height - 1) * ramp)
        clock += rng.expovariate(8 / 1440)
    noise = np.array([rng.uniform(0.95, 1.05) for _ in range(1440)])
    return [float(v) for v in (base * factor * noise)[start : start + minutes]]


# --- Placement: the matching engine against the book, with the capacity this fleet took ------------------------


def fleet_demand() -> Demand:
    """One replica: one T4, on demand, inference, a fixed duration (a service), within the price cap."""
    return Demand(
        demand_id="fleet-replica",
        gpu_count=1,
        gpu_models=frozenset({GPU_MODEL}),
        pricing_models=frozenset({"on_demand"}),
        max_price_per_hour=PRICE_CAP,
        profile=Profile.INFERENCE,
        duration_hours=1.0,
    )


class Market:
    """The book as one fleet sees it: every placement takes capacity (instances of the offer and GPUs of its
    pool), every stop gives it back."""

    def __init__(self, book: OfferBook, *, now: dt.datetime) -> None:
        self.book, self.now = book, now
        self.position = {v.offer_id: i for i, v in enumerate(book.views)}
        self.taken = np.zeros(len(book))
        self.pool_used = np.zeros(max(book.n_pools, 1))
        self.demand = fleet_demand()

    def _now_book(self) -> OfferBook:
        pool = self.book.col("pool")
        used = np.where(pool >= 0, self.pool_used[np.maximum(pool, 0)], 0.0)
        columns = {"capacity": self.book.col("capacity") - self.taken, "pool_free": self.book.col("pool_free") - used}
        return dataclasses.replace(self.book, columns={**self.book.columns, **columns})

    def _draw(self, j: int, units: float) -> float:
        view = self.book.views[j]
        return units if view.divisible else units * view.gpu_count

    def place(self) -> tuple[int, float] | None:
        """The best offer with capacity left (its book position, and the units taken), or None."""
        quotes = rank(self.demand, self._now_book(), now=self.now, limit=1).quotes
        if not quotes:
            return None
        j, units = self.position[quotes[0].offer.offer_id], float(quotes[0].units)
        self.taken[j] += units
        pool = int(self.book.col("pool")[j])
        if pool >= 0:
            self.pool_used[pool] += self._draw(j, units)
        return j, units

    def release(self, j: int, units: float) -> None:
        self.taken[j] -= units
        pool = int(self.book.col("pool")[j])
        if pool >= 0:
            self.pool_used[pool] -= self._draw(j, units)


# --- A fleet through the day -----------------------------------------------------------------------------------


@dataclass
class Replica:
    offer: int  # book position
    units: float
    kind: str
    gpus: int
    price: Decimal  # USD per hour
    ordered: int  # minute
    ready: int
    ended: int | None = None

    def held(self, end: int) -> int:
        """Minutes held (bought) up to ``end``."""
        return (self.ended if self.ended is not None else end) - self.ordered


@dataclass
class FleetRun:
    name: str
    replicas: list[Replica] = field(default_factory=list)
    under_served_minutes: int = 0
    unserved_requests: float = 0.0
    peak_replicas: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    unplaced: int = 0  # replicas the fleet wanted and the book could not give

    def gpu_hours(self, end: int) -> float:
        return sum(r.gpus * r.held(end) for r in self.replicas) / 60

    def dollars(self, end: int) -> Decimal:
        return sum((r.price * r.held(end) / 60 for r in self.replicas), Decimal(0)).quantize(Decimal("0.01"))

    def mix(self, end: int) -> dict[str, float]:
        """Replica-hours by provider kind."""
        hours: Counter[str] = Counter()
        for r in self.replicas:
            hours[r.kind] += r.held(end) / 60
        return dict(sorted(hours.items(), key=lambda kv: -kv[1]))


def _order(fleet: FleetRun, market: Market, *, minute: int, boot: int) -> bool:
    placed = market.place()
    if placed is None:
        fleet.unplaced += 1
        return False
    j, units = placed
    view = market.book.views[j]
    if view.divisible:  # units are GPUs of the machine, each at its share of the listing's price
        gpus, price = int(units), view.price_usd_per_hour / view.gpu_count * int(units)
    else:  # units are whole instances
        gpus, price = view.gpu_count * int(units), view.price_usd_per_hour * int(units)
    fleet.replicas.append(Replica(offer=j, units=units, kind=view.provider_kind, gpus=gpus, price=price,
                                  ordered=minute, ready=minute + boot))  # fmt: skip
    return True


def _stop(fleet: FleetRun, market: Market, replica: Replica, minute: int) -> None:
    replica.ended = minute
    market.release(replica.offer, replica.units)


def _serve(fleet: FleetRun, load: float, running: int) -> None:
    capacity = running * REPLICA_RPS
    if load > capacity + 1e-9:
        fleet.under_served_minutes += 1
        fleet.unserved_requests += (load - capacity) * 60


def run_fixed(name: str, load: Sequence[float], market: Market, replicas: int) -> FleetRun:
    """``replicas`` placed and running from minute 0 to the end."""
    fleet = FleetRun(name)
    for _ in range(replicas):
        _order(fleet, market, minute=0, boot=0)
    running = len(fleet.replicas)
    fleet.peak_replicas = running
    for value in load:
        _serve(fleet, value, running)
    return fleet


def run_autoscaled(load: Sequence[float], market: Market, *, start: int, rule: ScalingRule, maximum: int) -> FleetRun:
    """The fleet deciding every minute with ``decide``; see the module docstring."""
    fleet = FleetRun("autoscaled")
    first = max(1, math.ceil(load[0] / (REPLICA_RPS * rule.target / 100)))
    for _ in range(min(first, maximum)):
        _order(fleet, market, minute=0, boot=0)
    desired = len(fleet.replicas)
    window: deque[float] = deque(maxlen=max(1, rule.window_s // 60))
    last_out: dt.datetime | None = None
    last_in: dt.datetime | None = None
    for minute, value in enumerate(load):
        live = [r for r in fleet.replicas if r.ended is None]
        running = [r for r in live if r.ready <= minute]
        starting = [r for r in live if r.ready > minute]
        fleet.peak_replicas = max(fleet.peak_replicas, len(live))
        _serve(fleet, value, len(running))
        per_replica = min(100.0, 100.0 * value / (len(running) * REPLICA_RPS)) if running else None
        if per_replica is not None:
            window.append(per_replica)
        now = DAY + dt.timedelta(minutes=start + minute)
        decision = decide(
            rule,
            FleetView(
                now=now, minimum=1, maximum=maximum, running=len(running), starting=len(starting),
                desired_before=desired, load=sum(window) / len(window) * len(running) if window and running else None,
                last_scale_out=last_out, last_scale_in=last_in,
            ),
        )  # fmt: skip
        fleet.decisions[decision.action] += 1
        desired = decision.desired
        if decision.action in (Action.SCALE_OUT, Action.REPLACE):
            last_out = now if decision.action == Action.SCALE_OUT else last_out
            for _ in range(decision.change):
                if not _order(fleet, market, minute=minute, boot=BOOT_MINUTES):
                    break
        elif decision.action == Action.SCALE_IN:
            last_in = now
            # Starting replicas first (the latest ordered), then the dearest running ones.
            victims = sorted(starting, key=lambda r: -r.ordered) + sorted(running, key=lambda r: -r.price)
            for replica in victims[: -decision.change]:
                _stop(fleet, market, replica, minute)
    return fleet


@dataclass
class Day:
    seed: int
    start: int
    load: list[float]
    fleets: dict[str, FleetRun]
    sizes: dict[str, int]  # fixed fleets' replicas
    offers: int  # T4 offers within the cap in the book
    kinds: list[str]  # their provider kinds

    @property
    def minutes(self) -> int:
        return len(self.load)


def simulate(book: OfferBook, *, now: dt.datetime, seed: int = SEED, quick: bool = False) -> Day:
    """The three fleets over the same stream, each placing against its own copy of ``book``'s capacity."""
    start, minutes = (QUICK_START, QUICK_MINUTES) if quick else (0, 1440)
    load = load_curve(seed=seed, start=start, minutes=minutes)
    sizes = {
        "fixed-peak": math.ceil(max(load) / REPLICA_RPS),
        "fixed-mean": math.ceil(sum(load) / len(load) / REPLICA_RPS),
    }
    rule = ScalingRule(kind=RuleKind.UTILIZATION, target=TARGET_UTILIZATION)
    # The autoscaled fleet may hold twice what the peak needs: the maximum is a guard, not the plan.
    fleets = {"autoscaled": run_autoscaled(load, Market(book, now=now), start=start, rule=rule,
                                           maximum=min(64, 2 * sizes["fixed-peak"]))}  # fmt: skip
    for name, size in sizes.items():
        fleets[name] = run_fixed(name, load, Market(book, now=now), size)
    ranked = rank(fleet_demand(), book, now=now, limit=10_000).quotes
    return Day(seed=seed, start=start, load=load, fleets=fleets, sizes=sizes, offers=len(ranked),
               kinds=sorted({q.offer.provider_kind for q in ranked}))  # fmt: skip


# --- The report ------------------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return "n/a" if b == 0 else f"{a / b:.2f}"


def report(day: Day, out: Any = None) -> bool:
    """Print the day's figures, the ratios and the goal; True when the goal is met."""
    out = out or sys.stdout
    end = day.minutes
    mean, peak = sum(day.load) / end, max(day.load)

    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"seed {day.seed}; {end} one-minute steps from {day.start // 60:02d}:{day.start % 60:02d} UTC; "
        f"load mean {mean:.1f} req/s, peak {peak:.1f} req/s")  # fmt: skip
    say(f"a replica: 1 x {GPU_MODEL} serving {REPLICA_RPS:g} req/s (assumption), useful {BOOT_MINUTES} min after "
        f"its order (assumption), on demand within {PRICE_CAP} USD/h")  # fmt: skip
    say(f"offers: {day.offers} within the cap, from {', '.join(day.kinds)} (the broker's offer sync of the sandboxes)")
    say(f"fixed fleets: peak {day.sizes['fixed-peak']} = ceil({peak:.1f} / {REPLICA_RPS:g}), "
        f"mean {day.sizes['fixed-mean']} = ceil({mean:.1f} / {REPLICA_RPS:g}); "
        f"autoscaled: decide() every minute, utilization target {TARGET_UTILIZATION:g} %")  # fmt: skip
    say()
    say(f"{'':34}" + "".join(f"{name:>14}" for name in FLEETS))
    rows: list[tuple[str, Any]] = [
        ("GPU-hours bought", lambda f: f"{f.gpu_hours(end):.1f}"),
        ("dollars (USD)", lambda f: f"{f.dollars(end):.2f}"),
        ("under-served minutes", lambda f: f"{f.under_served_minutes}"),
        ("requests beyond capacity (%)", lambda f: f"{100 * f.unserved_requests / (sum(day.load) * 60):.2f}"),
        ("peak replicas", lambda f: f"{f.peak_replicas}"),
        ("replicas ordered", lambda f: f"{len(f.replicas)}"),
        ("replicas the book could not give", lambda f: f"{f.unplaced}"),
        ("scaling decisions (out / in)",
         lambda f: f"{f.decisions[Action.SCALE_OUT] + f.decisions[Action.REPLACE]} / {f.decisions[Action.SCALE_IN]}"),
    ]  # fmt: skip
    for label, cell in rows:
        say(f"{label:34}" + "".join(f"{cell(day.fleets[name]):>14}" for name in FLEETS))
    say()
    for name in FLEETS:
        mix = ", ".join(f"{kind} {hours:.1f}" for kind, hours in day.fleets[name].mix(end).items())
        say(f"mix of {name} (replica-hours by provider kind): {mix}")
    say()
    auto = day.fleets["autoscaled"]
    for name in ("fixed-peak", "fixed-mean"):
        other = day.fleets[name]
        ours, theirs = float(auto.dollars(end)), float(other.dollars(end))
        saving = (
            f"saves {1 - ours / theirs:.0%} of its dollars" if ours < theirs else f"costs {ours / theirs - 1:.0%} more"
        )
        gpu_hours = _ratio(auto.gpu_hours(end), other.gpu_hours(end))
        under = f"{auto.under_served_minutes} against {other.under_served_minutes}"
        dollars = _ratio(ours, theirs)
        say(f"autoscaled / {name}: dollars {dollars}, GPU-hours {gpu_hours}, under-served minutes {under}: {saving}")
    cheaper = auto.dollars(end) < day.fleets["fixed-peak"].dollars(end)
    mean_under = day.fleets["fixed-mean"].under_served_minutes
    served = auto.under_served_minutes <= UNDER_SERVED_SHARE * mean_under and mean_under > 0
    met = cheaper and served
    reasons = [
        f"costs {'less' if cheaper else 'no less'} than the peak-sized fleet "
        f"({auto.dollars(end)} against {day.fleets['fixed-peak'].dollars(end)} USD)",
        f"under-served {auto.under_served_minutes} minutes against the mean-sized fleet's {mean_under} "
        f"({'at most' if served else 'more than'} {UNDER_SERVED_SHARE:.0%} of them)",
    ]
    say(f"goal (cheaper than fixed-peak, under-served at most {UNDER_SERVED_SHARE:.0%} of fixed-mean's minutes): "
        f"{'met' if met else 'not met'}: the autoscaled fleet {'; '.join(reasons)}")  # fmt: skip
    return met


# --- The world: the sandboxes' offers through the broker's sync ------------------------------------------------


def sync_world() -> tuple[list[Any], dt.datetime]:
    """Start every sandbox cloud and the Kubernetes sandbox, connect an account to each, list the independent T4
    hosts with simulated agents, and sync every account's offers through ``offers_sync``. Returns what to stop
    and the sync's time. Other accounts in the database are disabled: only this run's offers are on sale."""
    from django.utils import timezone

    from marketplace.catalog.services import offers_sync
    from providers.community.agent import Agent, parse_simulated
    from providers.community.services import machine_heartbeat, machine_list
    from providers.models import Machine, MachineState, Provider, ProviderAccount
    from providers.services import provider_account_connect
    from sandboxes.demo import SANDBOX_ACCOUNTS, start_all

    ProviderAccount.objects.update(enabled=False)
    running: list[Any] = []
    tag = uuid.uuid4().hex[:6]
    sandboxes = start_all(["aws", "azure", "gcp", "alibaba", "tencent", "kubernetes"])
    running.extend(sandboxes.values())
    accounts = []
    for kind, sandbox in sandboxes.items():
        spec = SANDBOX_ACCOUNTS[kind](sandbox)
        account = ProviderAccount(
            provider=Provider.objects.create(name=f"bench fleets {kind} {tag}"), kind=kind, name=f"{kind}-fleets",
            endpoint_url=spec.endpoint_url, regions=spec.demo_regions, options=dict(spec.options),
        )  # fmt: skip
        account.set_credentials(spec.credentials)
        account.save()
        accounts.append(account)
    hosts = provider_account_connect(
        provider_name=f"bench fleets hosts {tag}", kind="community", name="t4-hosts", credentials={}, regions=["us-tx"]
    )
    for name, count, price in HOSTS:
        listing = {
            "gpu_model": GPU_MODEL, "gpu_count": count, "gpu_memory_gb": 16, "vcpus": 8 * count,
            "memory_gib": 32 * count, "disk_gb": 500, "network_gbps": Decimal(10), "country": "US", "region": "us-tx",
            "price_per_gpu_hour": Decimal(price), "min_gpus_per_lease": 1,
        }  # fmt: skip
        listed = machine_list(account=hosts, name=name, listing=listing)
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                      simulated=parse_simulated(f"T4:16x{count}"), launch_seconds=0, lease_threads=False)  # fmt: skip
        url = agent.serve("127.0.0.1", 0, report=False)
        running.append(agent)
        now = timezone.now()
        Machine.objects.filter(pk=listed.machine.pk).update(
            agent_url=url, state=MachineState.VERIFIED, online=True, last_heartbeat_at=now, registered_at=now
        )
        # One heartbeat since it registered: its uptime is whole, so the ranking gives it the prior reliability
        # of a machine with no launches yet, not the zero of one that never reported.
        machine_heartbeat(machine=Machine.objects.get(pk=listed.machine.pk), gpus=[IDLE_GPU] * count, instances=0)
    accounts.append(hosts)
    for account in accounts:
        outcome = offers_sync(account_id=account.pk)
        said = f"{outcome.report.upserted} offers" if outcome.ok and outcome.report else f"failed: {outcome.error}"
        print(f"synced {account.kind}: {said}", file=sys.stderr)
    return running, timezone.now()


def stop_world(running: Sequence[Any]) -> None:
    for thing in running:
        thing.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES // 60} hours instead of a day")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_fleets")
    args = parser.parse_args(argv)

    from bench.sync import django_on

    django_on(args.database, CELERY_BROKER_URL="memory://")
    from marketplace.catalog.selectors import offer_book

    running, now = sync_world()
    try:
        day = simulate(offer_book(now=now), now=now, seed=args.seed, quick=args.quick)
    finally:
        stop_world(running)
    return 0 if report(day) else 1


if __name__ == "__main__":
    raise SystemExit(main())
