"""Signed checkpoints of the ledger's Merkle tree, and the proofs that tie entries and checkpoints together.

A checkpoint says "the first ``size`` entries have root ``root``", signed with the broker's Ed25519 key
(``ledger.note``). Inclusion proofs show an entry is among a checkpoint's entries; consistency proofs show a
later checkpoint extends an earlier one. Together with the anchors (``ledger.anchoring``) they let anyone
check the ledger without trusting the database.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils import timezone
from web3 import Web3

from ledger import merkle, note
from ledger.chain import send_anchor
from ledger.models import Anchor, Checkpoint, LedgerHead
from ledger.tree import ProofUnavailable, StoredTree, leaf_hashes, subtree_hashes_extend

__all__ = ["ProofUnavailable", "checkpoint_create", "consistency_proof", "inclusion_proofs"]

log = logging.getLogger(__name__)


@cache
def signing_key() -> Ed25519PrivateKey:
    """The checkpoint key: ``LEDGER_SIGNING_KEY``, else the seed in ``LEDGER_SIGNING_KEY_FILE``, which is created
    (mode 0600) on first use when missing, so a fresh machine signs without setup."""
    encoded = settings.LEDGER_SIGNING_KEY
    source = "LEDGER_SIGNING_KEY"
    if not encoded:
        path = Path(settings.LEDGER_SIGNING_KEY_FILE)
        source = f"LEDGER_SIGNING_KEY_FILE ({path.name})"
        if not path.exists():
            seed = Ed25519PrivateKey.generate().private_bytes_raw()
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(base64.b64encode(seed).decode() + "\n")
            log.warning("made a new ledger signing key in %s; keep it safe, checkpoints are signed with it", path)
        encoded = path.read_text().strip()
    try:
        seed = base64.b64decode(encoded, validate=True)
        return Ed25519PrivateKey.from_private_bytes(seed)
    except (ValueError, binascii.Error):
        raise ImproperlyConfigured(f"{source} is not base64 of a 32-byte Ed25519 seed") from None


def verifier_key() -> str:
    """The public key auditors check checkpoint signatures with (``ledger.note`` format)."""
    return note.verifier_key(settings.LEDGER_ORIGIN, signing_key().public_key())


def verifier_keys() -> dict[str, str]:
    """Every verifier key a checkpoint may have been signed with, by key id (hex): the current key and
    ``LEDGER_PREVIOUS_VERIFIER_KEYS``."""
    keys = {}
    for vkey in [*settings.LEDGER_PREVIOUS_VERIFIER_KEYS, verifier_key()]:
        try:
            _name, key_id, _public = note.parse_verifier_key(vkey)
        except note.NoteError as exc:
            raise ImproperlyConfigured(f"LEDGER_PREVIOUS_VERIFIER_KEYS holds a bad key: {exc}") from None
        keys[key_id.hex()] = vkey
    return keys


def checkpoint_create(*, now: dt.datetime | None = None) -> Checkpoint | None:
    """Sign a checkpoint of the whole ledger as it is now; None when the newest checkpoint already covers it.

    Safe to run concurrently: the size is unique, so a second writer of the same checkpoint gets the first's.
    """
    head = LedgerHead.objects.filter(id=1).first()
    size = head.size if head else 0
    latest = Checkpoint.objects.order_by("-size").first()
    if size == 0 or (latest is not None and latest.size >= size):
        return None
    subtree_hashes_extend(size)
    root = StoredTree().root(size)
    body = note.CheckpointBody(settings.LEDGER_ORIGIN, size, root)
    key = signing_key()
    try:
        with transaction.atomic():
            return Checkpoint.objects.create(
                size=size,
                root_hash=root.hex(),
                origin=body.origin,
                note=note.sign(body, settings.LEDGER_ORIGIN, key),
                key_id=note.key_id(settings.LEDGER_ORIGIN, key.public_key()).hex(),
                created_at=now or timezone.now(),
            )
    except IntegrityError:
        return Checkpoint.objects.filter(size=size).first()


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


# --- Anchors ----------------------------------------------------------------------------------------------------


@cache
def _embedded_chain() -> Web3:
    """The in-process test chain: one per process, gone when the process ends (development and tests only)."""
    from web3 import EthereumTesterProvider

    return Web3(EthereumTesterProvider())


def chain() -> Web3:
    """The chain anchors go to: ``LEDGER_CHAIN_RPC_URL`` if set, else the embedded test chain."""
    if settings.LEDGER_CHAIN_RPC_URL:
        return Web3(Web3.HTTPProvider(settings.LEDGER_CHAIN_RPC_URL, request_kwargs={"timeout": 30}))
    return _embedded_chain()


def _chain_private_key() -> str:
    if settings.LEDGER_CHAIN_PRIVATE_KEY:
        return str(settings.LEDGER_CHAIN_PRIVATE_KEY)
    if settings.LEDGER_CHAIN_PRIVATE_KEY_FILE:
        return Path(settings.LEDGER_CHAIN_PRIVATE_KEY_FILE).read_text().strip()
    if settings.LEDGER_CHAIN_RPC_URL:
        raise ImproperlyConfigured("LEDGER_CHAIN_RPC_URL needs LEDGER_CHAIN_PRIVATE_KEY or its _FILE to sign anchors")
    return ""


def anchor_sender(w3: Web3) -> str:
    """The address the broker's anchors come from on ``w3``: the configured key's, or the test chain's first
    account."""
    private_key = _chain_private_key()
    return str(w3.eth.account.from_key(private_key).address if private_key else w3.eth.accounts[0])


def checkpoint_anchor(checkpoint: Checkpoint) -> Anchor:
    """Write ``checkpoint``'s (size, root) to the chain and record the transaction. Returns the existing anchor
    if there is one. A crash between sending and recording leaves a second anchor of the same checkpoint on
    the chain when retried: harmless, both state the same root."""
    existing = Anchor.objects.filter(checkpoint=checkpoint).first()
    if existing is not None:
        return existing
    record = send_anchor(
        chain(), checkpoint.size, bytes.fromhex(checkpoint.root_hash), private_key=_chain_private_key()
    )
    try:
        with transaction.atomic():
            return Anchor.objects.create(
                checkpoint=checkpoint,
                chain_id=record.chain_id,
                tx_hash=record.tx_hash,
                block_number=record.block_number,
                block_hash=record.block_hash,
                sender=record.sender,
                anchored_at=timezone.now(),
            )
    except IntegrityError:
        return Anchor.objects.get(checkpoint=checkpoint)


def ledger_checkpoint_and_anchor(*, limit: int = 10) -> Checkpoint | None:
    """The periodic step: sign a checkpoint if the ledger grew, then anchor checkpoints still without one."""
    made = checkpoint_create()
    for pending in Checkpoint.objects.filter(anchor__isnull=True).order_by("size")[:limit]:
        checkpoint_anchor(pending)
    return made
