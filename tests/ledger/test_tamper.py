"""Tampering as a database superuser would, past the append-only triggers: the broker's own check
(``ledger_verify``) and the auditor's tool (``ledger.audit``, on a bundle exported after the tampering) must
both catch every case, and name what was wrong.

The ledger: 12 entries, an anchored checkpoint, 8 more, a second anchored checkpoint, then 2 entries that no
checkpoint covers yet (22 in all). Before tampering, the auditor audits it once and keeps the state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction

from ledger import merkle, note
from ledger.anchoring import chain
from ledger.audit import AuditReport, audit
from ledger.canonical import canonical_bytes, entry_envelope, sha256_hex
from ledger.chain import anchor_data
from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.keys import signing_key, verifier_key
from ledger.models import GENESIS_HASH, Checkpoint, LedgerEntry, LedgerHead
from ledger.receipts import audit_bundle, receipt
from ledger.services import ledger_append, ledger_sequence, ledger_verify
from tests.ledger.tamper import triggers_bypassed

pytestmark = pytest.mark.django_db

SUBJECT = "order:alpha"


@dataclass(frozen=True)
class Before:
    """What the outside world kept before the tampering: the auditor's state and a buyer's receipt."""

    state: dict[str, Any]
    receipt: dict[str, Any]


def _append(n: int, start: int) -> None:
    for i in range(start, start + n):
        with transaction.atomic():
            subject = SUBJECT if i % 3 == 0 else f"order:other-{i}"
            ledger_append(kind="order.event", subject=subject, payload={"i": i, "amount_usd": f"{i}.50"})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


def _export() -> dict[str, Any]:
    return json.loads(json.dumps(audit_bundle(with_entries=True)))


def _audit(**kwargs: Any) -> AuditReport:
    kwargs.setdefault("w3", chain())
    kwargs.setdefault("trusted_key", verifier_key())
    return audit(_export(), **kwargs)


def _failed(report: AuditReport, family: str, text: str) -> bool:
    return any(c.family == family and text in c.message for c in report.failures)


@pytest.fixture
def before() -> Before:
    _append(12, start=0)
    ledger_checkpoint_and_anchor()
    _append(8, start=12)
    ledger_checkpoint_and_anchor()
    _append(2, start=20)
    assert LedgerEntry.objects.count() == 22 and list(Checkpoint.objects.values_list("size", flat=True)) == [12, 20]
    assert ledger_verify(chain=chain()).ok
    report = _audit()
    assert report.ok, report.text()
    assert report.state is not None
    return Before(state=report.state, receipt=json.loads(json.dumps(receipt(SUBJECT))))


# --- Tampering with entries ------------------------------------------------------------------------------------


def _entry(sequence: int) -> LedgerEntry:
    return LedgerEntry.objects.get(sequence=sequence)


def _hashes(*, sequence: int, kind: str, subject: str, created_at: Any, payload: str, prev_hash: str) -> list[str]:
    """payload_hash, entry_hash, leaf_hash of an entry, computed as ledger_append does."""
    payload_hash = sha256_hex(payload.encode())
    envelope = entry_envelope(
        sequence=sequence,
        kind=kind,
        subject=subject,
        created_at=created_at,
        payload_hash=payload_hash,
        prev_hash=prev_hash,
    )
    return [payload_hash, sha256_hex(envelope), merkle.leaf_hash(envelope).hex()]


def _renumber(cursor: Any, sequences: range, delta: int) -> None:
    """Move entries by ``delta`` one row at a time, in the order that never collides with the unique index."""
    for sequence in sorted(sequences, reverse=delta > 0):
        cursor.execute("UPDATE ledger_ledgerentry SET sequence = %s WHERE sequence = %s", [sequence + delta, sequence])


def _set_head(cursor: Any) -> None:
    """Make the head row agree with the tampered chain, as a careful attacker would."""
    last = LedgerEntry.objects.filter(sequence__isnull=False).order_by("-sequence").first()
    assert last is not None
    cursor.execute(
        "UPDATE ledger_ledgerhead SET size = %s, head_hash = %s WHERE id = 1", [last.sequence, last.entry_hash]
    )


def change_a_payload_byte(cursor: Any) -> None:
    payload = _entry(7).payload
    assert '"i":6' in payload
    cursor.execute("UPDATE ledger_ledgerentry SET payload = %s WHERE sequence = 7", [payload.replace('"i":6', '"i":9')])


def delete_and_renumber(cursor: Any) -> None:
    cursor.execute("DELETE FROM ledger_ledgerentry WHERE sequence = 5")
    _renumber(cursor, range(6, 23), -1)  # close the gap
    _set_head(cursor)


def insert_and_renumber(cursor: Any) -> None:
    """A forged entry at #8, well formed and chained to #7; the entries after it move up by one."""
    seventh = _entry(7)
    _renumber(cursor, range(8, 23), +1)
    payload = canonical_bytes({"i": 777, "amount_usd": "0.01"}).decode()
    hashes = _hashes(
        sequence=8,
        kind="order.refunded",
        subject=SUBJECT,
        created_at=seventh.created_at,
        payload=payload,
        prev_hash=seventh.entry_hash,
    )
    cursor.execute(
        "INSERT INTO ledger_ledgerentry "
        "(sequence, kind, subject, payload, payload_hash, prev_hash, entry_hash, leaf_hash, created_at) "
        "SELECT 8, %s, %s, %s, %s, %s, %s, %s, created_at FROM ledger_ledgerentry WHERE sequence = 7",
        ["order.refunded", SUBJECT, payload, *hashes[:1], seventh.entry_hash, *hashes[1:]],
    )
    _set_head(cursor)


