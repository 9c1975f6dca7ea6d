"""Order writes. Every state change goes through ``order_transition``, which claims the row with a
conditional update and writes the ledger entry in the same transaction."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.models import Offer, OfferStatus, Order, OrderState, Organization


class OrderError(Exception):
    """Base for refusals a buyer should see; ``code`` is machine-readable."""

    code = "order_error"


class OfferNotFound(OrderError):
    code = "offer_not_found"


class OfferNotOrderable(OrderError):
    code = "offer_not_orderable"


class IdempotencyConflict(OrderError):
    code = "idempotency_conflict"


class TransitionRefused(OrderError):
    """The order is not in a state that allows the move (someone else moved it first, or it is final)."""

    code = "invalid_state"


def _ledger(order: Order, kind: str, **fields: Any) -> None:
    ledger_append(
        kind=kind,
        subject=f"order:{order.public_id}",
        payload={"order": str(order.public_id), "organization": order.organization_id, **fields},
    )


def order_transition(*, order: Order, to: str, reason: str = "", **ledger_fields: Any) -> Order:
    """Move ``order`` to state ``to`` if the transitions table allows it from the state it is in now.

    Claims the row with ``UPDATE ... WHERE state = <current>``: when another worker moved it first, no row
    matches and ``TransitionRefused`` is raised with nothing written. The ledger entry commits with the change.
    """
    current = order.state
    if to not in Order.TRANSITIONS[current]:
        raise TransitionRefused(f"order {order.public_id} cannot go from {current} to {to}")
    now = timezone.now()
    with transaction.atomic():
        claimed = Order.objects.filter(pk=order.pk, state=current).update(
            state=to, state_reason=reason, state_changed_at=now
        )
        if claimed != 1:
            raise TransitionRefused(f"order {order.public_id} is no longer {current}")
        _ledger(order, f"order.{to}", previous=current, state=to, reason=reason, **ledger_fields)
    order.state, order.state_reason, order.state_changed_at = to, reason, now
    return order


@dataclass(frozen=True)
class PlaceRequest:
    offer_id: int
    max_price_per_hour: Decimal | None = None
    allow_failover: bool = True
    regions: tuple[str, ...] = ()

    def fingerprint(self) -> str:
        body = {
            "offer": self.offer_id,
            "max_price_per_hour": None if self.max_price_per_hour is None else format(self.max_price_per_hour, "f"),
            "allow_failover": self.allow_failover,
            "regions": sorted(self.regions),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PlaceResult:
    order: Order
    created: bool


def order_place(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    request: PlaceRequest,
    idempotency_key: str | None = None,
    now: dt.datetime | None = None,
) -> PlaceResult:
    """Place an order for an offer, price locked at the offer's current USD price.

    Idempotent on (organization, ``idempotency_key``): a repeat with the same body returns the first order
    (``created`` False); the same key with a different body raises ``IdempotencyConflict``. Raises
    ``OfferNotFound`` for an unknown offer and ``OfferNotOrderable`` for one that is not for sale or above the
    buyer's cap. The provisioning task is enqueued only after the order commits.
    """
    fingerprint = request.fingerprint()
    if idempotency_key:
        existing = Order.objects.filter(organization=organization, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replay(existing, fingerprint)
    # Only offers on sale are visible; anything else answers as unknown so ids reveal nothing.
    offer = (
        Offer.objects.select_related("gpu_model", "account")
        .filter(pk=request.offer_id, status=OfferStatus.AVAILABLE, account__enabled=True)
        .first()
    )
    if offer is None:
        raise OfferNotFound(f"offer {request.offer_id} does not exist or is not for sale")
    now = now or timezone.now()
    cap = request.max_price_per_hour if request.max_price_per_hour is not None else offer.price_usd
    if offer.price_usd > cap:
        raise OfferNotOrderable(f"offer {offer.pk} costs {offer.price_usd} USD/h, above your cap of {cap}")
    try:
        with transaction.atomic():
            order = Order.objects.create(
                organization=organization,
                created_by=user,
                offer=offer,
                gpu_model=offer.gpu_model,
                gpu_count=offer.gpu_count,
                pricing_model=offer.pricing_model,
                regions=list(request.regions),
                max_price_per_hour=cap,
                allow_failover=request.allow_failover,
                price_per_hour=offer.price_usd,
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
                price_usd_per_hour=offer.price_usd,
                max_price_per_hour=cap,
            )
            from marketplace.tasks import order_provision_task

            order_provision_task.delay_on_commit(order.pk)
    except IntegrityError:
        # A concurrent request with the same key won the insert; answer as its replay.
        if not idempotency_key:
            raise
        existing = Order.objects.get(organization=organization, idempotency_key=idempotency_key)
        return _replay(existing, fingerprint)
    return PlaceResult(order=order, created=True)


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
    if order.state not in (OrderState.RUNNING, OrderState.PROVISIONING):
        raise TransitionRefused(f"order {order.public_id} is {order.state}; nothing to terminate")
    with transaction.atomic():
        order_transition(order=order, to=OrderState.TERMINATING, reason=reason)
        from marketplace.tasks import order_terminate_task

        order_terminate_task.delay_on_commit(order.pk)
    return order
