"""What a buyer does to an order: place it (from an offer or a quote, under budget and credit), terminate it,
and the sweep that ends orders at their scheduled end. Every state change goes through
``orders.transitions.order_transition``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.billing.credit import order_hold_place
from marketplace.launch.config import LaunchChoice, LaunchConfigInvalid, launch_configuration_create
from marketplace.launch.leases import launch_problems_for
from marketplace.matching import Amount
from marketplace.models import (
    LaunchConfiguration,
    Offer,
    OfferStatus,
    Order,
    OrderState,
    Organization,
    PaymentTerms,
    Quote,
)
from marketplace.orders.bids import BidBelowMinimum, bid_resolve
from marketplace.orders.budgets import budget_check
from marketplace.orders.errors import (
    BidRefused,
    IdempotencyConflict,
    OfferNotFound,
    OfferNotOrderable,
    QuoteExpired,
    QuoteNotFound,
    QuoteUsed,
    TransitionRefused,
)
from marketplace.orders.quoting import quote_get
from marketplace.orders.selectors import order_spent_usd
from marketplace.orders.transitions import order_transition
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import endpoints_known, order_event_emit, with_endpoints


def _ledger(order: Order, kind: str, **fields: Any) -> None:
    ledger_append(
        kind=kind,
        subject=f"order:{order.public_id}",
        payload={"order": str(order.public_id), "organization": order.organization_id, **fields},
    )


@dataclass(frozen=True)
class PlaceRequest:
    """An offer at its current price, or a quote (``quote_id``) at the price it locked."""

    offer_id: int | None = None
    max_price_per_hour: Decimal | None = None
    allow_failover: bool = True
    regions: tuple[str, ...] = ()
    quote_id: str | None = None
    duration_hours: Decimal | None = None  # None: a quote's duration, else until terminated
    # What to launch: inline, or a template. None: the quote's configuration, else the defaults (just the
    # machine, every key of the organisation, SSH open to the caller's address only).
    launch: LaunchChoice | None = None
    caller_address: str | None = None  # where the request came from: who may reach the machine by default
    # An independent machine's interruptible offer: the bid per GPU-hour (None: the machine's minimum).
    bid_per_gpu_hour: Decimal | None = None
    # Runs until terminated whatever the quote's duration (a fleet's replica, which its fleet ends).
    open_ended: bool = False

    def fingerprint(self) -> str:
        body = {
            "offer": self.offer_id,
            "quote": self.quote_id,
            "duration_hours": None if self.duration_hours is None else format(self.duration_hours, "f"),
            "max_price_per_hour": None if self.max_price_per_hour is None else format(self.max_price_per_hour, "f"),
            "allow_failover": self.allow_failover,
            "regions": sorted(self.regions),
            "launch": None if self.launch is None else {"data": self.launch.data, "template": self.launch.template},
        }
        if self.bid_per_gpu_hour is not None:  # only then: fingerprints stored before bids existed still match
            body["bid_per_gpu_hour"] = format(self.bid_per_gpu_hour, "f")
        if self.open_ended:
            body["open_ended"] = True
        # Keyed: the body may hold the buyer's secret values, and a plain hash of a short secret can be guessed.
        message = json.dumps(body, sort_keys=True, default=str).encode()
        return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PlaceResult:
    order: Order
    created: bool
    warnings: tuple[str, ...] = ()  # e.g. close to a budget


def order_place(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    request: PlaceRequest,
    idempotency_key: str | None = None,
    now: dt.datetime | None = None,
) -> PlaceResult:
    """Place an order for an offer at its current USD price, or for a quote at the price the quote locked.

    A quote must be the organisation's own (else ``QuoteNotFound``), unexpired (``QuoteExpired``) and not
    ordered before (``QuoteUsed``: one order per quote, enforced by a unique column). Idempotent on
    (organization, ``idempotency_key``): a repeat with the same body returns the first order (``created``
    False); the same key with a different body raises ``IdempotencyConflict``. Raises
    ``OfferNotFound`` for an unknown offer and ``OfferNotOrderable`` for one that is not for sale or above the
    buyer's cap, and ``LaunchConfigInvalid`` for a launch configuration that is wrong or that the offer's
    provider would refuse (its documented limits), before anything is stored. The provisioning task is
    enqueued only after the order commits.
    """
    fingerprint = request.fingerprint()
    if idempotency_key:
        existing = Order.objects.filter(organization=organization, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replay(existing, fingerprint)
    now = now or timezone.now()
    quote = None
    if request.quote_id is not None:
        quote, offer, price = _quoted_offer(organization, request.quote_id, now)
    else:
        offer = _offer_on_sale(request.offer_id)
        price = offer.price_usd
    try:
        bid = bid_resolve(offer=offer, bid_per_gpu_hour=request.bid_per_gpu_hour)
    except BidBelowMinimum as exc:
        raise BidRefused(str(exc)) from None
    if bid is not None:
        price = bid * offer.gpu_count  # a bidder pays its bid, whatever the listing's minimum
    cap = request.max_price_per_hour if request.max_price_per_hour is not None else price
    duration = request.duration_hours
    # A quote for a fixed duration stops the order at it. One for fixed work only estimates the hours on this
    # card from datasheets: stopping there could cut the job short, so the buyer's own limits stop it.
    if quote is not None and int((quote.demand or {}).get("nodes", 1)) > 1:
        raise OfferNotOrderable(
            f"quote {quote.public_id} is for {quote.demand['nodes']} nodes: "
            "order it as a cluster (POST /api/v1/clusters)"
        )
    if (
        duration is None
        and not request.open_ended
        and quote is not None
        and (quote.demand or {}).get("amount") != Amount.WORK
    ):
        duration = quote.duration_hours
    if price > cap:
        raise OfferNotOrderable(f"offer {offer.pk} costs {price} USD/h, above your cap of {cap}")
    try:
        with transaction.atomic():
            # The organisation's row is the lock that makes the budget check and the insert one step.
            locked = with_endpoints(Organization.objects.select_for_update().filter(pk=organization.pk), "pk")
            if locked is None:
                raise Organization.DoesNotExist(f"organisation {organization.pk} does not exist")
            warnings = budget_check(locked, adding_per_hour=price, now=now)
            config = launch_config_for(
                organization=organization,
                user=user,
                offer=offer,
                quote=quote,
                launch=request.launch,
                caller_address=request.caller_address,
            )
            spend_cap = config.spec.get("spend_cap_usd")
            order = Order.objects.create(
                launch_config=config,
                spend_cap_usd=None if spend_cap is None else Decimal(spend_cap),
                organization=organization,
                created_by=user,
                offer=offer,
                quote=quote,
                gpu_model=offer.gpu_model,
                gpu_count=offer.gpu_count,
                pricing_model=offer.pricing_model,
                regions=list(request.regions),
                max_price_per_hour=cap,
                allow_failover=request.allow_failover,
                price_per_hour=price,
                bid_per_gpu_hour=bid,
                duration_hours=duration,
                state=OrderState.PLACED,
                state_changed_at=now,
                idempotency_key=idempotency_key or None,
                request_fingerprint=fingerprint,
            )
            _ledger(
                order,
                "order.placed",
                state=OrderState.PLACED,
                offer=offer.pk,
                instance_type=offer.instance_type,
                zone=offer.zone,
                pricing_model=offer.pricing_model,
                price_usd_per_hour=price,
                bid_per_gpu_hour=bid,
                max_price_per_hour=cap,
                quote=None if quote is None else str(quote.public_id),
                duration_hours=duration,
                spend_cap_usd=spend_cap,
                launch_sha256=config.sha256,
            )
            if locked.payment_terms == PaymentTerms.PREPAID:
                # Before anything launches; PaymentRequired rolls the order back with the rest.
                order_hold_place(order, locked, now=now)
            order_event_emit(order=order, previous=None, now=now, endpoints=endpoints_known(locked))
            enqueue_on_commit("marketplace.order_provision", order.pk)
    except IntegrityError:
        # A concurrent request with the same key won the insert; answer as its replay. Without a key, the
        # only unique field two requests can collide on is the quote: someone ordered it first.
        holder = None if quote is None else Order.objects.filter(quote=quote).first()
        if holder is not None and (not idempotency_key or holder.idempotency_key != idempotency_key):
            raise QuoteUsed(f"quote {quote.public_id} has already been ordered") from None
        if not idempotency_key:
            raise
        existing = Order.objects.get(organization=organization, idempotency_key=idempotency_key)
        return _replay(existing, fingerprint)
    return PlaceResult(order=order, created=True, warnings=tuple(warnings))


def launch_config_for(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    offer: Offer,
    quote: Quote | None,
    launch: LaunchChoice | None,
    caller_address: str | None,
) -> LaunchConfiguration:
    """What a placement launches: ``launch`` (stored now), else the quote's configuration, else the defaults, with
    SSH open to ``caller_address``. ``LaunchConfigInvalid`` when it is wrong or ``offer``'s provider would refuse
    it (its documented limits). Runs inside the placement's transaction."""
    if launch is None and quote is not None and quote.launch_config is not None:
        config = quote.launch_config
    else:
        choice = launch or LaunchChoice()
        if choice.caller_address is None:
            choice = dataclasses.replace(choice, caller_address=caller_address)
        config = launch_configuration_create(organization=organization, user=user, choice=choice)
    problems = launch_problems_for(offer=offer, config=config)
    if problems:
        raise LaunchConfigInvalid({p.field: p.message for p in problems})
    return config


