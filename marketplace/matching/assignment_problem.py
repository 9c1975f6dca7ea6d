"""The generalised assignment problem the optimiser solves (``Problem``: demands, their columns, capacity rows and
penalties; ``Solution``: a choice with its objective and certified bound), and the quick answers every solve starts
from and ends with: a regret-ordered greedy choice and its improvement by moves to cheaper columns with room."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Problem:
    """Columns sorted by demand, then cost. ``row`` is a column's capacity row, -1 for unlimited stock;
    ``units`` is what the column takes of that row (instances, or GPUs of a divisible listing or a pool)."""

    demand: IntArray
    row: IntArray
    units: FloatArray
    cost: FloatArray
    capacity: FloatArray
    unplaced: FloatArray
    starts: IntArray  # columns of demand d are starts[d]:starts[d + 1]
    label: IntArray  # the caller's id of each column (an offer's index), kept in the sorted order
    # Per demand, a lower bound on the cost of every column of it left out of the problem (the cheapest
    # one left out; inf when none was): what keeps the bound valid for the whole problem when only each
    # demand's cheapest columns were built (see ``assignment.build_problem``'s ``keep``).
    floor: FloatArray

    @classmethod
    def build(
        cls,
        demand: npt.ArrayLike,
        row: npt.ArrayLike,
        units: npt.ArrayLike,
        cost: npt.ArrayLike,
        capacity: npt.ArrayLike,
        unplaced: npt.ArrayLike,
        label: npt.ArrayLike | None = None,
        presorted: bool = False,
        floor: npt.ArrayLike | None = None,
    ) -> Problem:
        """Columns in any order, or already by demand then cost when ``presorted`` (a sort of millions of
        columns is the slowest step otherwise). ``floor``: per demand, a lower bound on the cost of any
        column of it not given (default inf: every column is given)."""
        d = np.asarray(demand, dtype=np.int64)
        c = np.asarray(cost, dtype=np.float64)
        penalty = np.asarray(unplaced, dtype=np.float64)
        labels = np.arange(len(c)) if label is None else np.asarray(label, dtype=np.int64)
        rows = np.asarray(row, dtype=np.int64)
        amounts = np.asarray(units, dtype=np.float64)
        if not presorted:
            order = np.lexsort((c, d))
            d, c, rows, amounts, labels = d[order], c[order], rows[order], amounts[order], labels[order]
        return cls(
            demand=d,
            row=rows,
            units=amounts,
            cost=c,
            capacity=np.asarray(capacity, dtype=np.float64),
            unplaced=penalty,
            starts=np.searchsorted(d, np.arange(len(penalty) + 1)).astype(np.int64),
            label=labels,
            floor=np.full(len(penalty), np.inf) if floor is None else np.asarray(floor, dtype=np.float64),
        )

    @property
    def n_demands(self) -> int:
        return len(self.unplaced)

    @property
    def n_columns(self) -> int:
        return len(self.cost)

    def columns_of(self, d: int) -> slice:
        return slice(int(self.starts[d]), int(self.starts[d + 1]))

    def objective(self, choice: IntArray) -> float:
        placed = choice >= 0
        return float(self.cost[choice[placed]].sum() + self.unplaced[~placed].sum())

    def fits(self, choice: IntArray) -> bool:
        """True when ``choice`` respects every capacity and gives each demand one of its own columns."""
        placed = choice[choice >= 0]
        if np.any(self.demand[placed] != np.flatnonzero(choice >= 0)):
            return False
        rows = self.row[placed]
        limited = rows >= 0
        used = np.bincount(rows[limited], weights=self.units[placed][limited], minlength=len(self.capacity))
        return bool(np.all(used <= self.capacity + 1e-9))


@dataclass(frozen=True, eq=False)
class Solution:
    choice: IntArray  # per demand, its column or -1
    objective: float
    lower_bound: float
    gap: float
    method: str
    optimal: bool
    seconds: float


def residual_of(problem: Problem, choice: IntArray) -> FloatArray:
    residual = problem.capacity.copy()
    placed = choice[choice >= 0]
    rows = problem.row[placed]
    np.subtract.at(residual, rows[rows >= 0], problem.units[placed][rows >= 0])
    return residual


def take_cheapest(problem: Problem, d: int, residual: FloatArray, candidates: IntArray | None = None) -> int:
    """The cheapest column of ``d`` (among ``candidates`` if given) that fits the residual capacity and
    beats leaving it unplaced, taken (residual updated); -1 if none."""
    cols = np.arange(problem.starts[d], problem.starts[d + 1]) if candidates is None else candidates
    if cols.size == 0:
        return -1
    room = np.append(residual, np.inf)[problem.row[cols]]  # row -1 (unlimited) reads the appended inf
    ok = (room >= problem.units[cols] - 1e-9) & (problem.cost[cols] < problem.unplaced[d])
    if not ok.any():
        return -1
    j = int(cols[np.argmax(ok)])  # columns are in cost order
    if problem.row[j] >= 0:
        residual[problem.row[j]] -= problem.units[j]
    return j


def greedy(problem: Problem, order: npt.ArrayLike | None = None) -> IntArray:
    """Each demand in turn takes its cheapest column with room. Default order: largest regret first
    (the demands that lose most by missing their best column go first)."""
    n = problem.n_demands
    if order is None:
        best = np.full(n, np.inf)
        second = problem.unplaced.copy()
        has = problem.starts[1:] > problem.starts[:-1]
        best[has] = problem.cost[problem.starts[:-1][has]]
        two = (problem.starts[1:] - problem.starts[:-1]) >= 2
        second[two] = np.minimum(second[two], problem.cost[problem.starts[:-1][two] + 1])
        order = np.argsort(-(second - np.where(has, best, second)), kind="stable")
    residual = problem.capacity.copy()
    choice = np.full(n, -1, dtype=np.int64)
    for d in np.asarray(order, dtype=np.int64):
        choice[d] = take_cheapest(problem, int(d), residual)
    return choice


def improve(problem: Problem, choice: IntArray, deadline: float) -> IntArray:
    """Move demands to cheaper columns that have room, until no move helps or time runs out."""
    choice = choice.copy()
    residual = residual_of(problem, choice)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for d in range(problem.n_demands):
            current = int(choice[d])
            current_cost = problem.unplaced[d] if current < 0 else problem.cost[current]
            cols = np.arange(problem.starts[d], problem.starts[d + 1])
            cols = cols[problem.cost[cols] < current_cost - 1e-9]
            if cols.size == 0:
                continue
            if current >= 0 and problem.row[current] >= 0:
                residual[problem.row[current]] += problem.units[current]
            j = take_cheapest(problem, d, residual, cols)
            if j < 0:
                if current >= 0 and problem.row[current] >= 0:
                    residual[problem.row[current]] -= problem.units[current]
                continue
            choice[d] = j
            improved = True
    return choice
