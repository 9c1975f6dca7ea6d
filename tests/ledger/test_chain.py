from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from ledger.canonical import canonical_bytes
from ledger.models import GENESIS_HASH, LedgerEntry, LedgerHead
from ledger.services import LedgerError, ledger_append, ledger_verify
from tests.ledger.tamper import triggers_bypassed


def _append(n: int) -> list[LedgerEntry]:
    entries = []
    for i in range(n):
        with transaction.atomic():
            entries.append(ledger_append(kind="test.event", subject=f"thing:{i}", payload={"i": i}))
    return entries


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
def test_an_entry_rolls_back_with_its_change():
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_append(kind="x", subject="y", payload={})
        raise RuntimeError("the change failed")

    assert LedgerEntry.objects.count() == 0
    assert not LedgerHead.objects.filter(size__gt=0).exists()


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
