"""Thin Celery tasks for the ledger."""

from __future__ import annotations

from celery import shared_task

from ledger.checkpoints import ledger_checkpoint_and_anchor


@shared_task(name="ledger.checkpoint", acks_late=True)
def ledger_checkpoint_task() -> int | None:
    """Sign a checkpoint if the ledger grew and anchor what is not anchored yet; the new checkpoint's size."""
    made = ledger_checkpoint_and_anchor()
    return None if made is None else made.size
