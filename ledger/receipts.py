"""What the broker publishes for outside verification, as plain JSON-ready dicts.

- ``entry_json``: an entry with everything needed to recompute its hashes (``created_at`` in the canonical
  text the envelope uses).
- ``checkpoint_json``: a signed checkpoint and its anchor.
- ``receipt``: one subject's entries (an order's), each with its inclusion proof against the newest
  checkpoint that covers it, that checkpoint, and the verifier key. Entries newer than every checkpoint are
  listed as ``pending``, and the receipt's ``status`` is ``pending`` (else ``complete``) with ``first_pending``,
  the first such entry's sequence, and ``signed_size``, the newest checkpoint's size (0 before the first): the
  next checkpoint covers them. Entries the sequencer has not yet chained are listed as ``queued`` (kind,
  subject, time and payload, no sequence or hashes) and make the receipt ``pending`` too.
  ``receipt_for_buyer`` also has them chained and that checkpoint signed promptly, rather than at
  the periodic one (``LEDGER_CHECKPOINT_INTERVAL_S``).
- ``audit_bundle``: checkpoints, the consistency proofs between consecutive ones, the key history, and
  optionally every leaf hash and every entry: the input of ``python -m ledger.audit``.
- ``key_history_json``: every signing key with the checkpoints it signed and the handover note that links it
  to the key before (in the bundle, in receipts, and at ``GET /api/v1/ledger/key``).

Formats are versioned by their ``format`` field; ``ledger/audit/`` is their reader.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from ledger import merkle
from ledger.canonical import canonical_bytes
from ledger.checkpoints import ProofUnavailable, checkpoint_sign_claim, checkpoint_sign_release, inclusion_proofs
from ledger.keys import key_history, verifier_key, verifier_keys
from ledger.models import Checkpoint, LedgerEntry
from ledger.services import SEQUENCE_BATCHES_PER_CALL, ledger_sequence

log = logging.getLogger(__name__)

RECEIPT_FORMAT = "broker-ledger-receipt/1"
BUNDLE_FORMAT = "broker-ledger-audit/1"
COMPLETE, PENDING = "complete", "pending"
# How soon a buyer may ask again for a pending receipt: a prompt signing is queued, and it takes a moment.
PENDING_RETRY_AFTER_S = 2
# At most one prompt signing per this many seconds, however many buyers ask: every checkpoint is anchored on a
# chain (a transaction each, 10 a minute at most by the periodic task), so buyers polling a busy ledger must not
# multiply them. Entries that just missed one wait this long at worst, not LEDGER_CHECKPOINT_INTERVAL_S.
PROMPT_SIGNING_SPACING_S = 10.0


def entry_json(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "sequence": entry.sequence,
        "kind": entry.kind,
        "subject": entry.subject,
        "created_at": canonical_bytes(entry.created_at).decode().strip('"'),
        "payload": entry.payload,
        "payload_hash": entry.payload_hash,
        "prev_hash": entry.prev_hash,
        "entry_hash": entry.entry_hash,
        "leaf_hash": entry.leaf_hash,
    }


def checkpoint_json(checkpoint: Checkpoint) -> dict[str, Any]:
    anchor = getattr(checkpoint, "anchor", None)
    return {
        "size": checkpoint.size,
        "root": checkpoint.root_hash,
        "note": checkpoint.note,
        "key_id": checkpoint.key_id,
        "created_at": canonical_bytes(checkpoint.created_at).decode().strip('"'),
        "anchor": None
        if anchor is None
        else {
            "chain_id": anchor.chain_id,
            "tx_hash": anchor.tx_hash,
            "block_number": anchor.block_number,
            "block_hash": anchor.block_hash,
            "sender": anchor.sender,
        },
    }


def _timestamp(value: Any) -> str | None:
    return None if value is None else canonical_bytes(value).decode().strip('"')


def key_history_json() -> list[dict[str, Any]]:
    """Each signing key in turn: its verifier key (null when neither the configuration nor a handover names it),
    the sizes and times of the first and last checkpoint it signed (null for the current key before its first),
    and ``handover``, its first checkpoint's note cosigned by the key before and naming both (null for the first
    key, or a rotation the old key did not sign). Readers check the handovers; they are not asked to trust this."""
    return [
        {
            "verifier_key": p.verifier_key,
            "key_id": p.key_id,
            "first_size": p.first_size,
            "last_size": p.last_size,
            "first_signed_at": _timestamp(p.first_signed_at),
            "last_signed_at": _timestamp(p.last_signed_at),
            "handover": p.handover,
        }
        for p in key_history()
    ]


def signer_key(checkpoint: Checkpoint) -> str:
    """The verifier key that signed ``checkpoint``: after a rotation the newest checkpoint may still carry
    the previous key's signature (``LEDGER_PREVIOUS_VERIFIER_KEYS``) until the next one is signed."""
    return verifier_keys().get(checkpoint.key_id, verifier_key())


def latest_checkpoint() -> Checkpoint | None:
    return Checkpoint.objects.select_related("anchor").order_by("-size").first()


