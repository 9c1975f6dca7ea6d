"""A running order that lost its machine: a cloud's spot preemption, an outbid on an independent host, a host or
lease agent gone silent. The machine's attempt fails and the order fails over when the buyer allowed it, or
ends, with the reason on its record."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.launch.leases import lease_end
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    Instance,
    Lease,
    Order,
    OrderHealth,
    OrderState,
    SilentPeriod,
    WebhookEventType,
)
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.launching import NO_FAILOVER, Step, attempt_ledger
from marketplace.orders.reservations import reservation_release
from marketplace.orders.transitions import order_transition
from marketplace.webhooks.services import instance_event_emit
from providers.community.services import machine_silent_since
from providers.errors import (
    CapacityUnavailable,
)
from providers.services import adapter_for_account
from providers.types import InstanceState, PricingModel


def order_preempt(*, order_id: int, now: dt.datetime | None = None) -> tuple[Step, int | None]:
    """End an outbid order whose notice is over (``preempt_at`` at or before ``now``): stop its instance on its
    host, then settle it as lost (ledgered, announced, released), provisioning it again when the buyer allowed
    failover and failing it otherwise. Returns the order's next step and the order that outbid it, now free to
    launch (None when nothing was done).

    Idempotent and safe to run early: it works under the order's row lock, so of the task booked for the
    notice's end and the minute sweep, whichever comes second waits, then finds the order no longer running
    and does nothing; before ``preempt_at`` nothing happens either. Raises the adapter's
    ``TransientProviderError`` when the host cannot be asked (nothing written; the task retries, the sweep
    tries again)."""
    now = now or timezone.now()
    with transaction.atomic():
        # FOR NO KEY UPDATE: a second preemption waits here; rows that merely point at the order do not.
        order = (
            Order.objects.select_for_update(no_key=True, of=("self",))
            .select_related("preempted_for__order")
            .get(pk=order_id)
        )
        if order.state != OrderState.RUNNING or order.preempt_at is None or order.preempt_at > now:
            return Step.DONE, None
        instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
        if instance is None:
            return Step.DONE, None
        # The host's call has its own deadline; the lock is held across it so the lease is stopped once.
        handle = adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
        winner = order.preempted_for.order if order.preempted_for is not None else None
        by = (
            "an on-demand order" if winner is not None and winner.pricing_model != PricingModel.SPOT else "a higher bid"
        )
        reason = f"outbid by {by} for its GPUs on {instance.zone}; instance {instance.provider_instance_id} stopped"
        step = instance_lost(
            order, instance, state=handle.state.value, ended_at=now, reason=reason, code=OUTBID, outbid_by=by
        )
    return step, None if winner is None else winner.pk


# The provider code of a lease ended because a higher bid or an on-demand order took its GPUs.
OUTBID = "outbid"


def host_silent_since(instance: Instance, now: dt.datetime) -> dt.datetime | None:
    """The last report from the instance's host if it is an independent host silent now, else None. Its
    lease agent's heartbeats count: a lease still reporting runs on a machine that is alive."""
    lease_heard = Lease.objects.filter(attempt_id=instance.attempt_id).values_list("last_heartbeat_at", flat=True)
    return machine_silent_since(
        account_id=instance.account_id, name=instance.zone, now=now, heard_at=lease_heard.first()
    )


def instance_lost_silent(order: Order, instance: Instance, last_report: dt.datetime) -> Step:
    """The host went silent under a running lease: lost, and billed until the host's last report (recorded as
    its end, which metering reads). Its attempt fails as a capacity error, so this order's failover does not
    pick the silent machine again and the shared blocks keep other orders off it until it is withdrawn from
    sale. Recorded ``unknown``: nobody could ask the host to stop it, so the sweep and the reconciler stop it
    should the host come back."""
    billed_until = max(last_report, instance.ready_at or last_report)
    said = billed_until.isoformat(timespec="seconds")
    reason = (
        f"host {instance.zone} went silent under instance {instance.provider_instance_id}: no report for more "
        f"than {settings.AGENT_SILENCE_S:g} s; billed until {said}, the last report from the host"
    )
    return instance_lost(
        order,
        instance,
        state=InstanceState.UNKNOWN.value,
        ended_at=billed_until,
        reason=reason,
        code=HOST_SILENT,
        attempt_failed=True,
        billed_until=said,
    )


# The provider code of an attempt whose host went silent under its running lease.
HOST_SILENT = "host_silent"


