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
import itertools
import logging
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Value, Window
from django.db.models.functions import Coalesce, Lag
from django.utils import timezone

from ledger import merkle, note
from ledger.chain import Web3, recursion_limit_kept, send_anchor
from ledger.models import Anchor, Checkpoint, LedgerHead
from ledger.services import SEQUENCE_BATCHES_PER_CALL, ledger_sequence
from ledger.tree import ProofUnavailable, StoredTree, leaf_hashes, subtree_hashes_extend

__all__ = [
    "KeyPeriod",
    "ProofUnavailable",
    "checkpoint_create",
    "checkpoint_sign_claim",
    "checkpoint_sign_release",
    "consistency_proof",
    "inclusion_proofs",
    "key_history",
]

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


def previous_signing_key() -> Ed25519PrivateKey | None:
    """The retiring key during a rotation (``LEDGER_PREVIOUS_SIGNING_KEY`` or the seed in its ``_FILE``), or
    None. It cosigns the new key's first checkpoint (``checkpoint_create``) and nothing else."""
    encoded, source = settings.LEDGER_PREVIOUS_SIGNING_KEY, "LEDGER_PREVIOUS_SIGNING_KEY"
    if not encoded and settings.LEDGER_PREVIOUS_SIGNING_KEY_FILE:
        source = "LEDGER_PREVIOUS_SIGNING_KEY_FILE"
        encoded = Path(settings.LEDGER_PREVIOUS_SIGNING_KEY_FILE).read_text().strip()
    if not encoded:
        return None
    try:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        raise ImproperlyConfigured(f"{source} is not base64 of a 32-byte Ed25519 seed") from None


def verifier_key() -> str:
    """The public key auditors check checkpoint signatures with (``ledger.note`` format)."""
    return note.verifier_key(settings.LEDGER_ORIGIN, signing_key().public_key())


def _configured_keys() -> dict[str, str]:
    """The verifier keys the configuration vouches for, by key id (hex): the current key, the retiring one and
    ``LEDGER_PREVIOUS_VERIFIER_KEYS``."""
    keys = {}
    previous = previous_signing_key()
    configured = [*settings.LEDGER_PREVIOUS_VERIFIER_KEYS, verifier_key()]
    if previous is not None:
        configured.insert(0, note.verifier_key(settings.LEDGER_ORIGIN, previous.public_key()))
    for vkey in configured:
        try:
            _name, key_id, _public = note.parse_verifier_key(vkey)
        except note.NoteError as exc:
            raise ImproperlyConfigured(f"LEDGER_PREVIOUS_VERIFIER_KEYS holds a bad key: {exc}") from None
        keys[key_id.hex()] = vkey.strip()
    return keys


def verifier_keys() -> dict[str, str]:
    """Every verifier key a checkpoint may have been signed with, by key id (hex): the configured keys and every
    key a verified handover checkpoint links to one of them (``key_history``)."""
    return {p.key_id: p.verifier_key for p in key_history() if p.verifier_key and p.trusted} | _configured_keys()


@dataclass(frozen=True)
class KeyPeriod:
    """One signing key's turn: the checkpoints of sizes ``first_size``..``last_size`` (None for the current key
    before its first checkpoint). ``handover`` is the note of its first checkpoint when the key before cosigned
    it, naming this key (``ledger.note``); None for the first key and for a rotation the old key did not sign.
    ``trusted``: the configuration holds this key, or a verified handover links it to one that is."""

    key_id: str
    verifier_key: str | None
    first_size: int | None
    last_size: int | None
    first_signed_at: dt.datetime | None
    last_signed_at: dt.datetime | None
    handover: str | None
    trusted: bool


def _handover_keys(handover: str) -> tuple[str, str] | None:
    """(old, new) verifier keys of a handover note whose signatures by both verify, else None."""
    try:
        text = handover.partition("\n\n")[0] + "\n"
        named = note.parse_body(text).rotation()
        if named is None:
            return None
        for vkey in named:
            note.open_note(handover, vkey)
    except note.NoteError:
        return None
    return named


