"""From a provider's "running" to a machine the buyer can use: poll the launched instance, wait for its lease
agent's ready report, and give up on a machine that does not report within ``BROKER_BOOT_TIMEOUT_S`` of its
launch, reports the wrong GPUs or cannot start SSH (its attempt fails, so the order fails over). A workload that
will not start fails the order, since another machine would fail it the same way."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.launch.leases import lease_end
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    Instance,
    Lease,
    LeaseState,
    Order,
    OrderState,
    WebhookEventType,
)
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.launching import Step, attempt_ledger
from marketplace.orders.reservations import reservation_release
from marketplace.orders.selectors import order_spent_usd
from marketplace.orders.transitions import order_transition
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import endpoints_known, instance_event_emit, with_endpoints
from providers.errors import (
    ProviderError,
)
from providers.services import adapter_for_account
from providers.types import InstanceState

log = logging.getLogger(__name__)


def order_poll(*, order_id: int) -> Step:
    """Check the launched instance, then its lease.

    ``Step.POLL`` while the provider still starts the instance; ``Step.WAIT`` once it runs and the agent on
    it has not reported ready (the order stays provisioning); ``Step.DONE`` when the order is running (or
    no longer provisioning). An instance that failed before running (the asynchronous capacity failures of
    GCP, Azure and Tencent), or a machine silent past its boot deadline, fails its attempt and answers
    ``Step.PROVISION``, so the order fails over to the next offer.
    """
    # The order, its active instance and that instance's lease in one read; no instance: nothing to poll.
    instance = with_endpoints(
        Instance.objects.select_related("order", "account", "attempt__lease").filter(order_id=order_id, active=True),
        "order__organization_id",
    )
    if instance is None or instance.order.state != OrderState.PROVISIONING:
        return Step.DONE
    order = instance.order
    handle = adapter_for_account(instance.account).describe(instance.region, instance.provider_instance_id)
    if handle.state == InstanceState.RUNNING:
        _instance_running(instance, handle.public_ip or "")
        lease = getattr(instance.attempt, "lease", None)
        if order.launch_config_id is None or (lease is not None and lease.state == LeaseState.READY):
            if order_running_if_ready(order_id=order.pk):
                return Step.DONE
            return order_boot_check(order_id=order.pk)
        # Not ready yet (the common poll): the rows just read answer the boot check without reading them again.
        return _boot_step(order, instance, lease, timezone.now())
    if handle.state in (InstanceState.TERMINATED, InstanceState.FAILED):
        if handle.state == InstanceState.FAILED:
            # Some clouds (Azure) keep a VM whose allocation failed, with its disk and NIC: remove it.
            try:
                adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
            except ProviderError as exc:
                log.warning("could not remove failed instance %s: %s", instance.provider_instance_id, exc)
        error_class = str(handle.extra.get("error_class") or "final")
        code = str(handle.extra.get("error_code") or handle.state.value)
        message = str(handle.extra.get("error_message") or f"instance {handle.state.value} before it was running")
        _instance_failed(order, instance, handle.state.value, error_class, code, message)
        return Step.PROVISION
    return Step.POLL


def _instance_running(instance: Instance, public_ip: str) -> None:
    """Record that the provider runs ``instance`` at ``public_ip``: announced once (a poll that sees it running
    again must not announce it twice); a poll that finds nothing changed writes nothing."""
    running = InstanceState.RUNNING.value
    if instance.running_at is None:
        endpoints = endpoints_known(instance)
        # With no endpoint to tell, the conditional update is the whole change, atomic on its own: no BEGIN, COMMIT.
        with transaction.atomic() if endpoints is not False else contextlib.nullcontext():
            if Instance.objects.filter(pk=instance.pk, running_at__isnull=True).update(
                running_at=timezone.now(), state=running, public_ip=public_ip
            ):
                instance_event_emit(
                    instance_id=instance.pk,
                    event_type=WebhookEventType.INSTANCE_RUNNING,
                    organization_id=instance.order.organization_id,
                    endpoints=endpoints,
                )
                return
    elif (instance.state, instance.public_ip) == (running, public_ip):
        return
    # Its running was recorded already (by an earlier poll, or the agent's ready report), perhaps without the
    # address: bring state and address up to date.
    Instance.objects.filter(pk=instance.pk).update(state=running, public_ip=public_ip)


def _instance_failed(order: Order, instance: Instance, state: str, error_class: str, code: str, message: str) -> None:
    """Settle an instance that will never serve the order: inactive, its attempt failed with the reason (once),
    its lease ended, ledgered and announced."""
    with transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(state=state, active=False, terminated_at=timezone.now())
        Attempt.objects.filter(pk=instance.attempt.pk).update(
            outcome=AttemptOutcome.FAILED,
            error_class=error_class[:32],
            provider_code=code[:128],
            provider_message=message[:2000],
            finished_at=timezone.now(),
        )
        reservation_release(attempt_id=instance.attempt_id)
        lease_end(attempt_id=instance.attempt_id)
        attempt = instance.attempt
        attempt.order = order
        attempt_ledger(
            attempt,
            "attempt.failed",
            error_class=error_class,
            provider_code=code,
            instance=instance.provider_instance_id,
        )
        instance_event_emit(
            instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_FAILED, error_class=error_class, code=code
        )


def order_running_if_ready(*, order_id: int) -> bool:
    """Move the order to running if the lease of its active instance is ready: metering starts, the scheduled
    end (duration or spend cap) is set, and the ledger records the host keys the buyer should see on first
    connection. An order placed before launch configurations existed runs once the provider says so.

    Called by the agent's ready report and by the poll; whichever comes second finds it done. True when the
    order is running now."""
    order = Order.objects.select_related("launch_config").get(pk=order_id)
    if order.state != OrderState.PROVISIONING:
        return order.state == OrderState.RUNNING
    instance = Instance.objects.filter(order=order, active=True).first()
    if instance is None:
        return False
    lease = Lease.objects.filter(attempt_id=instance.attempt_id).first()
    booted = order.launch_config_id is not None
    if booted and (lease is None or lease.state != LeaseState.READY):
        return False
    if not booted and instance.running_at is None:
        return False
    now = timezone.now()
    try:
        with transaction.atomic():
            # The agent may report before the poll saw the provider's "running": the machine demonstrably runs.
            Instance.objects.filter(pk=instance.pk, running_at__isnull=True).update(running_at=now)
            Instance.objects.filter(pk=instance.pk, state=InstanceState.PENDING.value).update(
                state=InstanceState.RUNNING.value
            )
            Instance.objects.filter(pk=instance.pk).update(ready_at=now)
            run_until, end_reason = _scheduled_end(order, now)
            if run_until is not None:
                Order.objects.filter(pk=order.pk).update(run_until=run_until)
            fields: dict[str, object] = {"instance": instance.provider_instance_id}
            if run_until is not None:
                fields.update(run_until=run_until.isoformat(), ends_by=end_reason)
            if booted and lease is not None:
                fields.update(
                    host_keys=[k["fingerprint"] for k in lease.host_keys], launch_sha256=order.launch_config.sha256
                )
                instance_event_emit(
                    instance_id=instance.pk,
                    event_type=WebhookEventType.INSTANCE_READY,
                    organization_id=order.organization_id,
                )
            order_transition(order=order, to=OrderState.RUNNING, savepoint=False, **fields)
    except TransitionRefused:
        order.refresh_from_db(fields=["state"])
        return order.state == OrderState.RUNNING
    return True


def _scheduled_end(order: Order, now: dt.datetime) -> tuple[dt.datetime | None, str]:
    """When the running order must stop: its duration from now, or when what is left of its spend cap runs out
    at the locked price, whichever is first; (None, "") for neither."""
    ends: list[tuple[dt.datetime, str]] = []
    if order.duration_hours is not None:
        ends.append((now + dt.timedelta(hours=float(order.duration_hours)), "duration"))
    if order.spend_cap_usd is not None and order.price_per_hour > 0:
        left = max(Decimal(0), order.spend_cap_usd - order_spent_usd(order, now=now))
        ends.append((now + dt.timedelta(hours=float(left / order.price_per_hour)), "spend_cap"))
    if not ends:
        return None, ""
    return min(ends)


def _booting(order_id: int) -> tuple[Order | None, Instance | None, Lease | None]:
    """A provisioning order, its active instance and that instance's lease (None where there is none)."""
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.PROVISIONING:
        return None, None, None
    instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
    if instance is None:
        return order, None, None
    return order, instance, Lease.objects.filter(attempt_id=instance.attempt_id).first()


