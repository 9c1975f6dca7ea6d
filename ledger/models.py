"""Ledger rows. Created only by ``ledger.services.ledger_append`` inside the caller's transaction."""

from __future__ import annotations

from django.db import models

GENESIS_HASH = "0" * 64


class LedgerEntry(models.Model):
    """One entry. ``entry_hash`` = SHA-256 of the canonical envelope, which includes ``prev_hash``.

    The envelope (sequence, kind, subject, created_at, payload_hash, prev_hash) is what later proofs commit to;
    ``payload`` keeps the canonical JSON text so anyone can recompute ``payload_hash``.
    """

    sequence = models.PositiveBigIntegerField(unique=True)
    kind = models.CharField(max_length=64)
    subject = models.CharField(max_length=128, db_index=True)
    payload = models.TextField()
    payload_hash = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64)
    entry_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["sequence"]
        constraints = [models.CheckConstraint(condition=models.Q(sequence__gte=1), name="ledger_sequence_positive")]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.kind} {self.subject}"


class LedgerHead(models.Model):
    """A single row holding the chain's size and last hash; appends lock it so sequences never gap or fork."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    size = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default=GENESIS_HASH)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="ledger_head_singleton")]

    def __str__(self) -> str:
        return f"ledger head size={self.size}"
