"""What happens when: the one table of the market's reactions to the order's and the lease's events.

Read it top to bottom as the life of an order. Each handler is a line here; the modules it calls sit above the
state machine and are never called back by it (docs/ARCHITECTURE.md, "The order's life in one direction").
``MarketplaceConfig.ready`` installs the table; ``marketplace.events.publish`` runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from marketplace.billing.credit import order_settle
from marketplace.events import LeaseReady, OrderEnded, OrderLeaving, OrderMoved
from marketplace.models import Order, OrderState
from marketplace.orders.readiness import order_running_if_ready
from marketplace.orders.reservations import reservations_release_for_order
from marketplace.orders.silence import silence_close_on_leaving
from marketplace.sla.credits import sla_credit_at_order_end
from marketplace.sla.outages import outages_on_end, outages_on_leaving_running, outages_on_running
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import order_event_emit

log = logging.getLogger(__name__)


def silent_period_close(event: OrderLeaving) -> None:
    """Off its machine: a silence in progress ends here, and the next machine starts healthy."""
    if event.previous == OrderState.RUNNING:
        silence_close_on_leaving(order_id=event.order.pk, to=event.to, now=event.now)


def outages_on_leaving(event: OrderLeaving) -> None:
    """Off running: the SSH probe starts afresh on the next machine; a lost machine opens a provider outage."""
    if event.previous == OrderState.RUNNING:
        outages_on_leaving_running(order=event.order, to=event.to, now=event.now)


def reservations_release(event: OrderEnded) -> None:
    """The GPUs the order's attempts held on independent machines go back on sale."""
    reservations_release_for_order(order_id=event.order.pk)


def money_settle(event: OrderEnded) -> None:
    """Its hold released, its cost charged (commission and tax), before the order's ledger entry is written."""
    order_settle(event.order, event.line, now=event.now)


def sla_credit_at_end(event: OrderEnded) -> None:
    """Its outages closed and its month so far judged against its SLA, the credit paid (after its charge).
    In a savepoint: a surprise here is logged and left to the month's close, never a refused termination."""
    try:
        with transaction.atomic():
            outages_on_end(order_id=event.order.pk, now=event.now)
            sla_credit_at_order_end(order=event.order, now=event.now)
    except Exception:
        log.exception("SLA of order %s not judged at its end; the month's close judges it", event.order.pk)


def outages_on_run(event: OrderMoved) -> None:
    """Running (again): the provider's outage of a lost machine ends."""
    if event.to == OrderState.RUNNING:
        outages_on_running(order_id=event.order.pk, now=event.now)


def webhook_queue(event: OrderMoved) -> None:
    """``order.<state>`` for the organisation's endpoints, sent after commit."""
    order_event_emit(order=event.order, previous=event.previous, now=event.now)


def cluster_advance(event: OrderMoved) -> None:
    """A node of a multi-node job: its cluster decides what the group does next (orders/clusters.py)."""
    if event.order.cluster_id is not None:
        enqueue_on_commit("marketplace.cluster_advance", event.order.cluster_id)


def fleet_evaluate(event: OrderMoved) -> None:
    """A replica of a fleet that ended or failed: its fleet evaluates at once (and replaces it if it should)."""
    if event.order.fleet_id is not None and event.to in Order.FINAL_STATES:
        enqueue_on_commit("marketplace.fleet_evaluate", event.order.fleet_id)


def order_running(event: LeaseReady) -> None:
    """Every machine of the order is usable: the order runs (and its meter starts)."""
    order_running_if_ready(order_id=event.order_id)


HANDLERS: dict[type, Sequence[Callable[[Any], None]]] = {
    OrderLeaving: [silent_period_close, outages_on_leaving],
    OrderEnded: [reservations_release, money_settle, sla_credit_at_end],
    OrderMoved: [outages_on_run, webhook_queue, cluster_advance, fleet_evaluate],
    LeaseReady: [order_running],
}