def swap_two_entries(cursor: Any) -> None:
    cursor.execute("UPDATE ledger_ledgerentry SET sequence = 1000000 WHERE sequence = 3")
    cursor.execute("UPDATE ledger_ledgerentry SET sequence = 3 WHERE sequence = 9")
    cursor.execute("UPDATE ledger_ledgerentry SET sequence = 9 WHERE sequence = 1000000")


@dataclass(frozen=True)
class Case:
    tamper: Callable[[Any], None]
    verify_first_bad: int | None
    verify_problem: str
    audit_failures: list[tuple[str, str]]


CASES = {
    "one payload byte": Case(
        change_a_payload_byte,
        7,
        "payload does not match its stored hash",
        [("entries", "entry #7: its payload does not hash to its payload_hash")],
    ),
    "an entry deleted, the rest renumbered": Case(
        delete_and_renumber,
        5,
        "prev_hash does not match",
        [
            ("entries", "entry #5: its prev_hash does not link to the entry_hash of the entry before (#4)"),
            ("entries", "entry #5: its entry_hash differs"),
            ("roots", "checkpoint 12: the root recomputed"),
            ("roots", "checkpoint 20: the root recomputed"),
        ],
    ),
    "a forged entry inserted, the rest renumbered": Case(
        insert_and_renumber,
        9,
        "prev_hash does not match",
        [
            ("entries", "entry #9: its prev_hash does not link to the entry_hash of the entry before (#8)"),
            ("roots", "checkpoint 12: the root recomputed"),
            ("consistency", "checkpoints 12 -> 20"),
        ],
    ),
    "two entries swapped": Case(
        swap_two_entries,
        3,
        "prev_hash does not match",
        [
            ("entries", "entry #3: its prev_hash does not link"),
            ("entries", "entry #3: its entry_hash differs"),
            ("entries", "entry #9: its entry_hash differs"),
            ("roots", "checkpoint 12: the root recomputed"),
        ],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tampered_entries_are_caught_by_the_broker_and_by_the_auditor(before, name):
    case = CASES[name]
    with triggers_bypassed() as cursor:
        case.tamper(cursor)

    result = ledger_verify(chain=chain())
    assert not result.ok
    assert result.first_bad_sequence == case.verify_first_bad, result
    assert case.verify_problem in result.problem

    for report in (_audit(), _audit(state=before.state)):
        assert not report.ok
        for family, text in case.audit_failures:
            assert _failed(report, family, text), f"no failed {family} check with {text!r}:\n{report.text()}"
        assert report.state is None


def test_a_deleted_entry_that_leaves_a_gap(before):
    with triggers_bypassed() as cursor:
        cursor.execute("DELETE FROM ledger_ledgerentry WHERE sequence = 5")

    result = ledger_verify(chain=chain())
    assert (result.first_bad_sequence, result.problem) == (5, "sequence gap: expected #5, found #6")

    # The export still gives the auditor the ledger as it is, saying why it cannot prove consistency.
    bundle = _export()
    assert "consistency proofs left out" in bundle["problem"]
    report = audit(bundle, w3=chain(), trusted_key=verifier_key(), state=before.state)
    assert not report.ok and _failed(report, "entries", "entry #6: expected #5")


# --- Rewriting the whole chain consistently --------------------------------------------------------------------


def _rewrite_chain(cursor: Any, *, from_sequence: int) -> list[bytes]:
    """Change the payload of ``from_sequence`` and recompute every hash and link from there on, and the head: the
    hash chain is whole again. Returns the new leaf hashes."""
    prev, leaves = GENESIS_HASH, []
    for entry in LedgerEntry.objects.order_by("sequence"):
        if entry.sequence >= from_sequence:
            payload = entry.payload
            if entry.sequence == from_sequence:
                payload = canonical_bytes({"i": 999, "amount_usd": "0.00"}).decode()
            payload_hash, entry_hash, leaf_hash = _hashes(
                sequence=entry.sequence,
                kind=entry.kind,
                subject=entry.subject,
                created_at=entry.created_at,
                payload=payload,
                prev_hash=prev,
            )
            cursor.execute(
                "UPDATE ledger_ledgerentry SET payload = %s, payload_hash = %s, prev_hash = %s, entry_hash = %s, "
                "leaf_hash = %s WHERE id = %s",
                [payload, payload_hash, prev, entry_hash, leaf_hash, entry.pk],
            )
        else:
            entry_hash, leaf_hash = entry.entry_hash, entry.leaf_hash
        prev = entry_hash
        leaves.append(bytes.fromhex(leaf_hash))
    cursor.execute("UPDATE ledger_ledgerhead SET head_hash = %s WHERE id = 1", [prev])
    return leaves


def _rewrite_checkpoints(cursor: Any, leaves: list[bytes], how: str) -> None:
    """Bring the checkpoint rows in line with the rewritten leaves: ``roots`` only (the notes stay), ``notes``
    with the body rewritten under the old signature, or ``resigned`` with the real (stolen) key."""
    origin = settings.LEDGER_ORIGIN
    for checkpoint in Checkpoint.objects.order_by("size"):
        root = merkle.root_from_hashes(leaves[: checkpoint.size])
        body = note.CheckpointBody(origin, checkpoint.size, root)
        if how == "roots":
            signed = checkpoint.note
        elif how == "notes":
            signature = checkpoint.note.partition("\n\n")[2]
            signed = f"{body.text()}\n{signature}"
        else:
            signed = note.sign(body, origin, signing_key())
        cursor.execute(
            "UPDATE ledger_checkpoint SET root_hash = %s, note = %s WHERE size = %s",
            [root.hex(), signed, checkpoint.size],
        )


@pytest.mark.parametrize(
    ("checkpoints", "verify_problem", "audit_failures"),
    [
        pytest.param(
            "kept",
            "checkpoint 12: the entries' Merkle root differs from the signed root",
            [("roots", "checkpoint 12: the root recomputed"), ("consistency", "checkpoints 12 -> 20")],
            id="checkpoints kept: caught by the signed roots",
        ),
        pytest.param(
            "roots",
            "checkpoint 12: its row differs from its signed note",
            [("signature", "checkpoint 12: signature verifies but its note states root")],
            id="checkpoint roots rewritten: caught by the signed notes",
        ),
        pytest.param(
            "notes",
            "checkpoint 12: signature by gpu-broker/ledger does not verify",
            [("signature", "checkpoint 12: its note does not verify: signature by gpu-broker/ledger does not verify")],
            id="checkpoint notes rewritten: caught by the signatures",
        ),
        pytest.param(
            "resigned",
            "checkpoint 12: the chain anchored size 12",
            [("anchor", "checkpoint 12: anchor tx 0x"), ("anchor", "checkpoint 20: anchor tx 0x")],
            id="re-signed with the stolen key: caught only by the anchors",
        ),
    ],
)
def test_a_chain_rewritten_consistently(before, checkpoints, verify_problem, audit_failures):
    with triggers_bypassed() as cursor:
        leaves = _rewrite_chain(cursor, from_sequence=4)
        if checkpoints != "kept":
            _rewrite_checkpoints(cursor, leaves, checkpoints)

    # The broker's check: the hash chain alone is whole again, the checkpoints or anchors give it away.
    result = ledger_verify(chain=chain())
    assert not result.ok and result.first_bad_sequence is None and result.entries_checked == 22
    assert verify_problem in result.problem, result.problem
    assert ledger_verify(chain=None).ok is (checkpoints == "resigned")

    # The auditor, given the chain: the entries recompute (the rewrite is consistent), the rest does not.
    report = _audit()
    assert not report.ok
    assert report.family("entries")[0].status == "ok"
    for family, text in audit_failures:
        assert _failed(report, family, text), f"no failed {family} check with {text!r}:\n{report.text()}"
    if checkpoints == "resigned":
        assert {c.family for c in report.failures} == {"anchor"}  # every signature, proof and root checks out

    # The auditor without a chain but with the state of the audit before the tampering, and a buyer with the
    # receipt they were given before: both know the log changed under them.
    remembered = audit(_export(), receipts=[before.receipt], trusted_key=verifier_key(), state=before.state)
    assert not remembered.ok
    if checkpoints != "kept":
        assert _failed(remembered, "state", "checkpoint 20 (root")
        assert _failed(remembered, "state", "the log was rewritten")
        assert _failed(remembered, "receipt", "two different logs")
    if checkpoints == "resigned":
        # Without the chain and without a memory of the log, a rewrite signed with the stolen key is invisible:
        # that is the point of anchoring, and of keeping the state.
        assert audit(_export(), trusted_key=verifier_key()).ok


def test_re_anchoring_from_another_address_is_caught_by_the_anchor_address_the_auditor_knows(before):
    """The attacker holds the signing key and some chain account: they rewrite the chain, re-sign every
    checkpoint, anchor the forged roots from their own address and point the anchor rows there. Every anchor
    then states its checkpoint's size and root; only the sender gives it away, against the broker's anchor
    address the auditor was given or remembered, and the auditor's state catches the rewrite too."""
    honest_sender = before.state["anchor_sender"]
    w3 = chain()
    attacker = next(a for a in w3.eth.accounts if a.lower() != honest_sender.lower())
    with triggers_bypassed() as cursor:
        leaves = _rewrite_chain(cursor, from_sequence=2)
        _rewrite_checkpoints(cursor, leaves, "resigned")
        for checkpoint in Checkpoint.objects.order_by("size"):
            data = anchor_data(checkpoint.size, bytes.fromhex(checkpoint.root_hash))
            tx = w3.eth.send_transaction({"from": attacker, "to": attacker, "value": 0, "data": data})
            mined = w3.eth.wait_for_transaction_receipt(tx)
            cursor.execute(
                "UPDATE ledger_anchor SET tx_hash = %s, block_number = %s, block_hash = %s, sender = %s "
                "WHERE checkpoint_id = %s",
                [
                    "0x" + bytes(tx).hex(),
                    mined["blockNumber"],
                    "0x" + bytes(mined["blockHash"]).hex(),
                    attacker,
                    checkpoint.pk,
                ],
            )
    assert LedgerHead.objects.get().size == 22

    # The broker's own check knows its anchor address.
    problem = ledger_verify(chain=w3).problem
    assert "was sent by" in problem and "not the broker's" in problem
    # A newcomer with only the key: everything the broker published agrees with itself and with the chain.
    assert _audit().ok
    # Told the broker's anchor address, or remembering it from an earlier audit, the auditor sees the forgery.
    for report in (_audit(anchor_sender=honest_sender), _audit(trusted_key=None, state=before.state)):
        assert not report.ok
        assert _failed(report, "anchor", f"is not the broker's anchor address {honest_sender}"), report.text()
    assert _failed(_audit(state=before.state), "state", "the log was rewritten")