def _offer_on_sale(offer_id: int | None) -> Offer:
    # Only offers on sale are visible; anything else answers as unknown so ids reveal nothing.
    offer = (
        Offer.objects.select_related("gpu_model", "account")
        .filter(pk=offer_id, status=OfferStatus.AVAILABLE, account__enabled=True)
        .first()
    )
    if offer is None:
        raise OfferNotFound(f"offer {offer_id} does not exist or is not for sale")
    return offer


def _quoted_offer(organization: Organization, quote_id: str, now: dt.datetime) -> tuple[Quote, Offer, Decimal]:
    """The organisation's unexpired, unused quote, its offer (still listed) and the price it locked."""
    quote = quote_get(organization=organization, public_id=quote_id)
    if quote is None:
        raise QuoteNotFound(f"quote {quote_id} does not exist")
    if quote.expires_at <= now:
        raise QuoteExpired(f"quote {quote_id} expired at {quote.expires_at.isoformat()}; ask for a new one")
    if Order.objects.filter(quote=quote).exists():
        raise QuoteUsed(f"quote {quote_id} has already been ordered")
    offer = quote.offer
    if offer.status != OfferStatus.AVAILABLE or not offer.account.enabled:
        raise OfferNotOrderable(f"the quoted offer {offer.pk} is no longer for sale; ask for a new quote")
    return quote, offer, quote.price_per_hour


