"""An order's measured availability over a period: pure arithmetic on intervals (no ORM, no clock).

The service window is when the order should have been usable: from its first machine's ready report (or the
period's start) to its end (or the period's end), less the stretches its buyer had it stopped, which are neither
service nor outage. Outages of every cause are clipped to the window and merged, so two causes seen at once (the
agent silent while SSH fails too) count once. Availability is the share of the window not in an outage; an empty
window is 100 % (nothing was owed).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

Interval = tuple[dt.datetime, dt.datetime]
# Four places of a percent: a month is 2.6 million seconds, so one second moves the fourth place.
PCT_PLACES = Decimal("0.0001")


@dataclass(frozen=True)
class Measured:
    """What was measured over a window: seconds of service owed, seconds down within them, and the share up."""

    measured_seconds: int
    down_seconds: int

    @property
    def availability_pct(self) -> Decimal:
        """Percent up, rounded down to four places: a measurement never rounds up past a tier's threshold."""
        if self.measured_seconds <= 0:
            return Decimal(100)
        up = Decimal(self.measured_seconds - self.down_seconds) * 100 / Decimal(self.measured_seconds)
        return up.quantize(PCT_PLACES, rounding=ROUND_FLOOR)


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals' union as disjoint intervals in order (empty or reversed ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def clipped(intervals: Iterable[Interval], low: dt.datetime, high: dt.datetime) -> list[Interval]:
    """Each interval cut to [low, high); those outside it dropped."""
    return [(max(s, low), min(e, high)) for s, e in intervals if min(e, high) > max(s, low)]


def subtract(base: list[Interval], holes: Iterable[Interval]) -> list[Interval]:
    """``base`` (disjoint, ordered) with every ``hole`` cut out of it."""
    result = list(base)
    for hole_start, hole_end in merged(holes):
        cut: list[Interval] = []
        for start, end in result:
            if hole_end <= start or hole_start >= end:
                cut.append((start, end))
                continue
            if start < hole_start:
                cut.append((start, hole_start))
            if hole_end < end:
                cut.append((hole_end, end))
        result = cut
    return result


def _seconds(intervals: Iterable[Interval]) -> int:
    return int(sum((end - start).total_seconds() for start, end in intervals))


def availability(
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    outages: Iterable[tuple[dt.datetime, dt.datetime | None]],
    stopped: Iterable[tuple[dt.datetime, dt.datetime | None]] = (),
) -> Measured:
    """Measure a window. An outage or stop still open (end None) lasts to ``window_end``. Outages overlapping
    each other count once; time stopped by the buyer is out of the window, down or not."""
    if window_end <= window_start:
        return Measured(0, 0)
    service = subtract([(window_start, window_end)], ((s, e or window_end) for s, e in stopped))
    down = merged(clipped(((s, e or window_end) for s, e in outages), window_start, window_end))
    down_in_service: list[Interval] = []
    for start, end in service:
        down_in_service += clipped(down, start, end)
    return Measured(measured_seconds=_seconds(service), down_seconds=_seconds(down_in_service))
