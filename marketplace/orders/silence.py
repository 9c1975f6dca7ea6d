"""Silence on every provider kind (issue 33, point 5): a running order whose lease agent stops reporting is
degraded, and recovers when the agent reports again.

Degraded is a health flag on a running order, not a state of its own: the order still runs (it is metered, ends on
schedule or at its spend cap, the buyer may terminate it, the provider may take it), so every rule written for
running orders keeps holding, and the life cycle's ``state_changed_at``, which the sweeps judge staleness by, is
left alone. Its two moves are declared as data (``Order.HEALTH_TRANSITIONS``) and made only by
``order_health_transition``, which claims the row with ``UPDATE ... WHERE state = running AND health = <current>``
and, in the same transaction, opens or closes the order's ``SilentPeriod`` (the minutes without reports, for
SLAs), writes the ledger entry and queues the webhook (``instance.unhealthy``, ``instance.recovered``).

``orders_silence_sweep`` (a beat job every 15 s) notices silence: a ready lease whose last heartbeat (or its ready
report, before any heartbeat) is older than ``BROKER_LEASE_SILENCE_S``. The launch configuration's
``on_silence`` decides what follows: ``keep`` waits for the agent, ``replace`` queues
``marketplace.order_silence_replace``, which terminates the machine and fails the order over
(``provisioning.order_silence_replace``). A heartbeat that arrives again queues ``marketplace.order_silence_recover``
(``leases.lease_heartbeat``), and the sweep recovers any degraded order whose agent reported since, in case that
task was lost. Every step is safe to run twice and alongside itself: the claims decide who acts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.launch.config import ON_SILENCE_REPLACE, on_silence_of
from marketplace.models import (
    Instance,
    LeaseHeartbeat,
    LeaseState,
    Order,
    OrderHealth,
    OrderState,
    OutageCause,
    SilenceEnd,
    SilentPeriod,
    WebhookEventType,
)
from marketplace.orders.outages import outage_close, outage_open
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import instance_event_emit

log = logging.getLogger(__name__)

# What fell silent: the lease agent on the machine (every provider kind runs one).
LEASE_AGENT = "lease_agent"
# At most this many orders degraded, recovered or handed to replacement per sweep run; the next run carries on.
SWEEP_LIMIT = 200
# A degraded order to be replaced that still runs on the silent machine this long after it was noticed had its
# replacement task lost (or still retrying a provider that does not answer): the sweep queues it again.
REPLACE_AGAIN_AFTER = dt.timedelta(minutes=5)


class HealthTransitionRefused(Exception):
    """The order is not running in the health the move starts from (someone else moved it first)."""


def order_health_transition(
    *, order: Order, to: str, at: dt.datetime, instance: Instance | None = None, now: dt.datetime | None = None
) -> Order:
    """Move the running ``order``'s health to ``to`` if ``Order.HEALTH_TRANSITIONS`` allows it from ``order.health``.

    To degraded: ``instance`` is the machine whose agent fell silent and ``at`` its last report; a silent period
    opens from ``at``. To healthy: ``at`` is the first report after the silence; the open period closes there
    (recovered). Claims the row with ``UPDATE ... WHERE state = running AND health = <current>``: when the order
    moved meanwhile, ``HealthTransitionRefused`` is raised with nothing written. The period, the ledger entry
    (``order.degraded`` / ``order.recovered``) and the webhook commit with the change."""
    current = order.health
    if to not in Order.HEALTH_TRANSITIONS[current]:
        raise HealthTransitionRefused(f"order {order.public_id} cannot go from {current} to {to}")
    now = now or timezone.now()
    with transaction.atomic():
        claimed = Order.objects.filter(pk=order.pk, state=OrderState.RUNNING, health=current).update(health=to)
        if claimed != 1:
            raise HealthTransitionRefused(f"order {order.public_id} is no longer running and {current}")
        if to == OrderHealth.DEGRADED:
            if instance is None:
                raise ValueError("degrading an order needs the instance whose agent fell silent")
            period = SilentPeriod.objects.create(
                order=order, instance=instance, cause=LEASE_AGENT, started_at=at, noticed_at=now
            )
            reason = (
                f"the agent on instance {instance.provider_instance_id} has not reported since "
                f"{at.isoformat(timespec='seconds')} (more than {settings.LEASE_SILENCE_S:g} s)"
            )
            # The SLA's outage is the silent period itself: opened and closed with it, in this transaction.
            outage_open(order_id=order.pk, cause=OutageCause.AGENT_SILENT, at=at, instance=instance, detail=reason)
            event = WebhookEventType.INSTANCE_UNHEALTHY
        else:
            period = SilentPeriod.objects.select_for_update().get(order=order, ended_at__isnull=True)
            period.ended_at, period.ended_by = max(at, period.started_at), SilenceEnd.RECOVERED
            period.save(update_fields=["ended_at", "ended_by"])
            outage_close(order_id=order.pk, cause=OutageCause.AGENT_SILENT, at=period.ended_at)
            instance = period.instance
            reason = f"the agent on instance {instance.provider_instance_id} reports again"
            event = WebhookEventType.INSTANCE_RECOVERED
        on_silence = on_silence_of(order.launch_config.spec if order.launch_config_id else None)
        fields = {
            "silent_since": period.started_at.isoformat(timespec="seconds"),
            "silent_seconds": period.seconds(now),
            "on_silence": on_silence,
        }
        ledger_append(
            kind="order.degraded" if to == OrderHealth.DEGRADED else "order.recovered",
            subject=f"order:{order.public_id}",
            payload={
                "order": str(order.public_id),
                "organization": order.organization_id,
                "instance": instance.provider_instance_id,
                "health": to,
                "previous": current,
                "reason": reason,
                **fields,
            },
        )
        instance_event_emit(instance_id=instance.pk, event_type=event, now=now, reason=reason, **fields)
    order.health = to
    return order


def silence_close_on_leaving(*, order_id: int, to: str, now: dt.datetime) -> None:
    """The order leaves running (to ``to``): a silent period still open ends now, and the order is healthy
    again for whatever machine it runs on next. Called inside ``order_transition``'s transaction."""
    ended_by = SilenceEnd.REPLACED if to == OrderState.PROVISIONING else SilenceEnd.ENDED
    closed = SilentPeriod.objects.filter(order_id=order_id, ended_at__isnull=True).update(
        ended_at=now, ended_by=ended_by
    )
    outage_close(order_id=order_id, cause=OutageCause.AGENT_SILENT, at=now)
    if closed:
        Order.objects.filter(pk=order_id, health=OrderHealth.DEGRADED).update(health=OrderHealth.HEALTHY)


