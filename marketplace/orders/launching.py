"""Launching an order: pick the next offer (the ranked book, the buyer's exclusions, budget room), open an
attempt for it, launch it through its provider's adapter, and fail over to the next offer when the provider has
no capacity. Called by thin Celery tasks; every step re-reads the database, so running it twice is safe.

"Running" means usable: the order becomes running when the lease agent on the machine reports the ordered GPUs,
the workload started and SSH answering (``readiness.py``), not when the provider says its instance runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Case, When
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.catalog.selectors import offer_view, offers_for_matching
from marketplace.launch.leases import boot_spec, lease_end, lease_open
from marketplace.matching import Demand, OfferView, rank_offers
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    Cluster,
    Instance,
    Lease,
    Offer,
    Order,
    OrderState,
    WebhookEventType,
)
from marketplace.orders.bids import machine_of, outbid_possible, preemption_pending
from marketplace.orders.blocks import SOLD_OUT, order_exclusion, provider_blocks
from marketplace.orders.budgets import budget_room_per_hour
from marketplace.orders.clusters import placement_group_name
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.reservations import gpu_indexes_held, reservation_release, reservation_take
from marketplace.orders.transitions import order_transition
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import endpoints_known, instance_event_emit, with_endpoints
from providers.base import ProviderAdapter
from providers.errors import (
    CapacityUnavailable,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.services import adapter_for_account
from providers.types import GPU_FRACTION, InstanceHandle, InstanceState, LaunchSpec, PricingModel

log = logging.getLogger(__name__)


class Step(enum.StrEnum):
    """What the caller (a task) should do next."""

    POLL = "poll"
    WAIT = "wait"  # the provider runs the machine; its agent has not reported ready yet
    DONE = "done"
    PROVISION = "provision"  # the launched instance failed before it was ready: fail over


def attempt_ledger(attempt: Attempt, kind: str, **fields: object) -> None:
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


def _next_offer(order: Order, now: dt.datetime, *, tried: bool) -> Offer | None:
    """The buyer's chosen offer first (``tried``: the order has had an attempt already); after a failure, the
    best remaining offer for the same demand."""
    share = float((order.offer.extra or {}).get(GPU_FRACTION, 1.0))
    demand = Demand(
        gpu_count=order.gpu_count,
        gpu_models=frozenset({order.gpu_model.key}),
        regions=frozenset(order.regions),
        pricing_models=frozenset({order.pricing_model}),
        max_price_per_hour=order.max_price_per_hour,
        fractions=share < 1,  # the buyer picked a slice: slices of that share serve it (filtered below)
    )
    # An order that has tried nothing has no failures of its own to avoid: only the blocks shared by all.
    exclusion = order_exclusion(order, now=now) if tried else provider_blocks(now=now)
    max_age = dt.timedelta(seconds=settings.OFFER_MAX_AGE_S)
    if not tried:
        first = order.offer  # read with its GPU model and account, with the order, by order_provision
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
    listed = {o.pk: o for o in offers_for_matching(gpu_model=order.gpu_model.key, min_gpu_count=order.gpu_count)}
    # Same GPU count only: a bigger machine would bill the buyer for GPUs the order did not ask for. And the
    # same share of a card: a whole GPU never fails over to a slice of one (AWS g6f, a MIG profile), nor a
    # slice to another size.
    candidates = [
        c
        for c in map(offer_view, listed.values())
        if c.gpu_count == order.gpu_count and math.isclose(c.gpu_fraction, share, rel_tol=1e-6)
    ]
    # A dearer offer must also fit the organisation's hourly budget, this order's own rate set aside.
    room = budget_room_per_hour(order, now=now)
    if room is not None and room < (demand.max_price_per_hour or room):
        demand = dataclasses.replace(demand, max_price_per_hour=room)
    best = rank_offers(demand, candidates, now=now, max_age=max_age, exclusion=exclusion).best
    if best is None:
        # Nothing free fits: a machine whose interruptible leases this order outranks is sold to it next, their
        # GPUs taken after the notice. Free GPUs come first, so nobody is outbid while they would do.
        best = rank_offers(demand, _outbid_views(order, candidates), now=now, max_age=max_age, exclusion=exclusion).best
    return None if best is None else listed[best.offer.offer_id]


def _outbid_views(order: Order, views: list[OfferView]) -> list[OfferView]:
    """The full ones among ``views`` whose machine ``order`` can outbid enough of (``outbid_possible``), shown
    without their limit; the reservation settles it under the machine's lock, outbidding or refusing."""
    full = {
        v.offer_id: v for v in views if v.capacity is not None and v.capacity < (order.gpu_count if v.divisible else 1)
    }
    offers = Offer.objects.filter(pk__in=full).order_by("pk")
    return [dataclasses.replace(full[o.pk], capacity=None) for o in offers if outbid_possible(offer=o, order=order)]


