"""Provisioning: launch the order's offer through its adapter, fail over on capacity, poll until the provider
runs it, wait for the machine's agent to report it ready, terminate. Called by thin Celery tasks; every step
re-reads the database, so running it twice is safe.

"Running" means usable: the order becomes running when the lease agent on the machine reports the ordered
GPUs, the workload started and SSH answering (``marketplace/launch/leases.py``), not when the provider says
its instance runs. A machine that does not report within ``BROKER_BOOT_TIMEOUT_S`` of its launch, reports
the wrong GPUs or cannot start SSH is terminated and its attempt failed, so the order fails over; a workload
that will not start fails the order, since another machine would fail it the same way."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
import math
from collections.abc import Callable, Iterable
from decimal import Decimal

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.catalog.selectors import offer_view, offer_views_for
from marketplace.launch.leases import boot_spec, lease_end, lease_open
from marketplace.matching import Demand, rank_offers
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    Cluster,
    Instance,
    Lease,
    LeaseState,
    Offer,
    Order,
    OrderHealth,
    OrderState,
    SilentPeriod,
    WebhookEventType,
)
from marketplace.orders.bids import machine_of, outbid_possible, preemption_pending
from marketplace.orders.blocks import order_exclusion
from marketplace.orders.budgets import budget_room_per_hour
from marketplace.orders.clusters import placement_group_name
from marketplace.orders.reservations import gpu_indexes_held, reservation_release, reservation_take
from marketplace.orders.selectors import order_spent_usd
from marketplace.orders.services import TransitionRefused, order_transition
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import instance_event_emit
from providers.base import ProviderAdapter, unknown_instance
from providers.community.services import machine_silent_since
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.models import ProviderKind
from providers.services import adapter_for_account
from providers.types import GPU_FRACTION, InstanceHandle, InstanceState, LaunchSpec, PricingModel

log = logging.getLogger(__name__)


class Step(enum.StrEnum):
    """What the caller (a task) should do next."""

    POLL = "poll"
    WAIT = "wait"  # the provider runs the machine; its agent has not reported ready yet
    DONE = "done"
    PROVISION = "provision"  # the launched instance failed before it was ready: fail over


def _attempt_ledger(attempt: Attempt, kind: str, **fields: object) -> None:
    ledger_append(
        kind=kind,
        subject=f"order:{attempt.order.public_id}",
        payload={
            "order": str(attempt.order.public_id),
            "attempt": attempt.number,
            "offer": attempt.offer_id,
            "client_token": attempt.client_token,
            **fields,
        },
    )


def _next_offer(order: Order, now: dt.datetime) -> Offer | None:
    """The buyer's chosen offer first; after a failure, the best remaining offer for the same demand."""
    share = float((order.offer.extra or {}).get(GPU_FRACTION, 1.0))
    demand = Demand(
        gpu_count=order.gpu_count,
        gpu_models=frozenset({order.gpu_model.key}),
        regions=frozenset(order.regions),
        pricing_models=frozenset({order.pricing_model}),
        max_price_per_hour=order.max_price_per_hour,
        fractions=share < 1,  # the buyer picked a slice: slices of that share serve it (filtered below)
    )
    exclusion = order_exclusion(order, now=now)
    max_age = dt.timedelta(seconds=settings.OFFER_MAX_AGE_S)
    if not order.attempts.exists():
        first = Offer.objects.select_related("gpu_model", "account").get(pk=order.offer_id)
        # A quote locked its price: its offer is launched at that price even if the listing has risen since.
        first_demand = dataclasses.replace(demand, max_price_per_hour=None) if order.quote_id else demand
        # The buyer's pick is skipped while another order's failure blocks its zone, region or account.
        view = offer_view(first)
        full = view.capacity is not None and view.capacity < (order.gpu_count if view.divisible else 1)
        if full and outbid_possible(offer=first, order=order):
            # A full machine whose interruptible leases this order outranks: the reservation outbids them.
            view = dataclasses.replace(view, capacity=None)
        ranked = rank_offers(first_demand, [view], now=now, max_age=max_age, exclusion=exclusion)
        if ranked.best is not None:
            return first
    if not order.allow_failover:
        return None
    candidates = offer_views_for(gpu_model=order.gpu_model.key, min_gpu_count=order.gpu_count)
    # Same GPU count only: a bigger machine would bill the buyer for GPUs the order did not ask for. And the
    # same share of a card: a whole GPU never fails over to a slice of one (AWS g6f, a MIG profile), nor a
    # slice to another size.
    candidates = [
        c for c in candidates if c.gpu_count == order.gpu_count and math.isclose(c.gpu_fraction, share, rel_tol=1e-6)
    ]
    # A dearer offer must also fit the organisation's hourly budget, this order's own rate set aside.
    room = budget_room_per_hour(order, now=now)
    if room is not None and room < (demand.max_price_per_hour or room):
        demand = dataclasses.replace(demand, max_price_per_hour=room)
    best = rank_offers(demand, candidates, now=now, max_age=max_age, exclusion=exclusion).best
    return None if best is None else Offer.objects.select_related("account").get(pk=best.offer.offer_id)


