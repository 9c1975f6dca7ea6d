from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.canonical import canonical_bytes, entry_envelope
from ledger.models import GENESIS_HASH, LedgerEntry, LedgerHead
from ledger.services import LedgerError, ledger_append, ledger_queued, ledger_sequence, ledger_verify
from tests.ledger.tamper import triggers_bypassed


def _append(n: int) -> list[LedgerEntry]:
    """``n`` entries, each in its own change, then sequenced as their writers would right after committing
    (this test's transaction never commits, so no writer's after-commit call runs)."""
    queued = []
    for i in range(n):
        with transaction.atomic():
            queued.append(ledger_append(kind="test.event", subject=f"thing:{i}", payload={"i": i}))
    ledger_sequence()
    return [LedgerEntry.objects.get(pk=entry_id) for entry_id in queued]


@pytest.mark.django_db
def test_entries_are_chained_and_gapless():
    entries = _append(3)

    assert [e.sequence for e in entries] == [1, 2, 3]
    assert entries[0].prev_hash == GENESIS_HASH
    assert entries[1].prev_hash == entries[0].entry_hash
    assert entries[2].prev_hash == entries[1].entry_hash
    head = LedgerHead.objects.get()
    assert (head.size, head.head_hash) == (3, entries[2].entry_hash)
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_append_outside_a_transaction_is_refused():
    with pytest.raises(LedgerError):
        ledger_append(kind="x", subject="y", payload={})
    assert LedgerEntry.objects.count() == 0


@pytest.mark.django_db
def test_an_entry_is_queued_in_its_change_and_chained_by_the_sequencer():
    with transaction.atomic():
        entry_id = ledger_append(kind="test.event", subject="thing:q", payload={"i": 1})
    stored = LedgerEntry.objects.get(pk=entry_id)
    assert stored.queued and (stored.prev_hash, stored.entry_hash, stored.leaf_hash) == (None, None, "")
    assert ledger_queued()[0] == 1
    assert ledger_verify().ok  # a queued entry is not yet in the chain, and the chain is whole without it

    assert ledger_sequence() == 1

    stored = LedgerEntry.objects.get(pk=entry_id)
    assert stored.sequence == 1 and stored.prev_hash == GENESIS_HASH and len(stored.leaf_hash) == 64
    assert ledger_queued() == (0, None)
    assert ledger_sequence() == 0  # nothing left: a second run chains nothing twice


@pytest.mark.django_db
def test_the_sequencer_chains_entries_in_the_order_they_were_written():
    for i in range(5):
        with transaction.atomic():
            ledger_append(kind="test.event", subject="thing:order", payload={"i": i})
    ledger_sequence()
    payloads = list(LedgerEntry.objects.filter(subject="thing:order").values_list("sequence", "payload"))
    assert payloads == [(i + 1, f'{{"i":{i}}}') for i in range(5)]
    assert ledger_verify().ok


@pytest.mark.django_db
def test_a_sequenced_entry_cannot_be_sequenced_again_even_by_raw_sql():
    (entry,) = _append(1)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_ledgerentry SET sequence = 7 WHERE id = %s", [entry.pk])
    with transaction.atomic():
        queued_id = ledger_append(kind="test.event", subject="thing:z", payload={})
    # Only the sequencer's one change is allowed on a queued row: never its content.
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_ledgerentry SET payload = '{}', sequence = 2 WHERE id = %s", [queued_id])
    # Nor half of it: a sequence without its hashes leaves the row in no state the chain knows.
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_ledgerentry SET sequence = 2 WHERE id = %s", [queued_id])
    assert LedgerEntry.objects.get(pk=queued_id).queued and ledger_sequence() == 1 and ledger_verify().ok


