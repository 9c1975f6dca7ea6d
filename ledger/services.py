"""Writing and verifying the ledger. The only module that creates ledger rows."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ledger import merkle, note
from ledger.apps import wipe_allowed
from ledger.canonical import canonical_bytes, entry_envelope, sha256_hex
from ledger.models import GENESIS_HASH, LedgerEntry, LedgerHead, PersonalDatum


class LedgerError(Exception):
    """Raised when an append is attempted outside a transaction or the chain head is inconsistent."""


def ledger_append(*, kind: str, subject: str, payload: dict[str, Any]) -> LedgerEntry:
    """Append one entry, chained to the previous one.

    Must run inside the caller's ``transaction.atomic()`` block, so the entry commits or rolls back with the
    change it records. Concurrent writers serialise on the head row (``SELECT ... FOR UPDATE`` on PostgreSQL,
    the database write lock on SQLite), so sequences are gapless and the chain never forks.
    """
    if not connection.in_atomic_block:
        raise LedgerError("ledger_append must be called inside the transaction of the change it records")
    head, _ = LedgerHead.objects.select_for_update().get_or_create(id=1)
    payload_text = canonical_bytes(payload).decode("utf-8")
    payload_hash = sha256_hex(payload_text.encode("utf-8"))
    sequence = head.size + 1
    # Microseconds are dropped so the timestamp survives every database's datetime precision unchanged.
    created_at = timezone.now().replace(microsecond=0)
    envelope = entry_envelope(
        sequence=sequence,
        kind=kind,
        subject=subject,
        created_at=created_at,
        payload_hash=payload_hash,
        prev_hash=head.head_hash,
    )
    entry = LedgerEntry.objects.create(
        sequence=sequence,
        kind=kind,
        subject=subject,
        payload=payload_text,
        payload_hash=payload_hash,
        prev_hash=head.head_hash,
        entry_hash=sha256_hex(envelope),
        leaf_hash=merkle.leaf_hash(envelope).hex(),
        created_at=created_at,
    )
    updated = LedgerHead.objects.filter(id=1, size=head.size).update(size=sequence, head_hash=entry.entry_hash)
    if updated != 1:
        raise LedgerError("ledger head moved during append")
    return entry


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a full chain check. ``first_bad_sequence`` is None when the chain is intact."""

    entries_checked: int
    first_bad_sequence: int | None
    problem: str

    @property
    def ok(self) -> bool:
        return self.first_bad_sequence is None and not self.problem


def _entries(batch: int = 2000) -> Iterator[LedgerEntry]:
    last = 0
    while True:
        rows = list(LedgerEntry.objects.filter(sequence__gt=last).order_by("sequence")[:batch])
        if not rows:
            return
        yield from rows
        last = rows[-1].sequence


def ledger_verify(*, chain: Any = None) -> VerifyResult:
    """Recompute every hash from the stored payloads and check the links, the sequence and the head; then
    recompute the Merkle root at every checkpoint, check the checkpoint's signature, and, given ``chain`` (a
    ``Web3``), check each anchor's transaction states that same size and root.

    A chain rewritten consistently from the first entry passes the link checks but not the checkpoints'
    signed roots; rewritten checkpoints fail their signatures or their anchors. Reports the first problem;
    never modifies anything.
    """
    prev_hash = GENESIS_HASH
    expected = 1
    count = 0
    leaves: list[bytes] = []
    for entry in _entries():
        count += 1
        if entry.sequence != expected:
            return VerifyResult(count, expected, f"sequence gap: expected #{expected}, found #{entry.sequence}")
        payload_hash = sha256_hex(entry.payload.encode("utf-8"))
        if payload_hash != entry.payload_hash:
            return VerifyResult(count, entry.sequence, "payload does not match its stored hash")
        if entry.prev_hash != prev_hash:
            return VerifyResult(count, entry.sequence, "prev_hash does not match the previous entry's hash")
        envelope = entry_envelope(
            sequence=entry.sequence,
            kind=entry.kind,
            subject=entry.subject,
            created_at=entry.created_at,
            payload_hash=payload_hash,
            prev_hash=prev_hash,
        )
        if sha256_hex(envelope) != entry.entry_hash:
            return VerifyResult(count, entry.sequence, "entry_hash does not match its recomputed envelope")
        leaf = merkle.leaf_hash(envelope)
        if leaf.hex() != entry.leaf_hash:
            return VerifyResult(count, entry.sequence, "leaf_hash does not match its recomputed envelope")
        leaves.append(leaf)
        prev_hash = entry.entry_hash
        expected += 1
    head = LedgerHead.objects.filter(id=1).first()
    size = head.size if head else 0
    head_hash = head.head_hash if head else GENESIS_HASH
    if size != count or head_hash != prev_hash:
        return VerifyResult(count, None, f"head says size {size} / {head_hash[:12]}, chain has {count} entries")
    problem = _checkpoints_problem(leaves, chain)
    return VerifyResult(count, None, problem)


