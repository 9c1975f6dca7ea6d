"""The ledger is append-only in the model, the queryset and the database, and gapless under concurrent writers."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.models import Anchor, Checkpoint, LedgerEntry, LedgerImmutable
from ledger.services import ledger_allow_wipe, ledger_append, ledger_sequence, ledger_verify


def _append(n: int, subject: str = "thing") -> None:
    for i in range(n):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=f"{subject}:{i}", payload={"i": i})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


@pytest.mark.django_db
def test_the_orm_refuses_to_change_or_delete_an_entry():
    _append(2)
    entry = LedgerEntry.objects.get(sequence=1)
    entry.kind = "forged"
    with pytest.raises(LedgerImmutable):
        entry.save()
    with pytest.raises(LedgerImmutable):
        entry.delete()
    with pytest.raises(LedgerImmutable):
        LedgerEntry.objects.filter(sequence=1).update(kind="forged")
    with pytest.raises(LedgerImmutable):
        LedgerEntry.objects.all().delete()
    assert LedgerEntry.objects.get(sequence=1).kind == "test.event"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE ledger_ledgerentry SET kind = 'forged' WHERE sequence = 1",
        "DELETE FROM ledger_ledgerentry WHERE sequence = 2",
        "DELETE FROM ledger_ledgerentry",
    ],
)
def test_the_database_refuses_raw_updates_and_deletes(sql):
    _append(2)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    assert ledger_verify().ok and LedgerEntry.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE ledger_checkpoint SET root_hash = 'forged'",
        "DELETE FROM ledger_checkpoint",
        "UPDATE ledger_anchor SET block_number = 1",
        "DELETE FROM ledger_anchor",
    ],
)
def test_checkpoints_and_anchors_are_protected_too(sql):
    now = timezone.now()
    checkpoint = Checkpoint.objects.create(
        size=1, root_hash="ab" * 32, origin="test", note="n", key_id="00000000", created_at=now
    )
    Anchor.objects.create(
        checkpoint=checkpoint, chain_id=1, tx_hash="0x" + "cd" * 32, block_number=7, block_hash="0x" + "ef" * 32,
        sender="0x" + "00" * 20, anchored_at=now,
    )  # fmt: skip
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.mark.django_db
def test_truncate_is_refused_unless_the_session_allows_a_wipe():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no TRUNCATE; its DELETE is refused above")
    _append(2)
    with pytest.raises(IntegrityError, match="append-only: TRUNCATE"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE ledger_ledgerentry")
    assert LedgerEntry.objects.count() == 2
    ledger_allow_wipe(True)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("TRUNCATE ledger_ledgerentry")
            assert LedgerEntry.objects.count() == 0
            transaction.set_rollback(True)
    finally:
        ledger_allow_wipe(False)


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_leave_a_gapless_chain():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    writers, each = 8, 25
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            barrier.wait()
            _append(each, subject=f"writer{n}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    ledger_sequence()  # whatever the writers' own calls left while another held the sequencer's lock
    assert list(LedgerEntry.objects.values_list("sequence", flat=True)) == list(range(1, writers * each + 1))
    assert ledger_verify().ok