def order_silence_replace(*, order_id: int, now: dt.datetime | None = None) -> Step:
    """The degraded order's launch configuration says ``on_silence: replace``: terminate the machine whose agent
    fell silent, then settle it as lost (ledgered, announced, released), provisioning the order again when the
    buyer allowed failover and failing it otherwise, as any lost machine is. Its attempt fails as
    ``agent_silent``: the order's failover skips the offer, but one machine's silence is no capacity signal,
    so its zone stays open to other orders. Billed until the machine was stopped, as it ran until then.

    Idempotent: an order no longer running and degraded on that machine is left alone (``Step.DONE``). Raises
    the adapter's ``TransientProviderError`` when the provider cannot be asked; the task retries, and the
    silence sweep queues it again should the task be lost."""
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.RUNNING or order.health != OrderHealth.DEGRADED:
        return Step.DONE
    instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
    period = SilentPeriod.objects.filter(order=order, ended_at__isnull=True).first()
    if instance is None or period is None or period.instance_id != instance.pk:
        return Step.DONE
    heard = Lease.objects.filter(attempt_id=instance.attempt_id).values_list("last_heartbeat_at", flat=True).first()
    if heard is not None and heard > period.started_at:
        # The agent reported after all (its report raced the sweep): nothing to replace; the order recovers.
        return Step.DONE
    handle = adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
    said = period.started_at.isoformat(timespec="seconds")
    reason = (
        f"the agent on instance {instance.provider_instance_id} has not reported since {said}; "
        "the launch configuration says replace, so the machine was stopped"
    )
    return instance_lost(
        order,
        instance,
        state=handle.state.value,
        ended_at=now or timezone.now(),
        reason=reason,
        code=AGENT_SILENT,
        attempt_failed=True,
        error_class=AGENT_SILENT,
        silent_since=said,
    )


# The error class and provider code of an attempt whose machine was replaced after its agent fell silent.
AGENT_SILENT = "agent_silent"


def instance_lost(
    order: Order,
    instance: Instance,
    *,
    state: str,
    ended_at: dt.datetime,
    reason: str,
    code: str,
    attempt_failed: bool = False,
    error_class: str = CapacityUnavailable.error_class,
    **fields: str,
) -> Step:
    """Settle a running order's lost machine: inactive from ``ended_at`` (where its metering stops), its units
    and lease released, ``order.instance_lost`` ledgered and announced, and the order provisioning again or,
    without failover, failed. Claims the instance: a second sweep that lost the same machine does nothing,
    and an order that moved on meanwhile (the buyer ended it) keeps its own path."""
    spot = order.pricing_model == PricingModel.SPOT
    try:
        with transaction.atomic():
            if not Instance.objects.filter(pk=instance.pk, active=True).update(
                state=state, active=False, terminated_at=ended_at
            ):
                return Step.DONE
            # Whatever took the machine, a notice of preemption on it is over: the next machine starts clean.
            Order.objects.filter(pk=order.pk, preempt_at__isnull=False).update(preempt_at=None, preempted_for=None)
            if attempt_failed:
                _lost_attempt_fail(order, instance, code=code, message=reason, error_class=error_class)
            reservation_release(attempt_id=instance.attempt_id)
            lease_end(attempt_id=instance.attempt_id)
            instance_event_emit(instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_LOST, spot=spot, **fields)
            ledger_append(
                kind="order.instance_lost",
                subject=f"order:{order.public_id}",
                payload={
                    "order": str(order.public_id),
                    "instance": instance.provider_instance_id,
                    "state": state,
                    "spot": spot,
                    "code": code,
                    **fields,
                },
            )
            if order.allow_failover:
                order_transition(order=order, to=OrderState.PROVISIONING, reason=reason + "; provisioning again")
            else:
                order_transition(order=order, to=OrderState.FAILED, reason=f"{reason}; {NO_FAILOVER.format('machine')}")
    except TransitionRefused:
        return Step.DONE
    return Step.PROVISION if order.allow_failover else Step.DONE


def _lost_attempt_fail(order: Order, instance: Instance, *, code: str, message: str, error_class: str) -> None:
    """Fail the launched attempt whose machine was lost, as ``error_class`` (once: conditional on its outcome)."""
    failed = Attempt.objects.filter(pk=instance.attempt_id, outcome=AttemptOutcome.LAUNCHED).update(
        outcome=AttemptOutcome.FAILED,
        error_class=error_class,
        provider_code=code,
        provider_message=message[:2000],
        finished_at=timezone.now(),
    )
    if failed:
        attempt = instance.attempt
        attempt.order = order
        attempt_ledger(attempt, "attempt.failed", error_class=error_class, provider_code=code)
