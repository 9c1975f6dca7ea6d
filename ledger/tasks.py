"""Thin Celery tasks for the ledger."""

from __future__ import annotations

from celery import shared_task

from ledger.checkpoints import checkpoint_create, ledger_checkpoint_and_anchor
from ledger.services import ledger_sequence


@shared_task(name="ledger.checkpoint", acks_late=True)
def ledger_checkpoint_task() -> int | None:
    """Sign a checkpoint if the ledger grew and anchor what is not anchored yet; the new checkpoint's size."""
    made = ledger_checkpoint_and_anchor()
    return None if made is None else made.size


@shared_task(name="ledger.checkpoint_sign", acks_late=True)
def ledger_checkpoint_sign_task() -> int | None:
    """Sign a checkpoint now, for a buyer whose receipt has entries no checkpoint covers yet (queued by
    ``ledger.receipts.checkpoint_sign_soon``, at most one per ``PROMPT_SIGNING_SPACING_S``); the new
    checkpoint's size, or None when one already covers the ledger. Safe to run twice and beside the periodic
    task: ``checkpoint_create`` is single-writer. Anchoring is left to the periodic task, as it waits on a chain."""
    made = checkpoint_create()
    return None if made is None else made.size


@shared_task(name="ledger.sequence", acks_late=True)
def ledger_sequence_task() -> int:
    """Chain the entries still queued; the number chained. Writers ask the sequencer themselves right after
    they commit; this periodic run catches the entries of a writer that died between its commit and that call.
    Any number may run at once: one sequences, the others find the sequencer's lock taken and return."""
    return ledger_sequence()
