"""Scheduling independent hosts: which job runs where and when, on machines sold per GPU.

Pure: no ORM, no I/O, no clock. Time is an integer minute passed in; prices are ``Decimal`` per GPU-hour.

``schedule(now=, hosts=, queue=, arrivals=, settings=) -> Decision`` takes the whole market at one event (a
job arrived, a lease ended, a queued job's wait bound is reached) and decides, without keeping any state of its
own (the caller applies the decision and calls again at the next event):

- **Placement, best fit.** A job goes where its work is cheapest (price over the host's ``work_rate``); among
  the hosts within ``pack_tolerance`` of that, on the one its lease leaves the fewest free GPUs, preferring a
  machine already split over a whole one, so whole machines stay whole for the jobs that need them.
- **Prices fall as the seller accepts.** An on-demand job pays the host's list price lowered by the seller's
  ``PriceFallRule`` (``providers.community.pricing.fallen_price``: a fragment of a split machine, a machine
  idle for hours), locked at placement. An interruptible job pays its bid, which must reach the host's
  minimum bid (with no bid, it pays that minimum) and stay below the host's fallen on-demand price. Either
  way the lease's price times its GPUs stays within the job's budget (``cap`` x GPUs asked).
- **Preemption.** An on-demand job that finds no free GPUs may take those of interruptible leases, the lowest
  bids first, on the host where that stops the fewest GPUs. The preempted job comes back in the same call as a
  job submitted now, with the work it has left (all of it unless it checkpoints: then the work up to its
  last checkpoint is kept), and is placed, queued or refused like any other.
- **Moves to defragment.** Failing that, a checkpointed lease may move to another host (checkpointing first,
  so only ``restart_minutes`` are lost) when that frees enough GPUs of one machine for the on-demand job.
- **A bounded queue with EASY backfill.** A job that cannot start waits while ``now < submitted + max_wait``
  and is refused once that bound is reached. The first waiting on-demand job that can start within its bound
  holds a reservation: the host and the earliest minute enough GPUs free up there (the interruptible leases
  there count as free, they will be preempted). Another on-demand job may start on that host only if it ends
  by then or leaves enough GPUs for the reservation; interruptible jobs backfill anywhere, since preempting
  them delays nothing (Slurm's backfill scheduler is the model: Lifka, "The ANL/IBM SP scheduling system",
  1995).

Order within a call: on-demand jobs before interruptible ones, each by submission minute then id; a queued job
thus keeps its place ahead of later arrivals. Every job passed in (queued, arriving or preempted in the call)
ends the call in exactly one of ``placements``, ``moves`` (a moved lease's new run), ``queued`` or
``refused``. Durations are taken as exact (a reservation computed from lease ends is only as good as them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from decimal import Decimal
from enum import StrEnum

from providers.community.pricing import NO_FALL, PriceFallRule, fallen_price


class SchedulingError(ValueError):
    """A job, lease or host is malformed; the message names the field."""


class LeaseKind(StrEnum):
    ON_DEMAND = "on_demand"
    INTERRUPTIBLE = "interruptible"


@dataclasses.dataclass(frozen=True)
class Job:
    """Work to run: ``gpus`` GPUs for ``minutes`` of work, after ``restart_minutes`` of relaunch (a resumed job).

    ``cap_per_gpu_hour`` sets the budget: a lease of ``n`` GPUs at price ``p`` is allowed when
    ``p * n <= cap * gpus`` (a host renting no fewer than its minimum may cost more GPUs than asked). An
    interruptible job pays ``bid_per_gpu_hour``, or with none each host's minimum bid (as an order without a
    bid does). ``models`` empty means any model with ``min_memory_gb``.
    """

    job_id: str
    gpus: int
    minutes: int
    kind: LeaseKind
    cap_per_gpu_hour: Decimal
    submitted: int
    max_wait: int = 0
    models: frozenset[str] = frozenset()
    min_memory_gb: int = 0
    bid_per_gpu_hour: Decimal | None = None
    checkpointed: bool = False
    restart_minutes: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise SchedulingError(f"job {self.job_id}: gpus must be at least 1, not {self.gpus}")
        if self.minutes < 1:
            raise SchedulingError(f"job {self.job_id}: minutes must be at least 1, not {self.minutes}")
        if self.max_wait < 0 or self.restart_minutes < 0:
            raise SchedulingError(f"job {self.job_id}: max_wait and restart_minutes cannot be negative")
        if self.bid_per_gpu_hour is not None and (self.kind is LeaseKind.ON_DEMAND or self.bid_per_gpu_hour <= 0):
            raise SchedulingError(f"job {self.job_id}: bid_per_gpu_hour must be positive, on an interruptible job")

    @property
    def wait_until(self) -> int:
        """The last minute it may start."""
        return self.submitted + self.max_wait

    @property
    def run_minutes(self) -> int:
        return self.restart_minutes + self.minutes


@dataclasses.dataclass(frozen=True)
class Running:
    """A lease running ``job`` on ``gpu_indexes`` of a host since ``started``, at a locked price."""

    job: Job
    gpu_indexes: tuple[int, ...]
    started: int
    price_per_gpu_hour: Decimal

    @property
    def ends(self) -> int:
        return self.started + self.job.run_minutes

    @property
    def gpus(self) -> int:
        return len(self.gpu_indexes)

    def work_done(self, now: int, *, checkpoint_every: int) -> int:
        """Minutes of work saved if stopped at ``now``: none without checkpoints, else up to the last one
        (``checkpoint_every`` 0: continuously)."""
        if not self.job.checkpointed:
            return 0
        worked = max(0, min(now - self.started - self.job.restart_minutes, self.job.minutes))
        return worked if checkpoint_every <= 0 else worked - worked % checkpoint_every


@dataclasses.dataclass(frozen=True)
class HostView:
    """One machine now. ``min_gpus_per_lease == gpus`` means it is sold whole only. ``idle_since`` is the
    minute its last lease ended (``None`` while one runs); ``work_rate`` is useful work per GPU-hour."""

    host_id: int
    gpu_model: str
    gpu_memory_gb: int
    gpus: int
    min_gpus_per_lease: int
    list_price: Decimal
    min_bid: Decimal
    work_rate: float = 1.0
    price_rule: PriceFallRule = NO_FALL
    idle_since: int | None = None
    running: tuple[Running, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.min_gpus_per_lease <= self.gpus:
            raise SchedulingError(f"host {self.host_id}: min_gpus_per_lease must be 1 to {self.gpus}")
        held = [i for lease in self.running for i in lease.gpu_indexes]
        if len(held) != len(set(held)) or any(not 0 <= i < self.gpus for i in held):
            raise SchedulingError(f"host {self.host_id}: running leases hold a GPU twice or beyond its {self.gpus}")


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    pack_tolerance: float = 0.10
    restart_minutes: int = 5  # relaunch and reload of a checkpointed job that resumes
    checkpoint_every: int = 30  # a preempted checkpointed job keeps its work up to the last checkpoint
    preempt: bool = True
    move: bool = True


@dataclasses.dataclass(frozen=True)
class Placement:
    job: Job
    host_id: int
    gpu_indexes: tuple[int, ...]
    price_per_gpu_hour: Decimal


@dataclasses.dataclass(frozen=True)
class Preemption:
    """``lease`` stopped on ``host_id`` for an on-demand job; ``resumed`` is the work it has left."""

    lease: Running
    host_id: int
    resumed: Job


@dataclasses.dataclass(frozen=True)
class Move:
    """``lease`` checkpointed and stopped on ``from_host``; its work left runs as ``to``."""

    lease: Running
    from_host: int
    to: Placement


@dataclasses.dataclass(frozen=True)
class Refusal:
    job: Job
    reason: str


@dataclasses.dataclass(frozen=True)
class Reservation:
    job_id: str
    host_id: int
    start: int
    gpus: int


@dataclasses.dataclass(frozen=True)
class Decision:
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    moves: tuple[Move, ...]
    queued: tuple[Job, ...]
    refused: tuple[Refusal, ...]
    reservation: Reservation | None


@dataclasses.dataclass
class _Host:
    view: HostView
    free: list[int]
    running: list[Running]

    @property
    def interruptible_gpus(self) -> int:
        return sum(r.gpus for r in self.running if r.job.kind is LeaseKind.INTERRUPTIBLE)

    def copy(self) -> _Host:
        return _Host(view=self.view, free=list(self.free), running=list(self.running))


def lease_size(job: Job, host: HostView) -> int:
    """GPUs a lease of ``job`` takes on ``host``: what it asks, at least the host's minimum, all of a
    machine sold whole; 0 when the host is too small."""
    if job.gpus > host.gpus:
        return 0
    return host.gpus if host.min_gpus_per_lease == host.gpus else max(job.gpus, host.min_gpus_per_lease)


def _suits(job: Job, host: HostView) -> bool:
    return (not job.models or host.gpu_model in job.models) and host.gpu_memory_gb >= job.min_memory_gb


def _price(job: Job, host: _Host, *, free: int, now: int) -> Decimal | None:
    """What ``job`` pays per GPU-hour on ``host`` with ``free`` GPUs free before it, or None if refused there."""
    view = host.view
    size = lease_size(job, view)
    idle = (now - view.idle_since) / 60 if view.idle_since is not None and free == view.gpus else 0.0
    price = fallen_price(view.list_price, view.price_rule, free_gpus=free, total_gpus=view.gpus, idle_hours=idle)
    if job.kind is LeaseKind.INTERRUPTIBLE:
        bid = view.min_bid if job.bid_per_gpu_hour is None else job.bid_per_gpu_hour
        # Nobody bids for a lease that can be taken from them at what a firm one costs: once the fallen
        # on-demand price reaches the bid, the machine sells no interruptible lease (as the catalogue does).
        if bid < view.min_bid or price <= bid:
            return None
        price = bid
    return price if price * size <= job.cap_per_gpu_hour * job.gpus else None


def _score(job: Job, host: HostView, price: Decimal) -> float:
    return float(price) * lease_size(job, host) / (job.gpus * host.work_rate)


class _Market:
    """The hosts within one call. A trial copy shares the hosts until it changes one (copy on write)."""

    def __init__(self, hosts: Iterable[HostView]) -> None:
        self.hosts: dict[int, _Host] = {}
        for view in hosts:
            held = {i for lease in view.running for i in lease.gpu_indexes}
            free = [i for i in range(view.gpus) if i not in held]
            self.hosts[view.host_id] = _Host(view=view, free=free, running=list(view.running))
        self._shared: set[int] = set()

    def copy(self) -> _Market:
        other = _Market(())
        other.hosts = dict(self.hosts)
        other._shared = set(self.hosts)
        return other

    def _own(self, host_id: int) -> _Host:
        if host_id in self._shared:
            self._shared.discard(host_id)
            self.hosts[host_id] = self.hosts[host_id].copy()
        return self.hosts[host_id]

    def take(self, host_id: int, job: Job, price: Decimal, now: int) -> Placement:
        host = self._own(host_id)
        size = lease_size(job, host.view)
        host.free.sort()
        taken, host.free = tuple(host.free[:size]), host.free[size:]  # the lowest free indexes, as GPU holds do
        host.running.append(Running(job=job, gpu_indexes=taken, started=now, price_per_gpu_hour=price))
        return Placement(job=job, host_id=host_id, gpu_indexes=taken, price_per_gpu_hour=price)

    def stop(self, host_id: int, lease: Running) -> None:
        host = self._own(host_id)
        host.running.remove(lease)
        host.free.extend(lease.gpu_indexes)


def _leaves_room(host: _Host, job: Job, size: int, stopped: int, now: int, reservation: Reservation | None) -> bool:
    """Whether ``job`` starting now on ``host`` (taking ``size`` GPUs, after stopping ``stopped`` GPUs of
    interruptible leases) leaves the reservation its GPUs at its start: EASY backfill's rule."""
    if (
        reservation is None
        or reservation.job_id == job.job_id
        or reservation.host_id != host.view.host_id
        or job.kind is LeaseKind.INTERRUPTIBLE  # preempted when the reservation starts, so it delays nothing
        or now + job.run_minutes <= reservation.start
    ):
        return True
    freed = sum(r.gpus for r in host.running if r.job.kind is LeaseKind.ON_DEMAND and r.ends <= reservation.start)
    return len(host.free) - size + freed + host.interruptible_gpus - stopped >= reservation.gpus