def order_boot_check(*, order_id: int, now: dt.datetime | None = None) -> Step:
    """The provider runs the order's machine: is its agent late? Past the lease's boot deadline with no ready
    report, the machine is terminated and its attempt failed (``boot_timeout``), and the order fails over
    (``Step.PROVISION``). ``Step.WAIT`` while there is time; ``Step.DONE`` when there is nothing to wait for."""
    order, instance, lease = _booting(order_id)
    if order is None or instance is None:
        return Step.DONE
    return _boot_step(order, instance, lease, now or timezone.now())


def _boot_step(order: Order, instance: Instance, lease: Lease | None, now: dt.datetime) -> Step:
    """``order_boot_check`` on rows already read: the provisioning order, its active instance and its lease."""
    if lease is None or lease.state == LeaseState.READY:
        return Step.DONE
    if lease.state in (LeaseState.FAILED, LeaseState.REFUSED):
        return order_boot_settle(order_id=order.pk)
    if lease.boot_deadline is None or now < lease.boot_deadline:
        return Step.WAIT
    heard = "claimed its boot token but never reported ready" if lease.claimed_at else "never phoned home"
    message = f"no ready report within {settings.BOOT_TIMEOUT_S} s of launch: the machine's agent {heard}"
    _boot_failed(order, instance, "boot_timeout", "boot_timeout", message)
    return Step.PROVISION


