"""The total time one adapter call may take, its retries included.

The SDKs' timeouts are per step (a connect, each wait for bytes), so a call that is retried is bounded only by
attempts x (connect + read) plus the waits between them, and raising ``max_attempts`` in an account's options
would stretch it further. A client that retries itself asks ``CallDeadline.allows_retry`` before each retry:
a retry starts only if a whole attempt, at its timeouts, still ends by the deadline. The worst case of one call
is then ``CALL_DEADLINE_S`` (per cloud in CONTRIBUTING.md). A peer that trickles bytes just inside the read
timeout is bounded by the task's time limit instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CALL_DEADLINE_S = 90.0


class CallDeadline:
    """Started when a call starts; ``attempt_s`` is one attempt's worst case (connect + read timeout)."""

    def __init__(
        self, attempt_s: float, total_s: float = CALL_DEADLINE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.attempt_s = attempt_s
        self.ends = clock() + total_s
        self._clock = clock

    def allows_retry(self, delay_s: float) -> bool:
        """Whether an attempt started after waiting ``delay_s`` would still end by the deadline."""
        return self._clock() + delay_s + self.attempt_s <= self.ends