def _key_runs() -> tuple[list[list[Any]], dict[int, str]]:
    """[key_id, first_size, last_size, first_at, last_at] for each run of checkpoints by one key, and the note of
    each run's first checkpoint. The database finds where the key changes (LAG over the size order), so Python
    reads a row per rotation, not one per checkpoint (a checkpoint a minute is half a million a year)."""
    starts = list(
        Checkpoint.objects.annotate(before=Coalesce(Window(Lag("key_id"), order_by=F("size").asc()), Value("")))
        .exclude(before=F("key_id"))
        .order_by("size")
        .values_list("key_id", "size", "created_at", "note")
    )
    runs: list[list[Any]] = []
    for index, (key_id, size, created_at, _note) in enumerate(starts):
        later = (
            Checkpoint.objects.filter(size__lt=starts[index + 1][1]) if index + 1 < len(starts) else Checkpoint.objects
        )
        last_size, last_at = later.order_by("-size").values_list("size", "created_at")[0]
        runs.append([key_id, size, last_size, created_at, last_at])
    return runs, {size: text for _id, size, _at, text in starts}


_history_memo: dict[tuple[Any, ...], list[KeyPeriod]] = {}


def key_history() -> list[KeyPeriod]:
    """Every key that signed checkpoints, in size order, each with the range it signed, then the current key if
    it has signed none yet. Keys are named from the configuration and from the handover notes; a key is
    ``trusted`` only when configured or reached from a configured key through verified handovers.

    Public endpoints serve it, so it is computed once per new checkpoint: checkpoint rows are append-only, so the
    newest one's size and root stand for the whole table, and the configured keys for the rest."""
    newest = Checkpoint.objects.order_by("-size").values_list("size", "root_hash").first()
    memo_key = (newest, tuple(sorted(_configured_keys().items())))
    if newest is not None and memo_key in _history_memo:
        return _history_memo[memo_key]
    periods = _key_history()
    if newest is not None:
        _history_memo.clear()  # only the newest is ever asked for again
        _history_memo[memo_key] = periods
    return periods


def _key_history() -> list[KeyPeriod]:
    runs, notes = _key_runs()
    handovers: list[str | None] = [None]
    named: dict[str, str] = {}
    for previous, run in itertools.pairwise(runs):
        keys = _handover_keys(notes[run[1]])
        ids = None if keys is None else [note.parse_verifier_key(k)[1].hex() for k in keys]
        linked = keys is not None and ids == [previous[0], run[0]]
        handovers.append(notes[run[1]] if linked else None)
        if keys is not None and linked:
            named.update({previous[0]: keys[0], run[0]: keys[1]})
    configured = _configured_keys()
    trusted = {i for i, run in enumerate(runs) if run[0] in configured}
    grew = True
    while grew:  # a handover links both ways: the old key named its successor, the new key its predecessor
        before = len(trusted)
        trusted |= {i for i in range(1, len(runs)) if handovers[i] and i - 1 in trusted}
        trusted |= {i - 1 for i in range(1, len(runs)) if handovers[i] and i in trusted}
        grew = len(trusted) > before
    periods = []
    for i, (key_id, first, last, first_at, last_at) in enumerate(runs):
        vkey = configured.get(key_id) or named.get(key_id)
        periods.append(KeyPeriod(key_id, vkey, first, last, first_at, last_at, handovers[i], i in trusted))
    current = note.key_id(settings.LEDGER_ORIGIN, signing_key().public_key()).hex()
    if not periods or periods[-1].key_id != current:
        periods.append(KeyPeriod(current, verifier_key(), None, None, None, None, None, True))
    return periods


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


# --- Anchors ----------------------------------------------------------------------------------------------------


@cache
def _embedded_chain() -> Web3:
    """The in-process test chain: one per process, gone when the process ends (development and tests only)."""
    with recursion_limit_kept():  # py-evm's import raises the process's recursion limit
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
