"""The lease of each periodic job (issue 23, point 3): which run holds it, until when, and when the last began."""

from __future__ import annotations

from django.db import models


class PeriodicRun(models.Model):
    """One periodic job's lease. A run claims it with one conditional UPDATE, so of two beats' (or two workers')
    runs only one holds it; a crashed run's lease lapses at ``lease_until`` (its task's hard time limit)."""

    name = models.CharField(max_length=64, unique=True)
    holder = models.CharField(max_length=32, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    runs = models.PositiveBigIntegerField(default=0)
    skipped = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} ({'running' if self.holder else 'idle'})"