def _open_attempt(order: Order, offer: Offer, now: dt.datetime) -> Attempt | None:
    """Record the attempt before the provider hears of it and, on a finite listing, hold its units in the same
    transaction. A listing with too few units left fails the attempt at once (a capacity error, so the
    failover and the shared blocks treat it like a cloud's sold-out zone) and nobody is called.

    None, with nothing written, when the order is no longer provisioning (the buyer ended it while an earlier
    attempt was in flight): an ended order never gets another machine."""
    with transaction.atomic():
        # The claim: a write on the order's row, held until the attempt commits (PostgreSQL's row lock,
        # SQLite's write lock). A terminate that committed first is seen here; one that comes later waits,
        # and its task then finds this attempt pending and looks for its machine at the provider.
        if not Order.objects.filter(pk=order.pk, state=OrderState.PROVISIONING).update(state=OrderState.PROVISIONING):
            return None
        number = order.attempts.count() + 1
        attempt = Attempt.objects.create(
            order=order,
            number=number,
            offer=offer,
            client_token=f"{order.ref}-a{number}",
            started_at=now,
        )
        _attempt_ledger(attempt, "attempt.started", zone=offer.zone, instance_type=offer.instance_type)
        lease_open(attempt=attempt, now=now)
        if not reservation_take(attempt=attempt):
            sold_out = CapacityUnavailable(
                f"listing {offer.instance_type} in {offer.zone} has no units left", code="listing.sold_out"
            )
            attempt_fail(attempt=attempt, error=sold_out)
            attempt.outcome = AttemptOutcome.FAILED
    return attempt


def attempt_fail(*, attempt: Attempt, error: ProviderError) -> None:
    """Record a failed attempt (once: the conditional update ignores an attempt already settled). Its units
    and its lease end with it: no machine of this attempt will serve the order, so no agent may claim it."""
    with transaction.atomic():
        updated = Attempt.objects.filter(pk=attempt.pk, outcome=AttemptOutcome.PENDING).update(
            outcome=AttemptOutcome.FAILED,
            error_class=error.error_class,
            provider_code=error.code[:128],
            provider_message=error.message[:2000],
            finished_at=timezone.now(),
        )
        if updated:
            _attempt_ledger(attempt, "attempt.failed", error_class=error.error_class, provider_code=error.code)
        reservation_release(attempt_id=attempt.pk)
        lease_end(attempt_id=attempt.pk)


def attempt_settle_after_transient(*, order_id: int, error: ProviderError) -> Step:
    """The provider kept failing transiently on the pending attempt: find out whether it launched anyway.

    A timed-out RunInstances may still have started a machine. Look for an instance tagged with this order
    and attempt; adopt it if there is one, otherwise fail the attempt so provisioning fails over. Raises
    ``TransientProviderError`` when the provider cannot even be asked, so the caller retries later instead
    of failing over blind (which could leave a second machine running).
    """
    order = Order.objects.get(pk=order_id)
    attempt = order.attempts.select_related("offer__account", "order").filter(outcome=AttemptOutcome.PENDING).first()
    if attempt is None:
        return Step.DONE
    found = [
        h
        for h in adapter_for_account(attempt.offer.account).find_by_order(order.ref)
        if h.tags.get("broker:attempt") == str(attempt.number) and h.state != InstanceState.TERMINATED
    ]
    if found:
        record_launch(order, attempt, found[0])
        return Step.POLL
    attempt_fail(attempt=attempt, error=error)
    return Step.DONE