def receipt(subject: str) -> dict[str, Any]:
    """The receipt of ``subject``'s entries against the newest checkpoint; reads only."""
    checkpoint = latest_checkpoint()
    everything = list(LedgerEntry.objects.filter(subject=subject))
    entries = [e for e in everything if not e.queued]
    queued = [e for e in everything if e.queued]
    covered = [e for e in entries if checkpoint is not None and e.sequence <= checkpoint.size]
    proofs: dict[int, list[str]] = {}
    problem = ""
    if checkpoint is not None:
        try:
            proofs = {p.sequence: p.path for p in inclusion_proofs([e.sequence for e in covered], checkpoint)}
        except ProofUnavailable as exc:
            # A gap below the checkpoint: publish what there is, so the reader sees the problem, not a 500.
            problem = f"no inclusion proofs: {exc}"
    pending = [e for e in entries if e not in covered]
    return {
        "format": RECEIPT_FORMAT,
        "origin": settings.LEDGER_ORIGIN,
        "status": PENDING if pending or queued else COMPLETE,
        "signed_size": 0 if checkpoint is None else checkpoint.size,
        "first_pending": pending[0].sequence if pending else None,
        "verifier_key": verifier_key() if checkpoint is None else signer_key(checkpoint),
        "subject": subject,
        "checkpoint": None if checkpoint is None else checkpoint_json(checkpoint),
        "entries": [{**entry_json(e), "inclusion_proof": proofs.get(e.sequence)} for e in covered],
        "pending": [entry_json(e) for e in pending],
        "queued": [entry_json(e) for e in queued],
        "key_history": key_history_json(),
        **({"problem": problem} if problem else {}),
    }


def receipt_for_buyer(subject: str) -> dict[str, Any]:
    """``receipt(subject)`` for a buyer waiting on it. When entries are pending, a prompt signing is queued once
    the current transaction commits (``checkpoint_sign_soon``), so asking again after ``PENDING_RETRY_AFTER_S``
    (or a few times, within ``PROMPT_SIGNING_SPACING_S``) finds them covered. The answer is what the ledger
    holds now: the signing never delays it. Entries still queued are sequenced first (unless another process is
    sequencing them at this moment)."""
    ledger_sequence(max_batches=SEQUENCE_BATCHES_PER_CALL)
    body = receipt(subject)
    if body["status"] == PENDING:
        transaction.on_commit(checkpoint_sign_soon)
    return body


def checkpoint_sign_soon() -> None:
    """Queue a prompt signing (``ledger.checkpoint_sign``) unless one was queued in the last
    ``PROMPT_SIGNING_SPACING_S``: a burst of receipt requests makes one signing. With the task queue unreachable
    the claim is dropped at once; the periodic signing still covers the entries."""
    if not checkpoint_sign_claim(hold_s=PROMPT_SIGNING_SPACING_S):
        return
    try:
        # By name, so this module and the task module beside it do not import each other.
        current_app.tasks["ledger.checkpoint_sign"].delay()
    except OperationalError as exc:
        checkpoint_sign_release()
        log.warning("could not queue a prompt checkpoint signing (%s); the periodic one will sign", exc)


def audit_bundle(*, with_leaves: bool = True, with_entries: bool = False) -> dict[str, Any]:
    """Every checkpoint with the consistency proof from the one before, and (optionally) every leaf hash up to
    the newest checkpoint, and every entry. Entries carry no personal data, but they show every
    organisation's activity: full bundles are for auditors the operator trusts with that, not for buyers."""
    checkpoints = list(Checkpoint.objects.select_related("anchor").order_by("size"))
    size = checkpoints[-1].size if checkpoints else 0
    # The stored leaf hashes as they are, gaps included: an export must not refuse the ledger an auditor
    # most needs to see. Consistency proofs need every leaf, so a gap leaves them out (and says so).
    stored = LedgerEntry.objects.filter(sequence__lte=size).order_by("sequence").values_list("leaf_hash", flat=True)
    leaves = [bytes.fromhex(h) for h in stored]
    complete = len(leaves) == size
    consistency = [
        {
            "old_size": old.size,
            "new_size": new.size,
            "proof": [p.hex() for p in merkle.consistency_proof_from_hashes(old.size, leaves[: new.size])],
        }
        for old, new in itertools.pairwise(checkpoints)
        if complete
    ]
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "origin": settings.LEDGER_ORIGIN,
        "verifier_key": verifier_key(),
        "key_history": key_history_json(),
        "checkpoints": [checkpoint_json(c) for c in checkpoints],
        "consistency": consistency,
    }
    if not complete:
        bundle["problem"] = f"the ledger holds {len(leaves)} entries up to #{size}: consistency proofs left out"
    if with_leaves:
        bundle["leaf_hashes"] = [leaf.hex() for leaf in leaves]
    if with_entries:
        bundle["entries"] = [entry_json(e) for e in LedgerEntry.objects.filter(sequence__lte=size).order_by("sequence")]
    return bundle
