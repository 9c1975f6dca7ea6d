"""Batch assignment as a generalised assignment problem, solved near-optimally with a certified bound.

The problem (``assignment_problem.py``): each demand takes at most one of its columns (a feasible offer at a cost)
or stays unplaced at a penalty; the columns sharing a capacity row (an offer with finite stock, or a pool of GPUs
several offers draw on, such as an independent machine's lease sizes) may use at most its capacity, each column
taking its ``units`` of it. Minimise the total.

``solve`` answers within its time limit, always with a feasible choice:

1. a regret-ordered greedy answer, so there is one at once;
2. the LP relaxation by column generation over the cheapest columns (HiGHS through highspy, re-solving
   from its last basis as columns enter), priced against every column, with the Lagrangian bound of each
   round's duals kept, so the lower bound is valid even if time runs out before the LP converges;
3. the LP rounded (in its order of certainty, and in order of what leaving each demand out loses) and
   repaired, then improved by moving demands to cheaper columns with room, and, while the gap is above
   its target, by making room: moving the demands that fill a row elsewhere when the demand taking their
   place gains more than they lose;
4. HiGHS's MILP on the restricted problem: every column whose reduced cost is within the current gap (so,
   by the reduced-cost argument, the restricted optimum is the global one), capped per demand when that
   set is too large, under the time left.

``exact`` is HiGHS's MILP on every column under a time limit: the reference for quality, and the baseline
"HiGHS alone" the benchmark compares against.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from marketplace.matching.assignment_problem import (
    EPS,
    FloatArray,
    IntArray,
    Problem,
    Solution,
    greedy,
    improve,
    residual_of,
    take_cheapest,
)

TRACE = bool(os.environ.get("MATCHING_TRACE"))
_FIRST_COLUMNS = 30  # per demand, in the first LP
_ADD_COLUMNS = 20  # at most, per demand and round of pricing
_MILP_MAX_COLUMNS = 60_000  # in the restricted MILP
_MILP_GRACE_S = 0.1  # past its deadline before a MILP still running is abandoned


def trace(message: str) -> None:
    """Progress on stderr when MATCHING_TRACE is set: where the time of a batch goes."""
    if TRACE:
        print(message, file=sys.stderr)


_abandoned: set[threading.Thread] = set()


@atexit.register
def _wait_for_abandoned_solvers() -> None:
    """A process must not exit under a running HiGHS thread (the C++ runtime aborts): let them stop."""
    for solver in list(_abandoned):
        solver.join(60)


def _gap(objective: float, bound: float) -> float:
    if objective <= EPS:
        return 0.0
    return max(0.0, (objective - bound) / objective)


@dataclass(frozen=True, eq=False)
class _Relaxation:
    bound: float  # best valid lower bound seen (Lagrangian of each round's duals, LP value at convergence)
    converged: bool
    x: dict[int, float]  # column -> LP value, for the LP's support
    reduced: FloatArray | None  # reduced costs of every column at the final duals (converged only)
    # The least reduced cost any column left out of the problem can have at those duals (inf: none left out).
    left_out: float = np.inf


def _lagrangian(problem: Problem, adjusted: FloatArray, mu: FloatArray) -> float:
    """Σ_d min(penalty, cheapest adjusted column) + Σ_r μ_r cap_r: a lower bound for any μ ≤ 0. A column
    left out of the problem costs at least its demand's ``floor``, and its adjusted cost is no lower
    (μ ≤ 0 only adds to it), so the floor stands in for all of them and the bound holds for the whole
    problem."""
    best = np.minimum(problem.unplaced, problem.floor)
    has = problem.starts[1:] > problem.starts[:-1]
    if problem.n_columns:
        mins = np.minimum.reduceat(adjusted, problem.starts[:-1][has])
        best[has] = np.minimum(best[has], mins)
    finite = np.isfinite(problem.capacity)
    return float(best.sum() + (mu[finite] * problem.capacity[finite]).sum())


def _model(problem: Problem) -> highspy.Highs:
    """A HiGHS model with a row per demand (= 1), a row per capacity (<= capacity) and each demand's
    unplaced column; the caller adds the columns it wants (``_add_columns``)."""
    n, m = problem.n_demands, len(problem.capacity)
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(os.environ.get("HIGHS_LOG")))
    inf = highspy.kHighsInf
    lower = np.concatenate([np.ones(n), np.full(m, -inf)])
    upper = np.concatenate([np.ones(n), np.where(np.isfinite(problem.capacity), problem.capacity, inf)])
    h.addRows(n + m, lower, upper, 0, np.zeros(n + m, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
    h.addCols(
        n,
        problem.unplaced,
        np.zeros(n),
        np.ones(n),
        n,
        np.arange(n, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        np.ones(n),
    )
    return h


def _add_columns(h: highspy.Highs, problem: Problem, cols: IntArray) -> None:
    if cols.size == 0:  # no demand has a feasible offer: nothing to add (and no start index to write)
        return
    n = problem.n_demands
    rows = problem.row[cols]
    limited = rows >= 0
    per_column = 1 + limited.astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(per_column)[:-1]]).astype(np.int32)
    indices = np.empty(int(per_column.sum()), dtype=np.int32)
    values = np.empty(indices.size)
    indices[starts] = problem.demand[cols]
    values[starts] = 1.0
    second = starts[limited] + 1
    indices[second] = n + rows[limited]
    values[second] = problem.units[cols][limited]
    h.addCols(
        cols.size, problem.cost[cols], np.zeros(cols.size), np.ones(cols.size), indices.size, starts, indices, values
    )


def _relax(problem: Problem, seed: IntArray, deadline: float) -> _Relaxation:
    """The LP relaxation by column generation: HiGHS re-solves from its last basis as columns enter."""
    n = problem.n_demands
    rank_in_demand = np.arange(problem.n_columns) - problem.starts[problem.demand]
    active = np.zeros(problem.n_columns, dtype=bool)
    active[rank_in_demand < _FIRST_COLUMNS] = True
    active[seed[seed >= 0]] = True
    h = _model(problem)
    in_model = np.flatnonzero(active)
    _add_columns(h, problem, in_model)
    has = problem.starts[1:] > problem.starts[:-1]
    bound = -np.inf
    x: dict[int, float] = {}
    while True:
        lp_started = time.perf_counter()
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.01))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            trace(f"lp stopped: {h.getModelStatus()}")
            return _Relaxation(bound=max(bound, 0.0), converged=False, x=x, reduced=None)
        solution = h.getSolution()
        value = h.getInfo().objective_function_value
        trace(f"lp {in_model.size} columns {time.perf_counter() - lp_started:.3f}s value {value}")
        duals = np.asarray(solution.row_dual)
        pi, mu = duals[:n], np.minimum(duals[n:], 0.0)
        adjusted = problem.cost - problem.units * np.append(mu, 0.0)[problem.row]
        bound = max(bound, _lagrangian(problem, adjusted, mu))
        x_values = np.asarray(solution.col_value)[n:]
        support = x_values > 1e-7
        x = dict(zip(in_model[support].tolist(), x_values[support].tolist(), strict=True))
        reduced = adjusted - pi[problem.demand]
        tolerance = 1e-7 * max(1.0, abs(value) / max(n, 1))
        entering = (reduced < -tolerance) & ~active
        if not entering.any():
            # The LP value bounds the whole problem only if no column left out could enter either: each
            # costs at least its demand's floor, so none can when floor - π_d is not negative.
            left_out = float(np.min(problem.floor - pi)) if n else np.inf
            if left_out >= -tolerance:
                return _Relaxation(bound=max(bound, value), converged=True, x=x, reduced=reduced, left_out=left_out)
            trace("lp: a column left out of the problem could enter; the Lagrangian bound stands")
            return _Relaxation(bound=bound, converged=False, x=x, reduced=None)
        if time.perf_counter() > deadline:
            return _Relaxation(bound=bound, converged=False, x=x, reduced=None)
        # Per demand, its most negative column enters with every other within half of it: a few per
        # demand per round, found without sorting millions of reduced costs.
        pricing = np.where(entering, reduced, 0.0)
        most_negative = np.zeros(n)
        most_negative[has] = np.minimum.reduceat(pricing, problem.starts[:-1][has])
        new = np.flatnonzero(entering & (pricing <= 0.5 * most_negative[problem.demand]))
        if new.size > _ADD_COLUMNS * n:
            # Too many for one round: the most negative few per demand.
            by_demand = new[np.lexsort((reduced[new], problem.demand[new]))]
            first = np.searchsorted(problem.demand[by_demand], problem.demand[by_demand], side="left")
            new = by_demand[np.arange(by_demand.size) - first < _ADD_COLUMNS]
        trace(f"pricing: {new.size} columns enter")
        active[new] = True
        _add_columns(h, problem, new)
        in_model = np.concatenate([in_model, new])


def _round(problem: Problem, relaxation: _Relaxation, *, by_value: bool = False) -> IntArray:
    """Each demand in turn to its LP column with the most weight that has room. By default the demands the
    LP placed most surely go first, and one whose LP columns are full takes its cheapest column with room
    at once. ``by_value`` orders them by what the LP says leaving each out would lose (weight x penalty)
    and lets the rest take their cheapest columns with room only after every LP-guided placement, largest
    penalty first: on a GPU pool, a big job the LP split between machines then finds the room that small
    demands placed surely would otherwise have taken."""
    n = problem.n_demands
    by_demand: dict[int, list[tuple[float, int]]] = {}
    for j, v in relaxation.x.items():
        by_demand.setdefault(int(problem.demand[j]), []).append((v, j))
    certainty = np.array([max((v for v, _ in by_demand.get(d, [])), default=0.0) for d in range(n)])
    residual = problem.capacity.copy()
    choice = np.full(n, -1, dtype=np.int64)
    left: list[int] = []
    for d in np.argsort(-(certainty * problem.unplaced if by_value else certainty), kind="stable"):
        d = int(d)
        preferred = [j for _, j in sorted(by_demand.get(d, []), reverse=True)]
        j = -1
        for cand in preferred:
            r = problem.row[cand]
            if problem.cost[cand] < problem.unplaced[d] and (r < 0 or residual[r] >= problem.units[cand] - 1e-9):
                j = cand
                if r >= 0:
                    residual[r] -= problem.units[cand]
                break
        if j < 0 and by_value:
            left.append(d)
            continue
        choice[d] = j if j >= 0 else take_cheapest(problem, d, residual)
    for d in sorted(left, key=lambda d: -problem.unplaced[d]):
        choice[d] = take_cheapest(problem, d, residual)
    return choice


def _make_room(problem: Problem, choice: IntArray, deadline: float) -> IntArray:
    """Move demands to cheaper columns whose row is full, by moving the row's other demands out of the way:
    each to its cheapest column with room in another row, or unplaced, when the demand gains more than
    they lose together. ``improve`` only moves into room; this is the move a pool of GPUs needs (a 4-GPU
    job in place of two pairs that fit elsewhere). Demands with the most at stake go first."""
    choice = choice.copy()
    residual = residual_of(problem, choice)
    members: dict[int, set[int]] = {}
    for placed in np.flatnonzero(choice >= 0):
        r = int(problem.row[choice[placed]])
        if r >= 0:
            members.setdefault(r, set()).add(int(placed))

    def cost_of(d: int, j: int) -> float:
        return float(problem.unplaced[d] if j < 0 else problem.cost[j])

    def elsewhere(e: int, away: int, taken: dict[int, float]) -> int:
        """``e``'s cheapest column with room outside row ``away`` (room already promised counted), or -1."""
        cols = np.arange(problem.starts[e], problem.starts[e + 1])
        rows = problem.row[cols]
        promised = np.array([taken.get(int(r), 0.0) for r in rows]) if taken else 0.0
        room = np.append(residual, np.inf)[rows] - promised
        ok = (rows != away) & (room >= problem.units[cols] - 1e-9) & (problem.cost[cols] < problem.unplaced[e])
        return int(cols[np.argmax(ok)]) if ok.any() else -1

    moved = True
    while moved and time.perf_counter() < deadline:
        moved = False
        for index in np.argsort(-problem.unplaced, kind="stable"):
            if time.perf_counter() > deadline:
                break
            d = int(index)
            current = int(choice[d])
            # Columns are in cost order: the cheaper ones come before the current one.
            end = current if current >= 0 else int(problem.starts[d + 1])
            cols = np.arange(problem.starts[d], end)
            cols = cols[(problem.cost[cols] < cost_of(d, current) - 1e-9) & (problem.row[cols] >= 0)]
            own_row = int(problem.row[current]) if current >= 0 else -1
            for j in cols:
                if time.perf_counter() > deadline:
                    break
                r = int(problem.row[j])
                gain = cost_of(d, current) - float(problem.cost[j])
                free = residual[r] + (problem.units[current] if own_row == r else 0.0)
                need = problem.units[j] - free
                if need <= 1e-9:
                    continue  # room already: improve's move
                if own_row >= 0 and own_row != r:
                    residual[own_row] += problem.units[current]  # room d leaves behind, for the others
                plans = []
                for e in members.get(r, set()) - {d}:
                    alt = elsewhere(e, r, {})
                    loss = cost_of(e, alt) - float(problem.cost[choice[e]])
                    plans.append((loss / problem.units[choice[e]], loss, e, alt))
                plans.sort()
                freed, lost = 0.0, 0.0
                out: list[tuple[int, int]] = []
                taken: dict[int, float] = {}
                for _, loss, e, alt in plans:
                    if freed >= need - 1e-9 or lost >= gain:
                        break
                    if alt >= 0 and problem.row[alt] >= 0 and taken:
                        # Two of them may want the same room elsewhere: re-check with what is promised.
                        alt = elsewhere(e, r, taken)
                        loss = cost_of(e, alt) - float(problem.cost[choice[e]])
                    if alt >= 0 and problem.row[alt] >= 0:
                        taken[int(problem.row[alt])] = taken.get(int(problem.row[alt]), 0.0) + problem.units[alt]
                    out.append((e, alt))
                    freed += problem.units[choice[e]]
                    lost += loss
                if own_row >= 0 and own_row != r:
                    residual[own_row] -= problem.units[current]
                if freed < need - 1e-9 or lost >= gain - 1e-9:
                    continue
                for e, alt in out:
                    residual[r] += problem.units[choice[e]]
                    members[r].discard(e)
                    choice[e] = alt
                    if alt >= 0 and problem.row[alt] >= 0:
                        residual[problem.row[alt]] -= problem.units[alt]
                        members.setdefault(int(problem.row[alt]), set()).add(e)
                if own_row >= 0:
                    residual[own_row] += problem.units[current]
                    members[own_row].discard(d)
                residual[r] -= problem.units[j]
                members.setdefault(r, set()).add(d)
                choice[d] = int(j)
                moved = True
                break
    return choice


