"""Celery tasks of orders: thin wrappers around their services (ids in, idempotent, acks late), and the sweeps
that keep orders moving."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone

from marketplace.billing.credit_sweep import credit_sweep
from marketplace.jobs import one_at_a_time
from marketplace.models import Order, OrderState
from marketplace.orders.actions import (
    order_reboot_instance,
    order_resume_step,
    order_running_again,
    order_start_instance,
    order_stop_instance,
    orders_starting_overdue,
)
from marketplace.orders.bids import PREEMPT_TASK, orders_preemption_due
from marketplace.orders.cluster_telemetry import clusters_gpus_read
from marketplace.orders.clusters import cluster_advance, clusters_to_advance
from marketplace.orders.ending import instance_end_settle, instances_to_settle, order_terminate_instance
from marketplace.orders.launching import Step, attempt_settle_after_transient, order_provision
from marketplace.orders.losses import order_preempt, order_silence_replace
from marketplace.orders.readiness import order_boot_check, order_boot_settle, order_give_up, order_poll
from marketplace.orders.reconcile import account_resources_reconcile, order_reconcile, orders_to_reconcile
from marketplace.orders.running import orders_check_running
from marketplace.orders.services import orders_end_scheduled
from marketplace.orders.silence import order_silence_recover, orders_silence_sweep
from marketplace.taskkit import TASK_OPTIONS, backoff, stops_at_soft_limit, sweep_time_check
from providers.errors import ProviderError, TransientProviderError
from providers.models import ProviderAccount

log = logging.getLogger(__name__)


@shared_task(name="marketplace.order_provision", bind=True, max_retries=None, **TASK_OPTIONS)
def order_provision_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        step = order_provision(order_id=order_id)
    except TransientProviderError as exc:
        if self.request.retries < settings.PROVISION_TRANSIENT_RETRIES:
            raise self.retry(exc=exc, countdown=backoff(self.request.retries)) from None
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
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None
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
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
    return step.value


@shared_task(name="marketplace.order_terminate", bind=True, max_retries=None, **TASK_OPTIONS)
def order_terminate_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return order_terminate_instance(order_id=order_id).value
    except TransientProviderError as exc:
        # Termination is never abandoned: a machine left running bills the buyer.
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None


@shared_task(name="marketplace.order_stop", bind=True, max_retries=None, **TASK_OPTIONS)
def order_stop_task(self, order_id: int, polls: int = 0) -> str:  # type: ignore[no-untyped-def]
    """Stop the stopping order's machine, then watch it until the provider says stopped (the sweep picks up
    one that outlives ``PROVISION_POLL_LIMIT`` polls)."""
    try:
        step = order_stop_instance(order_id=order_id)
    except TransientProviderError as exc:
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None
    if step == Step.POLL and polls + 1 < settings.PROVISION_POLL_LIMIT:
        order_stop_task.apply_async((order_id, polls + 1), countdown=settings.PROVISION_POLL_INTERVAL_S)
    return step.value


@shared_task(name="marketplace.order_start", bind=True, max_retries=None, **TASK_OPTIONS)
def order_start_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return order_start_instance(order_id=order_id).value
    except TransientProviderError as exc:
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None


@shared_task(name="marketplace.order_reboot", bind=True, max_retries=None, **TASK_OPTIONS)
def order_reboot_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return order_reboot_instance(order_id=order_id).value
    except TransientProviderError as exc:
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None


@shared_task(name="marketplace.order_running_again", **TASK_OPTIONS)
def order_running_again_task(order_id: int, at: str) -> bool:
    """The lease agent reported (at ``at``, ISO 8601) for a starting order (marketplace/orders/actions.py)."""
    return order_running_again(order_id=order_id, at=datetime.fromisoformat(at))


@shared_task(name="marketplace.cluster_advance", bind=True, max_retries=None, **TASK_OPTIONS)
def cluster_advance_task(self, cluster_id: int) -> str:  # type: ignore[no-untyped-def]
    """A node of the cluster changed state: run the group's rule (marketplace/orders/clusters.py)."""
    return cluster_advance(cluster_id=cluster_id)


def _preempt_and_move_on(order_id: int) -> Step:
    """Preempt the order if its notice is over, then queue what follows: its own provisioning when it fails
    over, and the order that outbid it."""
    step, winner_id = order_preempt(order_id=order_id)
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
    if winner_id is not None:
        order_provision_task.delay(winner_id)
    return step


@shared_task(name=PREEMPT_TASK, bind=True, max_retries=None, **TASK_OPTIONS)
def order_preempt_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """Booked by the notice for its end (``eta``): take the outbid order's machine then, not at the next sweep.
    Run early, twice, or after the sweep did it, it does nothing."""
    try:
        return _preempt_and_move_on(order_id).value
    except TransientProviderError as exc:
        # The host did not answer: retry with backoff; the sweep also keeps trying while the order is due.
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None


