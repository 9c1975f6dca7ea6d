"""Celery tasks: thin wrappers that call one service each. Ids in, idempotent, acks late."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery import current_app, current_task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from marketplace.catalog.fanout import offers_sync_claim, offers_sync_release
from marketplace.catalog.services import offers_sync
from marketplace.jobs import one_at_a_time
from marketplace.models import Order, OrderState
from marketplace.orders.bids import orders_preemption_due
from marketplace.orders.provisioning import (
    Step,
    attempt_settle_after_transient,
    instance_end_settle,
    instances_to_settle,
    order_boot_check,
    order_boot_settle,
    order_give_up,
    order_poll,
    order_preempt,
    order_provision,
    order_terminate_instance,
    orders_check_running,
)
from providers.errors import ProviderError, TransientProviderError
from providers.models import ProviderAccount

log = logging.getLogger(__name__)

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True}
# A whole cloud's catalogue (many regions, paged calls, each bounded by its client's deadline) may take longer
# than the app-wide limit (CELERY_TASK_SOFT_TIME_LIMIT); the other tasks here keep that one.
SYNC_LIMITS = {"soft_time_limit": 900, "time_limit": 960}


_sweep_deadline: ContextVar[float | None] = ContextVar("sweep_deadline", default=None)


def _stops_at_soft_limit(sweep: Callable[..., Any]) -> Callable[..., Any]:
    """A sweep that reaches its soft time limit stops there and returns None: each item it finished was its own
    transaction and stays done, and the next run (the beat's) carries on."""

    @functools.wraps(sweep)
    def run(*args: Any, **kwargs: Any) -> Any:
        # The limits a message carries (the sender's settings) are the ones the worker enforces.
        hard_soft = getattr(getattr(current_task, "request", None), "timelimit", None) or (None, None)
        limit = hard_soft[1] or current_app.conf.task_soft_time_limit
        token = _sweep_deadline.set(time.monotonic() + limit if limit else None)
        try:
            return sweep(*args, **kwargs)
        except SoftTimeLimitExceeded:
            log.warning("%s stopped at its soft time limit; the next run carries on", sweep.__name__)
            return None
        finally:
            _sweep_deadline.reset(token)

    return run


def _sweep_time_check() -> None:
    """Before each item of a sweep: past the soft limit, stop. The limit's own exception may never reach the
    sweep: an SDK that catches every exception during a request (botocore turns it into a retryable
    HTTPClientError) returns a ProviderError instead, once its call gives up."""
    deadline = _sweep_deadline.get()
    if deadline is not None and time.monotonic() >= deadline:
        raise SoftTimeLimitExceeded()


def _backoff(retries: int) -> float:
    return float(min(60, 2 ** (retries + 1)))


@shared_task(name="marketplace.offers_sync_account", **TASK_OPTIONS, **SYNC_LIMITS)
def offers_sync_account_task(account_id: int) -> bool:
    """Sync one provider account's offers; a failure is recorded on the account, never raised. Then hand the
    next due account to the queue (marketplace/catalog/fanout.py), so a round reaches every account with at
    most ``OFFER_SYNC_IN_FLIGHT`` syncs queued at a time."""
    try:
        return offers_sync(account_id=account_id).ok
    finally:
        offers_sync_release(account_id=account_id)
        for next_id in offers_sync_claim():
            offers_sync_account_task.delay(next_id)


@shared_task(name="marketplace.offers_sync_all", **TASK_OPTIONS)
@one_at_a_time("offers-sync-all")
def offers_sync_all_task() -> int:
    """Start a sync round: hand the due accounts to the queue, as many as the in-flight bound allows; each sync
    that ends hands over the next. One task per account, so one slow or failing cloud blocks no other."""
    ids = offers_sync_claim()
    for account_id in ids:
        offers_sync_account_task.delay(account_id)
    return len(ids)


@shared_task(name="marketplace.order_provision", bind=True, max_retries=None, **TASK_OPTIONS)
def order_provision_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        step = order_provision(order_id=order_id)
    except TransientProviderError as exc:
        if self.request.retries < settings.PROVISION_TRANSIENT_RETRIES:
            raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from None
        # Out of retries for this offer: adopt what it launched despite the errors, or fail it over.
        try:
            step = attempt_settle_after_transient(order_id=order_id, error=exc)
        except TransientProviderError as lookup_error:
            raise self.retry(exc=lookup_error, countdown=60) from None
        if step != Step.POLL:
            # The next offer gets a task of its own, with a fresh retry budget.
            order_provision_task.delay(order_id)
            return "failed-over"
    if step == Step.POLL:
        order_poll_task.apply_async((order_id,), countdown=settings.PROVISION_POLL_INTERVAL_S)
    return step.value


@shared_task(name="marketplace.order_poll", bind=True, max_retries=None, **TASK_OPTIONS)
def order_poll_task(self, order_id: int, polls: int = 0) -> str:  # type: ignore[no-untyped-def]
    try:
        step = order_poll(order_id=order_id)
    except TransientProviderError:
        step = Step.POLL
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
        return step.value
    if step == Step.WAIT:
        # The provider runs the machine; the agent's ready report moves the order on, and the check booked at
        # the boot deadline when the launch was recorded catches a silent one.
        return step.value
    if step == Step.POLL:
        if polls + 1 >= settings.PROVISION_POLL_LIMIT:
            order_give_up(order_id=order_id, reason=f"instance not running after {polls + 1} polls")
            return Step.DONE.value
        order_poll_task.apply_async((order_id, polls + 1), countdown=settings.PROVISION_POLL_INTERVAL_S)
    return step.value


@shared_task(name="marketplace.order_boot_deadline", bind=True, max_retries=None, **TASK_OPTIONS)
def order_boot_deadline_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """Fail over a machine that has not reported ready by its deadline; nothing when it has, or has time left."""
    try:
        step = order_boot_check(order_id=order_id)
    except TransientProviderError as exc:
        raise self.retry(exc=exc, countdown=_backoff(min(self.request.retries, 5))) from None
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
    return step.value


@shared_task(name="marketplace.order_boot_settle", bind=True, max_retries=None, **TASK_OPTIONS)
def order_boot_settle_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """The agent reported the machine unusable: terminate it, then fail the order or fail over."""
    try:
        step = order_boot_settle(order_id=order_id)
    except TransientProviderError as exc:
        # The machine must go: retried until the provider answers.
        raise self.retry(exc=exc, countdown=_backoff(min(self.request.retries, 5))) from None
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
    return step.value


@shared_task(name="marketplace.order_terminate", bind=True, max_retries=None, **TASK_OPTIONS)
def order_terminate_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return order_terminate_instance(order_id=order_id).value
    except TransientProviderError as exc:
        # Termination is never abandoned: a machine left running bills the buyer.
        raise self.retry(exc=exc, countdown=_backoff(min(self.request.retries, 5))) from None


@shared_task(name="marketplace.cluster_advance", bind=True, max_retries=None, **TASK_OPTIONS)
def cluster_advance_task(self, cluster_id: int) -> str:  # type: ignore[no-untyped-def]
    """A node of the cluster changed state: run the group's rule (marketplace/orders/clusters.py)."""
    from marketplace.orders.clusters import cluster_advance

    return cluster_advance(cluster_id=cluster_id)


@shared_task(name="marketplace.orders_sweep", **TASK_OPTIONS)
@_stops_at_soft_limit
@one_at_a_time("orders-sweep")
def orders_sweep_task() -> int:
    """Stop orders whose requested duration is over, and re-enqueue orders whose task was lost (placed or
    provisioning, or terminating, untouched for a while). Runs every minute (``CELERY_BEAT_SCHEDULE``)."""
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.orders.services import orders_end_scheduled

    count = orders_end_scheduled()
    # Prepaid orders' holds follow their usage; an order whose credit ran out stops here.
    from marketplace.billing.credit import credit_sweep

    count += credit_sweep()["stopped"]
    # Outbid interruptible orders whose notice is over leave their machine; the order that outbid them launches.
    for order_id in orders_preemption_due(now=timezone.now()):
        _sweep_time_check()
        try:
            step, winner_id = order_preempt(order_id=order_id)
        except ProviderError as exc:
            log.warning("could not preempt order %s: %s", order_id, exc)
            continue
        if step == Step.PROVISION:
            order_provision_task.delay(order_id)
        if winner_id is not None:
            order_provision_task.delay(winner_id)
        count += 1
    # Machines the provider took away (spot preemptions): noticed within a minute, re-provisioned if allowed. One
    # batched read per account and region, not one call per order; the time is checked between those reads.
    running = Order.objects.filter(state=OrderState.RUNNING).values_list("pk", flat=True)
    checked = orders_check_running(
        order_ids=list(running), before_each=_sweep_time_check, provision_again=order_provision_task.delay
    )
    count += len(checked.provision)
    if checked.failed:
        log.warning("orders sweep: %d running order(s) could not be checked: %s", len(checked.failed), checked.failed)
    # Ended machines the provider was still stopping: their state follows the provider's until it is final.
    for instance_id in instances_to_settle(now=timezone.now()):
        _sweep_time_check()
        try:
            instance_end_settle(instance_id=instance_id)
        except ProviderError as exc:
            log.warning("could not check ended instance %s: %s", instance_id, exc)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # one instance's surprise must not stop the sweep for every other order
            log.exception("checking ended instance %s failed", instance_id)
    # Multi-node jobs whose coordinator task was lost: the group's rule runs again (it is idempotent).
    from marketplace.orders.clusters import cluster_advance, clusters_to_advance

    for cluster_id in clusters_to_advance():
        _sweep_time_check()
        try:
            cluster_advance(cluster_id=cluster_id)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # one cluster's surprise must not stop the sweep for every other order
            log.exception("advancing cluster %s failed", cluster_id)
    cutoff = timezone.now() - timedelta(minutes=5)
    stale = Order.objects.filter(state_changed_at__lt=cutoff)
    for order_id in stale.filter(state__in=[OrderState.PLACED, OrderState.PROVISIONING]).values_list("pk", flat=True):
        order_provision_task.delay(order_id)
        count += 1
    for order_id in stale.filter(state=OrderState.TERMINATING).values_list("pk", flat=True):
        order_terminate_task.delay(order_id)
        count += 1
    return count


@shared_task(name="marketplace.orders_reconcile", **TASK_OPTIONS)
@_stops_at_soft_limit
@one_at_a_time("orders-reconcile")
def orders_reconcile_task() -> dict[str, int]:
    """Compare stuck and recently ended orders with the providers and fix drift (marketplace.orders.reconcile)."""
    from django.utils import timezone

    from marketplace.orders.reconcile import account_resources_reconcile, order_reconcile, orders_to_reconcile

    totals = {"orders": 0, "adopted": 0, "terminated": 0, "errors": 0, "released": 0}
    now = timezone.now()
    for order_id in orders_to_reconcile(now=now):
        _sweep_time_check()
        try:
            report = order_reconcile(order_id=order_id)
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not one order's failure
        except Exception:  # one order's surprise must not stop the sweep for everyone else's
            log.exception("reconciling order %s failed", order_id)
            totals["errors"] += 1
            continue
        totals["orders"] += 1
        totals["adopted"] += len(report.adopted)
        totals["terminated"] += len(report.terminated)
        totals["errors"] += len(report.errors)
    for account_id in ProviderAccount.objects.filter(enabled=True).values_list("pk", flat=True):
        _sweep_time_check()
        try:
            report = account_resources_reconcile(account_id=account_id, now=now)
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            log.exception("reconciling the resources of account %s failed", account_id)
            totals["errors"] += 1
            continue
        totals["released"] += len(report.terminated)
        totals["errors"] += len(report.errors)
    return totals


@shared_task(name="marketplace.idempotency_expire", **TASK_OPTIONS)
@one_at_a_time("idempotency-expire")
def idempotency_expire_task() -> int:
    from marketplace.api.idempotency import idempotent_responses_expire

    return idempotent_responses_expire()


@shared_task(name="marketplace.payouts_due", **TASK_OPTIONS)
@_stops_at_soft_limit
@one_at_a_time("payouts-due")
def payouts_due_task() -> dict[str, int]:
    """Pay out every provider owed at least ``PAYOUT_MINIMUM_MINOR`` (daily, ``CELERY_BEAT_SCHEDULE``). Safe to
    run twice: a payout is keyed by its id at Stripe, and an organisation's row lock makes one payout at a time."""
    from marketplace.billing.payouts import payouts_due

    return payouts_due(before_each=_sweep_time_check)


@shared_task(name="marketplace.invoices_issue_due", **TASK_OPTIONS)
@_stops_at_soft_limit
@one_at_a_time("invoices-issue-due")
def invoices_issue_due_task() -> int:
    """Issue last month's invoices (marketplace.billing.invoices); safe to run again: an issued invoice is
    returned as it is, and a run cut short by its time limit is finished by the next."""
    from django.utils import timezone

    from marketplace.billing.invoices import invoices_issue_due

    return len(invoices_issue_due(timezone.now(), before_each=_sweep_time_check))


@shared_task(name="marketplace.billing_sweep", **TASK_OPTIONS)
@_stops_at_soft_limit
@one_at_a_time("billing-sweep")
def billing_sweep_task() -> dict[str, int]:
    """Every minute: charge the saved card of organisations whose credit fell below their auto top-up, and
    settle top-ups whose answer or webhook never came (marketplace.billing.payments)."""
    from marketplace.billing.payments import auto_topups_due, topups_settle_stale

    return {"auto_topups": auto_topups_due(before_each=_sweep_time_check), **topups_settle_stale()}