def order_silence_degrade(*, order_id: int, now: dt.datetime | None = None) -> bool:
    """Degrade the running order if its lease agent is silent now, and queue the machine's replacement when its
    launch configuration says ``replace``. True when this call degraded it; a healthy or already degraded order
    is left alone (idempotent)."""
    now = now or timezone.now()
    order = Order.objects.select_related("launch_config").get(pk=order_id)
    if order.state != OrderState.RUNNING or order.health != OrderHealth.HEALTHY:
        return False
    found = _silent_instances(now=now).filter(order_id=order_id).first()
    if found is None:
        return False
    try:
        with transaction.atomic():
            order_health_transition(order=order, to=OrderHealth.DEGRADED, at=found.heard, instance=found, now=now)
            if on_silence_of(order.launch_config.spec if order.launch_config_id else None) == ON_SILENCE_REPLACE:
                enqueue_on_commit("marketplace.order_silence_replace", order.pk)
    except HealthTransitionRefused:
        return False
    return True


def order_silence_recover(*, order_id: int, now: dt.datetime | None = None) -> bool:
    """Recover the degraded order if its silent machine's agent has reported since the silence began; the period
    ends at that first report. True when this call recovered it (idempotent: False when there is nothing to do)."""
    now = now or timezone.now()
    order = Order.objects.select_related("launch_config").get(pk=order_id)
    if order.state != OrderState.RUNNING or order.health != OrderHealth.DEGRADED:
        return False
    period = SilentPeriod.objects.filter(order=order, ended_at__isnull=True).first()
    if period is None:
        return False
    first = LeaseHeartbeat.objects.filter(
        lease__attempt_id=period.instance.attempt_id, at__gt=period.started_at
    ).aggregate(first=Min("at"))["first"]
    if first is None:
        return False
    try:
        order_health_transition(order=order, to=OrderHealth.HEALTHY, at=first, now=now)
    except HealthTransitionRefused:
        return False
    return True


