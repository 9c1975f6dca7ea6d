"""Ending: terminate an order's instances at its provider, release what it held, and settle an instance whose
end the provider has confirmed (or that the sweep finds ended without the order noticing)."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from marketplace.launch.leases import lease_end
from marketplace.models import (
    AttemptOutcome,
    Instance,
    Order,
    OrderState,
    StoppedPeriod,
    WebhookEventType,
)
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.launching import Step
from marketplace.orders.losses import host_silent_since
from marketplace.orders.transitions import order_transition
from marketplace.webhooks.services import instance_event_emit
from providers.base import unknown_instance
from providers.errors import (
    ProviderError,
    ProviderRequestRejected,
)
from providers.services import adapter_for_account
from providers.types import InstanceState

log = logging.getLogger(__name__)


def order_terminate_instance(*, order_id: int) -> Step:
    """Terminate the order's instance at the provider and mark the order terminated.

    Idempotent: terminating an already terminated instance is a no-op at the provider. An order that had no
    recorded instance is checked at the provider by its tag, so an instance launched just before the stop
    request is not orphaned.
    """
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.TERMINATING:
        return Step.DONE
    instance = Instance.objects.select_related("account").filter(order=order, active=True).first()
    if instance is not None:
        handle = adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
        with transaction.atomic():
            # Inactive once ended, like every other ending: nothing may take a terminated machine for live.
            ended_at = timezone.now()
            Instance.objects.filter(pk=instance.pk).update(
                state=handle.state.value, active=False, terminated_at=ended_at
            )
            # Terminated while stopped or starting: the stopped time ends with the machine.
            StoppedPeriod.objects.filter(order=order, ended_at__isnull=True).update(ended_at=ended_at)
            lease_end(attempt_id=instance.attempt_id)
            if instance.terminated_at is None:  # else the launch race in order_provision reported it
                instance_event_emit(instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_TERMINATED)
        detail = instance.provider_instance_id
    else:
        detail = ""
        pending = order.attempts.select_related("offer__account").filter(outcome=AttemptOutcome.PENDING)
        for attempt in pending:
            adapter = adapter_for_account(attempt.offer.account)
            for found in adapter.find_by_order(order.ref):
                adapter.terminate(found.region, found.instance_id)
                detail = found.instance_id
    try:
        order_transition(order=order, to=OrderState.TERMINATED, reason=order.state_reason, instance=detail)
    except TransitionRefused:
        pass
    # Every lease of an ended order ends, an in-flight attempt's too: a machine its launch still starts is
    # stopped by order_provision, and its agent must find nothing to claim.
    for attempt_id in order.attempts.values_list("pk", flat=True):
        lease_end(attempt_id=attempt_id)
    order_release_resources(order=order)
    return Step.DONE


# An ended instance's state is checked at its provider for this long after its end; one still stopping by then
# is left to the reconciler, which looks back as far and stops whatever still runs for an ended order.
ENDING_CHECK_WINDOW = dt.timedelta(hours=24)


# What an ended instance settles in: nothing will change it any more.
_ENDED_STATES = (InstanceState.TERMINATED.value, InstanceState.FAILED.value)


def instances_to_settle(*, now: dt.datetime) -> list[int]:
    """Ended instances (inactive) whose last known state is not final yet, ended within
    ``ENDING_CHECK_WINDOW``, oldest first: a terminate the provider answered with "shutting down" (AWS),
    a delete still running (GCP, Azure), a machine the provider stopped rather than terminated."""
    return list(
        Instance.objects.filter(active=False, terminated_at__gte=now - ENDING_CHECK_WINDOW)
        .exclude(state__in=_ENDED_STATES)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


# How long an ended instance may stay stopping before it is terminated again: longer than a terminate takes
# to finish (AWS's shutting-down, a GCP or Azure delete), so a terminate in flight is not repeated.
STOPPED_GRACE = dt.timedelta(minutes=5)


def instance_end_settle(*, instance_id: int, now: dt.datetime | None = None) -> str:
    """Record what the provider now says of an ended instance, so the order page, the order list and the API
    show the provider's state rather than the one its terminate answered. A provider that no longer knows the
    instance has terminated it (clouds forget deleted machines, at once or after a while). One still stopping
    or stopped ``STOPPED_GRACE`` after its end is terminated again: a machine the provider stopped rather than took
    (AWS "stopped", Azure "stopped" or deallocated, GCP's TERMINATED) keeps its disks billed, and Azure's
    "stopped" its compute, until someone deletes it. So is one still running: a lost instance (``unknown``,
    its host went silent) as soon as its host answers again, since the broker no longer pays for it, and any
    other after the same grace. Returns the state recorded.

    Idempotent, and a no-op for an active instance or one already terminated or failed. Raises the adapter's
    ``ProviderError`` when the provider cannot be asked; the next sweep asks again."""
    now = now or timezone.now()
    instance = Instance.objects.select_related("account").get(pk=instance_id)
    if instance.active or instance.state in _ENDED_STATES:
        return instance.state
    lost = instance.state == InstanceState.UNKNOWN
    if lost and host_silent_since(instance, now) is not None:
        return instance.state  # its host is still silent: a call would only wait out the agent's deadline
    adapter = adapter_for_account(instance.account)
    try:
        state = adapter.describe(instance.region, instance.provider_instance_id).state
        ended_at = instance.terminated_at or now
        # A lost machine had no terminate in flight (nobody could reach its host): it is stopped once seen.
        settled_late = lost or ended_at <= now - STOPPED_GRACE
        live = (InstanceState.STOPPING, InstanceState.STOPPED, InstanceState.RUNNING, InstanceState.PENDING)
        if state in live and settled_late:
            state = adapter.terminate(instance.region, instance.provider_instance_id).state
    except ProviderRequestRejected as exc:
        if not unknown_instance(exc):
            raise
        state = InstanceState.TERMINATED
    # Conditional on the state read: another path that settled the row meanwhile keeps its word.
    Instance.objects.filter(pk=instance.pk, active=False, state=instance.state).update(state=state.value)
    return state.value


def order_release_resources(*, order: Order) -> list[str]:
    """Best effort, right after an order ends: release what its launches created on each account it tried.
    What cannot go yet is left for ``account_resources_reconcile``; returns what was left, for the log."""
    left: list[str] = []
    accounts = {a.offer.account_id: a.offer.account for a in order.attempts.select_related("offer__account")}
    for account in accounts.values():
        try:
            remaining = adapter_for_account(account).release_order_resources(order.ref)
        except ProviderError as exc:
            left.append(f"{account.kind}/{account.name}: {exc}")
            continue
        left.extend(f"{r.kind}:{r.resource_id}" for r in remaining)
    if left:
        log.info("order %s: resources left for the reconciler: %s", order.public_id, ", ".join(left))
    return left
