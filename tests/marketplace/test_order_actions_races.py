"""Stop, start and restart run concurrently with themselves and each other (issue 36): threads on their own
database connections, released together, and PostgreSQL's row lock decides; one action happens, never two."""

from __future__ import annotations

import pytest

from ledger.models import LedgerEntry
from marketplace.models import Offer, Order, OrderState, StoppedPeriod
from marketplace.orders.actions import order_restart, order_stop
from marketplace.orders.errors import TransitionRefused
from tests.leases import running_order
from tests.races import race, race_same, require_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def _entries(order: Order, kind: str) -> int:
    return LedgerEntry.objects.filter(subject=f"order:{order.public_id}", kind=kind).count()


@pytest.fixture
def _gpu_models(transactional_db) -> None:
    """The GPU spec table, which a transactional test before this one flushed with every table."""
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)


@pytest.fixture
def order(_gpu_models, acme, alice, held_hosts, django_capture_on_commit_callbacks) -> Order:
    require_postgresql()
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand", gpu_count=8)
    return running_order(acme, alice, offer, django_capture_on_commit_callbacks, held_hosts, allow_failover=False)


def test_four_concurrent_stops_stop_the_machine_once(order):
    results, errors = race_same(4, lambda: order_stop(order=Order.objects.get(pk=order.pk)).state)

    assert errors == []
    # Each caller sees the order as the winner's move left it by then: stopping, or already stopped.
    assert len(results) == 4 and set(results) <= {OrderState.STOPPING, OrderState.STOPPED}
    order.refresh_from_db()
    assert order.state == OrderState.STOPPED
    assert (_entries(order, "order.stopping"), _entries(order, "order.stopped")) == (1, 1)
    assert StoppedPeriod.objects.filter(order=order).count() == 1


def test_a_stop_and_a_restart_at_once_make_one_move(order):
    results, errors = race(
        [
            lambda: order_stop(order=Order.objects.get(pk=order.pk)).state,
            lambda: order_restart(order=Order.objects.get(pk=order.pk)).state,
        ]
    )

    assert len(results) == 1 and len(errors) == 1
    assert isinstance(errors[0], TransitionRefused)
    assert _entries(order, "order.stopping") + _entries(order, "order.starting") == 1
