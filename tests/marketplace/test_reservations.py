"""No overselling: a finite listing's last units go to exactly as many orders as it has, under real concurrency."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.services import ledger_verify
from marketplace.catalog.selectors import offer_book
from marketplace.matching import Demand, rank
from marketplace.models import Attempt, Offer, Order, OrderState
from marketplace.orders.reservations import reservation_release, reservation_take
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.tasks import orders_sweep_task
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.leases import LAUNCH, boot_if_launched
from tests.races import race_same


def _listing(account, capacity: int) -> Offer:
    """An AWS sandbox offer made finite, the way an independent provider's listing is."""
    offer = account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd", "zone")[
        0
    ]
    Offer.objects.filter(pk=offer.pk).update(capacity=capacity)
    offer.refresh_from_db()
    return offer


def _place(acme, alice, offer, *, allow_failover: bool) -> Order:
    return order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(
            launch=LAUNCH,
            offer_id=offer.pk,
            max_price_per_hour=offer.price_usd + Decimal("0.01"),
            allow_failover=allow_failover,
        ),
    ).order


def _live_instances(account, order: Order) -> list[str]:
    return [
        h.instance_id
        for h in adapter_for_account(account).find_by_order(order.ref)
        if h.state != InstanceState.TERMINATED
    ]


def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")


@pytest.mark.django_db(transaction=True)
def test_concurrent_orders_for_the_last_units_never_oversell(acme, alice, aws_account, aws_sandbox):
    _require_postgresql()
    listing = _listing(aws_account, capacity=3)
    buyers = 10
    # Each committed at once; the eager task then provisions in its thread, racing the others.
    placed, errors = race_same(buyers, lambda: _place(acme, alice, listing, allow_failover=False).pk)

    assert errors == []
    orders = [boot_if_launched(o, aws_sandbox) for o in Order.objects.filter(pk__in=placed)]
    assert len(orders) == buyers
    running = [o for o in orders if o.state == OrderState.RUNNING]
    assert len(running) == 3, [(o.state, o.state_reason) for o in orders]
    assert {o.state for o in orders} == {OrderState.RUNNING, OrderState.FAILED}
    listing.refresh_from_db()
    assert listing.reserved == 3
    for order in orders:
        assert len(_live_instances(aws_account, order)) == (1 if order.state == OrderState.RUNNING else 0)
    # Only the three winners ever reached the provider.
    assert len(aws_sandbox.calls("RunInstances")) == 3

    for order in running:
        order_terminate(order=order)
    listing.refresh_from_db()
    assert listing.reserved == 0
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_a_writer_waiting_on_the_last_unit_sees_it_taken(acme, alice, aws_account, aws_sandbox):
    """Sixteen transactions take a unit each and hold their transaction open; five succeed."""
    _require_postgresql()
    listing = _listing(aws_account, capacity=5)
    owner = _place(acme, alice, aws_account.offers.exclude(pk=listing.pk).filter(gpu_count=1)[0], allow_failover=True)
    attempts = [
        Attempt.objects.create(
            order=owner, number=100 + i, offer=listing, client_token=f"{owner.ref}-race{i}", started_at=owner.created_at
        )
        for i in range(16)
    ]
    barrier = threading.Barrier(len(attempts))
    taken: list[bool] = []

    def take(attempt: Attempt) -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                taken.append(reservation_take(attempt=attempt))
                time.sleep(0.05)  # hold the row so the others queue on it
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(a,)) for a in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(taken) == [False] * 11 + [True] * 5
    listing.refresh_from_db()
    assert listing.reserved == 5
    assert sum(Attempt.objects.filter(pk__in=[a.pk for a in attempts]).values_list("reserved", flat=True)) == 5


