"""What a buyer does to a running order's machine besides ending it (issue 36): stop it keeping its disk, start
it again, restart it in place.

Each request is two steps, as terminating is: the service (``order_stop``, ``order_start``, ``order_restart``)
takes the order's row lock, checks the move, makes the transition (ledgered) and queues the provider call for
after the commit; the task's step (``order_stop_instance``, ``order_start_instance``, ``order_reboot_instance``)
calls the provider and settles the order on its answer. The lock and the conditional transition make a second
request while one is in flight a no-op (stop while stopping or stopped, start while starting or running) and two
concurrent ones a single action. Every step is safe to run twice: it acts only while the order is in the state
its request left it, and the provider's stop and start are idempotent by contract (``providers/base.py``).

States: running -> stopping -> stopped -> starting -> running; a restart is running -> starting -> running. A
provider that refuses a stop sends the order back to running, one that refuses a start (no capacity) back to
stopped, each with the provider's reason. Starting ends only when the lease agent reports after the provider
accepted the start (``order_running_again``, from ``marketplace.launch.leases.lease_heartbeat``), so a machine
that came back without its agent is not billed as usable.

Billing while stopped follows the provider (``ProviderAdapter.stopped_compute_billed``): a ``StoppedPeriod`` from
the stop the provider accepted to the first report after the start carries what the provider charges per hour
then, and ``selectors.order_usage`` leaves the period out of the compute charge and charges that instead.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.models import Instance, Order, OrderState, StoppedPeriod
from marketplace.orders.errors import ActionUnsupported, TransitionRefused
from marketplace.orders.launching import Step
from marketplace.orders.transitions import order_transition
from marketplace.taskkit import enqueue_on_commit
from providers.base import ProviderAdapter
from providers.errors import CapacityUnavailable, ProviderError, TransientProviderError
from providers.services import adapter_for_account
from providers.types import InstanceState

log = logging.getLogger(__name__)

# What the order page and the API say of a stopped machine's disk where the offer carries no storage price.
DISK_AT_ZERO = (
    "the provider still bills the stopped machine's disk, but its offers carry no storage price, so the broker "
    "passes that charge on at 0"
)


def _locked(order: Order) -> tuple[Order, Instance | None]:
    """The order re-read under its row lock (call inside a transaction), and its active instance."""
    locked = Order.objects.select_for_update().get(pk=order.pk)
    instance = Instance.objects.select_related("account").filter(order=locked, active=True).first()
    return locked, instance


def _adapter_for(order: Order, instance: Instance | None, what: str) -> ProviderAdapter:
    if order.cluster_id is not None:
        # A cluster's rule reads a node that is not running as one lost, and fails the round over.
        raise ActionUnsupported(f"order {order.public_id} is a node of a cluster: its nodes run and end together")
    if instance is None:
        raise TransitionRefused(f"order {order.public_id} has no machine to {what}")
    adapter = adapter_for_account(instance.account)
    if not adapter.stoppable:
        raise ActionUnsupported(f"{instance.account.kind} machines cannot be {what}ped and started again here")
    return adapter


@dataclass(frozen=True)
class OrderActions:
    """What the buyer may do to the order's machine now (the page's buttons), and what a stopped machine costs."""

    stop: bool
    start: bool
    restart: bool
    stopped_rule: str  # the billing rule of the order's latest stop, or what a stop would bill


def order_actions(order: Order) -> OrderActions:
    """Which of stop, start and restart the order allows in its state on its provider, and the stopped billing
    rule (the latest stop's, else the provider's). Reads only: no provider is called."""
    instance = order.instance
    if instance is None or not instance.active or order.state not in _ACTING_STATES or order.cluster_id is not None:
        return OrderActions(stop=False, start=False, restart=False, stopped_rule="")
    adapter = adapter_for_account(instance.account)
    latest = order.stopped_periods.order_by("-started_at", "-pk").first()
    rule = latest.billing_rule if latest is not None else stopped_rate(order, adapter)[1]
    if not adapter.stoppable:
        return OrderActions(stop=False, start=False, restart=False, stopped_rule="")
    running = order.state == OrderState.RUNNING
    return OrderActions(
        stop=running and adapter.can_stop(order.pricing_model),
        start=order.state == OrderState.STOPPED,
        restart=running,
        stopped_rule=rule,
    )


_ACTING_STATES = (OrderState.RUNNING, OrderState.STOPPING, OrderState.STOPPED, OrderState.STARTING)


def order_stop(*, order: Order, reason: str = "stopped by buyer") -> Order:
    """Ask for the running order's machine to be stopped, its disk kept. Idempotent: a stopping or stopped order
    is returned as it is. Raises ``TransitionRefused`` for an order in any other state than running and
    ``ActionUnsupported`` where its provider has no stop. The provider is called by the task queued on commit."""
    with transaction.atomic():
        locked, instance = _locked(order)
        if locked.state in (OrderState.STOPPING, OrderState.STOPPED):
            return locked
        if locked.state != OrderState.RUNNING:
            raise TransitionRefused(f"order {locked.public_id} is {locked.state}; only a running order can be stopped")
        adapter = _adapter_for(locked, instance, "stop")
        if not adapter.can_stop(locked.pricing_model):
            kind = instance.account.kind if instance is not None else adapter.kind
            raise ActionUnsupported(f"{kind} cannot stop a {locked.pricing_model} machine and keep it: end it instead")
        order_transition(order=locked, to=OrderState.STOPPING, reason=reason)
        enqueue_on_commit("marketplace.order_stop", locked.pk)
    return locked


def order_start(*, order: Order, reason: str = "started again by buyer") -> Order:
    """Ask for the stopped order's machine to be started again. Idempotent: a starting or running order is
    returned as it is. ``TransitionRefused`` for any other state (a stopping order must finish stopping first),
    ``ActionUnsupported`` where the provider has no start."""
    with transaction.atomic():
        locked, instance = _locked(order)
        if locked.state in (OrderState.STARTING, OrderState.RUNNING):
            return locked
        if locked.state != OrderState.STOPPED:
            raise TransitionRefused(f"order {locked.public_id} is {locked.state}; only a stopped order can be started")
        _adapter_for(locked, instance, "start")
        Order.objects.filter(pk=locked.pk).update(resumed_at=None)
        order_transition(order=locked, to=OrderState.STARTING, reason=reason)
        enqueue_on_commit("marketplace.order_start", locked.pk)
    return locked


def order_restart(*, order: Order, reason: str = "restarted by buyer") -> Order:
    """Ask for the running order's machine to be rebooted in place (same disk, same address); the order is
    starting until its lease agent reports again, and billed throughout as a running machine. Idempotent: a
    starting order is returned as it is. ``TransitionRefused`` for any state but running, ``ActionUnsupported``
    where the provider cannot reboot."""
    with transaction.atomic():
        locked, instance = _locked(order)
        if locked.state == OrderState.STARTING:
            return locked
        if locked.state != OrderState.RUNNING:
            raise TransitionRefused(
                f"order {locked.public_id} is {locked.state}; only a running order can be restarted"
            )
        _adapter_for(locked, instance, "restart")
        Order.objects.filter(pk=locked.pk).update(resumed_at=None)
        order_transition(order=locked, to=OrderState.STARTING, reason=reason, restart=True)
        enqueue_on_commit("marketplace.order_reboot", locked.pk)
    return locked


def _provider_reason(exc: ProviderError) -> str:
    return f"{exc.message} ({exc.code})" if exc.code else exc.message


def order_stop_instance(*, order_id: int, now: dt.datetime | None = None) -> Step:
    """Stop the stopping order's machine at its provider. ``Step.POLL`` while the provider is still stopping it,
    ``Step.DONE`` once the order is stopped (or no longer stopping). The stopped period (billing) opens when the
    provider first accepts the stop; the order is stopped when the provider says stopped. A refusal sends the
    order back to running with the provider's reason; a ``TransientProviderError`` propagates for the retry."""
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.STOPPING:
        return Step.DONE
    instance = Instance.objects.select_related("account").filter(order=order, active=True).first()
    if instance is None:
        return Step.DONE
    adapter = adapter_for_account(instance.account)
    accepted = StoppedPeriod.objects.filter(order=order, ended_at__isnull=True).exists()
    try:
        # Once the provider has accepted the stop, later steps only watch it finish.
        call = adapter.describe if accepted else adapter.stop
        handle = call(instance.region, instance.provider_instance_id)
    except TransientProviderError:
        raise
    except ProviderError as exc:
        try:
            order_transition(
                order=order, to=OrderState.RUNNING, reason=f"the provider refused the stop: {_provider_reason(exc)}"
            )
        except TransitionRefused:
            pass
        return Step.DONE
    now = now or timezone.now()
    with transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(state=handle.state.value)
        if not accepted:
            rate, rule = stopped_rate(order, adapter)
            StoppedPeriod.objects.create(
                order=order, instance=instance, started_at=now, usd_per_hour=rate, billing_rule=rule
            )
        if handle.state != InstanceState.STOPPED:
            return Step.POLL
        try:
            order_transition(
                order=order, to=OrderState.STOPPED, reason=order.state_reason, instance=instance.provider_instance_id
            )
        except TransitionRefused:
            pass
    return Step.DONE


