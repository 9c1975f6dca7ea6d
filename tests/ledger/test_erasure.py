"""Erasing a person, from the admin and from the command line: data gone, ledger and proofs intact."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import transaction

from ledger import merkle
from ledger.checkpoints import checkpoint_create, inclusion_proofs
from ledger.models import LedgerEntry, PersonalDatum
from ledger.services import ledger_append, ledger_verify, personal_commitment, personal_reveal

pytestmark = pytest.mark.django_db


def _signed(person: str, name: str) -> str:
    with transaction.atomic():
        commitment = personal_commitment(person=person, value={"username": name})
        ledger_append(kind="test.signed", subject=f"{person}:thing", payload={"by": commitment})
    return commitment


def test_staff_erase_people_from_the_admin(admin_client):
    alice = _signed("user:1", "alice")
    bob = _signed("user:2", "bob")
    checkpoint = checkpoint_create()
    datum = PersonalDatum.objects.get(person="user:1")

    response = admin_client.post(
        "/admin/ledger/personaldatum/",
        {"action": "erase_people", "_selected_action": [datum.pk]},
        follow=True,
    )

    assert response.status_code == 200
    assert "Erased 1 record(s) of 1 people." in response.content.decode()
    assert personal_reveal(alice) is None and personal_reveal(bob) == {"username": "bob"}
    assert ledger_verify().ok
    erased = LedgerEntry.objects.get(kind="personal.erased")
    assert erased.subject == "person:user:1" and "alice" not in erased.payload
    entries = LedgerEntry.objects.filter(sequence__lte=checkpoint.size).order_by("sequence")
    for proof, entry in zip(inclusion_proofs([e.sequence for e in entries], checkpoint), entries, strict=True):
        assert merkle.verify_inclusion(
            bytes.fromhex(entry.leaf_hash),
            entry.sequence - 1,
            checkpoint.size,
            [bytes.fromhex(p) for p in proof.path],
            bytes.fromhex(checkpoint.root_hash),
        )


def test_the_erase_command_names_what_it_erased(capsys):
    _signed("user:9", "zoe")
    _signed("user:9", "zoe.alt")
    call_command("ledger", "erase", "--person", "user:9", "--reason", "GDPR article 17 request 2026-114")
    assert "erased 2 personal data record(s) of user:9" in capsys.readouterr().out
    assert not PersonalDatum.objects.filter(person="user:9").exists()
    assert ledger_verify().ok
