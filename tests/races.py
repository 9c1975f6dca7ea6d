"""Races for concurrency tests: threads released together by a barrier, each on its own database connection
(closed when it ends), so the database's locks decide the outcome, never a sleep."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import pytest
from django.db import connection

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