def stopped_rate(order: Order, adapter: ProviderAdapter) -> tuple[Decimal, str]:
    """What the order costs per hour while stopped, and the rule that says so: its whole price where the provider
    keeps the machine held for it (an independent host's GPUs), else 0 with the reason (its disk is billed by
    the provider, but offers carry no storage price)."""
    words = adapter.stopped_billing or "its disks"
    if adapter.stopped_compute_billed:
        return order.price_per_hour, f"the provider bills {words}, so the order costs its whole price while stopped"
    return Decimal(0), f"the provider bills {words}; {DISK_AT_ZERO}"


def order_start_instance(*, order_id: int, now: dt.datetime | None = None) -> Step:
    """Start the starting order's stopped machine at its provider; ``Step.DONE`` once the provider accepted it
    (the lease agent's next report makes the order running) or when there is nothing to do. A refusal for
    capacity, or any other final refusal, leaves the order stopped with the provider's reason and its disk
    kept. ``TransientProviderError`` propagates for the retry."""
    return _start_or_reboot(order_id=order_id, reboot=False, now=now)


def order_reboot_instance(*, order_id: int, now: dt.datetime | None = None) -> Step:
    """Reboot the restarting order's machine at its provider; as ``order_start_instance``, except that a refusal
    sends the order back to running (its machine never stopped)."""
    return _start_or_reboot(order_id=order_id, reboot=True, now=now)


