"""Reads of the ledger."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Max, QuerySet

from ledger.models import LedgerEntry


def entries_for_subject(subject: str) -> QuerySet[LedgerEntry]:
    """The subject's entries in chain order, those still queued for the sequencer last."""
    return LedgerEntry.objects.filter(subject=subject)


def latest_hashes(subjects: Iterable[str]) -> dict[str, str]:
    """The newest entry hash per subject, in two queries whatever the number of subjects."""
    subjects = list(subjects)
    if not subjects:
        return {}
    newest = (
        LedgerEntry.objects.filter(subject__in=subjects).values("subject").annotate(seq=Max("sequence")).values("seq")
    )
    return dict(LedgerEntry.objects.filter(sequence__in=newest).values_list("subject", "entry_hash"))
