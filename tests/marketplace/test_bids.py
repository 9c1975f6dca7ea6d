"""Interruptible rentals with bids (issue 19): a bid at or above the machine's minimum; a higher bid or an
on-demand order outbids the lowest bid after a notice, ledgered and announced, and the outbid order moves to
another machine (with failover) or fails (without); an equal or lower bid outbids nobody; the storefront shows
the winning bid.

Driven on real simulated host agents (``tests.hosts``); the notice runs out by setting ``preempt_at`` back,
never by sleeping."""

from __future__ import annotations

import datetime as dt
import json
import socket
from decimal import Decimal

import pytest
from django.conf import settings
from django.utils import timezone
from kombu import Exchange, Queue
from rest_framework.test import APIClient

from broker.celery import app as celery_app
from broker.queues import PROVISIONING_QUEUE
from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.query import offers_search
from marketplace.catalog.services import offers_sync
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    GpuHold,
    GpuModel,
    Offer,
    OfferStatus,
    Order,
    OrderState,
    WebhookDelivery,
    WebhookEventType,
)
from marketplace.orders.blocks import SOLD_OUT, provider_blocks
from marketplace.orders.errors import BidRefused
from marketplace.orders.launching import Step, order_provision
from marketplace.orders.losses import order_preempt
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.tasks import order_preempt_task, orders_sweep_task
from marketplace.webhooks.services import webhook_endpoint_create
from providers.models import Machine
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched
from tests.races import race_behind_row_lock, require_postgresql
from tests.test_worker import queues_purge

pytestmark = pytest.mark.django_db

# Two eight-GPU machines rented four GPUs at a time or whole: 1.90 a GPU-hour on demand, bids from 0.90.
BIDDABLE = {**LISTING, "min_gpus_per_lease": 4, "min_bid_per_gpu_hour": Decimal("0.9000")}


@pytest.fixture
def hosts(fleet):
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)  # a transactional test before this one flushed the seeded rows
    agents = start_hosts(fleet, ["fra-h100-1", "fra-h100-2"], lease_threads=False, listing=BIDDABLE)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