def _best(candidates: list[tuple[float, int, bool, int, Decimal]], tolerance: float) -> tuple[int, Decimal] | None:
    """Among (score, leftover, whole, host_id, price), the best fit within ``tolerance`` of the best score."""
    if not candidates:
        return None
    best = min(c[0] for c in candidates)
    close = [c for c in candidates if c[0] <= best * (1 + tolerance)]
    pick = min(close, key=lambda c: (c[1], c[2], c[0], c[3]))
    return pick[3], pick[4]


def _place_free(
    job: Job,
    market: _Market,
    now: int,
    reservation: Reservation | None,
    settings: SchedulerSettings,
    exclude: int | None = None,
) -> tuple[int, Decimal] | None:
    candidates = []
    for host in market.hosts.values():
        if len(host.free) < job.gpus:  # a lease is never smaller than the job: the cheap test first
            continue
        view = host.view
        size = lease_size(job, view)
        if view.host_id == exclude or not size or len(host.free) < size or not _suits(job, view):
            continue
        price = _price(job, host, free=len(host.free), now=now)
        if price is None or not _leaves_room(host, job, size, 0, now, reservation):
            continue
        whole = len(host.free) == view.gpus
        candidates.append((_score(job, view, price), len(host.free) - size, whole, view.host_id, price))
    return _best(candidates, settings.pack_tolerance)