# Said of every order without failover that fails: nothing else was tried, so nothing may suggest it was.
_NO_FAILOVER = "failover was not allowed, so no other {} was tried"


def _failure_summary(order: Order) -> str:
    """Why the order failed, in the buyer's words: what each attempt ran into and, for an order without
    failover, that no other offer was tried."""
    parts = [
        f"{a.offer.instance_type} in {a.offer.zone}: {a.error_class} ({a.provider_code or 'no code'})"
        for a in order.attempts.select_related("offer").filter(outcome=AttemptOutcome.FAILED)
    ]
    if not order.allow_failover:
        if not parts:
            why = "a recent failure blocks its zone, region or account, or it is stale or above the price cap"
            return f"the chosen offer cannot be launched now ({why}); {_NO_FAILOVER.format('offer')}"
        return "failed on the chosen offer: " + "; ".join(parts) + f"; {_NO_FAILOVER.format('offer')}"
    if not parts:
        return "no offer satisfies the order within its price cap"
    return "no offer left within the price cap after " + "; ".join(parts)


def order_provision(*, order_id: int) -> Step:
    """Launch the order on its best feasible offer, failing over on provider errors.

    Idempotent: an attempt is recorded before the provider is called, and a pending attempt found on entry
    (a crash or a redelivered task) is resumed with the same client token, so the provider returns the same
    instance rather than a second one. ``TransientProviderError`` is raised to the caller for a retry with
    the same attempt; other provider errors fail the attempt and move on to the next offer, but only while
    the order is still provisioning: each new attempt first claims the order's row, so an order ended while
    a launch was in flight gets no further attempt and no second machine.
    """
    order = Order.objects.select_related("gpu_model", "offer", "launch_config").get(pk=order_id)
    if order.state == OrderState.PLACED:
        try:
            order = order_transition(order=order, to=OrderState.PROVISIONING)
        except TransitionRefused:
            order.refresh_from_db()
    if order.state != OrderState.PROVISIONING:
        return Step.DONE
    if Instance.objects.filter(order=order, active=True).exists():
        return Step.POLL
    while True:
        now = timezone.now()
        attempt = order.attempts.select_related("offer__account").filter(outcome=AttemptOutcome.PENDING).first()
        fresh = attempt is None
        if attempt is None:
            offer = _next_offer(order, now)
            if offer is None:
                try:
                    order_transition(order=order, to=OrderState.FAILED, reason=_failure_summary(order))
                except TransitionRefused:
                    pass
                return Step.DONE
            opened = _open_attempt(order, offer, now)
            if opened is None:
                log.info("order %s ended while provisioning: no further attempt", order.public_id)
                return Step.DONE
            attempt = opened
            if attempt.outcome == AttemptOutcome.FAILED:
                continue
        offer = attempt.offer
        spec = _launch_spec(order, attempt)
        adapter = adapter_for_account(offer.account)
        if fresh and not _launch_acceptable(adapter, attempt, spec):
            continue
        # Only a fresh attempt: a resumed one may already have launched, and its machine counts in the usage.
        if fresh and not _quota_allows(adapter, attempt, spec):
            continue
        if preemption_pending(attempt_id=attempt.pk):
            # Its GPUs still run an order it outbid, under notice: the sweep that ends that order wakes this one.
            log.info("order %s attempt %s waits for an outbid order to leave", order.public_id, attempt.number)
            return Step.WAIT
        try:
            handle = adapter.launch(spec)
        except TransientProviderError:
            raise
        except ProviderError as exc:
            log.info("order %s attempt %s failed: %s", order.public_id, attempt.number, exc)
            attempt_fail(attempt=attempt, error=exc)
            continue
        record_launch(order, attempt, handle)
        order.refresh_from_db(fields=["state"])
        if order.state != OrderState.PROVISIONING:
            # Terminated while the launch was in flight: stop the machine now rather than leave it billing.
            stopped = adapter.terminate(handle.region, handle.instance_id)
            # An order already ended had its terminate task before this machine was recorded: nothing else
            # will settle it. One still terminating leaves that to its task (which records the machine).
            settled = order.state in Order.FINAL_STATES
            with transaction.atomic():
                ended = list(Instance.objects.filter(order=order, active=True).values_list("pk", "attempt_id"))
                Instance.objects.filter(pk__in=[pk for pk, _ in ended]).update(
                    state=stopped.state.value, terminated_at=timezone.now(), **({"active": False} if settled else {})
                )
                for stopped_id, attempt_id in ended:
                    if settled:
                        lease_end(attempt_id=attempt_id)
                    instance_event_emit(instance_id=stopped_id, event_type=WebhookEventType.INSTANCE_TERMINATED)
            return Step.DONE
        return Step.POLL