def order_boot_settle(*, order_id: int) -> Step:
    """The agent reported that the machine cannot serve the order (a failed or refused lease): terminate the
    machine and fail its attempt. A workload that would not start fails the order with the agent's reason
    (``Step.DONE``); the wrong GPUs or no SSH fail over (``Step.PROVISION``). Idempotent: an instance already
    settled is not touched again."""
    order, instance, lease = _booting(order_id)
    if order is None or instance is None or lease is None or lease.state not in (LeaseState.FAILED, LeaseState.REFUSED):
        return Step.DONE
    if lease.state == LeaseState.REFUSED:
        _boot_failed(order, instance, "gpu_mismatch", "gpu_mismatch", lease.failure_reason)
        return Step.PROVISION
    if lease.failure_stage == "workload":
        _boot_failed(order, instance, "workload", "workload_failed", lease.failure_reason)
        try:
            order_transition(
                order=order, to=OrderState.FAILED, reason=f"the workload did not start: {lease.failure_reason}"
            )
        except TransitionRefused:
            pass
        return Step.DONE
    _boot_failed(order, instance, "boot", f"{lease.failure_stage}_failed", lease.failure_reason)
    return Step.PROVISION


def _boot_failed(order: Order, instance: Instance, error_class: str, code: str, message: str) -> None:
    """Terminate a machine that ran but never became usable, then settle its attempt. The provider is asked
    first: a ``TransientProviderError`` leaves everything as it was for the task's retry, so the machine is
    never forgotten while it still bills."""
    handle = adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
    _instance_failed(order, instance, handle.state.value, error_class, code, message)


def order_give_up(*, order_id: int, reason: str) -> None:
    """The instance never reached running in time: stop it rather than leave it billing."""
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.PROVISIONING:
        return
    with transaction.atomic():
        order_transition(order=order, to=OrderState.TERMINATING, reason=reason)
        enqueue_on_commit("marketplace.order_terminate", order.pk)