def _preemptible(host: _Host, need: int) -> list[Running] | None:
    """The fewest interruptible leases, lowest bids first, that free ``need`` more GPUs; None if they cannot."""
    if need <= 0:
        return []
    bids = sorted(
        (r for r in host.running if r.job.kind is LeaseKind.INTERRUPTIBLE),
        key=lambda r: (r.price_per_gpu_hour, -r.started, r.job.job_id),
    )
    chosen, freed = [], 0
    for lease in bids:
        if freed >= need:
            break
        chosen.append(lease)
        freed += lease.gpus
    return chosen if freed >= need else None


def _place_preempting(
    job: Job, market: _Market, now: int, reservation: Reservation | None, settings: SchedulerSettings
) -> tuple[int, list[Running], Decimal] | None:
    best: tuple[tuple[int, float, int, int], int, list[Running], Decimal] | None = None
    for host in market.hosts.values():
        view = host.view
        size = lease_size(job, view)
        if not size or not _suits(job, view) or len(host.free) >= size:
            continue
        stopped = _preemptible(host, size - len(host.free))
        if not stopped:
            continue
        freed = sum(r.gpus for r in stopped)
        price = _price(job, host, free=len(host.free) + freed, now=now)
        if price is None or not _leaves_room(host, job, size, freed, now, reservation):
            continue
        key = (freed, _score(job, view, price), len(host.free) + freed - size, view.host_id)
        if best is None or key < best[0]:
            best = (key, view.host_id, stopped, price)
    return None if best is None else (best[1], best[2], best[3])


