"""A fleet's scaling rule as a pure function: what the fleet sees now, in, how many replicas it should hold and
why, out. No ORM, no I/O, no clock (``now`` is an argument), so the live fleets and the day-long simulation in
``bench/fleets.py`` decide with the same code.

The rule follows Kubernetes' HorizontalPodAutoscaler where that has an answer (the replicas a load needs are
``ceil(load / target)``; no change while the load per replica is within a tolerance of the target, 10 % by
default), and adds what a fleet of paid machines needs besides:

* **Hysteresis and cooldowns, so it never flaps.** A rule-driven scale-out waits ``scale_out_cooldown_s`` after
  the previous scale-out; a scale-in waits ``scale_in_cooldown_s`` after any change, and never happens while
  replicas are still starting (their load is not known yet). A change is also bounded per decision.
* **Replacement is not scaling.** A replica the fleet lost (preempted, failed, silent and ended) is replaced at
  once, cooldown or not: the fleet returns to what it last decided (``desired_before``).
* **Money first.** ``affordable`` (what the buyer's budget lets the fleet hold) caps everything, the minimum too.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from dataclasses import dataclass, field

# A fleet holds at most this many replicas: a few hundred GPUs, past any one buyer's sensible autoscaling.
MAX_REPLICAS = 64


class RuleKind(enum.StrEnum):
    """What drives the fleet: the replicas' mean GPU utilization, a metric the workload reports, or the clock."""

    UTILIZATION = "utilization"
    METRIC = "metric"
    SCHEDULE = "schedule"


class Action(enum.StrEnum):
    """What a decision does to the fleet."""

    HOLD = "hold"
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    REPLACE = "replace"


@dataclass(frozen=True)
class ScheduleWindow:
    """``replicas`` from ``start_minute`` (inclusive) to ``end_minute`` (exclusive), minutes after midnight UTC,
    on ``days`` (0 = Monday). A window whose end is not after its start runs past midnight into the next day."""

    days: frozenset[int]
    start_minute: int
    end_minute: int
    replicas: int

    def covers(self, now: dt.datetime) -> bool:
        minute = now.hour * 60 + now.minute
        if self.start_minute < self.end_minute:
            return now.weekday() in self.days and self.start_minute <= minute < self.end_minute
        # Past midnight: the evening part belongs to today's weekday, the morning part to yesterday's.
        if minute >= self.start_minute:
            return now.weekday() in self.days
        return minute < self.end_minute and (now.weekday() - 1) % 7 in self.days


@dataclass(frozen=True)
class ScalingRule:
    """How a fleet follows its load. ``target`` is per replica: mean GPU utilization in percent for
    ``UTILIZATION``, the metric's value for ``METRIC`` (e.g. 40 requests/s, or 10 queued jobs, per replica)."""

    kind: RuleKind
    target: float = 60.0
    tolerance: float = 0.1
    window_s: int = 300
    scale_out_cooldown_s: int = 180
    scale_in_cooldown_s: int = 600
    # Per decision: out by at most max(step_out, current) (so a fleet may double), in by at most step_in.
    step_out: int = 4
    step_in: int = 2
    schedule: tuple[ScheduleWindow, ...] = field(default=())


@dataclass(frozen=True)
class FleetView:
    """What the fleet sees at ``now``.

    ``running`` replicas are up and reporting; ``starting`` are ordered and not yet running. ``load`` is the
    total the rule reads over its window, in the target's unit: the sum over running replicas of their mean GPU
    utilization (so 3 replicas at 80 % are 240), or the metric's total over the fleet. None when nothing has
    reported yet. ``desired_before`` is what the previous decision asked for; ``affordable`` the most replicas
    the budget allows now (None: no budget)."""

    now: dt.datetime
    minimum: int
    maximum: int
    running: int
    starting: int
    desired_before: int
    load: float | None = None
    affordable: int | None = None
    last_scale_out: dt.datetime | None = None
    last_scale_in: dt.datetime | None = None