def _launch_spec(order: Order, attempt: Attempt) -> LaunchSpec:
    offer = attempt.offer
    return LaunchSpec(
        region=offer.region,
        zone=offer.zone,
        instance_type=offer.instance_type,
        pricing_model=PricingModel(offer.pricing_model),
        client_token=attempt.client_token,
        order_ref=order.ref,
        max_price=order.max_price_per_hour if offer.pricing_model == PricingModel.SPOT else None,
        tags={"broker:attempt": str(attempt.number)},
        gpu_count=offer.gpu_count,
        vcpus=offer.vcpus,
        offer_extra=dict(offer.extra or {}),
        image=(order.launch_config.spec.get("image") if order.launch_config is not None else None),
        boot=boot_spec(order=order, attempt=attempt),
        gpu_indexes=gpu_indexes_held(attempt_id=attempt.pk),
        placement_group=_placement_group(order),
    )


def _placement_group(order: Order) -> str | None:
    """The placement group a cluster's node launches into: its round's, when the cluster asks for one."""
    if order.cluster_id is None or order.cluster_round is None:
        return None
    cluster = Cluster.objects.only("public_id", "placement_group").get(pk=order.cluster_id)
    return placement_group_name(cluster, order.cluster_round) if cluster.placement_group else None


def _launch_acceptable(adapter: ProviderAdapter, attempt: Attempt, spec: LaunchSpec) -> bool:
    """The provider's documented limits take the launch's boot (user data size, disk, firewall rules). A
    configuration over them fails the attempt with the reason and no launch call; the order moves on to an
    offer whose provider takes it."""
    problems = adapter.launch_problems(spec)
    if not problems:
        return True
    refusal = ProviderRequestRejected("; ".join(str(p) for p in problems), code="launch_config", provider=adapter.kind)
    log.info("order %s attempt %s: %s", attempt.order.public_id, attempt.number, refusal)
    attempt_fail(attempt=attempt, error=refusal)
    return False


def _quota_allows(adapter: ProviderAdapter, attempt: Attempt, spec: LaunchSpec) -> bool:
    """The provider's published quotas leave room for the launch. A shortfall fails the attempt as a quota
    error (so the region is blocked for every order) without a launch call; a pre-check that cannot be
    answered leaves the decision to the launch itself."""
    try:
        adapter.quota_check(spec)
    except QuotaExceeded as exc:
        log.info("order %s attempt %s refused by quota pre-check: %s", attempt.order.public_id, attempt.number, exc)
        attempt_fail(attempt=attempt, error=exc)
        return False
    except ProviderError as exc:
        log.info("quota pre-check for attempt %s unanswered, launching anyway: %s", attempt.client_token, exc)
    return True


