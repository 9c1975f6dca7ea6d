"""Procurements on live listings: a divisible independent machine's lease-size offers draw on one stock of
free GPUs, so a batch never plans more GPUs on the machine than it has free, and every quote it places can
be ordered (the GPU holds take each one), in turn and concurrently on PostgreSQL."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.selectors import machine_pool, offer_views
from marketplace.catalog.services import offers_sync
from marketplace.matching import Demand, Profile
from marketplace.models import GpuHold, GpuModel, Offer, Order, OrderState, Quote
from marketplace.orders.quoting import procurement_run
from marketplace.orders.services import PlaceRequest, order_place
from providers.types import GPU_FRACTION
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import LAUNCH
from tests.races import race

MACHINE = "fra-h100-1"
# Eight H100s rented two at a time or more: offers of 2, 4 and 8 GPUs.
DIVISIBLE = {**LISTING, "min_gpus_per_lease": 2}
# Every demand left out costs the same penalty (three times its dearest option, the whole machine, which
# costs a pair and a quad alike per unit of their work), so the optimum places the most demands: pairs.
LEFT_OUT = "its feasible offers' capacity went to demands of the batch that gain more"


@pytest.fixture
def divisible_host(fleet):
    if not GpuModel.objects.exists():
        # A transactional test before this one flushed the rows the data migration seeded.
        gpu_models_upsert(GpuModel)
    agents = start_hosts(fleet, [MACHINE], lease_threads=False, listing=DIVISIBLE)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


def _offer(fleet, gpus: int) -> Offer:
    return Offer.objects.get(account=fleet, zone=MACHINE, gpu_count=gpus, pricing_model="on_demand")


def _order(acme, alice, *, offer: Offer | None = None, quote: Quote | None = None) -> Order:
    request = PlaceRequest(
        launch=LAUNCH,
        offer_id=None if offer is None else offer.pk,
        max_price_per_hour=None if offer is None else offer.price_usd,
        quote_id=None if quote is None else str(quote.public_id),
        allow_failover=False,
    )
    return order_place(organization=acme, user=alice, request=request).order


def _reserved(fleet) -> dict[int, tuple[int | None, int]]:
    rows = Offer.objects.filter(account=fleet, zone=MACHINE).values_list("gpu_count", "capacity", "reserved")
    return {gpus: (capacity, reserved) for gpus, capacity, reserved in rows}


def _held(order: Order) -> int:
    return GpuHold.objects.filter(attempt__order=order).count()


@pytest.mark.django_db
def test_a_procurement_plans_at_most_the_free_gpus_of_a_machine_and_each_of_its_quotes_can_be_ordered(
    fleet, divisible_host, acme, alice, alice_bearer, django_capture_on_commit_callbacks
):
    # Given a pair already running on the machine: GPUs 0 and 1 held, six free
    with django_capture_on_commit_callbacks(execute=True):
        running = _order(acme, alice, offer=_offer(fleet, 2))
    assert _held(running) == 2
    assert _reserved(fleet) == {2: (4, 1), 4: (2, 1), 8: (1, 1)}
    # The engine sees the machine's three lease sizes as one pool of its six free GPUs.
    pooled = {(v.gpu_count, v.capacity, v.capacity_pool, v.pool_capacity) for v in offer_views(now=running.created_at)}
    assert pooled == {(gpus, left, machine_pool(fleet.pk, MACHINE), 6) for gpus, left in ((2, 3), (4, 1), (8, 0))}

    # When a buyer procures three pairs and two quads of H100 (14 GPUs) over the API
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=alice_bearer)
    demands = [
        {"id": f"{kind}{i}", "profile": "training", "gpu_count": gpus, "gpu_models": ["H100-SXM5"]}
        for i, (kind, gpus) in enumerate([("pair", 2)] * 3 + [("quad", 4)] * 2)
    ]
    response = client.post(
        "/api/v1/procurements", data=json.dumps({"demands": demands, "time_limit": 2}), content_type="application/json"
    )

    # Then the plan fills the six free GPUs with the three pairs and no more; the quads say why they wait
    assert response.status_code == 201, response.content
    body = response.json()
    quotes = list(Quote.objects.filter(batch=body["batch"]).select_related("offer").order_by("rank"))
    assert [(q.demand["demand_id"], q.offer_id) for q in quotes] == [
        ("pair0", _offer(fleet, 2).pk),
        ("pair1", _offer(fleet, 2).pk),
        ("pair2", _offer(fleet, 2).pk),
    ]
    assert [(a["demand"], a["reason"]) for a in body["assignments"] if a["quote"] is None] == [
        ("quad3", LEFT_OUT),
        ("quad4", LEFT_OUT),
    ]

    # And every planned quote, ordered, gets its GPUs: the machine ends exactly full, nothing refused
    orders = []
    for quote in quotes:
        with django_capture_on_commit_callbacks(execute=True):
            orders.append(_order(acme, alice, quote=quote))
    for order, quote in zip(orders, quotes, strict=True):
        order.refresh_from_db()
        assert (order.state, _held(order)) == (OrderState.PROVISIONING, quote.offer.gpu_count), order.state_reason
    assert GpuHold.objects.filter(machine__name=MACHINE).count() == 8
    assert _reserved(fleet) == {2: (4, 4), 4: (2, 2), 8: (1, 1)}
    assert len(divisible_host[0].instances) == 1 + len(quotes)


@pytest.mark.django_db(transaction=True)
def test_the_quotes_of_one_procurement_ordered_at_once_all_get_their_gpus(fleet, divisible_host, acme, alice):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    # Given an idle 8-GPU machine and a batch wanting 16 of its GPUs (four pairs and two quads)
    wanted = [
        Demand(demand_id=f"{kind}{i}", profile=Profile.TRAINING, gpu_count=gpus, gpu_models=frozenset({"H100-SXM5"}))
        for i, (kind, gpus) in enumerate([("pair", 2)] * 4 + [("quad", 4)] * 2)
    ]
    result = procurement_run(organization=acme, user=alice, demands=wanted, time_limit=2)
    quotes = list(Quote.objects.filter(batch=result.batch).select_related("offer"))
    # The plan: the four pairs, the whole machine; the quads wait.
    assert sorted((q.demand["demand_id"], q.offer.gpu_count) for q in quotes) == [(f"pair{i}", 2) for i in range(4)]
    # When every placed quote is ordered at the same moment (each committed at once; the eager task then
    # reserves and launches in its thread, racing the others)
    placed, errors = race([lambda q=q: _order(acme, alice, quote=q).pk for q in quotes])

    # Then each order holds its lease's GPUs: the plan fits the machine, so none is refused
    assert errors == []
    orders = list(Order.objects.filter(pk__in=placed).order_by("pk"))
    assert [o.state for o in orders] == [OrderState.PROVISIONING] * len(quotes), [o.state_reason for o in orders]
    assert sorted(GpuHold.objects.values_list("gpu_index", flat=True)) == list(range(8))
    assert sorted(_held(o) for o in orders) == sorted(q.offer.gpu_count for q in quotes)
    assert _reserved(fleet) == {2: (4, 4), 4: (2, 2), 8: (1, 1)}


@pytest.mark.django_db
def test_a_machines_whole_gpu_offers_share_one_pool_slices_keep_their_own_and_queries_stay_fixed(fleet):
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    # Given a divisible machine sold on demand and as spot: six offers of one machine
    biddable = {**DIVISIBLE, "min_bid_per_gpu_hour": Decimal("0.9000")}
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=biddable)
    try:
        assert offers_sync(account_id=fleet.pk).ok
        with CaptureQueriesContext(connection) as one_machine:
            views = offer_views(now=timezone.now())

        # Then the six share the machine's pool of its eight GPUs
        assert sorted((v.pricing_model, v.gpu_count, v.capacity_pool, v.pool_capacity) for v in views) == [
            (pricing, gpus, machine_pool(fleet.pk, "fra-h100-1"), 8)
            for pricing in ("on_demand", "spot")
            for gpus in (2, 4, 8)
        ]

        # And a second machine adds offers, not queries
        agents += start_hosts(fleet, ["fra-h100-2"], lease_threads=False, listing=biddable)
        assert offers_sync(account_id=fleet.pk).ok
        with CaptureQueriesContext(connection) as two_machines:
            views = offer_views(now=timezone.now())
        assert len(views) == 12
        assert len({v.capacity_pool for v in views}) == 2
        assert len(two_machines) == len(one_machine)

        # And a slice of a GPU (a MIG profile, a seventh of a card), as a listing with MIG profiles sells it,
        # keeps its own count of slices: a pool counts whole GPUs
        whole = Offer.objects.get(account=fleet, zone="fra-h100-1", gpu_count=2, pricing_model="on_demand")
        mig = Offer.objects.get(pk=whole.pk)
        mig.pk = None
        mig.instance_type, mig.gpu_count, mig.capacity, mig.reserved = "community-1xH100-SXM5-mig-1g.10gb", 1, 56, 0
        mig.extra = {**whole.extra, GPU_FRACTION: 1 / 7}
        mig.save()
        views = offer_views(now=timezone.now())
        sliced = next(v for v in views if v.offer_id == mig.pk)
        assert (sliced.capacity, sliced.capacity_pool, sliced.pool_capacity) == (56, None, None)
        assert {v.pool_capacity for v in views if v.offer_id != mig.pk} == {8}
        assert len(views) == 13
    finally:
        stop_hosts(agents)
