"""One run of each periodic job at a time, however many beats and workers (issue 23, point 3)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection
from django.utils import timezone

from marketplace.beat import INTERVAL_HEADER, beat_schedule
from marketplace.jobs import one_at_a_time, periodic_claim, periodic_release
from marketplace.models import PeriodicRun
from marketplace.tasks import orders_sweep_task

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_a_second_run_while_the_first_holds_the_job_skips_and_a_later_one_runs():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent claims need PostgreSQL's row locks; SQLite serialises every write anyway")
    inside, leave = threading.Event(), threading.Event()
    ran: list[str] = []

    @one_at_a_time("test-job")
    def job(who: str) -> str:
        ran.append(who)
        if who == "first":
            inside.set()
            assert leave.wait(timeout=60)
        return who

    results: dict[str, str | None] = {}

    def first() -> None:
        try:
            results["first"] = job("first")
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(timeout=60)  # the first run holds the lease now
    assert job("second") is None  # a second beat's run: skipped, nothing done
    leave.set()
    thread.join()
    assert results["first"] == "first"
    assert job("third") == "third"  # the lease was given back
    assert ran == ["first", "third"]
    row = PeriodicRun.objects.get(name="test-job")
    assert (row.runs, row.skipped, row.holder) == (2, 1, "")


def test_a_crashed_runs_lease_lapses_at_its_time_limit():
    now = timezone.now()
    holder = periodic_claim("crashy", lease_s=360, now=now)
    assert holder is not None
    # The worker died: nobody releases it. Until the lease lapses another run skips; after, it runs.
    assert periodic_claim("crashy", lease_s=360, now=now + dt.timedelta(seconds=300)) is None
    later = periodic_claim("crashy", lease_s=360, now=now + dt.timedelta(seconds=361))
    assert later is not None
    periodic_release("crashy", holder)  # the dead run's late release cannot free the new holder's lease
    assert PeriodicRun.objects.get(name="crashy").holder == later


def test_two_beats_sending_the_same_tick_make_one_run():
    headers = {INTERVAL_HEADER: 60.0}
    first = orders_sweep_task.apply(headers=headers)
    second = orders_sweep_task.apply(headers=headers)  # the other beat's message for the same minute
    assert first.successful() and second.successful()
    assert first.result == 0 and second.result is None
    row = PeriodicRun.objects.get(name="orders-sweep")
    assert (row.runs, row.skipped) == (1, 1)
    # Sent by hand (no beat header), a run only waits its turn.
    assert orders_sweep_task.apply().result == 0


def test_the_beat_schedule_tells_each_interval_run_its_interval():
    schedule = beat_schedule({"a": {"task": "x", "schedule": 30.0}, "b": {"task": "y", "schedule": object()}})
    assert schedule["a"]["options"]["headers"] == {INTERVAL_HEADER: 30.0}
    assert "options" not in schedule["b"]  # a crontab entry has no fixed interval


# Jobs whose body serialises itself: the ledger's sequencer and checkpoint signer each take a PostgreSQL advisory
# lock (tests/ledger/test_sequencer.py, test_checkpoint_signers.py), so a second run waits or finds nothing to do.
SELF_SERIALISED = {"ledger.sequence", "ledger.checkpoint"}


def test_every_periodic_job_runs_one_at_a_time():
    from django.conf import settings

    from broker.celery import app

    app.loader.import_default_modules()
    unguarded = {
        entry["task"]
        for key, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if getattr(app.tasks[entry["task"]].run, "periodic_job", None) != key
    }
    assert unguarded == SELF_SERIALISED


def test_two_beats_sending_the_same_tick_withdraw_silent_machines_once():
    from marketplace.tasks import machines_withdraw_silent_task

    headers = {INTERVAL_HEADER: 30.0}
    first = machines_withdraw_silent_task.apply(headers=headers)
    second = machines_withdraw_silent_task.apply(headers=headers)
    assert (first.result, second.result) == (0, None)
    row = PeriodicRun.objects.get(name="machines-withdraw-silent")
    assert (row.runs, row.skipped) == (1, 1)