def record_launch(order: Order, attempt: Attempt, handle: InstanceHandle, *, adopted: bool = False) -> None:
    """The provider launched ``handle`` for ``attempt``: settle the attempt, record the instance, ledger it.
    ``adopted``: found by the reconciler rather than answered to the launch call."""
    now = timezone.now()
    with transaction.atomic():
        Attempt.objects.filter(pk=attempt.pk).update(outcome=AttemptOutcome.LAUNCHED, finished_at=now)
        instance = Instance.objects.create(
            order=order,
            attempt=attempt,
            account=attempt.offer.account,
            provider_instance_id=handle.instance_id,
            region=handle.region,
            zone=handle.zone,
            instance_type=handle.instance_type,
            state=handle.state.value,
            public_ip=handle.public_ip or "",
            launched_at=now,
        )
        Order.objects.filter(pk=order.pk).update(offer=attempt.offer, price_per_hour=_launch_price(order, attempt))
        booked = Lease.objects.filter(attempt=attempt, boot_deadline__isnull=True).update(
            boot_deadline=now + dt.timedelta(seconds=settings.BOOT_TIMEOUT_S)
        )
        if booked:
            # One check at the deadline per launch (the minute sweep looks again, should this task be lost).
            enqueue_on_commit("marketplace.order_boot_deadline", order.pk, countdown=settings.BOOT_TIMEOUT_S + 1)
        extra = {"adopted": True} if adopted else {}
        _attempt_ledger(attempt, "attempt.launched", instance=handle.instance_id, zone=handle.zone, **extra)
        instance_event_emit(instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_LAUNCHED, adopted=adopted)


def _launch_price(order: Order, attempt: Attempt) -> Decimal:
    """What the buyer pays per hour: the quote's locked price on the quoted offer, else the offer's price. A
    bidder pays its bid on an interruptible offer of an independent machine (the offer's price, the machine's
    minimum, if that is higher: a failover to a machine whose minimum is above the bid)."""
    offer = attempt.offer
    if order.cluster_id is not None:
        # A node of a cluster never fails over alone: it runs on the offer it was placed on, at the price its
        # cluster set for the round (a quote's locked share, or the listing's price then).
        return order.price_per_hour
    if order.bid_per_gpu_hour is not None and offer.pricing_model == PricingModel.SPOT and machine_of(offer):
        return max(order.bid_per_gpu_hour * offer.gpu_count, offer.price_usd)
    if order.quote_id is not None and order.quote is not None and order.quote.offer_id == attempt.offer_id:
        return order.quote.price_per_hour
    return offer.price_usd