def _open_attempt(order: Order, offer: Offer, now: dt.datetime, *, first: bool = False) -> Attempt | None:
    """Record the attempt before the provider hears of it and, on a finite listing, hold its units in the same
    transaction. A listing with too few units left fails the attempt at once (a capacity error coded
    ``SOLD_OUT``: the failover moves on, but no clock block follows, see ``blocks.py``) and nobody is called.

    None, with nothing written, when the order is no longer provisioning (the buyer ended it while an earlier
    attempt was in flight): an ended order never gets another machine. ``first``: the caller's transaction has
    just moved the order out of placed, which claimed its row and means it has no attempt yet; a failure here
    rolls that transaction back whole."""
    with transaction.atomic(savepoint=not first):
        # The claim: a write on the order's row, held until the attempt commits (PostgreSQL's row lock,
        # SQLite's write lock). A terminate that committed first is seen here; one that comes later waits,
        # and its task then finds this attempt pending and looks for its machine at the provider.
        if not first and not Order.objects.filter(pk=order.pk, state=OrderState.PROVISIONING).update(
            state=OrderState.PROVISIONING
        ):
            return None
        number = 1 if first else order.attempts.count() + 1
        attempt = Attempt.objects.create(
            order=order,
            number=number,
            offer=offer,
            client_token=_client_token(order, number),
            started_at=now,
        )
        attempt_ledger(attempt, "attempt.started", zone=offer.zone, instance_type=offer.instance_type)
        lease_open(attempt=attempt, now=now)
        if not reservation_take(attempt=attempt):
            sold_out = CapacityUnavailable(
                f"listing {offer.instance_type} in {offer.zone} has no units left", code=SOLD_OUT
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
            attempt_ledger(attempt, "attempt.failed", error_class=error.error_class, provider_code=error.code)
        if attempt.reserved:  # set with its units in the transaction that took them (reservation_take)
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
NO_FAILOVER = "failover was not allowed, so no other {} was tried"


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
            return f"the chosen offer cannot be launched now ({why}); {NO_FAILOVER.format('offer')}"
        return "failed on the chosen offer: " + "; ".join(parts) + f"; {NO_FAILOVER.format('offer')}"
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
    rows = Order.objects.select_related("gpu_model", "offer__account", "launch_config")
    order = with_endpoints(rows.filter(pk=order_id))
    if order is None:
        raise Order.DoesNotExist(f"order {order_id} does not exist")
    if order.offer.gpu_model_id == order.gpu_model_id:
        # The pick's card is the order's (placing copies it): one join fewer in a read every order makes.
        order.offer.gpu_model = order.gpu_model
    # One adapter per account for the whole task: a failover within the account reuses its SDK clients and what
    # it already read or made for this order (the image, the security group), instead of asking again.
    adapters: dict[int, ProviderAdapter] = {}
    first: Attempt | None = None
    if order.state == OrderState.PLACED:
        preparing = _first_launch_prepare(order, adapters)
        try:
            first = _start(order)
        except TransitionRefused:
            order.refresh_from_db()
        else:
            if first is None:
                return Step.DONE  # failed: nothing could serve it
        finally:
            _prepared(preparing, order)
    if order.state != OrderState.PROVISIONING:
        return Step.DONE
    # An order this task just moved out of placed has had no attempt before its first, so no instance.
    if first is None and Instance.objects.filter(order=order, active=True).exists():
        return Step.POLL
    while True:
        now = timezone.now()
        if first is not None:
            attempt, fresh, first = first, True, None
            if attempt.outcome == AttemptOutcome.FAILED:
                continue
        else:
            # One read answers both questions: the pending attempt sorts first; any other means one was made before.
            head = (
                order.attempts.select_related("offer__account")
                .order_by(Case(When(outcome=AttemptOutcome.PENDING, then=0), default=1), "pk")
                .first()
            )
            pending = head if head is not None and head.outcome == AttemptOutcome.PENDING else None
            fresh = pending is None
            if pending is None:
                offer = _next_offer(order, now, tried=head is not None)
                if offer is None:
                    try:
                        order_transition(order=order, to=OrderState.FAILED, reason=_failure_summary(order))
                    except TransitionRefused:
                        pass
                    return Step.DONE
                pending = _open_attempt(order, offer, now)
                if pending is None:
                    log.info("order %s ended while provisioning: no further attempt", order.public_id)
                    return Step.DONE
                if pending.outcome == AttemptOutcome.FAILED:
                    continue
            attempt = pending
        offer = attempt.offer
        spec = _launch_spec(order, attempt)
        adapter = adapters.get(offer.account_id)
        if adapter is None:
            adapter = adapters[offer.account_id] = adapter_for_account(offer.account)
        if fresh and not _launch_acceptable(adapter, attempt, spec):
            continue
        # Only a fresh attempt: a resumed one may already have launched, and its machine counts in the usage.
        if fresh and not _quota_allows(adapter, attempt, spec):
            continue
        # Only an attempt holding units outbids anyone (reservations.py gives notice as it takes them).
        if attempt.reserved and preemption_pending(attempt_id=attempt.pk):
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
        if not record_launch(order, attempt, handle):
            order.refresh_from_db(fields=["state"])
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


# Threads that make a first launch's resources while its attempt is recorded (``_first_launch_prepare``); the
# prefork worker's parent never submits, so a forked child starts with none running.
_preparing = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch-prepare")
# A preparation is SDK calls, each under its client's deadline; past this the launch makes what is missing itself.
PREPARE_WAIT_S = 60.0


def _first_launch_prepare(order: Order, adapters: dict[int, ProviderAdapter]) -> Future[None] | None:
    """Start making, on a thread of its own, what the launch of the order's first attempt on the buyer's pick
    needs besides the instance (``ProviderAdapter.launch_prepare``: on AWS the image read, the key pair and
    the security group), while ``_start`` records the attempt: the provider's calls and the database's
    then overlap. The thread touches no database. None when the pick's adapter makes nothing ahead."""
    offer = order.offer
    try:
        adapter = adapters.get(offer.account_id) or adapter_for_account(offer.account)
    except ProviderError:
        return None  # the attempt's own launch meets the same error and records it
    adapters[offer.account_id] = adapter
    if not adapter.prepares_launch:
        return None
    # The spec the first attempt will launch with: its client token, and so its boot token, follow from its number.
    spec = _launch_spec(order, Attempt(order=order, number=1, offer=offer, client_token=_client_token(order, 1)))
    return _preparing.submit(adapter.launch_prepare, spec)


def _prepared(preparing: Future[None] | None, order: Order) -> None:
    """Let a preparation finish before anything launches. Its failure is only logged: the launch makes what is
    missing again and reports what stops it."""
    if preparing is None:
        return
    try:
        preparing.result(timeout=PREPARE_WAIT_S)
    except TimeoutError:
        log.warning("order %s: preparing its launch took over %s s; it launches now", order.public_id, PREPARE_WAIT_S)
    except Exception as exc:  # the launch itself raises it, in the failover's terms
        log.info("order %s: preparing its launch failed, the launch will try again: %s", order.public_id, exc)


def _client_token(order: Order, number: int) -> str:
    return f"{order.ref}-a{number}"


def _start(order: Order) -> Attempt | None:
    """Move the placed ``order`` to provisioning and open its first attempt on the buyer's pick (or, when another
    order's failure blocks it, the best other offer), in one transaction: the transition's claim on the order's
    row is the attempt's claim too. None when nothing can serve the order, which then fails in that transaction.
    ``TransitionRefused``, with nothing written, when someone else moved the order first."""
    now = timezone.now()
    offer = _next_offer(order, now, tried=False)
    with transaction.atomic():
        order_transition(order=order, to=OrderState.PROVISIONING, savepoint=False)
        if offer is None:
            order_transition(order=order, to=OrderState.FAILED, reason=_failure_summary(order), savepoint=False)
            return None
        return _open_attempt(order, offer, now, first=True)


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
        # GPU holds exist only for an attempt holding units (reservation_take records how many).
        gpu_indexes=gpu_indexes_held(attempt_id=attempt.pk) if attempt.reserved else (),
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


def record_launch(order: Order, attempt: Attempt, handle: InstanceHandle, *, adopted: bool = False) -> bool:
    """The provider launched ``handle`` for ``attempt``: settle the attempt, record the instance, ledger it.
    ``adopted``: found by the reconciler rather than answered to the launch call.

    True when the order was still provisioning as the instance was recorded: the order's row is then locked
    by this transaction, so a terminate that comes later waits for it and finds the instance. False when the
    order had already left provisioning (its caller must see to the machine)."""
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
        price = _launch_price(order, attempt)
        provisioning = Order.objects.filter(pk=order.pk, state=OrderState.PROVISIONING).update(
            offer=attempt.offer, price_per_hour=price
        )
        if not provisioning:
            Order.objects.filter(pk=order.pk).update(offer=attempt.offer, price_per_hour=price)
        booked = Lease.objects.filter(attempt=attempt, boot_deadline__isnull=True).update(
            boot_deadline=now + dt.timedelta(seconds=settings.BOOT_TIMEOUT_S)
        )
        if booked:
            # One check at the deadline per launch (the minute sweep looks again, should this task be lost).
            enqueue_on_commit("marketplace.order_boot_deadline", order.pk, countdown=settings.BOOT_TIMEOUT_S + 1)
        extra = {"adopted": True} if adopted else {}
        attempt_ledger(attempt, "attempt.launched", instance=handle.instance_id, zone=handle.zone, **extra)
        instance_event_emit(
            instance_id=instance.pk,
            event_type=WebhookEventType.INSTANCE_LAUNCHED,
            organization_id=order.organization_id,
            endpoints=endpoints_known(order),
            adopted=adopted,
        )
    return bool(provisioning)


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