def _silent_instances(*, now: dt.datetime) -> QuerySet[Instance]:
    """Active instances of running, healthy orders whose ready lease last reported before the silence cutoff,
    each annotated with ``heard`` (its last report), the longest silent first."""
    cutoff = now - dt.timedelta(seconds=settings.LEASE_SILENCE_S)
    return (
        Instance.objects.filter(
            active=True,
            order__state=OrderState.RUNNING,
            order__health=OrderHealth.HEALTHY,
            attempt__lease__state=LeaseState.READY,
        )
        .annotate(heard=Coalesce("attempt__lease__last_heartbeat_at", "attempt__lease__ready_at"))
        .filter(heard__lt=cutoff)
        .order_by("heard", "pk")
    )


@dataclasses.dataclass
class SilenceSwept:
    """What one ``orders_silence_sweep`` run did, by order id; ``failed`` ones were logged and left for the next."""

    degraded: list[int] = dataclasses.field(default_factory=list)
    recovered: list[int] = dataclasses.field(default_factory=list)
    replace_again: list[int] = dataclasses.field(default_factory=list)
    failed: list[int] = dataclasses.field(default_factory=list)


def orders_silence_sweep(
    *, now: dt.datetime | None = None, limit: int = SWEEP_LIMIT, before_each: Callable[[], None] | None = None
) -> SilenceSwept:
    """Degrade running orders whose lease agent fell silent, recover degraded ones whose agent reported since,
    and queue again a replacement that has not happened. At most ``limit`` orders of each kind per run (the
    longest silent first); each order is its own transaction, and one order's failure is logged and never
    stops the others. ``before_each`` (the sweep's time check) runs before each order and may raise to stop."""
    now = now or timezone.now()
    swept = SilenceSwept()
    silent = list(_silent_instances(now=now).values_list("order_id", flat=True)[:limit])
    recovering = list(
        SilentPeriod.objects.filter(
            ended_at__isnull=True,
            order__state=OrderState.RUNNING,
            order__health=OrderHealth.DEGRADED,
            instance__attempt__lease__last_heartbeat_at__gt=F("started_at"),
        )
        .order_by("started_at", "pk")
        .values_list("order_id", flat=True)[:limit]
    )
    stuck = list(
        SilentPeriod.objects.filter(
            ended_at__isnull=True,
            noticed_at__lt=now - REPLACE_AGAIN_AFTER,
            order__state=OrderState.RUNNING,
            order__health=OrderHealth.DEGRADED,
            order__launch_config__spec__on_silence=ON_SILENCE_REPLACE,
            instance__active=True,
        )
        .exclude(order_id__in=recovering)
        .order_by("noticed_at", "pk")
        .values_list("order_id", flat=True)[:limit]
    )
    steps: list[tuple[list[int], list[int], Callable[..., bool]]] = [
        (silent, swept.degraded, order_silence_degrade),
        (recovering, swept.recovered, order_silence_recover),
    ]
    for ids, done, step in steps:
        for order_id in ids:
            if before_each is not None:
                before_each()
            try:
                if step(order_id=order_id, now=now):
                    done.append(order_id)
            except SoftTimeLimitExceeded:
                raise  # the sweep's time is up: not this order's failure
            except Exception:  # one order's surprise must not leave every other silent order unnoticed
                log.exception("silence sweep: order %s failed", order_id)
                swept.failed.append(order_id)
    for order_id in stuck:
        enqueue_on_commit("marketplace.order_silence_replace", order_id)
        swept.replace_again.append(order_id)
    return swept


@dataclasses.dataclass(frozen=True)
class Silence:
    """An order's record of its agent's silences: its health now, each period, and their total in minutes."""

    health: str
    periods: list[SilentPeriod]
    seconds: int

    @property
    def minutes(self) -> float:
        return round(self.seconds / 60, 1)


def order_silence(order: Order, *, now: dt.datetime) -> Silence:
    """The order's silent periods, oldest first (prefetched ``silent_periods`` are used as they are)."""
    periods = sorted(order.silent_periods.all(), key=lambda p: (p.started_at, p.pk))
    return Silence(health=order.health, periods=periods, seconds=sum(p.seconds(now) for p in periods))
