"""The bus and its table (issue 34, point 1): every event the order's life publishes has its handlers listed in
``marketplace/reactions.py``; they run inside the transition's transaction, in the table's order; and an event
published with no table installed is refused rather than lost."""

from __future__ import annotations

import typing

import pytest

from ledger.models import LedgerEntry
from marketplace import events
from marketplace.events import OrderEnded, OrderLeaving, OrderMoved, ReactionsMissing, handlers_install, publish
from marketplace.models import Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.orders.transitions import order_transition
from marketplace.reactions import HANDLERS
from tests.leases import LAUNCH


@pytest.fixture
def placed(acme, alice, aws_account) -> Order:
    offer = aws_account.offers.filter(instance_type="g5.xlarge").order_by("price_usd").first()
    return order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order


@pytest.fixture
def table_restored():
    yield
    handlers_install(HANDLERS)


def test_every_event_has_its_handlers_in_the_table():
    assert set(typing.get_args(events.Event)) == set(HANDLERS)
    assert all(HANDLERS[kind] for kind in HANDLERS)


def test_handlers_run_in_the_table_order_within_the_transition(placed, table_restored):
    seen: list[tuple[str, str, bool]] = []

    def note(step: str):
        def handler(event) -> None:
            # Inside the transaction: the row already says the new state, the ledger entry is or is not written.
            written = LedgerEntry.objects.filter(subject=f"order:{placed.public_id}", kind="order.cancelled").exists()
            seen.append((step, Order.objects.get(pk=placed.pk).state, written))

        return handler

    handlers_install(
        {
            OrderLeaving: [note("leaving")],
            OrderEnded: [note("ended"), note("ended, second")],
            OrderMoved: [note("moved")],
        }
    )
    order_transition(order=placed, to=OrderState.CANCELLED, reason="changed my mind")

    assert seen == [
        ("leaving", OrderState.CANCELLED, False),
        ("ended", OrderState.CANCELLED, False),
        ("ended, second", OrderState.CANCELLED, False),
        ("moved", OrderState.CANCELLED, True),
    ]


def test_a_failing_handler_rolls_the_transition_back(placed, table_restored):
    def refuse(event: OrderMoved) -> None:
        raise RuntimeError("a reaction failed")

    handlers_install({**HANDLERS, OrderMoved: [*HANDLERS[OrderMoved], refuse]})
    with pytest.raises(RuntimeError, match="a reaction failed"):
        order_transition(order=placed, to=OrderState.CANCELLED, reason="changed my mind")

    assert Order.objects.get(pk=placed.pk).state == OrderState.PLACED
    assert not LedgerEntry.objects.filter(subject=f"order:{placed.public_id}", kind="order.cancelled").exists()


def test_an_event_published_before_the_table_is_installed_is_refused(placed, monkeypatch):
    monkeypatch.setattr(events, "_handlers", None)
    with pytest.raises(ReactionsMissing, match="OrderMoved published before"):
        publish(OrderMoved(order=placed, previous=OrderState.PLACED, to=OrderState.CANCELLED, now=placed.created_at))
