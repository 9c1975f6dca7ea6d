"""What every Celery task of the market shares: delivery options, sweeps that stop at their soft time limit,
retry backoff, and ``enqueue``, which sends a task by its name.

Services queue follow-up work through ``enqueue`` rather than importing task modules, so the import graph runs
one way, tasks -> services (each app's ``tasks.py`` lives beside the services it calls).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from celery import current_app, current_task
from celery.exceptions import SoftTimeLimitExceeded
from django.db import transaction

log = logging.getLogger(__name__)

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True}
# A whole cloud's catalogue (many regions, paged calls, each bounded by its client's deadline) may take longer
# than the app-wide limit (CELERY_TASK_SOFT_TIME_LIMIT); the other tasks here keep that one.
SYNC_LIMITS = {"soft_time_limit": 900, "time_limit": 960}


_sweep_deadline: ContextVar[float | None] = ContextVar("sweep_deadline", default=None)


def stops_at_soft_limit(sweep: Callable[..., Any]) -> Callable[..., Any]:
    """A sweep that reaches its soft time limit stops there and returns None: each item it finished was its own
    transaction and stays done, and the next run (the beat's) carries on."""

    @functools.wraps(sweep)
    def run(*args: Any, **kwargs: Any) -> Any:
        # The limits a message carries (the sender's settings) are the ones the worker enforces.
        hard_soft = getattr(getattr(current_task, "request", None), "timelimit", None) or (None, None)
        limit = hard_soft[1] or current_app.conf.task_soft_time_limit
        token = _sweep_deadline.set(time.monotonic() + limit if limit else None)
        try:
            return sweep(*args, **kwargs)
        except SoftTimeLimitExceeded:
            log.warning("%s stopped at its soft time limit; the next run carries on", sweep.__name__)
            return None
        finally:
            _sweep_deadline.reset(token)

    return run


def sweep_time_check() -> None:
    """Before each item of a sweep: past the soft limit, stop. The limit's own exception may never reach the
    sweep: an SDK that catches every exception during a request (botocore turns it into a retryable
    HTTPClientError) returns a ProviderError instead, once its call gives up."""
    deadline = _sweep_deadline.get()
    if deadline is not None and time.monotonic() >= deadline:
        raise SoftTimeLimitExceeded()


def backoff(retries: int) -> float:
    return float(min(60, 2 ** (retries + 1)))


def enqueue(name: str, *args: Any, countdown: float | None = None, eta: datetime | None = None) -> None:
    """Queue the task called ``name`` (``marketplace.order_provision``...) with ``args``, as its ``delay`` would
    (run in process where tasks run eagerly, as in tests), to run ``countdown`` seconds from now or at ``eta``
    when given (on the queue its route names either way)."""
    task = current_app.tasks[name]
    if countdown is None and eta is None:
        task.delay(*args)
    else:
        task.apply_async(args, countdown=countdown, eta=eta)


def enqueue_on_commit(name: str, *args: Any, countdown: float | None = None, eta: datetime | None = None) -> None:
    """``enqueue`` once the current transaction commits (at once outside one): the task then reads what the
    transaction wrote, and a rolled-back change queues nothing."""
    transaction.on_commit(lambda: enqueue(name, *args, countdown=countdown, eta=eta))
