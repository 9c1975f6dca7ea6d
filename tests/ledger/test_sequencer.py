"""Issue 23, point 8: writers queue entries without a global lock; one sequencer at a time chains them.

Every guarantee of the old locked append holds: an entry commits or rolls back with its change (test_chain.py),
the sequence is gapless, the chain never forks, and no committed entry is left queued once the writers are done.
Writers never wait for the sequencer: it runs beside them (``ledger sequence --follow``), and here beside the
test's writers in a thread of its own, waited for by the state it leaves (nothing queued), not by a clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from ledger.models import LedgerEntry, LedgerHead
from ledger.receipts import receipt
from ledger.services import (
    SEQUENCER_LOCK_KEY,
    ledger_append,
    ledger_queued,
    ledger_sequence,
    ledger_sequence_follow,
    ledger_verify,
)
from ledger.tasks import ledger_sequence_task
from tests.races import advisory_lock_held, race_same, require_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def _write(subject: str, count: int) -> int:
    for i in range(count):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=subject, payload={"i": i})
    return count


@contextmanager
def sequencer_following() -> Iterator[list[int]]:
    """The sequencer process's loop in a thread for the block's length; at its end, waits until nothing is
    queued (a minute at most), stops the loop and yields how many entries it chained in a list."""
    stop = threading.Event()
    chained: list[int] = []

    def follow() -> None:
        try:
            chained.append(ledger_sequence_follow(stop=stop, idle_s=0.005))
        finally:
            connection.close()

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        yield chained
        deadline = time.monotonic() + 60
        while ledger_queued()[0] and time.monotonic() < deadline:  # wait for the state, not for a time
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=60)


def test_concurrent_writers_and_the_sequencer_leave_a_gapless_chain():
    """Eight writers, each entry in its own transaction, while the sequencer chains them as they commit."""
    require_postgresql()
    counter = iter(range(8))
    lock = threading.Lock()

    def writer() -> int:
        with lock:
            n = next(counter)
        return _write(f"writer:{n}", 25)

    with sequencer_following() as chained:
        written, errors = race_same(8, writer)

    assert errors == [] and sum(written) == 200 and chained == [200]
    assert ledger_queued() == (0, None)
    sequences = sorted(LedgerEntry.objects.values_list("sequence", flat=True))
    assert sequences == list(range(1, 201))
    assert LedgerHead.objects.get().size == 200
    result = ledger_verify()
    assert result.ok and result.entries_checked == 200, result.problem
    for n in range(8):  # each writer's entries keep the order it wrote them in
        payloads = list(LedgerEntry.objects.filter(subject=f"writer:{n}").values_list("payload", flat=True))
        assert payloads == [f'{{"i":{i}}}' for i in range(25)]


def test_a_writer_never_waits_for_the_sequencer_and_its_entry_is_chained_when_the_holder_lets_go():
    require_postgresql()
    with advisory_lock_held(SEQUENCER_LOCK_KEY):
        _write("order:busy", 1)  # commits; its after-commit call finds the sequencer's lock taken: no waiting

        assert LedgerEntry.objects.get(subject="order:busy").queued
        body = receipt("order:busy")
        assert body["status"] == "pending" and body["first_pending"] is None
        assert [e["kind"] for e in body["queued"]] == ["test.event"] and body["queued"][0]["entry_hash"] is None
        assert ledger_sequence() == 0  # anyone else asking also returns at once while the lock is held

    assert ledger_sequence() == 1
    assert LedgerEntry.objects.get(subject="order:busy").sequence == 1
    assert receipt("order:busy")["queued"] == []


def test_racing_sequencers_chain_each_entry_once():
    require_postgresql()
    with advisory_lock_held(SEQUENCER_LOCK_KEY):
        _write("thing:many", 50)
        assert ledger_queued()[0] == 50

    done, errors = race_same(4, ledger_sequence)

    assert errors == [] and sum(done) == 50
    assert ledger_queued() == (0, None)
    assert sorted(LedgerEntry.objects.values_list("sequence", flat=True)) == list(range(1, 51))
    assert ledger_verify().ok


def test_the_command_and_the_periodic_task_chain_what_is_queued(capsys):
    with advisory_lock_held(SEQUENCER_LOCK_KEY) if connection.vendor == "postgresql" else nullcontext():
        _write("order:late", 2)
    _write("order:later", 1)  # nothing chained these: no sequencer ran

    call_command("ledger", "sequence")
    assert "chained 3 queued entries" in capsys.readouterr().out
    _write("order:last", 1)
    assert ledger_sequence_task.delay().get() == 1
    assert ledger_queued() == (0, None) and ledger_verify().entries_checked == 4


def test_a_sequencer_called_inside_a_transaction_leaves_its_planner_settings_as_they_were():
    """The sequencer turns bitmap scans off for its own transaction (each batch would otherwise re-read every
    row chained since the last vacuum); a caller's transaction that goes on afterwards keeps the planner it had."""
    require_postgresql()
    _write("order:inside", 2)
    with transaction.atomic(), connection.cursor() as cursor:
        assert ledger_sequence() == 2
        cursor.execute("SHOW enable_bitmapscan")
        assert cursor.fetchone()[0] == "on"
    assert ledger_verify().ok
