"""Watching running orders: describe their instances at their providers (one call per account and region for a
whole group) and act on what changed: an instance a provider no longer lists, stopped or failed is lost
(``losses.py``); an unanswered describe waits."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable

from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from marketplace.models import (
    Instance,
    Order,
    OrderState,
)
from marketplace.orders.launching import Step
from marketplace.orders.losses import host_silent_since, instance_lost, instance_lost_silent
from providers.base import unknown_instance
from providers.errors import (
    CredentialsRejected,
    ProviderError,
    ProviderRequestRejected,
    TransientProviderError,
)
from providers.models import ProviderKind
from providers.services import adapter_for_account
from providers.types import InstanceHandle, InstanceState, PricingModel

log = logging.getLogger(__name__)


# The provider code a lost instance is recorded with when a batched describe no longer lists it (a single describe
# records the provider's own not-found code).
NOT_LISTED = "not_found"


@dataclasses.dataclass(frozen=True)
class Described:
    """What one batched read (``ProviderAdapter.describe_many``) said of an active instance, for
    ``order_check_running`` to act on without asking again: its ``handle``, None when the provider no longer
    lists it, or the transient ``error`` the whole read met."""

    instance_id: int  # the ``Instance`` row described
    handle: InstanceHandle | None = None
    error: TransientProviderError | None = None


def order_check_running(*, order_id: int, now: dt.datetime | None = None, described: Described | None = None) -> Step:
    """Is the running order's machine still there? If the provider took it (spot preemption, host loss),
    record the loss and provision the order again when the buyer allowed failover (``Step.PROVISION``),
    else fail the order. ``Step.DONE`` when nothing changed.

    A describe that fails transiently is not a loss: it is raised, and the next sweep asks again. Unless the
    machine is an independent host silent past ``BROKER_AGENT_SILENCE_S`` (no heartbeat from its agent or
    its lease's): then its lease is lost, and billed only until the host's last report.

    ``described`` is what a batched read already said of the order's active instance (``orders_check_running``):
    the provider is not asked again, and its answer is judged exactly as a describe's. When it is about another
    instance (the order moved on since), or None, the provider is asked."""
    now = now or timezone.now()
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.RUNNING:
        return Step.DONE
    instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
    if instance is None:
        return Step.DONE
    if described is not None and described.instance_id == instance.pk:
        if described.error is not None:
            # One error object stands for a whole group's orders: each raise starts a traceback of its own.
            return _check_unanswered(order, instance, now, described.error.with_traceback(None))
        handle = described.handle if described.handle is not None else _gone_handle(instance, NOT_LISTED)
    else:
        try:
            handle = adapter_for_account(instance.account).describe(instance.region, instance.provider_instance_id)
        except ProviderRequestRejected as exc:
            # Some clouds forget an instance as soon as it is gone (an ECS release, an Azure spot eviction that
            # deletes the VM): "not found" for a machine the broker launched means the provider took it.
            if not unknown_instance(exc):
                raise
            handle = _gone_handle(instance, exc.code)
        except TransientProviderError as exc:
            return _check_unanswered(order, instance, now, exc)
    # A running order's machine stopped at its provider (not by the broker: an order it stopped is not running)
    # is out of service for the buyer, the same as one stopping or taken.
    if handle.state not in (
        InstanceState.TERMINATED,
        InstanceState.FAILED,
        InstanceState.STOPPING,
        InstanceState.STOPPED,
    ):
        return Step.DONE
    spot = order.pricing_model == PricingModel.SPOT
    reason = f"instance {instance.provider_instance_id} {handle.state.value} by the provider" + (
        " (spot preemption)" if spot else ""
    )
    return instance_lost(
        order,
        instance,
        state=handle.state.value,
        ended_at=timezone.now(),
        reason=reason,
        code=str(handle.extra.get("error_code") or ""),
    )


def _gone_handle(instance: Instance, code: str) -> InstanceHandle:
    """The handle of an instance its provider no longer knows: terminated, with the code that said so."""
    return InstanceHandle(
        instance_id=instance.provider_instance_id,
        region=instance.region,
        zone=instance.zone,
        instance_type=instance.instance_type,
        state=InstanceState.TERMINATED,
        extra={"error_code": code},
    )


def _check_unanswered(order: Order, instance: Instance, now: dt.datetime, error: TransientProviderError) -> Step:
    """The provider could not be asked about the instance: raise ``error`` (the next sweep asks again), unless
    the instance is on an independent host silent now, whose lease is then lost."""
    last_report = host_silent_since(instance, now)
    if last_report is None:
        raise error
    return instance_lost_silent(order, instance, last_report)


@dataclasses.dataclass
class RunningChecked:
    """What ``orders_check_running`` did: the orders whose machine was lost and which go back to provisioning
    (``provision``), those it could not check (``failed``, each logged), and how many batched reads it made."""

    provision: list[int] = dataclasses.field(default_factory=list)
    failed: list[int] = dataclasses.field(default_factory=list)
    reads: int = 0


# How many order ids one query of their active instances names.
_IDS_PER_QUERY = 1000


def _read_group(instance: Instance) -> tuple[int, str, str]:
    """The instances one ``describe_many`` asks about together: an account's region (one endpoint of its cloud),
    or for an independent provider one machine, since each machine is its own endpoint (its agent) and a silent
    one must not leave the others' orders unchecked."""
    machine = instance.zone if instance.account.kind == ProviderKind.COMMUNITY else ""
    return instance.account_id, instance.region, machine


def orders_check_running(
    *,
    order_ids: Iterable[int],
    now: dt.datetime | None = None,
    before_each: Callable[[], None] | None = None,
    provision_again: Callable[[int], object] | None = None,
) -> RunningChecked:
    """``order_check_running`` for many orders, with one batched read (``ProviderAdapter.describe_many``) per
    provider account and region, or per independent machine, instead of one describe per order: the provider
    calls grow with the accounts and the fleet's size over each cloud's batch, not with the orders. Orders no
    longer running, or without an active instance, are left alone.

    Each group's answer is then judged order by order, exactly as ``order_check_running`` judges a describe; an
    order whose machine was lost and may fail over is handed to ``provision_again`` at once (so a sweep stopped
    later has already passed it on) and listed in ``provision``. One group's failure never stops another's:

    - the read failed transiently (the provider could not be asked): that is each of its orders' transient
      failure, judged without asking again; an independent host silent past ``BROKER_AGENT_SILENCE_S`` loses its
      lease, any other order is not checked this time;
    - the provider refused the account's credentials: none of its orders can be checked now;
    - anything else (a refusal, an unreadable answer, a surprise): each order is checked on its own, so one
      poisoned instance keeps only its own order unchecked.

    ``before_each`` (the sweep's time check) runs before each group's read and again once it is back, and may
    raise to stop there; each order's check is its own transaction, so what was done stays done. Safe to run
    again and alongside itself."""
    checked = RunningChecked()
    ids = list(dict.fromkeys(order_ids))
    active: dict[int, Instance] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        rows = Instance.objects.select_related("account").filter(
            order_id__in=ids[start : start + _IDS_PER_QUERY], order__state=OrderState.RUNNING, active=True
        )
        for instance in rows.order_by("pk"):
            active.setdefault(instance.order_id, instance)  # the one order_check_running would pick
    groups: dict[tuple[int, str, str], list[Instance]] = {}
    for instance in active.values():
        groups.setdefault(_read_group(instance), []).append(instance)
    for key in sorted(groups):
        if before_each is not None:
            before_each()
        members = groups[key]
        described = _describe_group(members, checked)
        if before_each is not None:
            # Again once the read is back: an SDK may have swallowed the time limit's exception into a
            # transient error (botocore does), and a read that outlasted the sweep is not acted on.
            before_each()
        if described is None:
            checked.failed.extend(i.order_id for i in members)
            continue
        moment = now or timezone.now()
        for instance in members:
            _check_one(instance.order_id, moment, described.get(instance.pk), checked, provision_again)
    return checked


def _describe_group(members: list[Instance], checked: RunningChecked) -> dict[int, Described] | None:
    """What one ``describe_many`` says of the group's instances (by ``Instance`` id); empty when it failed in a
    way each order must be asked about on its own, None when none of them can be checked now (logged)."""
    account, region = members[0].account, members[0].region
    where = f"{account.kind}/{account.name} in {region}"
    try:
        checked.reads += 1
        found = adapter_for_account(account).describe_many(region, [i.provider_instance_id for i in members])
    except SoftTimeLimitExceeded:
        raise
    except TransientProviderError as exc:
        log.warning("could not read the %d running instance(s) of %s: %s", len(members), where, exc)
        return {i.pk: Described(instance_id=i.pk, error=exc) for i in members}
    except CredentialsRejected as exc:
        log.warning("could not check the %d running order(s) of %s: %s", len(members), where, exc)
        return None
    except Exception:  # one poisoned answer must not leave the group's other orders unchecked: each asks alone
        log.exception("reading the %d running instance(s) of %s failed; checking them one by one", len(members), where)
        return {}
    return {i.pk: Described(instance_id=i.pk, handle=found.get(i.provider_instance_id)) for i in members}


def _check_one(
    order_id: int,
    now: dt.datetime,
    described: Described | None,
    checked: RunningChecked,
    provision_again: Callable[[int], object] | None,
) -> None:
    try:
        if order_check_running(order_id=order_id, now=now, described=described) == Step.PROVISION:
            checked.provision.append(order_id)
            if provision_again is not None:
                provision_again(order_id)
    except SoftTimeLimitExceeded:
        raise  # the sweep's time is up: not this order's failure
    except ProviderError as exc:
        log.warning("could not check order %s: %s", order_id, exc)
        checked.failed.append(order_id)
    except Exception:  # one order's surprise must not stop the check for everyone else's
        log.exception("checking running order %s failed", order_id)
        checked.failed.append(order_id)
