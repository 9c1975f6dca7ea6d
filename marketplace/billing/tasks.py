"""Celery tasks of billing: the periodic payouts, invoices, top-up sweeps and reconciliation."""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.utils import timezone

from marketplace.billing.invoices import invoices_issue_due
from marketplace.billing.payments import auto_topups_due, topups_settle_stale
from marketplace.billing.payouts import payouts_due
from marketplace.billing.reconciliation import reconcile_days
from marketplace.jobs import one_at_a_time
from marketplace.taskkit import TASK_OPTIONS, stops_at_soft_limit, sweep_time_check


@shared_task(name="marketplace.payouts_due", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("payouts-due")
def payouts_due_task() -> dict[str, int]:
    """Pay out every provider owed at least ``PAYOUT_MINIMUM_MINOR`` (daily, ``CELERY_BEAT_SCHEDULE``). Safe to
    run twice: a payout is keyed by its id at Stripe, and an organisation's row lock makes one payout at a time."""
    return payouts_due(before_each=sweep_time_check)


@shared_task(name="marketplace.invoices_issue_due", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("invoices-issue-due")
def invoices_issue_due_task() -> int:
    """Issue last month's invoices (marketplace.billing.invoices); safe to run again: an issued invoice is
    returned as it is, and a run cut short by its time limit is finished by the next."""
    return len(invoices_issue_due(timezone.now(), before_each=sweep_time_check))


@shared_task(name="marketplace.billing_sweep", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("billing-sweep")
def billing_sweep_task() -> dict[str, int]:
    """Every minute: charge the saved card of organisations whose credit fell below their auto top-up, and
    settle top-ups whose answer or webhook never came (marketplace.billing.payments)."""
    return {"auto_topups": auto_topups_due(before_each=sweep_time_check), **topups_settle_stale()}


@shared_task(name="marketplace.reconcile_stripe", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("reconcile-stripe")
def reconcile_stripe_task() -> dict[str, int]:
    """Match yesterday's and today's Stripe movements against the book (marketplace.billing.reconciliation);
    hourly, so yesterday is matched once more after it ended and today's mismatches show within the hour. A
    day whose Stripe could not be read is logged and tried again next time."""
    today = timezone.now().date()
    runs = reconcile_days([today - dt.timedelta(days=1), today])
    return {str(run.day): run.mismatches for run in runs}
