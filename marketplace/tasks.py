"""The market's Celery tasks, for Celery's autodiscovery (which reads each app's ``tasks.py``). Each task lives
beside the services it runs: ``catalog/tasks.py``, ``orders/tasks.py``, ``billing/tasks.py``, ``api/tasks.py``
and ``webhooks/tasks.py``; services queue work by task name (``marketplace.taskkit.enqueue``)."""

from __future__ import annotations

from marketplace.api.tasks import idempotency_expire_task
from marketplace.billing.tasks import (
    billing_sweep_task,
    invoices_issue_due_task,
    payouts_due_task,
    reconcile_stripe_task,
)
from marketplace.catalog.tasks import machines_withdraw_silent_task, offers_sync_account_task, offers_sync_all_task
from marketplace.fleets.tasks import fleet_evaluate_task, fleets_evaluate_task
from marketplace.orders.tasks import (
    cluster_advance_task,
    clusters_gpus_read_task,
    order_boot_deadline_task,
    order_boot_settle_task,
    order_poll_task,
    order_preempt_task,
    order_provision_task,
    order_silence_recover_task,
    order_silence_replace_task,
    order_terminate_task,
    orders_reconcile_task,
    orders_silence_sweep_task,
    orders_sweep_task,
)
from marketplace.sla.tasks import (
    sla_credit_settle_task,
    sla_month_close_task,
    sla_ssh_probe_all_task,
    sla_ssh_probe_task,
)
from marketplace.webhooks import tasks as webhook_tasks

__all__ = [
    "billing_sweep_task",
    "cluster_advance_task",
    "clusters_gpus_read_task",
    "fleet_evaluate_task",
    "fleets_evaluate_task",
    "idempotency_expire_task",
    "invoices_issue_due_task",
    "machines_withdraw_silent_task",
    "offers_sync_account_task",
    "offers_sync_all_task",
    "order_boot_deadline_task",
    "order_boot_settle_task",
    "order_poll_task",
    "order_preempt_task",
    "order_provision_task",
    "order_silence_recover_task",
    "order_silence_replace_task",
    "order_terminate_task",
    "orders_reconcile_task",
    "orders_silence_sweep_task",
    "orders_sweep_task",
    "payouts_due_task",
    "reconcile_stripe_task",
    "sla_credit_settle_task",
    "sla_month_close_task",
    "sla_ssh_probe_all_task",
    "sla_ssh_probe_task",
    "webhook_tasks",
]