def _milp(
    problem: Problem,
    cols: IntArray,
    time_limit: float,
    start: IntArray | None = None,
    gap_target: float = 1e-6,
) -> tuple[IntArray | None, bool, float]:
    """HiGHS's MILP over ``cols`` (plus every demand's unplaced option), from the feasible ``start`` if
    given: (choice or None, proven optimal, HiGHS's dual bound)."""
    n = problem.n_demands
    built = time.perf_counter()
    h = _model(problem)
    _add_columns(h, problem, cols)
    h.changeColsIntegrality(
        cols.size,
        np.arange(n, n + cols.size, dtype=np.int32),
        np.full(cols.size, highspy.HighsVarType.kInteger),
    )
    trace(f"milp model built in {time.perf_counter() - built:.2f}s")
    deadline = built + time_limit
    h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.01))

    # HiGHS checks its own limit coarsely (a second late is common on big models); this stops it on time.
    def stop_at_deadline(event: Any) -> None:
        if time.perf_counter() > deadline:
            event.interrupt()

    h.cbMipInterrupt += stop_at_deadline
    h.cbSimplexInterrupt += stop_at_deadline
    h.setOptionValue("mip_rel_gap", gap_target)
    if start is not None:
        values = np.zeros(n + cols.size)
        position = {int(c): n + i for i, c in enumerate(cols)}
        for d, j in enumerate(start):
            values[position[int(j)] if j >= 0 else d] = 1.0
        seed = highspy.HighsSolution()
        seed.col_value = values.tolist()
        h.setSolution(seed)
    ran = time.perf_counter()
    # Our own thread, not highspy's startSolve: that one allows a single solve per process.
    solver = threading.Thread(target=h.run, daemon=True, name="highs-milp")
    solver.start()
    solver.join(max(deadline - time.perf_counter(), 0.0) + _MILP_GRACE_S)
    finished = not solver.is_alive()
    trace(f"milp ran {time.perf_counter() - ran:.2f}s: {h.getModelStatus() if finished else 'abandoned'}")
    if not finished:
        # Still inside a step HiGHS does not interrupt (presolve, cut rounds on a busy machine): answer
        # without it. The solver thread stops at its next check of the interrupt.
        _abandoned.difference_update([t for t in _abandoned if not t.is_alive()])
        _abandoned.add(solver)
        return None, False, -np.inf
    info = h.getInfo()
    bound = float(info.mip_dual_bound)
    solution = h.getSolution()
    if not solution.value_valid:
        return None, False, bound
    chosen = np.asarray(solution.col_value)[n:] > 0.5
    choice = np.full(n, -1, dtype=np.int64)
    choice[problem.demand[cols[chosen]]] = cols[chosen]
    return choice, h.getModelStatus() == highspy.HighsModelStatus.kOptimal, bound


