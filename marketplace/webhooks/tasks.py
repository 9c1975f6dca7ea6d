"""Thin Celery tasks for webhooks, beside the services they run (``marketplace/tasks.py`` imports them)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from marketplace.jobs import one_at_a_time
from marketplace.webhooks.services import webhook_deliver, webhook_deliveries_due

# Both run on the webhook queue (broker/queues.py), consumed by a worker of its own.
TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True}
# A delivery is one send, bounded by its deadline, and two short transactions: far less than the app's limit.
DELIVER_LIMITS = {
    "soft_time_limit": settings.WEBHOOK_SEND_DEADLINE_S + 15,
    "time_limit": settings.WEBHOOK_SEND_DEADLINE_S + 30,
}


@shared_task(name="marketplace.webhook_deliver", **TASK_OPTIONS, **DELIVER_LIMITS)
def webhook_deliver_task(delivery_id: int) -> str:
    """Try one delivery once if it is due; safe to run twice (the service claims the row first)."""
    return webhook_deliver(delivery_id=delivery_id)


@shared_task(name="marketplace.webhooks_sweep", **TASK_OPTIONS)
@one_at_a_time("webhooks-sweep")
def webhooks_sweep_task() -> int:
    """Enqueue one delivery task per due delivery (retries, and any whose task was lost); how many."""
    ids = webhook_deliveries_due()
    for delivery_id in ids:
        webhook_deliver_task.delay(delivery_id)
    return len(ids)
