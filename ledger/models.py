"""Ledger rows. Created only by ``ledger.services`` inside the caller's transaction.

Entries and checkpoints are append-only three times over: the model refuses to save a changed row or delete one,
the queryset refuses ``update``/``delete``, and database triggers (migration 0002) refuse UPDATE, DELETE and
TRUNCATE whatever the client. Someone who can drop the triggers can still rewrite rows; that is what the
Merkle checkpoints, their signatures and their anchors on a chain catch.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models

GENESIS_HASH = "0" * 64


class LedgerImmutable(Exception):
    """An attempt to change or delete a ledger row."""


def _refuse(what: str) -> NoReturn:
    raise LedgerImmutable(f"ledger rows are append-only: {what} refused")


class AppendOnlyQuerySet(models.QuerySet[Any]):
    def update(self, **kwargs: Any) -> NoReturn:
        _refuse("update")

    def delete(self) -> NoReturn:
        _refuse("delete")

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("bulk_update")


class AppendOnlyModel(models.Model):
    """A row that is written once."""

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            _refuse(f"changing {type(self).__name__} {self.pk}")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"deleting {type(self).__name__} {self.pk}")


class LedgerEntry(AppendOnlyModel):
    """One entry. ``entry_hash`` = SHA-256 of the canonical envelope, which includes ``prev_hash``.

    An entry is written *queued* (no ``sequence``, ``prev_hash``, ``entry_hash`` or ``leaf_hash``) in the
    transaction of the change it records, so it commits or rolls back with it; the sequencer
    (``ledger.services.ledger_sequence``) later gives it its place in the chain, once. The database trigger
    allows exactly that one change (a queued row's chain fields filled, nothing else touched) and refuses
    every other UPDATE, as the model and queryset refuse all of them.

    The envelope (sequence, kind, subject, created_at, payload_hash, prev_hash) is the entry's Merkle leaf:
    ``leaf_hash`` = SHA-256(0x00 || envelope), kept so checkpoints and proofs need not rebuild envelopes.
    ``payload`` keeps the canonical JSON text so anyone can recompute ``payload_hash``; it never holds
    personal data, only commitments to it (``PersonalDatum``).
    """

    sequence = models.PositiveBigIntegerField(null=True)
    kind = models.CharField(max_length=64)
    subject = models.CharField(max_length=128)
    payload = models.TextField()
    payload_hash = models.CharField(max_length=64)
    # NULL, not "", while queued: the sequencer fills them, and unique hashes cannot share an empty value.
    prev_hash = models.CharField(max_length=64, null=True)  # noqa: DJ001
    entry_hash = models.CharField(max_length=64, null=True)  # noqa: DJ001
    leaf_hash = models.CharField(max_length=64, default="")  # filled by the sequencer; "" while queued
    created_at = models.DateTimeField()

    class Meta:
        # Queued entries (no sequence yet) after the sequenced ones, in the order they were written.
        ordering = [models.F("sequence").asc(nulls_last=True), "id"]
        # Every change in the marketplace inserts a row here and the sequencer updates it once, so it carries
        # only the indexes that are read: the unique sequence covers chained rows only, and no pattern-matching
        # twins. No unique entry_hash: each hash covers its unique sequence (migration 0006 says why).
        constraints = [
            models.CheckConstraint(condition=models.Q(sequence__gte=1), name="ledger_sequence_positive"),
            models.UniqueConstraint(
                fields=["sequence"], condition=models.Q(sequence__isnull=False), name="ledger_entry_sequence_unique"
            ),
        ]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(sequence__isnull=True), name="ledger_entry_queued"),
            models.Index(fields=["subject"], name="ledger_entry_subject"),
        ]

    def __str__(self) -> str:
        return f"{'queued' if self.queued else f'#{self.sequence}'} {self.kind} {self.subject}"

    @property
    def queued(self) -> bool:
        return self.sequence is None


class LedgerHead(models.Model):
    """A single row holding the chain's size and last hash; only the sequencer locks it, so sequences never gap
    or fork."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    size = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default=GENESIS_HASH)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="ledger_head_singleton")]

    def __str__(self) -> str:
        return f"ledger head size={self.size}"


class SubtreeHash(models.Model):
    """The Merkle root of a perfect, aligned block of leaves, kept so a checkpoint or a proof reads O(log n)
    hashes instead of every leaf (``ledger.tree``).

    The block is leaves ``[index << level, (index + 1) << level)``; ``level`` is a multiple of
    ``ledger.tree.TILE_HEIGHT``. Derived data: ``ledger verify`` never reads it, it recomputes from the
    entries, so a wrong row can make a proof fail to verify but cannot make a bad ledger pass.
    """

    level = models.PositiveSmallIntegerField()
    index = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["level", "index"], name="subtree_hash_position")]

    def __str__(self) -> str:
        return f"subtree level {self.level} #{self.index}"


class Checkpoint(AppendOnlyModel):
    """A signed statement of the tree: its first ``size`` entries have Merkle root ``root_hash``.

    ``note`` is the whole signed note as published (C2SP tlog-checkpoint body, a blank line, the signature
    line); ``key_id`` names the Ed25519 key that signed it.
    """

    size = models.PositiveBigIntegerField(unique=True)
    root_hash = models.CharField(max_length=64)
    origin = models.CharField(max_length=255)
    note = models.TextField()
    key_id = models.CharField(max_length=8)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["size"]

    def __str__(self) -> str:
        return f"checkpoint {self.size} {self.root_hash[:12]}"


class Anchor(AppendOnlyModel):
    """A checkpoint's (size, root) written to a chain: the transaction that carries it and its block."""

    checkpoint = models.OneToOneField(Checkpoint, on_delete=models.PROTECT, related_name="anchor")
    chain_id = models.PositiveBigIntegerField()
    tx_hash = models.CharField(max_length=66, unique=True)
    block_number = models.PositiveBigIntegerField()
    block_hash = models.CharField(max_length=66)
    sender = models.CharField(max_length=42)
    anchored_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"anchor of {self.checkpoint_id} in block {self.block_number}"


class PersonalDatum(models.Model):
    """Personal data an entry commits to: ``commitment`` = SHA-256(salt || canonical JSON of ``value``).

    Entries carry only the commitment. Erasing a person deletes these rows (salt and value); the entries,
    their hashes and every proof stay exactly as they were, and the commitment alone reveals nothing.
    """

    commitment = models.CharField(max_length=64, unique=True)
    person = models.CharField(max_length=64, db_index=True)
    salt = models.CharField(max_length=64)
    value = models.TextField()
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.person} {self.commitment[:12]}"
