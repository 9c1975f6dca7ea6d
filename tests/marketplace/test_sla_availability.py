"""The availability arithmetic (issue 38): outages merged across causes, clipped to the window, open ones running
to its end, buyer-stopped time out of the window."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from marketplace.sla.availability import Measured, availability, merged, subtract

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def test_no_outage_is_full_availability():
    measured = availability(window_start=T0, window_end=T0 + 10 * H, outages=[])
    assert measured == Measured(36000, 0)
    assert measured.availability_pct == Decimal("100.0000")


def test_overlapping_outages_of_two_causes_count_once():
    silent = (T0 + H, T0 + H + 30 * M)
    ssh = (T0 + H + 10 * M, T0 + H + 40 * M)
    measured = availability(window_start=T0, window_end=T0 + 10 * H, outages=[silent, ssh])
    assert measured == Measured(36000, 40 * 60)
    assert measured.availability_pct == Decimal("93.3333")


def test_an_open_outage_runs_to_the_windows_end_and_outages_are_clipped_to_it():
    before = (T0 - H, T0 + 6 * M)
    still_open = (T0 + 9 * H, None)
    measured = availability(window_start=T0, window_end=T0 + 10 * H, outages=[before, still_open])
    assert measured == Measured(36000, 6 * 60 + 3600)


def test_buyer_stopped_time_is_out_of_the_window_even_when_an_outage_covers_it():
    stopped = [(T0 + 2 * H, T0 + 4 * H)]
    outage = (T0 + 3 * H, T0 + 5 * H)  # half of it while stopped: only the other hour counts
    measured = availability(window_start=T0, window_end=T0 + 10 * H, outages=[outage], stopped=stopped)
    assert measured == Measured(8 * 3600, 3600)
    assert measured.availability_pct == Decimal("87.5000")


def test_a_stop_still_open_ends_the_service_at_the_windows_end():
    measured = availability(window_start=T0, window_end=T0 + 10 * H, outages=[], stopped=[(T0 + 5 * H, None)])
    assert measured == Measured(5 * 3600, 0)


def test_an_empty_window_owes_nothing():
    measured = availability(window_start=T0, window_end=T0, outages=[(T0 - H, None)])
    assert measured == Measured(0, 0)
    assert measured.availability_pct == Decimal(100)


def test_availability_rounds_down_so_it_never_crosses_a_threshold_upwards():
    # 99.49999...% must read below 99.5.
    measured = Measured(measured_seconds=10_000_000, down_seconds=50_001)
    assert measured.availability_pct == Decimal("99.4999")


def test_merge_and_subtract_edges():
    assert merged([(T0 + H, T0 + 2 * H), (T0, T0 + H), (T0 + 3 * H, T0 + 3 * H)]) == [(T0, T0 + 2 * H)]
    assert subtract([(T0, T0 + 4 * H)], [(T0 + H, T0 + 2 * H), (T0 + 3 * H, T0 + 5 * H)]) == [
        (T0, T0 + H),
        (T0 + 2 * H, T0 + 3 * H),
    ]