@shared_task(name="marketplace.orders_sweep", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("orders-sweep")
def orders_sweep_task() -> int:
    """Stop orders whose requested duration is over, and re-enqueue orders whose task was lost (placed or
    provisioning, or terminating, untouched for a while). Runs every minute (``CELERY_BEAT_SCHEDULE``)."""
    count = orders_end_scheduled()
    # Prepaid orders' holds follow their usage; an order whose credit ran out stops here.

    count += credit_sweep()["stopped"]
    # Outbid interruptible orders whose notice is over leave their machine; the order that outbid them launches.
    # Each notice booked its own task for its end (order_preempt_task): this is the backstop for a lost one.
    for order_id in orders_preemption_due(now=timezone.now()):
        sweep_time_check()
        try:
            _preempt_and_move_on(order_id)
        except ProviderError as exc:
            log.warning("could not preempt order %s: %s", order_id, exc)
            continue
        count += 1
    # Machines the provider took away (spot preemptions): noticed within a minute, re-provisioned if allowed. One
    # batched read per account and region, not one call per order; the time is checked between those reads.
    running = Order.objects.filter(state=OrderState.RUNNING).values_list("pk", flat=True)
    checked = orders_check_running(
        order_ids=list(running), before_each=sweep_time_check, provision_again=order_provision_task.delay
    )
    count += len(checked.provision)
    if checked.failed:
        log.warning("orders sweep: %d running order(s) could not be checked: %s", len(checked.failed), checked.failed)
    # Ended machines the provider was still stopping: their state follows the provider's until it is final.
    for instance_id in instances_to_settle(now=timezone.now()):
        sweep_time_check()
        try:
            instance_end_settle(instance_id=instance_id)
        except ProviderError as exc:
            log.warning("could not check ended instance %s: %s", instance_id, exc)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # one instance's surprise must not stop the sweep for every other order
            log.exception("checking ended instance %s failed", instance_id)
    # Multi-node jobs whose coordinator task was lost: the group's rule runs again (it is idempotent).

    for cluster_id in clusters_to_advance():
        sweep_time_check()
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
    # Machines started again whose agent stays silent: running (the provider bills them), left to silence.
    count += len(orders_starting_overdue())
    # Stops and starts whose task was lost, or a machine still stopping after the task's polls.
    for order_id in stale.filter(state=OrderState.STOPPING).values_list("pk", flat=True):
        order_stop_task.delay(order_id)
        count += 1
    for order_id in stale.filter(state=OrderState.STARTING, resumed_at__isnull=True).values_list("pk", flat=True):
        try:
            order_resume_step(order_id=order_id)
        except ProviderError as exc:
            log.warning("could not start order %s again: %s", order_id, exc)
        count += 1
    return count


@shared_task(name="marketplace.clusters_gpus_read", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("clusters-gpus-read")
def clusters_gpus_read_task() -> dict[str, int]:
    """Read each Kubernetes seller's DCGM exporter for its running orders' GPUs
    (marketplace.orders.cluster_telemetry)."""
    return clusters_gpus_read(now=timezone.now())


@shared_task(name="marketplace.orders_reconcile", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("orders-reconcile")
def orders_reconcile_task() -> dict[str, int]:
    """Compare stuck and recently ended orders with the providers and fix drift (marketplace.orders.reconcile)."""
    totals = {"orders": 0, "adopted": 0, "terminated": 0, "errors": 0, "released": 0}
    now = timezone.now()
    for order_id in orders_to_reconcile(now=now):
        sweep_time_check()
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
        sweep_time_check()
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


@shared_task(name="marketplace.orders_silence_sweep", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("orders-silence")
def orders_silence_sweep_task() -> dict[str, int]:
    """Degrade running orders whose lease agent fell silent, recover those that report again, and queue a lost
    replacement again (marketplace/orders/silence.py). Bounded per run; runs every 15 s."""
    swept = orders_silence_sweep(before_each=sweep_time_check)
    if swept.failed:
        log.warning("silence sweep: %d order(s) could not be judged: %s", len(swept.failed), swept.failed)
    return {
        "degraded": len(swept.degraded),
        "recovered": len(swept.recovered),
        "replace_again": len(swept.replace_again),
        "failed": len(swept.failed),
    }


@shared_task(name="marketplace.order_silence_replace", bind=True, max_retries=None, **TASK_OPTIONS)
def order_silence_replace_task(self, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """The buyer chose to replace a machine whose agent fell silent: stop it and fail the order over."""
    try:
        step = order_silence_replace(order_id=order_id)
    except TransientProviderError as exc:
        raise self.retry(exc=exc, countdown=backoff(min(self.request.retries, 5))) from None
    if step == Step.PROVISION:
        order_provision_task.delay(order_id)
    return step.value


@shared_task(name="marketplace.order_silence_recover", **TASK_OPTIONS)
def order_silence_recover_task(order_id: int) -> bool:
    """A degraded order's agent reported again: it is healthy, and its silent period closes at that report."""
    return order_silence_recover(order_id=order_id)
