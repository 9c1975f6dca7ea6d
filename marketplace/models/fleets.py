"""Fleets: replicas of one launch configuration that the broker orders and ends to follow a scaling rule, each
scaling decision it took, and the metric samples a fleet's workload posts."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from marketplace.fleets.policy import MAX_REPLICAS, Action, RuleKind
from marketplace.models.organizations import Organization

# A posted metric's value lies within this, either side of zero: past it, it is a unit mix-up or an attack
# on the sums, not a load (and floats lose whole units beyond 2**53 anyway).
METRIC_VALUE_BOUND = 1e12


class FleetState(models.TextChoices):
    ACTIVE = "active", "active"
    ENDED = "ended", "ended: every replica terminated, none placed again"


class FleetRuleKind(models.TextChoices):
    UTILIZATION = RuleKind.UTILIZATION.value, "the replicas' mean GPU utilization"
    METRIC = RuleKind.METRIC.value, "a metric the workload reports"
    SCHEDULE = RuleKind.SCHEDULE.value, "a schedule"


class MetricSource(models.TextChoices):
    POST = "post", "POSTed by the workload to /api/v1/fleets/<id>/metrics"
    PROMETHEUS = "prometheus", "read from a Prometheus text endpoint on each running replica"


class FleetAction(models.TextChoices):
    HOLD = Action.HOLD.value, "hold"
    SCALE_OUT = Action.SCALE_OUT.value, "scale out"
    SCALE_IN = Action.SCALE_IN.value, "scale in"
    REPLACE = Action.REPLACE.value, "replace lost replicas"
    END = "end", "end the fleet"


class Fleet(models.Model):
    """A buyer's fleet: ``min_replicas``..``max_replicas`` orders of one launch configuration for one demand,
    which the broker places and ends to follow the rule (``marketplace/fleets/services.py``).

    Each replica is a plain ``Order`` (``Order.fleet``), placed through the matching engine across every
    provider kind, never above ``max_price_per_gpu_hour`` per GPU nor, summed over every replica's spend, above
    ``budget_usd``. ``desired`` is what the last decision asked for; ``decision_count`` counts them and makes each
    placement's idempotency key, so an evaluation run again places nothing twice. State moves by conditional
    UPDATE only (active -> ended). ``metrics_token_hash`` is the SHA-256 of the fleet's metrics token, which
    replicas receive as a secret env var and which is good for this fleet's ``/metrics`` only.
    """

    TRANSITIONS: dict[str, frozenset[str]] = {
        FleetState.ACTIVE: frozenset({FleetState.ENDED}),
        FleetState.ENDED: frozenset(),
    }

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="fleets")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="fleets")
    name = models.CharField(max_length=80)
    launch_config = models.ForeignKey(
        "marketplace.LaunchConfiguration", on_delete=models.PROTECT, related_name="fleets"
    )
    demand = models.JSONField(help_text="one replica's demand as the engine reads it (as Quote.demand)")
    max_price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, help_text="USD, the price cap")
    budget_usd = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, help_text="total its replicas may spend; NULL: none"
    )
    min_replicas = models.PositiveSmallIntegerField()
    max_replicas = models.PositiveSmallIntegerField()
    # The rule (marketplace.fleets.policy.ScalingRule). Targets are utilization percent or metric units, not money.
    rule_kind = models.CharField(max_length=16, choices=FleetRuleKind.choices)
    rule_target = models.FloatField(default=60.0)
    rule_tolerance = models.FloatField(default=0.1)
    rule_window_s = models.PositiveIntegerField(default=300)
    scale_out_cooldown_s = models.PositiveIntegerField(default=180)
    scale_in_cooldown_s = models.PositiveIntegerField(default=600)
    step_out = models.PositiveSmallIntegerField(default=4)
    step_in = models.PositiveSmallIntegerField(default=2)
    schedule = models.JSONField(
        default=list, blank=True, help_text="[{days: [0..6], start: 'HH:MM', end: 'HH:MM', replicas}] in UTC"
    )
    metric_name = models.CharField(max_length=128, blank=True, default="")
    metric_source = models.CharField(max_length=16, choices=MetricSource.choices, blank=True, default="")
    metric_port = models.PositiveIntegerField(null=True, blank=True)
    metric_path = models.CharField(max_length=200, blank=True, default="")
    metrics_token_hash = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=FleetState.choices, default=FleetState.ACTIVE)
    state_reason = models.TextField(blank=True, default="")
    state_changed_at = models.DateTimeField()
    desired = models.PositiveSmallIntegerField(default=0)
    decision_count = models.PositiveIntegerField(default=0, help_text="decisions taken so far, holds included")
    last_scale_out = models.DateTimeField(null=True, blank=True)
    last_scale_in = models.DateTimeField(null=True, blank=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="fleet_idempotency_key_unique",
            ),
            models.CheckConstraint(
                condition=models.Q(min_replicas__gte=0, min_replicas__lte=models.F("max_replicas"))
                & models.Q(max_replicas__lte=MAX_REPLICAS),
                name="fleet_replica_bounds",
            ),
            models.CheckConstraint(condition=models.Q(desired__lte=MAX_REPLICAS), name="fleet_desired_bounded"),
            models.CheckConstraint(condition=models.Q(max_price_per_gpu_hour__gt=0), name="fleet_price_cap_positive"),
            models.CheckConstraint(
                condition=models.Q(budget_usd__isnull=True) | models.Q(budget_usd__gt=0), name="fleet_budget_positive"
            ),
        ]
        indexes = [models.Index(fields=["state"], name="fleet_state")]

    def __str__(self) -> str:
        return f"fleet {self.name} {self.public_id} ({self.state})"


class FleetDecision(models.Model):
    """One scaling decision of a fleet and what the broker did about it: the orders placed and ended (public
    ids), the fleet's price per hour after it, and the reason in words. Every non-hold decision is kept (a hold
    only when its reason changed), with a ``fleet.scaled`` ledger entry written in the same transaction."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="decisions")
    number = models.PositiveIntegerField(help_text="the fleet's decision counter when it was taken")
    at = models.DateTimeField()
    action = models.CharField(max_length=16, choices=FleetAction.choices)
    desired = models.PositiveSmallIntegerField()
    current = models.PositiveSmallIntegerField()
    load = models.FloatField(null=True, blank=True)
    reason = models.TextField()
    placed = models.JSONField(default=list, blank=True, help_text="public ids of the orders placed")
    ended = models.JSONField(default=list, blank=True, help_text="public ids of the orders ended")
    price_per_hour = models.DecimalField(max_digits=14, decimal_places=6, help_text="USD, the fleet's after it")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["fleet", "at"], name="fleet_decision_time")]

    def __str__(self) -> str:
        return f"{self.action} to {self.desired} for fleet {self.fleet_id} at {self.at}"


class FleetMetricSample(models.Model):
    """One value of a fleet's metric: POSTed by its workload, or read from a replica's Prometheus endpoint.
    Kept a day at most (the evaluation sweep prunes older rows)."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="metric_samples")
    order = models.ForeignKey(
        "marketplace.Order", null=True, blank=True, on_delete=models.SET_NULL, related_name="fleet_metric_samples"
    )
    name = models.CharField(max_length=128)
    value = models.FloatField()
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(value__gte=-METRIC_VALUE_BOUND, value__lte=METRIC_VALUE_BOUND),
                name="fleet_metric_value_bounded",
            )
        ]
        indexes = [models.Index(fields=["fleet", "name", "at"], name="fleet_metric_time")]

    def __str__(self) -> str:
        return f"{self.name}={self.value} for fleet {self.fleet_id} at {self.at}"
