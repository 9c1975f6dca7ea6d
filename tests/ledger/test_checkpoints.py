"""Signed checkpoints, proofs against them, anchors on the (in-process) chain, and erasure that keeps proofs."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from ledger import merkle, note
from ledger.anchoring import chain
from ledger.canonical import entry_envelope
from ledger.chain import AnchorError, read_anchor
from ledger.checkpoints import (
    ProofUnavailable,
    checkpoint_create,
    consistency_proof,
    inclusion_proofs,
    ledger_checkpoint_and_anchor,
)
from ledger.keys import verifier_key
from ledger.models import Checkpoint, LedgerEntry, PersonalDatum
from ledger.services import (
    ledger_append,
    ledger_sequence,
    ledger_verify,
    personal_commitment,
    personal_erase,
    personal_reveal,
)

pytestmark = pytest.mark.django_db


def _append(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=f"thing:{i}", payload={"i": i})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


def _envelopes() -> list[bytes]:
    return [
        entry_envelope(
            sequence=e.sequence,
            kind=e.kind,
            subject=e.subject,
            created_at=e.created_at,
            payload_hash=e.payload_hash,
            prev_hash=e.prev_hash,
        )
        for e in LedgerEntry.objects.order_by("sequence")
    ]


def test_a_checkpoint_is_a_signed_root_of_every_entry():
    _append(5)
    checkpoint = checkpoint_create()
    assert checkpoint is not None and checkpoint.size == 5
    assert checkpoint.root_hash == merkle.root(_envelopes()).hex()
    body = note.open_note(checkpoint.note, verifier_key())
    assert (body.origin, body.size, body.root.hex()) == ("gpu-broker/ledger", 5, checkpoint.root_hash)
    assert checkpoint_create() is None  # nothing new to sign


def test_a_changed_note_or_another_key_does_not_verify():
    _append(3)
    checkpoint = checkpoint_create()
    forged = checkpoint.note.replace("\n3\n", "\n4\n", 1)
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(forged, verifier_key())
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    stranger = note.verifier_key("gpu-broker/ledger", Ed25519PrivateKey.generate().public_key())
    with pytest.raises(note.NoteError, match="no signature"):
        note.open_note(checkpoint.note, stranger)
    with pytest.raises(note.NoteError):
        note.open_note("not a note", verifier_key())


def test_inclusion_and_consistency_proofs_verify_against_the_checkpoints():
    _append(6)
    old = checkpoint_create()
    _append(7, start=6)
    new = checkpoint_create()
    leaves = [merkle.leaf_hash(e) for e in _envelopes()]
    for proof in inclusion_proofs([1, 6, 13], new):
        index = proof.sequence - 1
        assert proof.leaf_hash == leaves[index].hex()
        path = [bytes.fromhex(p) for p in proof.path]
        assert merkle.verify_inclusion(leaves[index], index, new.size, path, bytes.fromhex(new.root_hash))
    path = [bytes.fromhex(p) for p in consistency_proof(old.size, new.size)]
    assert merkle.verify_consistency(
        old.size, new.size, bytes.fromhex(old.root_hash), bytes.fromhex(new.root_hash), path
    )
    with pytest.raises(ProofUnavailable):
        inclusion_proofs([14], new)
    with pytest.raises(ProofUnavailable):
        consistency_proof(new.size, old.size)


def test_checkpoints_are_anchored_on_the_chain():
    _append(4)
    made = ledger_checkpoint_and_anchor()
    anchor = Checkpoint.objects.get(pk=made.pk).anchor
    on_chain = read_anchor(chain(), anchor.tx_hash)
    assert (on_chain.size, on_chain.root.hex()) == (made.size, made.root_hash)
    assert (on_chain.block_number, on_chain.block_hash, on_chain.sender) == (
        anchor.block_number,
        anchor.block_hash,
        anchor.sender,
    )
    # A transaction that is not an anchor is refused by the reader.
    w3 = chain()
    plain = w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": w3.eth.accounts[1], "value": 1})
    w3.eth.wait_for_transaction_receipt(plain)
    with pytest.raises(AnchorError, match="not a broker ledger anchor"):
        read_anchor(w3, plain.hex())


def test_erasing_a_person_keeps_every_entry_and_proof():
    with transaction.atomic():
        commitment = personal_commitment(person="user:7", value={"username": "alice", "email": "alice@acme.test"})
        ledger_append(kind="test.signed", subject="thing:x", payload={"by": commitment})
    _append(3)
    before = checkpoint_create()
    entry = LedgerEntry.objects.get(kind="test.signed")
    assert "alice" not in entry.payload and json.loads(entry.payload) == {"by": commitment}
    assert personal_reveal(commitment) == {"username": "alice", "email": "alice@acme.test"}

    assert personal_erase(person="user:7", reason="erasure request") == 1

    assert personal_reveal(commitment) is None
    assert not PersonalDatum.objects.filter(person="user:7").exists()
    assert LedgerEntry.objects.get(pk=entry.pk).payload == entry.payload
    assert ledger_verify().ok
    (proof,) = inclusion_proofs([entry.sequence], before)
    assert merkle.verify_inclusion(
        bytes.fromhex(proof.leaf_hash),
        entry.sequence - 1,
        before.size,
        [bytes.fromhex(p) for p in proof.path],
        bytes.fromhex(before.root_hash),
    )
    after = checkpoint_create()  # the erasure is itself on the record, without the person's data
    erased = LedgerEntry.objects.get(kind="personal.erased")
    assert "alice" not in erased.payload and after.size == erased.sequence


@pytest.mark.parametrize("size", ["\u0661\u0662", "\u00b2", "012", "-1", ""])
def test_a_size_that_is_not_ascii_decimal_is_refused(size):
    _append(2)
    checkpoint = checkpoint_create()
    forged = checkpoint.note.replace("\n2\n", f"\n{size}\n", 1)
    with pytest.raises(note.NoteError):
        note.open_note(forged, verifier_key())


def test_a_rotated_key_still_verifies_the_old_checkpoints(settings):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ledger.keys import signing_key

    _append(2)
    checkpoint_create()
    old_vkey = verifier_key()
    new_key = Ed25519PrivateKey.generate()
    signing_key.cache_clear()
    import base64

    settings.LEDGER_SIGNING_KEY = base64.b64encode(new_key.private_bytes_raw()).decode()
    try:
        _append(1, start=2)
        checkpoint_create()
        problem = ledger_verify().problem
        assert "not a key of this ledger" in problem and "checkpoint 2" in problem
        settings.LEDGER_PREVIOUS_VERIFIER_KEYS = [old_vkey]
        assert ledger_verify().ok
    finally:
        signing_key.cache_clear()


def test_a_receipt_names_the_key_that_signed_its_checkpoint_across_a_rotation(settings):
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ledger import note
    from ledger.keys import signing_key
    from ledger.receipts import receipt

    _append(2)
    checkpoint_create()
    old_vkey = verifier_key()
    signing_key.cache_clear()
    settings.LEDGER_SIGNING_KEY = base64.b64encode(Ed25519PrivateKey.generate().private_bytes_raw()).decode()
    settings.LEDGER_PREVIOUS_VERIFIER_KEYS = [old_vkey]
    try:
        body = receipt("thing:1")  # the newest checkpoint is still the one the old key signed
        assert body["verifier_key"] == old_vkey != verifier_key()
        assert note.open_note(body["checkpoint"]["note"], body["verifier_key"]).size == 2
        _append(1, start=2)
        checkpoint_create()
        assert receipt("thing:1")["verifier_key"] == verifier_key()
    finally:
        signing_key.cache_clear()


def test_a_gap_below_the_checkpoint_gives_a_receipt_that_says_so():
    from ledger.receipts import receipt
    from tests.ledger.tamper import triggers_bypassed

    _append(4)
    checkpoint_create()
    with triggers_bypassed() as cursor:
        cursor.execute("DELETE FROM ledger_ledgerentry WHERE sequence = 2")
    body = receipt("thing:3")
    assert "a gap" in body["problem"] and body["entries"][0]["inclusion_proof"] is None
