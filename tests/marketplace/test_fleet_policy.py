"""The fleet's scaling rule (marketplace/fleets/policy.py): pure, so every case is a view in and a decision out."""

from __future__ import annotations

import datetime as dt

from marketplace.fleets.policy import Action, FleetView, RuleKind, ScalingRule, ScheduleWindow, decide

NOON = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)  # a Monday
UTIL = ScalingRule(kind=RuleKind.UTILIZATION, target=60.0)


def view(**kw: object) -> FleetView:
    base: dict[str, object] = dict(now=NOON, minimum=1, maximum=10, running=2, starting=0, desired_before=2)
    base.update(kw)
    return FleetView(**base)  # type: ignore[arg-type]


def test_it_scales_out_to_what_the_load_needs():
    decision = decide(UTIL, view(load=2 * 95.0))
    assert (decision.action, decision.desired, decision.current) == (Action.SCALE_OUT, 4, 2)
    assert "95.0% GPU utilization per replica" in decision.reason


def test_it_holds_within_the_tolerance_band():
    assert decide(UTIL, view(load=2 * 65.0)).action == Action.HOLD
    assert decide(UTIL, view(load=2 * 55.0)).action == Action.HOLD


def test_it_scales_in_only_after_the_cooldown_since_any_change():
    recent = view(running=4, desired_before=4, load=4 * 10.0, last_scale_out=NOON - dt.timedelta(seconds=300))
    held = decide(UTIL, recent)
    assert (held.action, held.desired) == (Action.HOLD, 4)
    assert "no scale-in before 12:05:00" in held.reason
    later = decide(UTIL, view(running=4, desired_before=4, load=4 * 10.0))
    assert (later.action, later.desired) == (Action.SCALE_IN, 2)  # needs 1, but in by 2 at most


def test_it_does_not_scale_in_while_replicas_start():
    decision = decide(UTIL, view(running=2, starting=2, desired_before=4, load=2 * 10.0))
    assert decision.action == Action.HOLD
    assert "2 still starting" in decision.reason


def test_a_lost_replica_is_replaced_at_once_despite_the_cooldown():
    decision = decide(UTIL, view(running=1, desired_before=2, load=60.0, last_scale_out=NOON))
    assert (decision.action, decision.desired, decision.current) == (Action.REPLACE, 2, 1)
    assert "1 replica to replace" in decision.reason


def test_scale_out_waits_for_its_cooldown_and_is_bounded():
    cooling = decide(UTIL, view(load=2 * 100.0, last_scale_out=NOON - dt.timedelta(seconds=60)))
    assert (cooling.action, cooling.desired) == (Action.HOLD, 2)
    burst = decide(UTIL, view(load=2 * 600.0, maximum=64))  # needs 20: out by max(4, 2) at most
    assert (burst.action, burst.desired) == (Action.SCALE_OUT, 6)


def test_the_maximum_and_the_budget_cap_everything():
    assert decide(UTIL, view(load=2 * 300.0, maximum=3)).desired == 3
    poor = decide(UTIL, view(load=2 * 300.0, affordable=1))
    assert (poor.action, poor.desired) == (Action.SCALE_IN, 1)
    assert "the budget allows 1" in poor.reason


def test_no_telemetry_holds_what_was_decided():
    decision = decide(UTIL, view(running=0, starting=2, load=None))
    assert (decision.action, decision.desired) == (Action.HOLD, 2)


def test_a_schedule_window_past_midnight_belongs_to_the_day_it_began():
    night = ScheduleWindow(days=frozenset({0}), start_minute=22 * 60, end_minute=6 * 60, replicas=5)
    rule = ScalingRule(kind=RuleKind.SCHEDULE, schedule=(night,))
    tuesday_3am = dt.datetime(2026, 12, 8, 3, 0, tzinfo=dt.UTC)
    assert decide(rule, view(now=tuesday_3am)).desired == 5
    assert decide(rule, view(now=NOON)).desired == 1
    wednesday_3am = dt.datetime(2026, 12, 9, 3, 0, tzinfo=dt.UTC)
    assert decide(rule, view(now=wednesday_3am)).desired == 1


def test_a_new_fleet_bringing_up_its_minimum_scales_out_rather_than_replacing():
    decision = decide(UTIL, view(running=0, desired_before=0, minimum=2))
    assert (decision.action, decision.desired, decision.current) == (Action.SCALE_OUT, 2, 0)
    assert decision.reason == "no telemetry from a running replica yet; the minimum is 2"


def test_a_raised_minimum_is_a_scale_out_that_also_names_the_replicas_lost():
    decision = decide(UTIL, view(running=1, desired_before=2, minimum=4))
    assert (decision.action, decision.desired, decision.current) == (Action.SCALE_OUT, 4, 1)
    assert decision.reason.endswith("; the minimum is 4; 1 replica to replace")


def test_a_light_load_on_the_fewest_replicas_says_so_rather_than_within_the_band():
    decision = decide(UTIL, view(running=1, desired_before=1, load=7.0))
    assert (decision.action, decision.desired) == (Action.HOLD, 1)
    assert decision.reason == "7.0% GPU utilization per replica against a target of 60: 1 is the fewest that carry it"


def test_a_heavy_load_already_answered_by_starting_replicas_holds_saying_why():
    decision = decide(UTIL, view(running=1, starting=2, desired_before=3, load=150.0))
    assert (decision.action, decision.desired) == (Action.HOLD, 3)
    assert decision.reason.endswith("the 3 ordered carry it once 2 starting run")