def order_poll(*, order_id: int) -> Step:
    """Check the launched instance, then its lease.

    ``Step.POLL`` while the provider still starts the instance; ``Step.WAIT`` once it runs and the agent on
    it has not reported ready (the order stays provisioning); ``Step.DONE`` when the order is running (or
    no longer provisioning). An instance that failed before running (the asynchronous capacity failures of
    GCP, Azure and Tencent), or a machine silent past its boot deadline, fails its attempt and answers
    ``Step.PROVISION``, so the order fails over to the next offer.
    """
    order = Order.objects.get(pk=order_id)
    if order.state != OrderState.PROVISIONING:
        return Step.DONE
    instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
    if instance is None:
        return Step.DONE
    handle = adapter_for_account(instance.account).describe(instance.region, instance.provider_instance_id)
    if handle.state == InstanceState.RUNNING:
        with transaction.atomic():
            Instance.objects.filter(pk=instance.pk).update(state=handle.state.value, public_ip=handle.public_ip or "")
            # Once: a poll that sees it running again must not announce it twice.
            if Instance.objects.filter(pk=instance.pk, running_at__isnull=True).update(running_at=timezone.now()):
                instance_event_emit(instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_RUNNING)
        if order_running_if_ready(order_id=order.pk):
            return Step.DONE
        return order_boot_check(order_id=order.pk)
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
        _attempt_ledger(
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
                instance_event_emit(instance_id=instance.pk, event_type=WebhookEventType.INSTANCE_READY)
            order_transition(order=order, to=OrderState.RUNNING, **fields)
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
    now = now or timezone.now()
    order, instance, lease = _booting(order_id)
    if order is None or instance is None or lease is None or lease.state == LeaseState.READY:
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
            Instance.objects.filter(pk=instance.pk).update(
                state=handle.state.value, active=False, terminated_at=timezone.now()
            )
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
    if handle.state not in (InstanceState.TERMINATED, InstanceState.FAILED, InstanceState.STOPPING):
        return Step.DONE
    spot = order.pricing_model == PricingModel.SPOT
    reason = f"instance {instance.provider_instance_id} {handle.state.value} by the provider" + (
        " (spot preemption)" if spot else ""
    )
    return _instance_lost(
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
    last_report = _host_silent_since(instance, now)
    if last_report is None:
        raise error
    return _instance_lost_silent(order, instance, last_report)


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


def order_preempt(*, order_id: int, now: dt.datetime | None = None) -> tuple[Step, int | None]:
    """End an outbid order whose notice is over (``preempt_at`` at or before ``now``): stop its instance on its
    host, then settle it as lost (ledgered, announced, released), provisioning it again when the buyer allowed
    failover and failing it otherwise. Returns the order's next step and the order that outbid it, now free to
    launch (None when it is gone or nothing changed).

    Idempotent: an order no longer running, or whose instance was already settled, is left alone. Raises the
    adapter's ``TransientProviderError`` when the host cannot be asked; the next sweep tries again."""
    now = now or timezone.now()
    order = Order.objects.select_related("preempted_for__order").get(pk=order_id)
    if order.state != OrderState.RUNNING or order.preempt_at is None or order.preempt_at > now:
        return Step.DONE, None
    instance = Instance.objects.select_related("account", "attempt").filter(order=order, active=True).first()
    if instance is None:
        return Step.DONE, None
    handle = adapter_for_account(instance.account).terminate(instance.region, instance.provider_instance_id)
    winner = order.preempted_for.order if order.preempted_for is not None else None
    by = "an on-demand order" if winner is not None and winner.pricing_model != PricingModel.SPOT else "a higher bid"
    reason = f"outbid by {by} for its GPUs on {instance.zone}; instance {instance.provider_instance_id} stopped"
    step = _instance_lost(
        order, instance, state=handle.state.value, ended_at=now, reason=reason, code=OUTBID, outbid_by=by
    )
    return step, None if winner is None else winner.pk


# The provider code of a lease ended because a higher bid or an on-demand order took its GPUs.
OUTBID = "outbid"


def _host_silent_since(instance: Instance, now: dt.datetime) -> dt.datetime | None:
    """The last report from the instance's host if it is an independent host silent now, else None. Its
    lease agent's heartbeats count: a lease still reporting runs on a machine that is alive."""
    lease_heard = Lease.objects.filter(attempt_id=instance.attempt_id).values_list("last_heartbeat_at", flat=True)
    return machine_silent_since(
        account_id=instance.account_id, name=instance.zone, now=now, heard_at=lease_heard.first()
    )


def _instance_lost_silent(order: Order, instance: Instance, last_report: dt.datetime) -> Step:
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
    return _instance_lost(
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
    return _instance_lost(
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


def _instance_lost(
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
                order_transition(
                    order=order, to=OrderState.FAILED, reason=f"{reason}; {_NO_FAILOVER.format('machine')}"
                )
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
        _attempt_ledger(attempt, "attempt.failed", error_class=error_class, provider_code=code)


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
    ``STOPPED_GRACE`` after its end is terminated again: a machine the provider stopped rather than took
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
    if lost and _host_silent_since(instance, now) is not None:
        return instance.state  # its host is still silent: a call would only wait out the agent's deadline
    adapter = adapter_for_account(instance.account)
    try:
        state = adapter.describe(instance.region, instance.provider_instance_id).state
        ended_at = instance.terminated_at or now
        # A lost machine had no terminate in flight (nobody could reach its host): it is stopped once seen.
        settled_late = lost or ended_at <= now - STOPPED_GRACE
        if state in (InstanceState.STOPPING, InstanceState.RUNNING, InstanceState.PENDING) and settled_late:
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