def _replay(existing: Order, fingerprint: str) -> PlaceResult:
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyConflict("this Idempotency-Key was already used with a different request body")
    return PlaceResult(order=existing, created=False)


def order_terminate(*, order: Order, reason: str = "terminated by buyer") -> Order:
    """Ask for the order's instance to be stopped. Idempotent: a terminating or terminated order is returned
    as it is. A placed order that never started is cancelled instead."""
    order.refresh_from_db()
    if order.state in (OrderState.TERMINATING, OrderState.TERMINATED):
        return order
    if order.state == OrderState.PLACED:
        return order_transition(order=order, to=OrderState.CANCELLED, reason=reason)
    ending_from = (
        OrderState.RUNNING,
        OrderState.PROVISIONING,
        OrderState.STOPPING,
        OrderState.STOPPED,
        OrderState.STARTING,
    )
    if order.state not in ending_from:
        raise TransitionRefused(f"order {order.public_id} is {order.state}; nothing to terminate")
    with transaction.atomic():
        order_transition(order=order, to=OrderState.TERMINATING, reason=reason)
        enqueue_on_commit("marketplace.order_terminate", order.pk)
    return order


def orders_end_scheduled(*, now: dt.datetime | None = None) -> int:
    """Start terminating every running order whose requested duration is over, or whose spend cap its usage
    reached (``run_until`` is the earlier of the two); how many were started."""
    now = now or timezone.now()
    started = 0
    for order in Order.objects.filter(state=OrderState.RUNNING, run_until__lte=now):
        reason = f"scheduled end: ran the requested {order.duration_hours} h"
        if order.spend_cap_usd is not None and (
            order.duration_hours is None or order_spent_usd(order, now=now) >= order.spend_cap_usd - Decimal("0.01")
        ):
            reason = f"spend cap reached: the order has cost its cap of {order.spend_cap_usd} USD"
        try:
            order_terminate(order=order, reason=reason)
        except TransitionRefused:
            continue  # the buyer or another sweep got there first
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not this order's failure
        except Exception:  # one order's surprise must not keep every other order running past its end
            logging.getLogger(__name__).exception("ending order %s at its scheduled end failed", order.public_id)
            continue
        started += 1
    return started
