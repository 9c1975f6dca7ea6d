"""Signed checkpoints of the ledger's Merkle tree, and the proofs that tie entries and checkpoints together.

A checkpoint says "the first ``size`` entries have root ``root``", signed with the broker's Ed25519 key
(``ledger.note``; the keys are ``ledger.keys``). Inclusion proofs show an entry is among a checkpoint's entries;
consistency proofs show a later checkpoint extends an earlier one. Together with the anchors (``ledger.anchoring``)
they let anyone check the ledger without trusting the database.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger import merkle, note
from ledger.anchoring import checkpoint_anchor
from ledger.keys import key_history, previous_signing_key, signing_key, verifier_key
from ledger.models import Checkpoint, LedgerHead
from ledger.services import SEQUENCE_BATCHES_PER_CALL, ledger_sequence
from ledger.tree import ProofUnavailable, StoredTree, leaf_hashes, subtree_hashes_extend

__all__ = [
    "ProofUnavailable",
    "checkpoint_create",
    "checkpoint_sign_claim",
    "checkpoint_sign_release",
    "consistency_proof",
    "inclusion_proofs",
]

log = logging.getLogger(__name__)


# Any fixed number will do: it names the lock only among this database's advisory locks.
_SIGNING_LOCK = 0x6C65646765722D63  # "ledger-c"
SIGNING_REQUESTED_KEY = "ledger:checkpoint-signing-requested"


def _signing_lock() -> None:
    """Take the signers' lock for the rest of the transaction. On PostgreSQL an advisory lock, which appends do
    not wait for; SQLite's IMMEDIATE transactions already hold the database's one write lock."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_SIGNING_LOCK])


def checkpoint_create(*, now: dt.datetime | None = None) -> Checkpoint | None:
    """Sign a checkpoint of the whole ledger as it is now; None when the newest checkpoint already covers it.

    Single writer whoever calls it (the periodic task, a buyer's prompt signing, ``ledger checkpoint``):
    signers take one lock in turn and read the ledger's size and the newest checkpoint under it, so checkpoints
    are created in size order, never twice for one size, and a second signer of the same size signs nothing.
    Entries still queued are sequenced first, under the signing lock (unless another process is sequencing them
    at that moment: the next checkpoint covers those), so the checkpoint covers the changes committed before.
    """
    ledger_sequence()
    with transaction.atomic():
        _signing_lock()
        ledger_sequence(max_batches=SEQUENCE_BATCHES_PER_CALL)
        return _checkpoint_sign(now)


def _checkpoint_sign(now: dt.datetime | None) -> Checkpoint | None:
    head = LedgerHead.objects.filter(id=1).first()
    size = head.size if head else 0
    latest = Checkpoint.objects.order_by("-size").first()
    if size == 0 or (latest is not None and latest.size >= size):
        return None
    subtree_hashes_extend(size)
    root = StoredTree().root(size)
    origin, key = settings.LEDGER_ORIGIN, signing_key()
    body, cosigners = note.CheckpointBody(origin, size, root), []
    current = note.key_id(origin, key.public_key()).hex()
    if latest is not None and latest.key_id != current:
        retired = next((p for p in key_history() if p.key_id == current and p.first_size is not None), None)
        if retired is not None:  # auditors refuse a key outside its range: so does the signer
            raise ImproperlyConfigured(
                f"LEDGER_SIGNING_KEY is key {current}, retired after checkpoint {retired.last_size}: a retired key "
                "never signs again; configure a new key"
            )
        # The first checkpoint after a rotation: the retiring key cosigns a line naming its successor.
        previous = previous_signing_key()
        if previous is not None and note.key_id(origin, previous.public_key()).hex() == latest.key_id:
            line = note.rotation_line(note.verifier_key(origin, previous.public_key()), verifier_key())
            body, cosigners = note.CheckpointBody(origin, size, root, (line,)), [previous]
        else:
            log.warning(
                "checkpoint %d is the first by key %s, but LEDGER_PREVIOUS_SIGNING_KEY is not key %s, which signed "
                "checkpoint %d: auditors can follow this rotation only with the new key given out of band",
                size,
                verifier_key(),
                latest.key_id,
                latest.size,
            )
    try:
        with transaction.atomic():
            return Checkpoint.objects.create(
                size=size,
                root_hash=root.hex(),
                origin=body.origin,
                note=note.sign(body, origin, key, *cosigners),
                key_id=note.key_id(settings.LEDGER_ORIGIN, key.public_key()).hex(),
                created_at=now or timezone.now(),  # after the lock: created_at rises with the size
            )
    except IntegrityError:  # a signer that skipped the lock (an older release during a deploy) got there first
        return Checkpoint.objects.filter(size=size).first()


def checkpoint_sign_claim(*, hold_s: float) -> bool:
    """Claim the one prompt signing allowed per ``hold_s`` seconds: True for the first caller, False until the
    claim expires or ``checkpoint_sign_release`` drops it. Expiry, not the signing's end, frees it: a lost
    task delays the next prompt signing, never stops it (and the periodic one never stops)."""
    return bool(caches["default"].add(SIGNING_REQUESTED_KEY, "1", timeout=hold_s))


def checkpoint_sign_release() -> None:
    caches["default"].delete(SIGNING_REQUESTED_KEY)


@dataclass(frozen=True)
class InclusionProof:
    sequence: int
    leaf_hash: str
    checkpoint_size: int
    path: list[str]


def inclusion_proofs(sequences: list[int], checkpoint: Checkpoint) -> list[InclusionProof]:
    """Each entry's audit path to ``checkpoint``'s root (entries must be within its size)."""
    tree = StoredTree()
    proofs = []
    for sequence in sequences:
        if not 1 <= sequence <= checkpoint.size:
            raise ProofUnavailable(f"entry #{sequence} is not in the checkpoint of size {checkpoint.size}")
        path = merkle.inclusion_path(sequence - 1, checkpoint.size, tree)
        (leaf,) = leaf_hashes(sequence - 1, 1)
        proofs.append(InclusionProof(sequence, leaf.hex(), checkpoint.size, [p.hex() for p in path]))
    return proofs


def consistency_proof(old_size: int, new_size: int) -> list[str]:
    """The proof that the tree of ``new_size`` entries extends the one of ``old_size`` (0 < old <= new)."""
    if not 0 < old_size <= new_size:
        raise ProofUnavailable(f"a consistency proof needs 0 < old size <= new size, not {old_size} and {new_size}")
    head = LedgerHead.objects.filter(id=1).first()
    if head is None or new_size > head.size:
        raise ProofUnavailable(f"the ledger has fewer than {new_size} entries")
    return [p.hex() for p in merkle.consistency_path(old_size, new_size, StoredTree())]


def ledger_checkpoint_and_anchor(*, limit: int = 10) -> Checkpoint | None:
    """The periodic step: sign a checkpoint if the ledger grew, then anchor checkpoints still without one."""
    made = checkpoint_create()
    for pending in Checkpoint.objects.filter(anchor__isnull=True).order_by("size")[:limit]:
        checkpoint_anchor(pending)
    return made
