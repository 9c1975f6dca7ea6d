"""Where the broker's own time goes while a benchmark times an order: database round trips, ledger appends,
ranking, task hops and SDK calls, counted and timed on the benchmark's thread; SDK calls other threads make
meanwhile (the launch's preparation, ``launching._first_launch_prepare``) are counted apart, since they overlap.

``Breakdown`` wraps, for the life of the benchmark process, the few functions each part runs through:
botocore's ``BaseClient._make_api_call`` (every SDK call, its rate-limit draw and retries included), the
broker's ``ledger_append`` and ``rank_offers`` where modules imported them, ``marketplace.taskkit.enqueue``
(a task handed to the queue), and, while measuring, Django's ``execute_wrapper`` on the thread's connection.
Outside ``measuring()`` the wrappers only pass through, so the baseline's boto3 calls are not counted. The
wrappers add a few microseconds per call, to the broker's side only; the figures are what the broker spends,
not a model of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


@dataclasses.dataclass
class Tally:
    """Counts and seconds of one measured stretch (or the sum of many)."""

    total_s: float = 0.0
    sdk_calls: int = 0
    sdk_s: float = 0.0
    db_queries: int = 0  # statements (Django's savepoints among them)
    db_tx_commands: int = 0  # BEGIN and COMMIT (or ROLLBACK): round trips of their own with psycopg
    db_s: float = 0.0
    ledger_appends: int = 0
    ledger_s: float = 0.0  # inside ledger_append, its insert included
    ledger_queries: int = 0  # of db_queries, those made inside ledger_append
    ledger_db_s: float = 0.0  # of db_s, the time of those
    ranking_calls: int = 0
    ranking_s: float = 0.0
    tasks: int = 0
    tasks_s: float = 0.0
    # SDK calls other threads made for the order meanwhile (the launch's preparation): they overlap the rest
    prepared_calls: int = 0
    prepared_s: float = 0.0
    prepare_wait_s: float = 0.0  # the order's thread waiting for that preparation to finish

    def add(self, other: Tally) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def per(self, runs: int) -> Tally:
        scaled = Tally()
        for field in dataclasses.fields(self):
            setattr(scaled, field.name, getattr(self, field.name) / runs)
        return scaled

    @property
    def rest_s(self) -> float:
        """What is left: Python in the broker (building queries and rows, the adapter, the boot script)."""
        ledger_own = self.ledger_s - self.ledger_db_s
        return self.total_s - self.sdk_s - self.db_s - ledger_own - self.ranking_s - self.tasks_s - self.prepare_wait_s

    def lines(self) -> list[str]:
        """The breakdown as the benchmarks print it, per order."""
        ms = 1000
        return [
            f"SDK: {self.sdk_calls:.1f} calls, {self.sdk_s * ms:.1f} ms",
            f"database: {self.db_queries + self.db_tx_commands:.1f} round trips, {self.db_s * ms:.1f} ms: "
            f"{self.db_queries:.1f} statements and {self.db_tx_commands:.1f} BEGIN or COMMIT "
            f"(the ledger's inserts among the statements: {self.ledger_queries:.1f}, {self.ledger_db_s * ms:.1f} ms)",
            f"ledger: {self.ledger_appends:.1f} appends, {self.ledger_s * ms:.1f} ms with their inserts",
            f"ranking: {self.ranking_calls:.1f} calls, {self.ranking_s * ms:.1f} ms",
            f"task hops: {self.tasks:.1f} tasks queued, {self.tasks_s * ms:.1f} ms",
            f"beside the order's thread, the launch's preparation (image, key pair, security group): "
            f"{self.prepared_calls:.1f} SDK calls, {self.prepared_s * ms:.1f} ms, while the attempt was recorded; "
            f"then waited for: {self.prepare_wait_s * ms:.1f} ms",
            f"the rest (Python: the ORM building queries and rows, adapter, boot script): {self.rest_s * ms:.1f} ms",
        ]


class Breakdown:
    """Install once, after Django is set up; then ``with breakdown.measuring() as tally:`` around what is timed."""

    def __init__(self) -> None:
        self._local = threading.local()
        import botocore.client
        from django.db import connection
        from psycopg.pq import TransactionStatus

        import ledger.services
        import marketplace.matching
        import marketplace.orders.launching
        import marketplace.taskkit

        self._connection = connection
        self._idle = TransactionStatus.IDLE
        client_class: Any = botocore.client.BaseClient
        client_class._make_api_call = self._timed(client_class._make_api_call, "sdk_calls", "sdk_s")
        self._rebind(ledger.services.ledger_append, self._ledger(ledger.services.ledger_append))
        self._rebind(marketplace.matching.rank_offers, self._timed(marketplace.matching.rank_offers, "ranking_calls",
                                                                   "ranking_s"))  # fmt: skip
        self._rebind(marketplace.taskkit.enqueue, self._timed(marketplace.taskkit.enqueue, "tasks", "tasks_s"))
        launching: Any = marketplace.orders.launching
        launching._prepared = self._timed(launching._prepared, "", "prepare_wait_s")
        self._measured: Tally | None = None  # the tally being measured, for the SDK calls of other threads

    @staticmethod
    def _rebind(original: Callable[..., Any], wrapped: Callable[..., Any]) -> None:
        # Modules import these by name: each binding is replaced where it was made, so construct a Breakdown
        # after the broker's modules are imported.
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                if value is original:
                    setattr(module, name, wrapped)

    def _tally(self) -> Tally | None:
        return getattr(self._local, "tally", None)

    def _timed(self, function: Callable[..., Any], count: str, seconds: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            tally = self._tally()
            if tally is None and count == "sdk_calls" and self._measured is not None:
                tally, count_as, seconds_as = self._measured, "prepared_calls", "prepared_s"  # another thread's call
            else:
                count_as, seconds_as = count, seconds
            if tally is None:
                return function(*args, **kwargs)
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if count_as:
                    setattr(tally, count_as, getattr(tally, count_as) + 1)
                setattr(tally, seconds_as, getattr(tally, seconds_as) + time.perf_counter() - started)

        return timed

    def _ledger(self, function: Callable[..., Any]) -> Callable[..., Any]:
        timed = self._timed(function, "ledger_appends", "ledger_s")

        @functools.wraps(function)
        def in_ledger(*args: Any, **kwargs: Any) -> Any:
            self._local.in_ledger = True
            try:
                return timed(*args, **kwargs)
            finally:
                self._local.in_ledger = False

        return in_ledger

    def _query(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        tally = self._tally()
        # psycopg sends BEGIN, a round trip of its own, before the first statement of a transaction.
        raw = context["connection"].connection
        begins = not raw.autocommit and raw.info.transaction_status == self._idle
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if tally is not None:
                spent = time.perf_counter() - started
                tally.db_queries += 1
                tally.db_tx_commands += int(begins)
                tally.db_s += spent
                if getattr(self._local, "in_ledger", False):
                    tally.ledger_queries += 1
                    tally.ledger_db_s += spent

    def _ended(self, end: Callable[[], Any]) -> Callable[[], Any]:
        """The thread's connection's COMMIT (or ROLLBACK), counted and timed."""

        def timed() -> Any:
            tally = self._tally()
            started = time.perf_counter()
            try:
                return end()
            finally:
                if tally is not None:
                    tally.db_tx_commands += 1
                    tally.db_s += time.perf_counter() - started

        return timed

    @contextlib.contextmanager
    def measuring(self) -> Iterator[Tally]:
        """Count and time on this thread until the block ends; ``total_s`` is the block's wall time."""
        from django.db import connections

        wrapper: Any = connections["default"]
        wrapper._commit, wrapper._rollback = self._ended(wrapper._commit), self._ended(wrapper._rollback)
        tally = Tally()
        self._local.tally = self._measured = tally
        started = time.perf_counter()
        try:
            with self._connection.execute_wrapper(self._query):
                yield tally
        finally:
            tally.total_s = time.perf_counter() - started
            self._local.tally = self._measured = None
            del wrapper._commit, wrapper._rollback  # the class's own again