pytestmark_db = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_the_loser_of_a_race_for_the_last_unit_fails_over_without_calling_the_provider(
    acme, alice, aws_account, aws_sandbox
):
    """The buyer ranks the listing while it still has a unit; a concurrent transaction takes that unit before the
    buyer's reservation. The buyer's conditional update waits on the row, finds it full, and fails over."""
    _require_postgresql()
    listing = _listing(aws_account, capacity=1)
    rival_order = _place(
        acme, alice, aws_account.offers.exclude(pk=listing.pk).filter(gpu_count=1)[0], allow_failover=True
    )
    rival = Attempt.objects.create(
        order=rival_order,
        number=100,
        offer=listing,
        client_token=f"{rival_order.ref}-rival",
        started_at=rival_order.created_at,
    )
    holding = threading.Event()

    def take_and_hold() -> None:
        try:
            with transaction.atomic():
                assert reservation_take(attempt=rival)
                holding.set()
                time.sleep(1.0)  # the buyer ranks meanwhile (the unit is still free to it) and then waits on the row
        finally:
            connection.close()

    rival_thread = threading.Thread(target=take_and_hold)
    rival_thread.start()
    assert holding.wait(10)
    aws_sandbox.clear_calls()
    buyer = _place(acme, alice, listing, allow_failover=True)
    rival_thread.join()

    boot_if_launched(buyer, aws_sandbox)
    assert buyer.state == OrderState.RUNNING, buyer.state_reason
    failed, launched = list(buyer.attempts.order_by("number"))
    assert (failed.offer_id, failed.error_class, failed.provider_code) == (listing.pk, "capacity", "listing.sold_out")
    assert failed.reserved == 0
    assert launched.offer_id != listing.pk and launched.outcome == "launched"
    # One launch: the sold-out listing was refused by the broker, not by a call to the cloud.
    assert len(aws_sandbox.calls("RunInstances")) == 1
    listing.refresh_from_db()
    assert listing.reserved == 1
    assert ledger_verify().ok


@pytestmark_db
def test_a_full_listing_is_passed_over_for_the_next_offer(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    listing = _listing(aws_account, capacity=1)
    with django_capture_on_commit_callbacks(execute=True):
        first = _place(acme, alice, listing, allow_failover=True)
    boot_if_launched(first, aws_sandbox)
    aws_sandbox.clear_calls()
    with django_capture_on_commit_callbacks(execute=True):
        second = _place(acme, alice, listing, allow_failover=True)
    boot_if_launched(second, aws_sandbox)
    assert first.state == second.state == OrderState.RUNNING
    assert first.offer_id == listing.pk
    (attempt,) = second.attempts.all()
    assert attempt.offer_id != listing.pk and attempt.outcome == "launched"
    assert len(aws_sandbox.calls("RunInstances")) == 1


@pytestmark_db
def test_ranking_leaves_out_a_listing_with_no_units_left(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    from django.utils import timezone

    listing = _listing(aws_account, capacity=1)
    with django_capture_on_commit_callbacks(execute=True):
        _place(acme, alice, listing, allow_failover=False)
    now = timezone.now()
    demand = Demand(gpu_models=frozenset({"T4"}), pricing_models=frozenset({"on_demand"}))
    ranking = rank(demand, offer_book(now=now), now=now, limit=500)
    assert listing.pk not in {q.offer.offer_id for q in ranking.quotes}
    assert ranking.rejected["capacity"] >= 1


@pytestmark_db
def test_units_come_back_when_an_attempt_fails_or_the_machine_is_lost(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, settings
):
    settings.BLOCK_CAPACITY_S = 0  # the refused zone is asked again at once
    listing = _listing(aws_account, capacity=1)
    # The provider refuses the launch: the attempt's unit is released as it fails.
    aws_sandbox.faults.inject("capacity", instance_type=listing.instance_type, zone=listing.zone, times=1)
    with django_capture_on_commit_callbacks(execute=True):
        refused = _place(acme, alice, listing, allow_failover=False)
    refused.refresh_from_db()
    assert refused.state == OrderState.FAILED
    listing.refresh_from_db()
    assert listing.reserved == 0

    with django_capture_on_commit_callbacks(execute=True):
        order = _place(acme, alice, listing, allow_failover=False)
    boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    listing.refresh_from_db()
    assert listing.reserved == 1
    # The machine disappears at the provider (host loss): the order fails and the unit is free again.
    adapter_for_account(aws_account).terminate(order.instance.region, order.instance.provider_instance_id)
    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task.apply().get()
    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    listing.refresh_from_db()
    assert listing.reserved == 0
    assert ledger_verify().ok


@pytestmark_db
def test_release_is_idempotent_and_the_schema_refuses_overselling(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    listing = _listing(aws_account, capacity=2)
    with django_capture_on_commit_callbacks(execute=True):
        order = _place(acme, alice, listing, allow_failover=False)
    attempt = order.attempts.get()
    assert attempt.reserved == 1
    assert reservation_release(attempt_id=attempt.pk) == 1
    assert reservation_release(attempt_id=attempt.pk) == 0  # a redelivered release gives nothing back twice
    listing.refresh_from_db()
    assert listing.reserved == 0

    with pytest.raises(IntegrityError), transaction.atomic():
        Offer.objects.filter(pk=listing.pk).update(reserved=3)
