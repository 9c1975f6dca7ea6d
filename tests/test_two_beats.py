"""Two beats against one broker and one worker make one run of each periodic job per interval (issue 23, point
3): real ``celery beat`` and ``celery worker`` processes on the configured broker (RabbitMQ in CI)."""

from __future__ import annotations

import sys
import time

import pytest

from broker.celery import app as celery_app
from marketplace.models import PeriodicRun
from tests.test_worker import queues_purge, worker_env, worker_start, worker_stop
from tests.waiting import wait_for

INTERVAL_S = 10  # the shortest offer-sync interval the settings accept


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_two_beats_make_one_run_per_interval(tmp_path):
    celery_app.conf.task_always_eager = False
    queues_purge()
    env = worker_env(BROKER_OFFER_SYNC_INTERVAL_S=str(INTERVAL_S), BROKER_VAR_DIR=str(tmp_path))
    worker = worker_start([sys.executable, "-m", "celery", "-A", "broker", "worker", "--pool", "solo",
                           "--loglevel", "WARNING"], env)  # fmt: skip
    beat = [sys.executable, "-m", "celery", "-A", "broker", "beat", "--loglevel", "WARNING", "--schedule"]
    beats = [worker_start([*beat, str(tmp_path / f"beat-{n}")], env) for n in (1, 2)]
    started = time.monotonic()
    try:
        job = PeriodicRun.objects.filter(name="offers-sync-all")

        def enough() -> bool:
            row = job.first()
            return row is not None and row.runs >= 2 and row.skipped >= 2

        wait_for(enough, "two runs and two skips of the offer sync", timeout=120)
        elapsed = time.monotonic() - started
    finally:
        worker_stop(*beats, worker)
        queues_purge()
    row = job.get()
    # Each interval both beats sent the job: one message ran it, the other found it had just run.
    assert row.runs <= elapsed / INTERVAL_S + 1, (row.runs, row.skipped, elapsed)
    assert row.skipped >= row.runs - 1
    assert row.holder == ""  # no run left holding it