def solve(problem: Problem, *, time_limit: float = 5.0, gap_target: float = 1e-4) -> Solution:
    """A feasible choice within ``time_limit`` seconds, with its objective, a proven lower bound and the
    gap between them (see the module docstring for the method). Stops early once the gap is at most
    ``gap_target``."""
    started = time.perf_counter()
    deadline = started + time_limit
    incumbent = greedy(problem)
    best_value = problem.objective(incumbent)
    method = "greedy"

    def adopt(choice: IntArray | None, name: str) -> None:
        nonlocal incumbent, best_value, method
        if choice is None or not problem.fits(choice):
            return
        value = problem.objective(choice)
        if value < best_value - 1e-9:
            incumbent, best_value, method = choice, value, name

    relaxation = _relax(problem, incumbent, started + 0.7 * time_limit)
    bound = relaxation.bound
    if relaxation.x:
        for by_value in (False, True):
            rounded = _round(problem, relaxation, by_value=by_value)
            adopt(improve(problem, rounded, started + 0.8 * time_limit), "lp-rounding")
    adopt(improve(problem, incumbent, started + 0.8 * time_limit), method)
    if _gap(best_value, bound) > gap_target:
        # Worth it where rows hold several units (GPU pools): the rounding leaves gaps there that one move
        # at a time into free room cannot close.
        made_room = _make_room(problem, incumbent, started + 0.8 * time_limit)
        adopt(improve(problem, made_room, started + 0.8 * time_limit), method)
    optimal = _gap(best_value, bound) < 1e-9
    remaining = deadline - time.perf_counter() - 0.05
    close_enough = _gap(best_value, bound) <= gap_target
    if not optimal and not close_enough and remaining > 0.05 and relaxation.reduced is not None:
        reduced = relaxation.reduced
        slack = best_value - bound
        within = reduced <= slack + 1e-9
        too_many = int(within.sum()) > _MILP_MAX_COLUMNS
        # Columns left out of the problem are in no restricted MILP: it certifies only if none could beat the
        # incumbent either.
        certified = not too_many and relaxation.left_out > slack + 1e-9
        if too_many:
            # The columns of smallest reduced cost overall: a selection, not a sort of millions.
            cut = np.partition(reduced, _MILP_MAX_COLUMNS)[_MILP_MAX_COLUMNS]
            within &= reduced < cut
        within[list(relaxation.x)] = True
        within[incumbent[incumbent >= 0]] = True
        # HiGHS can run most of a second past its limit (and an interrupt) in presolve on a big model.
        remaining = 0.8 * (deadline - time.perf_counter()) - 0.05
        trace(f"milp on {int(within.sum())} columns for {remaining:.2f}s")
        choice, proven, milp_bound = _milp(problem, np.flatnonzero(within), remaining, incumbent, gap_target)
        trace(f"milp done, {deadline - time.perf_counter():.2f}s to the deadline")
        adopt(choice, "milp")
        if proven and certified:
            # The restricted problem holds every column that could beat the incumbent, so its bound holds
            # for the whole problem.
            bound = max(bound, min(milp_bound, best_value))
            optimal = _gap(best_value, bound) < 1e-9
    return Solution(
        choice=incumbent,
        objective=best_value,
        lower_bound=min(bound, best_value),
        gap=0.0 if optimal else _gap(best_value, bound),
        method=method,
        optimal=optimal,
        seconds=time.perf_counter() - started,
    )


def exact(problem: Problem, *, time_limit: float = 60.0) -> Solution:
    """HiGHS's MILP over every column, nothing else: its answer (or none: choice all -1 and objective inf)
    when the time limit ends."""
    started = time.perf_counter()
    choice, proven, bound = _milp(problem, np.arange(problem.n_columns), time_limit)
    seconds = time.perf_counter() - started
    if choice is None:
        empty = np.full(problem.n_demands, -1, dtype=np.int64)
        return Solution(empty, np.inf, bound, np.inf, "highs", False, seconds)
    value = problem.objective(choice)
    if proven:
        bound = value
    return Solution(choice, value, bound, _gap(value, bound), "highs", proven, seconds)
