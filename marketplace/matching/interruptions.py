"""Expected completion time of a job on interruptible capacity: Poisson interruptions, checkpoints, restarts.

A job needs ``W`` hours of work. Interruptions arrive as a Poisson process of rate ``λ`` per wall-clock hour.
Work is saved every ``τ`` hours of work (writing a checkpoint takes ``C`` hours); an interruption loses the
work since the last checkpoint, and each restart takes ``R`` hours during which a further interruption
starts the restart over.

One segment of ``s`` hours (work plus its checkpoint write) then takes, in expectation,

    E[T(s)] = e^{λR} (e^{λs} - 1) / λ

Derivation (renewal argument): the expected wait for an uninterrupted stretch of length ``L`` is
``(e^{λL} - 1) / λ``. The first try of the segment costs ``E[min(X, s)] = (1 - e^{-λs}) / λ`` (``X`` the
time to the next interruption); with probability ``1 - e^{-λs}`` it is interrupted, after which the job
needs an uninterrupted stretch of ``R + s``. The sum simplifies to the formula above, which is the
per-segment term of J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", Future Generation Computer Systems 22(3), 2006 (doi:10.1016/j.future.2004.11.016): the total wall
time ``M e^{R/M} (e^{(τ+δ)/M} - 1) T_s/τ`` with ``M = 1/λ``, ``δ = C``, ``T_s = W``; Young (CACM 17(9),
1974) is its first-order approximation. Unlike the linear estimate "λ W (τ/2 + R)", it grows
exponentially in ``λ(τ + R)``: a job that checkpoints hourly on capacity interrupted six times an hour
needs ~300 hours per hour of work, i.e. it never finishes.

The job runs ``ceil(W/τ) - 1`` full segments of ``τ + C`` and a last one of the remaining work, which writes
no checkpoint. ``τ = 0`` is continuous checkpointing (nothing but the restart is lost: the limit
``W e^{λR}``); ``τ = None`` never checkpoints (every interruption starts the whole job over). At ``λ = 0``
the answer is exactly ``W`` plus the checkpoint writes.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from marketplace.matching.types import Demand, Tolerance

FloatArray = npt.NDArray[np.float64]

# Hours lost to one interruption besides the work since the last checkpoint: relaunch, reload, warm-up.
RESTART_HOURS = 0.25
# A stateless job only loses the items in flight and a relaunch.
STATELESS_RESTART_HOURS = 0.05
# A job expected to take more than this many times its work on an offer is taken never to finish there: the
# exponential blows up fast (λ(τ + R) of 10 is already a factor of thousands), and the optimiser's costs
# must stay finite.
MAX_SLOWDOWN = 100.0
# Floating-point slack when counting whole checkpoint intervals in the work (10 / 0.1 is 100.00000000000001).
_MAX_CHECKPOINTS = 1e9
_EPS = 1e-9


def segment_hours(rates: npt.ArrayLike, segment: float, restart_hours: float) -> FloatArray:
    """Expected wall-clock hours to get ``segment`` hours done at each of ``rates`` (interruptions per hour),
    restarting (``restart_hours``) after each interruption: ``e^{λR} (e^{λs} - 1) / λ``, and ``s`` at ``λ = 0``.
    Overflow gives inf, never an error."""
    lam = np.asarray(rates, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # expm1 keeps small rates accurate: e^{λs} - 1 loses every digit when λs is below 1e-16.
        value = np.exp(lam * restart_hours) * np.expm1(lam * segment) / lam
    return np.where(lam > 0, value, float(segment))


def expected_hours(
    work_hours: float,
    rates: npt.ArrayLike,
    *,
    checkpoint_hours: float | None,
    restart_hours: float,
    checkpoint_cost_hours: float = 0.0,
) -> FloatArray:
    """Expected wall-clock hours to finish ``work_hours`` of work at each of ``rates`` (see the module
    docstring). ``checkpoint_hours``: work between checkpoints, 0 for continuous, None for never.

    ``ValueError`` names the argument when one is negative or not a number (a rate included)."""
    lam = np.asarray(rates, dtype=np.float64)
    if lam.size and not (np.all(lam >= 0) and np.all(np.isfinite(lam))):
        raise ValueError("interruption rates must be finite and at least 0")
    for name, value in (
        ("work_hours", work_hours),
        ("restart_hours", restart_hours),
        ("checkpoint_cost_hours", checkpoint_cost_hours),
        ("checkpoint_hours", 0.0 if checkpoint_hours is None else checkpoint_hours),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and at least 0, not {value!r}")
    work = float(work_hours)
    # Checkpoints more often than this many per job are continuous checkpointing for every rate, and counting
    # them would overflow (a checkpoint every 1e-311 hours).
    if checkpoint_hours and work / checkpoint_hours > _MAX_CHECKPOINTS:
        checkpoint_hours = 0.0
    if checkpoint_hours is None or checkpoint_hours >= work:
        total = segment_hours(lam, work, restart_hours)
    elif checkpoint_hours == 0:
        with np.errstate(over="ignore"):
            total = work * np.exp(lam * restart_hours)
    else:
        full = max(math.ceil(work / checkpoint_hours - _EPS) - 1, 0)
        last = max(work - full * checkpoint_hours, 0.0)
        total = full * segment_hours(lam, checkpoint_hours + checkpoint_cost_hours, restart_hours)
        total = total + segment_hours(lam, last, restart_hours)
    # Exactly the work (and its checkpoint writes) where nothing interrupts it, whatever the rounding above.
    writes = 0.0 if not checkpoint_hours else max(math.ceil(work / checkpoint_hours - _EPS) - 1, 0)
    return np.where(lam > 0, total, work + writes * checkpoint_cost_hours)


def expected_completion_hours(demand: Demand, rates: npt.ArrayLike, work_hours: float | None = None) -> FloatArray:
    """Expected wall-clock hours for ``demand``'s work (``duration_hours`` unless ``work_hours``) at each of
    ``rates``, as its interruption tolerance bears them: a checkpointed job loses the work since its last
    checkpoint (``checkpoint_interval_hours``; 0 means continuous) and a restart (``RESTART_HOURS``); a
    stateless one only a quick restart (``STATELESS_RESTART_HOURS``); a job with no tolerance starts over
    (it is never placed on interruptible capacity, but its figure keeps that meaning)."""
    work = demand.duration_hours if work_hours is None else work_hours
    if demand.interruption_tolerance == Tolerance.STATELESS:
        return expected_hours(work, rates, checkpoint_hours=0.0, restart_hours=STATELESS_RESTART_HOURS)
    if demand.interruption_tolerance == Tolerance.CHECKPOINTED:
        return expected_hours(
            work, rates, checkpoint_hours=max(demand.checkpoint_interval_hours, 0.0), restart_hours=RESTART_HOURS
        )
    return expected_hours(work, rates, checkpoint_hours=None, restart_hours=RESTART_HOURS)
