"""The Celery queues and which worker consumes each (settings' routes and ``bin/run`` both read these).

Webhook deliveries have a queue of their own: a receiver that answers slowly holds a webhook worker, never one
that provisions orders. Each queue needs its own worker process (``celery worker -Q <queue>``); one worker
consuming both would share one pool, and slow deliveries could fill it.
"""

DEFAULT_QUEUE = "celery"  # Celery's default name, so tasks queued before the split are still consumed
WEBHOOK_QUEUE = "webhooks"
QUEUES = (DEFAULT_QUEUE, WEBHOOK_QUEUE)
WEBHOOK_TASKS = ("marketplace.webhook_deliver", "marketplace.webhooks_sweep")
