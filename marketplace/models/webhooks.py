"""Webhooks: the URLs an organisation has the broker POST order and instance events to, and every delivery
and HTTP attempt, so the delivery log shows each try."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from marketplace.models.organizations import Organization


class WebhookEventType(models.TextChoices):
    ORDER_PLACED = "order.placed", "order placed"
    ORDER_PROVISIONING = "order.provisioning", "order provisioning"
    ORDER_RUNNING = "order.running", "order running"
    ORDER_STOPPING = "order.stopping", "order stopping: its machine stops, its disk kept"
    ORDER_STOPPED = "order.stopped", "order stopped"
    ORDER_STARTING = "order.starting", "order starting again (a start or a restart)"
    ORDER_TERMINATING = "order.terminating", "order terminating"
    ORDER_TERMINATED = "order.terminated", "order terminated"
    ORDER_FAILED = "order.failed", "order failed"
    ORDER_CANCELLED = "order.cancelled", "order cancelled"
    ORDER_PREEMPTION_NOTICE = "order.preemption_notice", "order outbid: its machine is taken at the notice's end"
    ORDER_CREDIT_LOW = "order.credit_low", "prepaid credit running out: the order stops when its hold is used"
    INSTANCE_LAUNCHED = "instance.launched", "instance launched"
    INSTANCE_RUNNING = "instance.running", "instance running"
    INSTANCE_READY = "instance.ready", "instance ready: GPUs checked, workload started, SSH answering"
    INSTANCE_FAILED = "instance.failed", "instance failed before running"
    INSTANCE_LOST = "instance.lost", "instance taken away by the provider"
    INSTANCE_UNHEALTHY = "instance.unhealthy", "instance unhealthy: its agent stopped reporting"
    INSTANCE_RECOVERED = "instance.recovered", "instance recovered: its agent reports again"
    INSTANCE_TERMINATED = "instance.terminated", "instance terminated"
    FLEET_SCALED = "fleet.scaled", "fleet scaling decision: replicas placed or ended, and why"
    PING = "ping", "ping (sent on request only)"


class WebhookEndpoint(models.Model):
    """A URL that receives the organisation's events, each POST signed with the endpoint's secret.

    ``events`` lists the event types it subscribes to; empty means all (``ping`` is only ever sent on request).
    The secret is kept encrypted (``providers.secrets``) because signing needs it back; the user sees it once.
    ``consecutive_failures`` counts dead deliveries since the last delivered one; at
    ``webhooks.services.DISABLE_AFTER_DEAD`` the endpoint is switched off with ``disabled_reason``.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhook_endpoints")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    url = models.CharField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    events = models.JSONField(default=list, blank=True, help_text="event types; empty means all")
    active = models.BooleanField(default=True)
    secret_encrypted = models.TextField()
    consecutive_failures = models.PositiveIntegerField(default=0)
    disabled_reason = models.CharField(max_length=255, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["organization", "active"], name="webhook_endpoint_org_active")]

    def __str__(self) -> str:
        return f"webhook {self.pk} → {self.url}"

    def subscribes(self, event_type: str) -> bool:
        return event_type != WebhookEventType.PING and (not self.events or event_type in self.events)


class DeliveryState(models.TextChoices):
    PENDING = "pending", "pending"
    DELIVERED = "delivered", "delivered"
    DEAD = "dead", "dead"


class WebhookDelivery(models.Model):
    """One event for one endpoint, sent until a 2xx answer or out of attempts (then ``dead``).

    Created in the transaction of the change it reports, so a rolled-back change sends nothing.
    ``next_attempt_at`` is when it is due; while a worker sends it, it is pushed ahead as a lease, so the
    sweep does not send it twice and a crashed worker's delivery becomes due again. A redelivery is a new row
    with the same ``event_id`` (receivers deduplicate on it) and ``redelivery_of`` set.
    """

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    event_type = models.CharField(max_length=32, choices=WebhookEventType.choices)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    redelivery_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        # The sweep's query: only pending rows, by due time.
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due", condition=models.Q(state="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} → endpoint {self.endpoint_id} ({self.state})"


class WebhookAttempt(models.Model):
    """One HTTP try of a delivery: the status code, or the error when there was no answer."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveSmallIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    response_excerpt = models.CharField(max_length=500, blank=True, default="")
    duration_ms = models.PositiveIntegerField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_delivery_number_unique")
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}: {self.status_code or self.error}"