def _resumed(lease: Running, now: int, settings: SchedulerSettings, *, planned: bool) -> Job:
    """The work ``lease`` has left when stopped at ``now``; a planned stop (a move) checkpoints first."""
    every = 0 if planned else settings.checkpoint_every
    done = lease.work_done(now, checkpoint_every=every)
    return dataclasses.replace(
        lease.job,
        minutes=max(1, lease.job.minutes - done),
        submitted=now,
        restart_minutes=settings.restart_minutes if lease.job.checkpointed else 0,
    )


def _movable(lease: Running, now: int) -> bool:
    """A checkpointed on-demand lease that started before this call (one placed in it is simply placed again)."""
    return lease.job.checkpointed and lease.job.kind is LeaseKind.ON_DEMAND and lease.started < now


def _place_moving(
    job: Job, market: _Market, now: int, reservation: Reservation | None, settings: SchedulerSettings
) -> tuple[_Market, list[Move], list[Running], int, Decimal] | None:
    """Free one host for ``job`` by moving its checkpointed leases elsewhere (and preempting its bids); the
    market after the moves, with what moved and what was preempted; None when no host can be freed."""
    options = []
    for host in market.hosts.values():
        view = host.view
        size = lease_size(job, view)
        if not size or not _suits(job, view):
            continue
        movable = sum(r.gpus for r in host.running if _movable(r, now))
        if movable and len(host.free) + host.interruptible_gpus + movable >= size:
            options.append((movable, view.host_id))
    for _, host_id in sorted(options)[:3]:
        trial = market.copy()
        host = trial.hosts[host_id]
        size = lease_size(job, host.view)
        moves: list[Move] = []
        leases = sorted((r for r in host.running if _movable(r, now)), key=lambda r: (r.gpus, r.job.job_id))
        for lease in leases:
            if len(host.free) + host.interruptible_gpus >= size:
                break
            resumed = _resumed(lease, now, settings, planned=True)
            target = _place_free(resumed, trial, now, reservation, settings, exclude=host_id)
            if target is None:
                break
            trial.stop(host_id, lease)
            moves.append(Move(lease=lease, from_host=host_id, to=trial.take(target[0], resumed, target[1], now)))
            host = trial.hosts[host_id]
        stopped = _preemptible(host, size - len(host.free)) if moves else None
        if stopped is None:
            continue
        freed = sum(r.gpus for r in stopped)
        price = _price(job, host, free=len(host.free) + freed, now=now)
        if price is not None and _leaves_room(host, job, size, freed, now, reservation):
            return trial, moves, stopped, host_id, price
    return None


