"""One run of each periodic job at a time, however many beats and workers there are (issue 23, point 3).

Every periodic task is wrapped in ``one_at_a_time``: before its body runs it claims the job's lease
(``PeriodicRun``) with one conditional UPDATE, which PostgreSQL serialises on the row, so a second run, from a
second beat or a beat restarted mid-run, finds the lease held and skips. A run that dies without releasing it
(the worker killed) holds it only until its hard time limit, after which nothing of it can still be running.

Runs sent by a beat carry the schedule's interval in a header (``beat_schedule`` below): such a run also skips
when another run of the job began less than ``MIN_GAP_SHARE`` of an interval ago, so two beats each sending every
tick, whatever their offset, make one run per interval, not two. Runs sent by hand (or by a test) have no header
and only wait their turn.

The beat schedule itself is built by ``marketplace/beat.py``, which the settings module imports before the apps
are loaded.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery import current_app, current_task
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from marketplace.beat import INTERVAL_HEADER
from marketplace.models.jobs import PeriodicRun

log = logging.getLogger(__name__)

# Below 1 so that a run the queue delayed a little does not make the next tick's run skip.
MIN_GAP_SHARE = 0.8


def periodic_claim(name: str, *, lease_s: float, min_gap_s: float = 0.0, now: dt.datetime | None = None) -> str | None:
    """Claim job ``name``'s lease for ``lease_s``; the holder's token, or None when another run holds it (or,
    with ``min_gap_s``, began that recently)."""
    now = now or timezone.now()
    try:
        with transaction.atomic():
            PeriodicRun.objects.get_or_create(name=name)
    except IntegrityError:
        pass  # made by a concurrent first run
    holder = uuid.uuid4().hex
    free = Q(holder="") | Q(lease_until__lt=now)
    if min_gap_s > 0:
        free &= Q(last_started_at__isnull=True) | Q(last_started_at__lte=now - dt.timedelta(seconds=min_gap_s))
    claimed = PeriodicRun.objects.filter(free, name=name).update(
        holder=holder,
        lease_until=now + dt.timedelta(seconds=lease_s),
        last_started_at=now,
        runs=F("runs") + 1,
    )
    if not claimed:
        PeriodicRun.objects.filter(name=name).update(skipped=F("skipped") + 1)
        return None
    return holder


def periodic_release(name: str, holder: str, *, now: dt.datetime | None = None) -> None:
    """Give the lease back (only if this run still holds it: a lapsed lease may have passed to another)."""
    PeriodicRun.objects.filter(name=name, holder=holder).update(
        holder="", lease_until=None, last_finished_at=now or timezone.now()
    )


def one_at_a_time(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the wrapped periodic task's body only while holding job ``name``'s lease; a run that cannot claim
    it returns None and does nothing. The lease lasts the task's hard time limit."""

    def wrap(body: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            request = getattr(current_task, "request", None)
            hard = (getattr(request, "timelimit", None) or (None, None))[0] or current_app.conf.task_time_limit
            interval = _header_interval(request)
            holder = periodic_claim(name, lease_s=float(hard or 3600), min_gap_s=interval * MIN_GAP_SHARE)
            if holder is None:
                log.info("%s: another run holds the job or began less than an interval ago; skipped", name)
                return None
            try:
                return body(*args, **kwargs)
            finally:
                periodic_release(name, holder)

        run.periodic_job = name  # type: ignore[attr-defined]  # how tests find every job wrapped
        return run

    return wrap


def _header_interval(request: Any) -> float:
    value = getattr(request, INTERVAL_HEADER, None)
    if value is None:
        headers = getattr(request, "headers", None)
        value = headers.get(INTERVAL_HEADER) if isinstance(headers, dict) else None
    try:
        interval = float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return interval if 0 < interval < 10 * 86400 else 0.0
