"""The sequencer process paces itself by the rate entries arrive (issue 39): while they keep coming it lets about
``FOLLOW_TARGET_BATCH`` gather before a pass, within bounds, so each pass's fixed cost (a transaction, the head's
lock, a commit) is shared by many entries, and an entry never waits longer than ``FOLLOW_MAX_WAIT_S``."""

from __future__ import annotations

import pytest

from ledger.services import FOLLOW_MAX_WAIT_S, FOLLOW_TARGET_BATCH, _follow_wait


@pytest.mark.parametrize(
    ("count", "since", "expected"),
    [
        (0, 3.0, 0.02),  # nothing came: look again soon, a lone entry waits about idle_s
        (FOLLOW_TARGET_BATCH // 4, 0.02, 0.08),  # 5,000/s: about a target batch's worth of time
        (FOLLOW_TARGET_BATCH, 0.001, 0.02),  # faster than idle_s fills a batch: never below idle_s
        (1, 5.0, FOLLOW_MAX_WAIT_S),  # a trickle: never longer than the bound
    ],
)
def test_the_follower_waits_for_about_a_target_batch_within_its_bounds(count, since, expected):
    assert _follow_wait(count=count, since=since, idle_s=0.02) == pytest.approx(expected)


def test_an_idle_look_longer_than_the_bound_is_kept():
    assert _follow_wait(count=5, since=10.0, idle_s=1.0) == 1.0