@dataclass(frozen=True)
class Decision:
    """How many replicas the fleet should hold (``desired``), against how many it has (``current``), and why."""

    action: Action
    desired: int
    current: int
    reason: str

    @property
    def change(self) -> int:
        return self.desired - self.current


def _cooling(last: dt.datetime | None, seconds: int, now: dt.datetime) -> dt.datetime | None:
    """When the cooldown that began at ``last`` ends, if it has not ended by ``now``."""
    if last is None:
        return None
    until = last + dt.timedelta(seconds=seconds)
    return until if now < until else None


def _rule_wants(rule: ScalingRule, view: FleetView, held: int) -> tuple[int, str]:
    """What the rule alone asks for, before limits, and why."""
    if rule.kind == RuleKind.SCHEDULE:
        for window in rule.schedule:
            if window.covers(view.now):
                return window.replicas, f"the schedule asks for {window.replicas} now"
        return view.minimum, f"no schedule window is open: the minimum, {view.minimum}"
    unit = "% GPU utilization" if rule.kind == RuleKind.UTILIZATION else " (metric)"
    if view.load is None or view.running == 0:
        return held, "no telemetry from a running replica yet"
    per_replica = view.load / view.running
    needed = max(1, math.ceil(view.load / rule.target - 1e-9))
    said = f"{per_replica:.1f}{unit} per replica against a target of {rule.target:g}"
    if per_replica > rule.target * (1 + rule.tolerance):
        if needed > held:
            return needed, f"{said}: {needed} needed"
        return held, f"{said}: the {held} ordered carry it once {view.starting} starting run"
    if per_replica < rule.target * (1 - rule.tolerance):
        if needed >= held:
            return held, f"{said}: {held} is the fewest that carry it"
        if view.starting:
            return held, f"{said}, but {view.starting} still starting"
        return needed, f"{said}: {needed} enough"
    return held, f"{said}: within the ±{rule.tolerance:.0%} band"


def decide(rule: ScalingRule, view: FleetView) -> Decision:
    """The replicas the fleet should hold now. Pure and total: any view gives a decision, never an error."""
    current = view.running + view.starting
    held = min(max(view.desired_before, view.minimum), view.maximum)
    wanted, reason = _rule_wants(rule, view, held)
    if held > view.desired_before and wanted == held:
        reason = f"{reason}; the minimum is {view.minimum}"

    if wanted > held:
        until = _cooling(view.last_scale_out, rule.scale_out_cooldown_s, view.now)
        if until is not None:
            wanted, reason = held, f"{reason}; cooling down after a scale-out until {until:%H:%M:%S}"
        else:
            step = max(rule.step_out, held)
            if wanted > held + step:
                wanted, reason = held + step, f"{reason}; out by {step} at most per decision"
    elif wanted < held:
        last = max((t for t in (view.last_scale_out, view.last_scale_in) if t is not None), default=None)
        until = _cooling(last, rule.scale_in_cooldown_s, view.now)
        if until is not None:
            wanted, reason = held, f"{reason}; no scale-in before {until:%H:%M:%S}"
        elif wanted < held - rule.step_in:
            wanted, reason = held - rule.step_in, f"{reason}; in by {rule.step_in} at most per decision"

    desired = min(max(wanted, view.minimum), view.maximum, MAX_REPLICAS)
    if desired != wanted:
        reason = f"{reason}; kept within {view.minimum}..{view.maximum}"
    if view.affordable is not None and desired > view.affordable:
        desired = max(view.affordable, 0)
        reason = f"{reason}; the budget allows {desired}"

    if desired > current:
        # Lost: replicas the previous decision asked for and that are gone. Replicas the fleet never had (its
        # first minimum, a minimum raised since) are a scale-out, not a replacement.
        lost = min(view.desired_before, desired) - current
        action = Action.REPLACE if lost > 0 and desired <= view.desired_before else Action.SCALE_OUT
        if lost > 0:
            reason = f"{reason}; {lost} replica{'s' if lost != 1 else ''} to replace"
    elif desired < current:
        action = Action.SCALE_IN
    else:
        action = Action.HOLD
    return Decision(action=action, desired=desired, current=current, reason=reason)