def _checkpoints_problem(leaves: list[bytes], chain: Any) -> str:
    """The first checkpoint or anchor that disagrees with the entries, or ""."""
    from django.conf import settings

    from ledger.chain import AnchorError, read_anchor
    from ledger.checkpoints import anchor_sender, key_history, verifier_keys
    from ledger.models import Anchor, Checkpoint

    checkpoints = list(Checkpoint.objects.order_by("size"))
    if not checkpoints:
        return ""
    keys = verifier_keys()
    signers = [p.key_id for p in key_history()]
    again = next((key_id for n, key_id in enumerate(signers) if key_id in signers[:n]), None)
    if again is not None:
        return f"key {again} signed checkpoints again after it was retired"
    roots = merkle.roots_at(leaves, [c.size for c in checkpoints])
    sender = anchor_sender(chain) if chain is not None else ""
    for checkpoint in checkpoints:
        where = f"checkpoint {checkpoint.size}"
        if checkpoint.size > len(leaves):
            return f"{where} covers more entries than the ledger has ({len(leaves)})"
        vkey = keys.get(checkpoint.key_id)
        if vkey is None:
            return f"{where}: signed by key {checkpoint.key_id}, which is not a key of this ledger"
        try:
            body = note.open_note(checkpoint.note, vkey)
        except note.NoteError as exc:
            return f"{where}: {exc}"
        if body.origin != settings.LEDGER_ORIGIN:
            return f"{where}: its note names origin {body.origin!r}, not {settings.LEDGER_ORIGIN!r}"
        if (body.size, body.root.hex()) != (checkpoint.size, checkpoint.root_hash):
            return f"{where}: its row differs from its signed note"
        if roots[checkpoint.size].hex() != checkpoint.root_hash:
            return f"{where}: the entries' Merkle root differs from the signed root"
        anchor = Anchor.objects.filter(checkpoint=checkpoint).first()
        if chain is None or anchor is None:
            continue
        try:
            on_chain = read_anchor(chain, anchor.tx_hash)
        except AnchorError as exc:
            return f"{where}: anchor {anchor.tx_hash}: {exc}"
        if (on_chain.size, on_chain.root.hex()) != (checkpoint.size, checkpoint.root_hash):
            return f"{where}: the chain anchored size {on_chain.size} root {on_chain.root.hex()[:12]}, not this"
        recorded = (anchor.chain_id, anchor.block_number, anchor.block_hash.lower(), anchor.sender.lower())
        found = (on_chain.chain_id, on_chain.block_number, on_chain.block_hash.lower(), on_chain.sender.lower())
        if recorded != found:
            return f"{where}: anchor {anchor.tx_hash} is recorded as {recorded}, the chain says {found}"
        if on_chain.sender.lower() != sender.lower():
            return f"{where}: anchor {anchor.tx_hash} was sent by {on_chain.sender}, not the broker's {sender}"
    return ""


def ledger_allow_wipe(allow: bool = True) -> None:
    """Let this database session empty the ledger tables wholesale (PostgreSQL TRUNCATE, SQLite DELETE), or stop
    letting it. For flushing a test database only: the triggers refuse every other UPDATE or DELETE anyway."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('ledger.maintenance', %s, false)", ["on" if allow else "off"])
    wipe_allowed.on = allow


# --- Personal data ----------------------------------------------------------------------------------------------


def personal_commitment(*, person: str, value: Any) -> str:
    """Keep ``value`` (personal data of ``person``, e.g. ``user:42``) outside the ledger and return the salted
    commitment to put in an entry's payload instead: SHA-256(salt || canonical JSON of value), hex.

    Call inside the transaction of the entry, so the datum and the entry commit together."""
    salt = secrets.token_bytes(32)
    text = canonical_bytes(value)
    commitment = sha256_hex(salt + text)
    PersonalDatum.objects.create(
        commitment=commitment, person=person, salt=salt.hex(), value=text.decode("utf-8"), created_at=timezone.now()
    )
    return commitment


def user_commitment(user: Any) -> str:
    """The commitment an entry carries for the user who made a change (``user:<pk>``, their username)."""
    return personal_commitment(person=f"user:{user.pk}", value={"username": user.get_username()})


def personal_reveal(commitment: str) -> Any | None:
    """The value behind a commitment, checked against it; None once the person was erased (or never existed)."""
    datum = PersonalDatum.objects.filter(commitment=commitment).first()
    if datum is None:
        return None
    if sha256_hex(bytes.fromhex(datum.salt) + datum.value.encode("utf-8")) != commitment:
        raise LedgerError(f"personal datum {commitment[:12]} does not match its commitment")
    return json.loads(datum.value)


def personal_erase(*, person: str, reason: str) -> int:
    """Erase everything kept about ``person``: their salts and values go, the entries stay, and every hash and
    proof still verifies (the commitments alone reveal nothing). Ledgered without personal data."""
    with transaction.atomic():
        erased, _ = PersonalDatum.objects.filter(person=person).delete()
        ledger_append(kind="personal.erased", subject=f"person:{person}", payload={"data": erased, "reason": reason})
    return erased