@pytest.fixture
def hook(acme, alice):
    """A webhook endpoint of Acme's (on a closed port: deliveries are recorded, none arrives)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return webhook_endpoint_create(organization=acme, user=alice, url=f"http://127.0.0.1:{port}/hook")


def _offer(zone: str, gpus: int, pricing: str) -> Offer:
    return Offer.objects.get(zone=zone, gpu_count=gpus, pricing_model=pricing)


def _place(acme, alice, hosts, capture, *, gpus: int = 8, pricing: str = "spot", bid: str | None = None,
           allow_failover: bool = False, zone: str = "fra-h100-1") -> Order:  # fmt: skip
    """Place and provision an order on ``zone``, booting its machine if it launched; the order, refreshed."""
    with capture(execute=True):
        order = Order.objects.get(
            pk=_placed(acme, alice, gpus=gpus, pricing=pricing, bid=bid, zone=zone, allow_failover=allow_failover)
        )
    with capture(execute=True):
        return boot_if_launched(order, hosts)


def _held(order: Order) -> list[tuple[str, int]]:
    rows = GpuHold.objects.filter(attempt__order=order).values_list("machine__name", "gpu_index")
    return sorted(rows)


def _entries(order: Order, kind: str) -> list[dict]:
    rows = LedgerEntry.objects.filter(kind=kind, subject=f"order:{order.public_id}").order_by("id")
    return [json.loads(e.payload) for e in rows]


def _notice_over(order: Order) -> None:
    Order.objects.filter(pk=order.pk).update(preempt_at=timezone.now() - dt.timedelta(seconds=1))


def _sweep(capture) -> None:
    with capture(execute=True):
        orders_sweep_task.apply().get()


def test_a_bid_below_the_machines_minimum_is_refused_naming_the_minimum(acme, alice, hosts):
    with pytest.raises(BidRefused, match=r"0\.85 USD per GPU-hour is below machine fra-h100-1's minimum of 0\.9000"):
        order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=_offer("fra-h100-1", 8, "spot").pk, bid_per_gpu_hour=Decimal("0.85")
            ),
        )

    assert not Order.objects.exists()
    assert not LedgerEntry.objects.filter(kind="order.placed").exists()


def test_the_api_answers_a_bid_below_the_minimum_with_a_400_naming_it(alice, hosts):
    api = APIClient()
    api.force_authenticate(alice)
    body = {"offer": _offer("fra-h100-1", 4, "spot").pk, "bid_per_gpu_hour": "0.5"}

    response = api.post("/api/v1/orders", data=json.dumps(body), content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bid_below_minimum"
    assert "minimum of 0.9000 USD per GPU-hour" in response.json()["error"]["message"]
    assert not Order.objects.exists()


def test_a_bid_pays_its_bid_and_no_bid_pays_the_minimum(acme, alice, hosts, django_capture_on_commit_callbacks):
    bidder = _place(acme, alice, hosts, django_capture_on_commit_callbacks, gpus=4, bid="1.25")
    plain = _place(acme, alice, hosts, django_capture_on_commit_callbacks, gpus=4)

    assert (bidder.state, plain.state) == (OrderState.RUNNING, OrderState.RUNNING)
    assert (bidder.bid_per_gpu_hour, bidder.price_per_hour) == (Decimal("1.2500"), Decimal("5.000000"))
    assert (plain.bid_per_gpu_hour, plain.price_per_hour) == (Decimal("0.9000"), Decimal("3.600000"))


@pytest.mark.parametrize("allow_failover", [True, False])
def test_a_higher_bid_outbids_the_lowest_after_the_notice(
    acme, alice, hosts, hook, allow_failover, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    low = _place(acme, alice, hosts, capture, bid="1.00", allow_failover=allow_failover)
    assert low.state == OrderState.RUNNING, low.state_reason
    first = low.instances.get()
    before = timezone.now()

    high = _place(acme, alice, hosts, capture, bid="1.20")

    # The notice: the higher bid holds the GPUs at once but waits to launch; the lower one still runs.
    low.refresh_from_db()
    assert high.state == OrderState.PROVISIONING and not high.instances.exists()
    assert _held(high) == [("fra-h100-1", i) for i in range(8)] and _held(low) == []
    assert low.state == OrderState.RUNNING and low.preempted_for == high.attempts.get()
    notice = dt.timedelta(seconds=settings.PREEMPTION_NOTICE_S)
    assert before + notice <= low.preempt_at <= timezone.now() + notice
    assert _entries(low, "order.preemption_notice") == [
        {
            "order": str(low.public_id),
            "by_order": str(high.public_id),
            "preempt_at": low.preempt_at.isoformat(),
            "outbid_by": "a higher bid",
            "bid_per_gpu_hour": "1.0000",
        }
    ]
    told = WebhookDelivery.objects.get(event_type=WebhookEventType.ORDER_PREEMPTION_NOTICE)
    assert (told.payload["order"], told.payload["preempt_at"]) == (str(low.public_id), low.preempt_at.isoformat())

    # A sweep within the notice changes nothing.
    _sweep(capture)
    low.refresh_from_db()
    assert low.state == OrderState.RUNNING and low.instances.get().active

    _notice_over(low)
    _sweep(capture)
    low, high = boot_if_launched(low, hosts), boot_if_launched(high, hosts)

    first.refresh_from_db()
    assert (first.active, first.state) == (False, "terminated")
    assert high.state == OrderState.RUNNING, high.state_reason
    assert high.instance.zone == "fra-h100-1" and high.price_per_hour == Decimal("9.600000")
    lost = _entries(low, "order.instance_lost")
    assert [(e["instance"], e["code"], e["outbid_by"], e["spot"]) for e in lost] == [
        (first.provider_instance_id, "outbid", "a higher bid", True)
    ]
    assert WebhookDelivery.objects.filter(event_type=WebhookEventType.INSTANCE_LOST).count() == 1
    assert low.preempt_at is None
    if allow_failover:
        assert low.state == OrderState.RUNNING, low.state_reason
        assert low.instance.zone == "fra-h100-2" and _held(low) == [("fra-h100-2", i) for i in range(8)]
        assert low.price_per_hour == Decimal("8.000000")
    else:
        assert low.state == OrderState.FAILED
        assert low.state_reason == (
            f"outbid by a higher bid for its GPUs on fra-h100-1; instance {first.provider_instance_id} stopped; "
            "failover was not allowed, so no other machine was tried"
        )
        assert _held(low) == []
    assert ledger_verify().ok


def test_an_on_demand_order_outbids_a_bid(acme, alice, hosts, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    bidder = _place(acme, alice, hosts, capture, bid="1.80")
    assert bidder.state == OrderState.RUNNING

    on_demand = _place(acme, alice, hosts, capture, pricing="on_demand")
    bidder.refresh_from_db()
    assert bidder.preempt_at is not None and on_demand.state == OrderState.PROVISIONING
    assert [e["outbid_by"] for e in _entries(bidder, "order.preemption_notice")] == ["an on-demand order"]

    _notice_over(bidder)
    _sweep(capture)
    bidder, on_demand = boot_if_launched(bidder, hosts), boot_if_launched(on_demand, hosts)

    assert on_demand.state == OrderState.RUNNING and on_demand.instance.zone == "fra-h100-1"
    assert bidder.state == OrderState.FAILED
    assert bidder.state_reason.startswith("outbid by an on-demand order for its GPUs on fra-h100-1")


@pytest.mark.parametrize("bid", ["1.00", "0.95"])
def test_an_equal_or_lower_bid_outbids_nobody(acme, alice, hosts, bid, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    running = _place(acme, alice, hosts, capture, bid="1.00")

    later = _place(acme, alice, hosts, capture, bid=bid)

    running.refresh_from_db()
    assert later.state == OrderState.FAILED and later.attempts.count() == 0
    assert running.state == OrderState.RUNNING and running.preempt_at is None
    assert _held(running) == [("fra-h100-1", i) for i in range(8)] and _held(later) == []
    assert not LedgerEntry.objects.filter(kind="order.preemption_notice").exists()


def test_only_the_lowest_bid_is_outbid_when_its_lease_frees_enough(
    acme, alice, hosts, client, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    page = f"/offers/{_offer('fra-h100-1', 4, 'spot').pk}/prices"
    assert "no bids running; minimum 0.9000 USD per GPU-hour" in client.get(page).content.decode()
    lowest = _place(acme, alice, hosts, capture, gpus=4, bid="1.00")
    # The offer table says it too, on the machine's interruptible offers still on sale (and no other's).
    table = client.get("/", {"q": "provider=community pricing=spot"}).content.decode()
    rows = [row for row in table.split("<tr>") if "winning-bid" in row]
    assert rows and all("fra-h100-1" in row for row in rows)
    assert all('<span class="small winning-bid">winning bid 1.0000 USD/GPU-h</span>' in row for row in rows)
    higher = _place(acme, alice, hosts, capture, gpus=4, bid="1.10")
    assert "winning bid 1.1000 USD per GPU-hour" in client.get(page).content.decode()

    newcomer = _place(acme, alice, hosts, capture, gpus=4, bid="1.05")

    lowest.refresh_from_db()
    higher.refresh_from_db()
    assert lowest.preempt_at is not None and higher.preempt_at is None
    assert _held(newcomer) == [("fra-h100-1", i) for i in range(4)]
    assert _held(higher) == [("fra-h100-1", i) for i in range(4, 8)]
    _notice_over(lowest)
    _sweep(capture)
    newcomer, lowest, higher = (boot_if_launched(o, hosts) for o in (newcomer, lowest, higher))
    assert (newcomer.state, higher.state, lowest.state) == (OrderState.RUNNING,) * 2 + (OrderState.FAILED,)
    assert "winning bid 1.1000 USD per GPU-hour" in client.get(page).content.decode()


def test_a_buyer_bids_from_the_storefront_order_form(alice, hosts, django_capture_on_commit_callbacks):
    import re

    from django.test import Client

    from marketplace.models import SshKey

    browser = Client()
    browser.force_login(alice)
    offer = _offer("fra-h100-1", 4, "spot")
    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    # The form says what a bid is up against before the buyer types one.
    assert 'id="bid"' in page and "minimum 0.9000 USD per GPU-hour; no bids running" in page
    nonce = re.search(r'name="nonce" value="([^"]+)"', page).group(1)
    key = SshKey.objects.get(name="alice@laptop")
    form = {"offer": offer.pk, "nonce": nonce, "duration_hours": "1", "ssh_keys": [str(key.public_id)],
            "workload_kind": "none", "access": "mine", "bid_per_gpu_hour": "1.25"}  # fmt: skip

    configured = browser.post("/orders/new", form)
    assert configured.status_code == 302, configured.content.decode()[:500]
    confirm = browser.get(configured["Location"]).content.decode()
    assert '<span id="confirm-bid">your bid 1.25 USD per GPU-hour</span>' in confirm
    with django_capture_on_commit_callbacks(execute=True):
        browser.post("/orders/place", {"nonce": nonce})

    order = Order.objects.get()
    assert order.bid_per_gpu_hour == Decimal("1.25") and order.price_per_hour == Decimal("5.00")
    # An on-demand offer's form has no bid.
    on_demand = _offer("fra-h100-1", 4, "on_demand")
    assert 'id="bid"' not in browser.get(f"/orders/new?offer={on_demand.pk}").content.decode()


def test_a_whole_machine_leased_to_a_bid_stays_on_sale_to_be_outbid(
    acme, alice, fleet, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    whole = {**LISTING, "min_bid_per_gpu_hour": Decimal("0.9000")}  # no minimum per lease: sold whole
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=whole)
    try:
        assert offers_sync(account_id=fleet.pk).ok
        bidder = _place(acme, alice, agents, capture, bid="1.00")
        assert bidder.state == OrderState.RUNNING

        # Its agent now reports no GPU free; the machine stays listed, the broker's holds say it is taken.
        assert offers_sync(account_id=fleet.pk).ok
        listed = _offer("fra-h100-1", 8, "on_demand")
        assert listed.status == OfferStatus.AVAILABLE and listed.capacity - listed.reserved == 0

        on_demand = _place(acme, alice, agents, capture, pricing="on_demand")
        bidder.refresh_from_db()
        assert bidder.preempt_at is not None and on_demand.state == OrderState.PROVISIONING
    finally:
        stop_hosts(agents)


def test_a_machine_held_only_by_bids_stays_in_search_with_its_bid_held_gpus_shown(
    acme, alice, fleet, client, django_capture_on_commit_callbacks
):
    # Sold whole: one bid takes all eight GPUs, so every unit of every offer of the machine is reserved.
    capture = django_capture_on_commit_callbacks
    whole = {**LISTING, "min_bid_per_gpu_hour": Decimal("0.9000")}
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=whole)
    try:
        assert offers_sync(account_id=fleet.pk).ok
        bidder = _place(acme, alice, agents, capture, bid="1.00")
        assert bidder.state == OrderState.RUNNING
        listed = _offer("fra-h100-1", 8, "on_demand")
        assert listed.capacity - listed.reserved == 0

        # An on-demand order outranks every bid (marketplace/orders/bids.py), so search still finds it ...
        found = offers_search("provider=community", now=timezone.now())
        assert sorted((o.pricing_model, o.gpu_count) for o in found) == [("on_demand", 8), ("spot", 8)]
        # ... and the free-GPU filter, which counts GPUs nobody holds, does not.
        assert offers_search("provider=community free>=1", now=timezone.now()) == []

        # The row says no GPU is free and all eight are held by a bid that can be outbid.
        client.force_login(alice)
        page = client.get("/", {"q": "provider=community pricing=on_demand"})
        (row,) = page.context["rows"].groups
        facts = page.context["facts"][row.lead.pk]
        assert (facts.free_gpus, facts.total_gpus, facts.bid_gpus) == (0, 8, 8)
        assert "8 on bids" in page.content.decode()
        # Its Order button opens the order form, not "no longer for sale".
        assert client.get("/orders/new", {"offer": listed.pk}).status_code == 200
    finally:
        stop_hosts(agents)


# --- No clock block on an exact count (issue 39) -------------------------------------------------------------------


def _placed(acme, alice, *, gpus: int, pricing: str, bid: str | None = None, zone: str = "fra-h100-1",
            allow_failover: bool = False) -> int:  # fmt: skip
    """Place an order (its provisioning runs as it commits, in this thread); its id."""
    return order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(
            launch=LAUNCH,
            offer_id=_offer(zone, gpus, pricing).pk,
            bid_per_gpu_hour=None if bid is None else Decimal(bid),
            allow_failover=allow_failover,
        ),
    ).order.pk


@pytest.mark.django_db(transaction=True)
def test_an_on_demand_order_outbids_lower_bids_after_their_own_sold_out_refusals(acme, alice, hosts):
    """Issue 39: bids racing for a machine's last GPUs were refused sold out, and those refusals blocked the
    lease size shared with the on-demand offer for 10 minutes: the on-demand order was refused while lower
    bids kept their GPUs."""
    require_postgresql()
    first = Order.objects.get(pk=_placed(acme, alice, gpus=4, pricing="spot", bid="1.00"))
    first = boot_if_launched(first, hosts)
    assert first.state == OrderState.RUNNING and _held(first) == [("fra-h100-1", i) for i in range(4)]
    machine = Machine.objects.get(name="fra-h100-1")

    # Given two equal bids racing for the last four GPUs, both past the ranking before either reserves
    placed, errors = race_behind_row_lock(
        machine, [lambda: _placed(acme, alice, gpus=4, pricing="spot", bid="1.00")] * 2
    )

    assert errors == []
    racers = [boot_if_launched(o, hosts) for o in Order.objects.filter(pk__in=placed).order_by("pk")]
    assert sorted(o.state for o in racers) == [OrderState.FAILED, OrderState.RUNNING]
    (second,) = (o for o in racers if o.state == OrderState.RUNNING)
    refused = Attempt.objects.get(order__in=placed, outcome=AttemptOutcome.FAILED)
    assert (refused.error_class, refused.provider_code, refused.offer.instance_type) == (
        "capacity", SOLD_OUT, _offer("fra-h100-1", 4, "on_demand").instance_type,
    )  # fmt: skip
    assert provider_blocks(now=timezone.now()).zone_types == frozenset()

    # When an on-demand order asks for four GPUs of the full machine
    on_demand = Order.objects.get(pk=_placed(acme, alice, gpus=4, pricing="on_demand"))

    # Then it outbids the lowest, oldest bid, which gets its notice; the other bid keeps its GPUs
    first.refresh_from_db()
    second.refresh_from_db()
    assert on_demand.state == OrderState.PROVISIONING, on_demand.state_reason
    assert first.preempt_at is not None and first.preempted_for.order_id == on_demand.pk
    assert second.preempt_at is None and _held(second) == [("fra-h100-1", i) for i in range(4, 8)]
    assert _held(on_demand) == [("fra-h100-1", i) for i in range(4)]
    assert [e["outbid_by"] for e in _entries(first, "order.preemption_notice")] == ["an on-demand order"]

    # And at the notice's end it runs there
    _notice_over(first)
    assert orders_sweep_task.apply().result >= 1
    on_demand, first = boot_if_launched(on_demand, hosts), boot_if_launched(first, hosts)
    assert on_demand.state == OrderState.RUNNING and on_demand.instance.zone == "fra-h100-1"
    assert first.state == OrderState.FAILED
    # No GPU was ever held twice, and the machine runs one lease per four GPUs
    assert sorted(_held(on_demand) + _held(second)) == [("fra-h100-1", i) for i in range(8)]
    live = [instance for instance in hosts[0].instances.values() if instance.holds_gpus()]
    assert sorted(i for instance in live for i in instance.gpu_indexes) == list(range(8))
    assert ledger_verify().ok


def test_failover_outbids_lower_bids_when_no_free_gpus_fit(acme, alice, hosts, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    # Given one machine leased whole on demand and the other held whole by a bid
    taken = _place(acme, alice, hosts, capture, pricing="on_demand", zone="fra-h100-2")
    bidder = _place(acme, alice, hosts, capture, bid="1.00", zone="fra-h100-1")
    assert (taken.state, bidder.state) == (OrderState.RUNNING, OrderState.RUNNING)

    # When an on-demand order with failover picks the machine leased on demand, which it cannot outbid
    on_demand = _place(acme, alice, hosts, capture, pricing="on_demand", zone="fra-h100-2", allow_failover=True)

    # Then it fails over to the machine held by the bid, which gets its notice
    bidder.refresh_from_db()
    assert on_demand.state == OrderState.PROVISIONING, on_demand.state_reason
    assert [a.offer.zone for a in on_demand.attempts.all()] == ["fra-h100-1"]
    assert bidder.preempt_at is not None and _held(on_demand) == [("fra-h100-1", i) for i in range(8)]
    assert _held(taken) == [("fra-h100-2", i) for i in range(8)]


def test_failover_takes_free_gpus_before_outbidding_anyone(acme, alice, hosts, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    taken = _place(acme, alice, hosts, capture, gpus=4, pricing="on_demand", zone="fra-h100-2")
    taken_too = _place(acme, alice, hosts, capture, gpus=4, pricing="on_demand", zone="fra-h100-2")
    bidder = _place(acme, alice, hosts, capture, gpus=4, bid="1.00", zone="fra-h100-1")
    assert {taken.state, taken_too.state, bidder.state} == {OrderState.RUNNING}

    on_demand = _place(acme, alice, hosts, capture, gpus=4, pricing="on_demand", zone="fra-h100-2", allow_failover=True)

    bidder.refresh_from_db()
    assert on_demand.state == OrderState.RUNNING, on_demand.state_reason
    assert _held(on_demand) == [("fra-h100-1", i) for i in range(4, 8)] and bidder.preempt_at is None


# --- Preemption at the notice's end (issue 39) ---------------------------------------------------------------------


def _outbid(acme, alice, hosts, capture) -> tuple[Order, Order]:
    """A bid of 1.00 running on all of fra-h100-1, and a bid of 1.20 placed for it (not provisioned yet)."""
    low = _place(acme, alice, hosts, capture, bid="1.00")
    assert low.state == OrderState.RUNNING
    with capture(execute=False):
        high = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=_offer("fra-h100-1", 8, "spot").pk, bid_per_gpu_hour=Decimal("1.20")
            ),
        ).order
    return low, high


def test_the_notice_books_the_preemption_for_its_end_on_the_provisioning_queue(
    acme, alice, hosts, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    low, high = _outbid(acme, alice, hosts, capture)
    # What a worker would receive: the message itself, off the broker
    celery_app.conf.task_always_eager = False
    queues_purge()
    try:
        with capture(execute=True):
            assert order_provision(order_id=high.pk) == Step.WAIT
        with celery_app.connection_for_read() as conn:
            queue = Queue(
                PROVISIONING_QUEUE, Exchange(PROVISIONING_QUEUE, type="direct"), routing_key=PROVISIONING_QUEUE
            )
            messages = []
            while (message := queue(conn.default_channel).get(no_ack=True)) is not None:
                messages.append(message)
    finally:
        queues_purge()

    low.refresh_from_db()
    assert low.preempt_at is not None and low.preempted_for.order_id == high.pk
    booked = [(m.headers["task"], json.loads(m.body)[0], m.headers["eta"]) for m in messages]
    assert [(task, args) for task, args, _ in booked] == [("marketplace.order_preempt", [low.pk])]
    assert dt.datetime.fromisoformat(booked[0][2]) == low.preempt_at


def test_the_preemption_runs_at_the_notices_end_not_before_and_once(
    acme, alice, hosts, hook, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    low, high = _outbid(acme, alice, hosts, capture)
    with capture(execute=True):  # the booked task runs at once here (eager): early, it does nothing
        assert order_provision(order_id=high.pk) == Step.WAIT
    low.refresh_from_db()
    first = low.instances.get()
    end = low.preempt_at

    # Before the end: nothing, by the service or the task
    assert order_preempt(order_id=low.pk, now=end - dt.timedelta(microseconds=1)) == (Step.DONE, None)
    with capture(execute=True):
        assert order_preempt_task.apply((low.pk,)).result == Step.DONE.value
    low.refresh_from_db()
    first.refresh_from_db()
    high.refresh_from_db()
    assert low.state == OrderState.RUNNING and first.active and low.preempt_at == end
    assert not LedgerEntry.objects.filter(kind="order.instance_lost").exists()
    assert high.state == OrderState.PROVISIONING and not high.instances.exists()

    # At the end (brought forward to now, rather than waiting for it): the task takes the lease, and the order
    # that outbid it launches
    Order.objects.filter(pk=low.pk).update(preempt_at=timezone.now())
    low.refresh_from_db()
    with capture(execute=True):
        assert order_preempt_task.apply((low.pk,)).result == Step.DONE.value
    # A second run (the booked task delivered twice, or the sweep) does nothing
    with capture(execute=True):
        assert order_preempt_task.apply((low.pk,)).result == Step.DONE.value
        assert orders_sweep_task.apply().get() == 0
    ended_at = low.preempt_at
    low, high = boot_if_launched(low, hosts), boot_if_launched(high, hosts)

    first.refresh_from_db()
    assert (first.active, first.state) == (False, "terminated") and first.terminated_at >= ended_at
    assert low.state == OrderState.FAILED and low.state_reason.startswith("outbid by a higher bid")
    assert LedgerEntry.objects.filter(kind="order.instance_lost", subject=f"order:{low.public_id}").count() == 1
    assert WebhookDelivery.objects.filter(event_type=WebhookEventType.INSTANCE_LOST).count() == 1
    assert high.state == OrderState.RUNNING, high.state_reason
    assert _held(high) == [("fra-h100-1", i) for i in range(8)]
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_the_booked_task_and_the_sweep_at_once_preempt_the_order_once(acme, alice, hosts):
    require_postgresql()
    low = boot_if_launched(Order.objects.get(pk=_placed(acme, alice, gpus=8, pricing="spot", bid="1.00")), hosts)
    high = Order.objects.get(pk=_placed(acme, alice, gpus=8, pricing="spot", bid="1.20"))
    low.refresh_from_db()
    assert low.preempt_at is not None and high.state == OrderState.PROVISIONING
    end = low.preempt_at

    # Both runs, exactly at the notice's end, reach the order's row lock before either goes on
    results, errors = race_behind_row_lock(low, [lambda: order_preempt(order_id=low.pk, now=end)] * 2)

    assert errors == []
    assert sorted(results, key=str) == sorted([(Step.DONE, None), (Step.DONE, high.pk)], key=str)
    assert LedgerEntry.objects.filter(kind="order.instance_lost", subject=f"order:{low.public_id}").count() == 1
    low.refresh_from_db()
    assert low.state == OrderState.FAILED