def _reserve(job: Job, market: _Market, now: int) -> Reservation | None:
    """The earliest minute and host at which enough GPUs free up for ``job`` (bids count as free)."""
    best: tuple[int, float, int] | None = None
    size_of = 0
    for host in market.hosts.values():
        view = host.view
        size = lease_size(job, view)
        if not size or not _suits(job, view) or view.list_price * size > job.cap_per_gpu_hour * job.gpus:
            continue
        count, start = len(host.free) + host.interruptible_gpus, now
        ends = sorted((r.ends, r.gpus) for r in host.running if r.job.kind is LeaseKind.ON_DEMAND)
        for end, gpus in ends:
            if count >= size:
                break
            count, start = count + gpus, max(end, now)
        if count < size:
            continue
        key = (start, _score(job, view, view.list_price), view.host_id)
        if best is None or key < best:
            best, size_of = key, size
    return None if best is None else Reservation(job_id=job.job_id, host_id=best[2], start=best[0], gpus=size_of)


def schedule(
    *,
    now: int,
    hosts: Sequence[HostView],
    queue: Sequence[Job] = (),
    arrivals: Sequence[Job] = (),
    settings: SchedulerSettings = SchedulerSettings(),
) -> Decision:
    """Decide placements, preemptions, moves, queueing and refusals at minute ``now``; see the module docstring.

    Raises ``SchedulingError`` when two jobs share an id or a host id repeats. A queued job whose bound passed
    before ``now`` (the caller did not call at its bound) is refused without being tried.
    """
    ids = [j.job_id for j in [*queue, *arrivals]] + [r.job.job_id for h in hosts for r in h.running]
    if len(ids) != len(set(ids)):
        raise SchedulingError("job ids must be unique across the queue, the arrivals and the running leases")
    if len({h.host_id for h in hosts}) != len(hosts):
        raise SchedulingError("host ids must be unique")
    market = _Market(hosts)
    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    moves: list[Move] = []
    queued: list[Job] = []
    refused: list[Refusal] = []
    reservation: Reservation | None = None

    jobs = sorted([*queue, *arrivals], key=lambda j: (j.kind is LeaseKind.INTERRUPTIBLE, j.submitted, j.job_id))
    on_demand = [j for j in jobs if j.kind is LeaseKind.ON_DEMAND]
    bids = [j for j in jobs if j.kind is LeaseKind.INTERRUPTIBLE]

    def preempted(host_id: int, stopped: list[Running]) -> None:
        if stopped:
            failed.clear()
        for lease in stopped:
            market.stop(host_id, lease)
            resumed = _resumed(lease, now, settings, planned=False)
            preemptions.append(Preemption(lease=lease, host_id=host_id, resumed=resumed))
            bids.append(resumed)  # tried again below, behind the bids already waiting

    # Within one call the free GPUs only shrink, so a job failed to place rules out every later one of the
    # same shape with no larger budget and no shorter run; until GPUs are freed (a preemption, a move) or a
    # whole machine is split, which may make its rest a cheaper fragment.
    failed: dict[tuple[object, ...], list[tuple[Decimal, int]]] = {}

    def start(host_id: int, job: Job, price: Decimal) -> None:
        host = market.hosts[host_id]
        if len(host.free) == host.view.gpus:
            failed.clear()
        placements.append(market.take(host_id, job, price, now))

    def shape(job: Job) -> tuple[object, ...]:
        return (job.kind, job.gpus, job.models, job.min_memory_gb, job.bid_per_gpu_hour)

    def hopeless(job: Job) -> bool:
        return any(job.cap_per_gpu_hour <= cap and job.run_minutes >= run for cap, run in failed.get(shape(job), ()))

    def wait_or_refuse(job: Job) -> None:
        if now < job.wait_until:
            queued.append(job)
        else:
            bound = f"within its wait of {job.max_wait} min" if job.max_wait else "on arrival"
            refused.append(Refusal(job=job, reason=f"no host could take it {bound}"))

    for job in on_demand:
        if job.wait_until < now:
            refused.append(Refusal(job=job, reason=f"its wait bound passed at minute {job.wait_until}"))
            continue
        free = None if hopeless(job) else _place_free(job, market, now, reservation, settings)
        if free is not None:
            start(free[0], job, free[1])
            continue
        taken = (
            None
            if hopeless(job)
            else _place_preempting(job, market, now, reservation, settings)
            if settings.preempt
            else None
        )
        if taken is not None:
            preempted(taken[0], taken[1])
            start(taken[0], job, taken[2])
            continue
        moved = _place_moving(job, market, now, reservation, settings) if settings.move and not hopeless(job) else None
        if moved is not None:
            market, made, stopped, host_id, price = moved
            moves.extend(made)
            failed.clear()
            preempted(host_id, stopped)
            start(host_id, job, price)
            continue
        failed.setdefault(shape(job), []).append((job.cap_per_gpu_hour, job.run_minutes))
        wait_or_refuse(job)
        if reservation is None and queued and queued[-1] is job:
            held = _reserve(job, market, now)
            if held is not None and held.start <= job.wait_until:
                reservation = held

    index = 0
    while index < len(bids):  # grows while on-demand jobs above preempt; interruptible jobs preempt nothing
        job = bids[index]
        index += 1
        if job.wait_until < now:
            refused.append(Refusal(job=job, reason=f"its wait bound passed at minute {job.wait_until}"))
            continue
        free = None if hopeless(job) else _place_free(job, market, now, reservation, settings)
        if free is not None:
            start(free[0], job, free[1])
        else:
            failed.setdefault(shape(job), []).append((job.cap_per_gpu_hour, job.run_minutes))
            wait_or_refuse(job)
    return Decision(
        placements=tuple(placements),
        preemptions=tuple(preemptions),
        moves=tuple(moves),
        queued=tuple(queued),
        refused=tuple(refused),
        reservation=reservation,
    )