@pytest.mark.django_db
def test_appends_go_on_after_a_rolled_back_change_and_are_counted_as_queries():
    # On PostgreSQL the append is a prepared statement, which the driver drops at every rollback: the next
    # append must prepare it again. Captured queries include it, as they would a statement of Django's cursor.
    with transaction.atomic():
        ledger_append(kind="test.event", subject="thing:a", payload={"i": 1})
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_append(kind="test.event", subject="thing:b", payload={"i": 2})
        raise RuntimeError("the change failed")
    seen: list[str] = []

    def watch(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(watch), transaction.atomic():
        last_id = ledger_append(kind="test.event", subject="thing:c", payload={"i": 3})
    assert sum("INSERT INTO ledger_ledgerentry" in q["sql"] for q in captured.captured_queries) == 1
    # The connection's execute wrappers see it too (bench/breakdown.py counts round trips with one).
    assert sum("INSERT INTO ledger_ledgerentry" in sql for sql in seen) == 1
    assert list(LedgerEntry.objects.order_by("id").values_list("subject", flat=True)) == ["thing:a", "thing:c"]
    assert LedgerEntry.objects.get(pk=last_id).payload == '{"i":3}'
    assert ledger_sequence() == 2 and ledger_verify().ok


@pytest.mark.django_db
def test_an_entry_rolls_back_with_its_change():
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_append(kind="x", subject="y", payload={})
        raise RuntimeError("the change failed")

    assert LedgerEntry.objects.count() == 0
    assert not LedgerHead.objects.filter(size__gt=0).exists()


@pytest.mark.parametrize(
    ("kind", "subject", "created_at"),
    [
        ("order.placed", "order:1", dt.datetime(2026, 12, 3, 11, 49, tzinfo=dt.UTC)),
        ("note", 'quote "é" \\ \u2028 line', "2026-12-03T11:49:00Z"),
        ("odd", "order:2", dt.datetime(2026, 12, 3, 12, 49, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))),
    ],
)
def test_an_envelope_is_the_canonical_json_of_its_fields_whichever_way_it_is_built(kind, subject, created_at):
    fields = {"sequence": 12, "kind": kind, "subject": subject, "created_at": created_at}
    fields |= {"payload_sha256": "ab" * 32, "prev": GENESIS_HASH}
    envelope = entry_envelope(
        sequence=12, kind=kind, subject=subject, created_at=created_at, payload_hash="ab" * 32, prev_hash=GENESIS_HASH
    )
    assert envelope == canonical_bytes(fields)


def test_canonical_json_refuses_floats_and_sorts_keys():
    assert canonical_bytes({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    with pytest.raises(TypeError):
        canonical_bytes({"price": 1.5})


@pytest.mark.django_db
def test_verify_command_names_the_tampered_entry(capsys):
    _append(4)
    # Tamper the way an attacker with table access would: rewrite a stored payload directly.
    with triggers_bypassed() as cursor:
        cursor.execute("UPDATE ledger_ledgerentry SET payload = %s WHERE sequence = 3", ['{"i":99}'])

    with pytest.raises(CommandError) as excinfo:
        call_command("ledger", "verify")

    assert "entry #3" in str(excinfo.value)
    assert "payload does not match" in str(excinfo.value)


@pytest.mark.django_db
def test_verify_detects_a_rehashed_entry_by_its_broken_link():
    entries = _append(3)
    # A smarter attacker recomputes the payload hash too; the next entry's link still gives it away.
    import hashlib

    new_payload = '{"i":42}'
    with triggers_bypassed() as cursor:
        cursor.execute(
            "UPDATE ledger_ledgerentry SET payload = %s, payload_hash = %s WHERE sequence = 2",
            [new_payload, hashlib.sha256(new_payload.encode()).hexdigest()],
        )

    result = ledger_verify()

    assert result.first_bad_sequence == 2
    assert "entry_hash" in result.problem
    assert entries[2].prev_hash == entries[1].entry_hash


@pytest.mark.django_db
def test_verify_detects_a_deleted_entry():
    _append(3)
    with triggers_bypassed() as cursor:
        cursor.execute("DELETE FROM ledger_ledgerentry WHERE sequence = 2")

    result = ledger_verify()

    assert result.first_bad_sequence == 2
    assert "gap" in result.problem


@pytest.mark.django_db
def test_verify_command_succeeds_on_an_intact_chain(capsys):
    _append(2)
    call_command("ledger", "verify")
    assert "ledger OK: 2 entries" in capsys.readouterr().out
