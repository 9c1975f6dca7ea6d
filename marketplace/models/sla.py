"""What the broker measured of each order's availability (issue 38): outages with their cause, the SSH probe's
running count, and the credits paid when an order fell below its SLA."""

from __future__ import annotations

import datetime as dt

from django.db import models

from marketplace.models.billing import BookEntry
from marketplace.models.orders import Instance, Order


class OutageCause(models.TextChoices):
    AGENT_SILENT = "agent_silent", "the lease agent stopped reporting"
    SSH_UNREACHABLE = "ssh_unreachable", "SSH did not answer"
    PROVIDER_STATE = "provider_state", "the provider took the machine (stopped, lost, preempted, being replaced)"


class Outage(models.Model):
    """A stretch in which the order was not usable, as the broker itself saw it. Open (``ended_at`` NULL) while
    it lasts; at most one open per (order, cause), a database constraint, so two reporters of the same cause
    meet it instead of double counting. Causes may overlap each other: availability merges them."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="outages")
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.PROTECT, related_name="outages")
    cause = models.CharField(max_length=24, choices=OutageCause.choices)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["order", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["order", "cause"], condition=models.Q(ended_at__isnull=True), name="outage_one_open_per_cause"
            ),
            models.CheckConstraint(
                condition=models.Q(ended_at__isnull=True) | models.Q(ended_at__gte=models.F("started_at")),
                name="outage_ends_after_start",
            ),
        ]
        indexes = [models.Index(fields=["cause"], condition=models.Q(ended_at__isnull=True), name="outage_open")]

    def __str__(self) -> str:
        return f"order {self.order_id} {self.cause} from {self.started_at} to {self.ended_at or 'now'}"

    def seconds(self, now: dt.datetime) -> int:
        return max(0, int(((self.ended_at or now) - self.started_at).total_seconds()))


class SshWatch(models.Model):
    """The SSH probe's memory of one order: consecutive failed probes, since when, and the last probe. One row
    per order, claimed with ``select_for_update`` by the probe that updates it."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="ssh_watch")
    failures = models.PositiveIntegerField(default=0)
    first_failed_at = models.DateTimeField(null=True, blank=True)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True, default="")

    def __str__(self) -> str:
        return f"order {self.order_id}: {self.failures} failed SSH probe(s) in a row"


class SlaCredit(models.Model):
    """The SLA judged for one order and one period (a month, or the part of it up to the order's end): what
    was committed and measured and the credit paid (``amount_minor`` 0 and no entry when none was owed).
    Unique per (order, period start): judging the same period twice pays once."""

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="sla_credits")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    committed_pct = models.DecimalField(max_digits=6, decimal_places=3)
    measured_pct = models.DecimalField(max_digits=7, decimal_places=4)
    measured_seconds = models.PositiveIntegerField()
    down_seconds = models.PositiveIntegerField()
    tier_pct = models.DecimalField(max_digits=6, decimal_places=2, default=0)
    charge_minor = models.BigIntegerField(default=0, help_text="the period's compute charge the tier applies to")
    amount_minor = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, default="USD")
    entry = models.OneToOneField(BookEntry, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["order", "period_start"]
        constraints = [
            models.UniqueConstraint(fields=["order", "period_start"], name="sla_credit_once_per_period"),
            models.CheckConstraint(condition=models.Q(amount_minor__gte=0), name="sla_credit_not_negative"),
        ]

    def __str__(self) -> str:
        return f"order {self.order_id} {self.period_start:%Y-%m}: {self.measured_pct}% -> {self.amount_minor}"