def order_resume_step(*, order_id: int) -> Step:
    """For the sweep: a starting order whose provider has not accepted its start yet (the task was lost) is
    started again, a resume (an open stopped period) with ``start``, a restart with ``reboot``."""
    resuming = StoppedPeriod.objects.filter(order_id=order_id, ended_at__isnull=True).exists()
    return _start_or_reboot(order_id=order_id, reboot=not resuming, now=None)


def _start_or_reboot(*, order_id: int, reboot: bool, now: dt.datetime | None) -> Step:
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.STARTING or order.resumed_at is not None:
        return Step.DONE
    instance = Instance.objects.select_related("account").filter(order=order, active=True).first()
    if instance is None:
        return Step.DONE
    adapter = adapter_for_account(instance.account)
    try:
        if reboot:
            handle = adapter.reboot(instance.region, instance.provider_instance_id)
        else:
            handle = adapter.start(instance.region, instance.provider_instance_id)
    except TransientProviderError:
        raise
    except ProviderError as exc:
        if reboot:
            back, why = OrderState.RUNNING, f"the provider refused the restart: {_provider_reason(exc)}"
        elif isinstance(exc, CapacityUnavailable):
            back = OrderState.STOPPED
            why = f"the provider has no capacity to start it now: {_provider_reason(exc)}; its disk is kept, try later"
        else:
            back, why = OrderState.STOPPED, f"the provider refused the start: {_provider_reason(exc)}; its disk is kept"
        try:
            order_transition(order=order, to=back, reason=why)
        except TransitionRefused:
            pass
        return Step.DONE
    now = now or timezone.now()
    Instance.objects.filter(pk=instance.pk).update(state=handle.state.value)
    Order.objects.filter(pk=order.pk, state=OrderState.STARTING, resumed_at__isnull=True).update(resumed_at=now)
    return Step.DONE


def orders_starting_overdue(*, now: dt.datetime | None = None) -> list[int]:
    """Starting orders whose provider accepted the start or reboot more than ``BROKER_BOOT_TIMEOUT_S`` ago and
    whose agent has not reported since: the provider runs (and bills) the machine, so the order is running
    again, saying so; the silence sweep then finds its agent silent and the launch configuration's
    ``on_silence`` decides (wait, or replace the machine). The ids moved."""
    now = now or timezone.now()
    overdue = Order.objects.filter(
        state=OrderState.STARTING, resumed_at__lte=now - dt.timedelta(seconds=settings.BOOT_TIMEOUT_S)
    )
    why = f"the machine runs again, but its agent has not reported within {settings.BOOT_TIMEOUT_S} s of the start"
    return [
        order_id
        for order_id in overdue.order_by("pk").values_list("pk", flat=True)
        if order_running_again(order_id=order_id, at=now, reason=why)
    ]


def order_running_again(*, order_id: int, at: dt.datetime, reason: str = "the machine's agent reports again") -> bool:
    """The lease agent reported at ``at``: a starting order whose provider accepted the start or reboot before
    then is running again. Closes the stopped period at ``at`` and moves the scheduled end later by the time
    spent stopped (stopped hours are not the hours the buyer asked to run). True when the order runs now;
    safe to call for every report (only the first one after the start moves anything)."""
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        if order.state != OrderState.STARTING:
            return order.state == OrderState.RUNNING
        if order.resumed_at is None or at < order.resumed_at:
            return False
        period = StoppedPeriod.objects.filter(order=order, ended_at__isnull=True).first()
        fields: dict[str, object] = {}
        if period is not None:
            period.ended_at = max(at, period.started_at)
            period.save(update_fields=["ended_at"])
            fields["stopped_seconds"] = int((period.ended_at - period.started_at).total_seconds())
            if order.run_until is not None:
                order.run_until += period.ended_at - period.started_at
                Order.objects.filter(pk=order.pk).update(run_until=order.run_until)
                fields["run_until"] = order.run_until.isoformat()
        order_transition(order=order, to=OrderState.RUNNING, reason=reason, **fields)
    return True
