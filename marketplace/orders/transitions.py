"""The order's state machine: ``order_transition`` is the only way an order changes state.

It claims the row with a conditional update, then tells the rest of the market through the bus
(``marketplace.events``) in three steps, all in its transaction: ``OrderLeaving`` as soon as the row is claimed,
``OrderEnded`` with the invoice line when the state is final, and ``OrderMoved`` once the ledger entry is written.
Who reacts to each is listed in ``marketplace/reactions.py``; nothing here imports billing, webhooks, clusters or
provisioning, which all sit above.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.events import OrderEnded, OrderLeaving, OrderMoved, publish
from marketplace.models import InvoiceLine, Order
from marketplace.orders.errors import TransitionRefused
from marketplace.orders.selectors import order_usage


def order_transition(*, order: Order, to: str, reason: str = "", savepoint: bool = True, **ledger_fields: Any) -> Order:
    """Move ``order`` to state ``to`` if the transitions table allows it from the state it is in now.

    Claims the row with ``UPDATE ... WHERE state = <current>``: when another worker moved it first, no row
    matches and ``TransitionRefused`` is raised with nothing written. The ledger entry commits with the change.
    ``savepoint=False`` inside a caller's transaction that any failure here must roll back whole (the caller
    does not catch it inside that transaction): two round trips fewer than the savepoint a nested block makes.
    """
    current = order.state
    if to not in Order.TRANSITIONS[current]:
        raise TransitionRefused(f"order {order.public_id} cannot go from {current} to {to}")
    now = timezone.now()
    with transaction.atomic(savepoint=savepoint):
        claimed = Order.objects.filter(pk=order.pk, state=current).update(
            state=to, state_reason=reason, state_changed_at=now
        )
        if claimed != 1:
            raise TransitionRefused(f"order {order.public_id} is no longer {current}")
        publish(OrderLeaving(order=order, previous=current, to=to, now=now))
        if to in Order.FINAL_STATES:
            line = _invoice_line(order, now)
            publish(OrderEnded(order=order, previous=current, to=to, line=line, now=now))
            if line is not None:
                ledger_fields = {**ledger_fields, "invoiced_seconds": line.seconds, "invoiced_usd": line.amount_usd}
        ledger_append(
            kind=f"order.{to}",
            subject=f"order:{order.public_id}",
            payload={
                "order": str(order.public_id),
                "organization": order.organization_id,
                "previous": current,
                "state": to,
                "reason": reason,
                **ledger_fields,
            },
        )
        publish(OrderMoved(order=order, previous=current, to=to, now=now))
    order.state, order.state_reason, order.state_changed_at = to, reason, now
    return order


def _invoice_line(order: Order, now: dt.datetime) -> InvoiceLine | None:
    """The ended order's line, at its locked price, if its machines ran at all."""
    order = Order.objects.select_related("gpu_model").prefetch_related("instances", "stopped_periods").get(pk=order.pk)
    usage = order_usage(order, now=now)
    if usage.seconds == 0:
        return None
    return InvoiceLine.objects.create(
        organization_id=order.organization_id,
        order=order,
        description=f"{order.gpu_count}x {order.gpu_model.key} {order.pricing_model}, order {order.public_id}",
        seconds=usage.seconds,
        price_per_hour=order.price_per_hour,
        amount_usd=usage.amount_usd,
        ended_at=now,
    )
