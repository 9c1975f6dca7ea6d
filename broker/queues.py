"""The Celery queues, which tasks go to each, and which worker consumes each (settings' routes and ``bin/run``
both read these) (issue 23, point 1).

One queue per concern, each consumed by a worker pool of its own, so a flood of one never waits in front of
another: thousands of offer syncs (``sync``) or a checkpoint waiting on a slow chain (``ledger``) or deliveries
to slow webhook receivers (``webhooks``) never hold a slot a buyer's launch needs (``provisioning``).
Everything else (the sweeps, billing, payouts) shares the default queue. A worker started without ``-Q``
consumes every queue (settings' ``CELERY_TASK_QUEUES``), as a single-process test or a small install does.
"""

DEFAULT_QUEUE = "celery"  # Celery's default name, so tasks queued before the split are still consumed
PROVISIONING_QUEUE = "provisioning"
SYNC_QUEUE = "sync"
LEDGER_QUEUE = "ledger"
WEBHOOK_QUEUE = "webhooks"
QUEUES = (DEFAULT_QUEUE, PROVISIONING_QUEUE, SYNC_QUEUE, LEDGER_QUEUE, WEBHOOK_QUEUE)

WEBHOOK_TASKS = ("marketplace.webhook_deliver", "marketplace.webhooks_sweep")
PROVISIONING_TASKS = (
    "marketplace.order_provision",
    "marketplace.order_poll",
    "marketplace.order_boot_deadline",
    "marketplace.order_boot_settle",
    "marketplace.order_terminate",
    "marketplace.cluster_advance",
    "marketplace.order_silence_replace",
    "marketplace.order_preempt",
)
SYNC_TASKS = ("marketplace.offers_sync_account",)
LEDGER_TASKS = ("ledger.checkpoint", "ledger.checkpoint_sign", "ledger.sequence")

ROUTES: dict[str, str] = {
    **{name: WEBHOOK_QUEUE for name in WEBHOOK_TASKS},
    **{name: PROVISIONING_QUEUE for name in PROVISIONING_TASKS},
    **{name: SYNC_QUEUE for name in SYNC_TASKS},
    **{name: LEDGER_QUEUE for name in LEDGER_TASKS},
}
