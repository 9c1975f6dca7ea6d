"""Races for concurrency tests: threads released together by a barrier, each on its own database connection
(closed when it ends), so the database's locks decide the outcome, never a sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import pytest
from django.db import connection, models, transaction

T = TypeVar("T")


def require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")


def race(works: Sequence[Callable[[], T]]) -> tuple[list[T], list[BaseException]]:
    """Run each of ``works`` in its own thread, all released at once; what they returned and what they raised,
    each in the order they finished."""
    barrier = threading.Barrier(len(works))
    results: list[T] = []
    errors: list[BaseException] = []

    def run(work: Callable[[], T]) -> None:
        try:
            barrier.wait()
            results.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def race_same(count: int, work: Callable[[], T]) -> tuple[list[T], list[BaseException]]:
    """``race`` with ``count`` copies of one ``work``."""
    return race([work] * count)


def _queued_on(row: models.Model) -> int:
    """Sessions (other than this one) waiting for ``row``'s lock, or first in line for it: PostgreSQL gives each
    a tuple lock on the row's table while it waits for the holder's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'tuple' AND relation = %s::regclass "
            "AND pid <> pg_backend_pid()",
            [row._meta.db_table],
        )
        return int(cursor.fetchone()[0])


def race_behind_row_lock(row: models.Model, works: Sequence[Callable[[], T]]) -> tuple[list[T], list[BaseException]]:
    """``race``, but this session holds ``row``'s lock (SELECT ... FOR UPDATE) until every work still running
    waits for it: each got as far as that lock (everything it read before was read with the row untouched),
    and then they go past it one by one in the order the database picks. A work that ends without the row is
    not waited for."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run(work: Callable[[], T]) -> None:
        try:
            results.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(work,)) for work in works]
    with transaction.atomic():
        type(row)._default_manager.select_for_update().get(pk=row.pk)
        for thread in threads:
            thread.start()
        give_up = time.monotonic() + 120  # a safety net for a broken test, not a timing
        while _queued_on(row) < sum(thread.is_alive() for thread in threads):
            assert time.monotonic() < give_up, "the works never all queued for the row"
            threads[0].join(timeout=0.01)  # a bounded wait for the next one to queue, never a fixed sleep
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a work never finished once the row was free"
    return results, errors


@contextmanager
def advisory_lock_held(key: int) -> Iterator[None]:
    """Another session holds PostgreSQL's transaction-scoped advisory lock ``key`` for the block's length, as a
    process at work under that lock would (e.g. the ledger's sequencer)."""
    from django.db import transaction

    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
                holding.set()
                release.wait(timeout=60)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(timeout=60), errors
    try:
        yield
    finally:
        release.set()
        thread.join(timeout=60)
    assert errors == []
