"""A seller's price falls in the market (issue 39): the offer sync prices a machine's leftover fragment and its
idle hours by the rule stored on the machine, and an order keeps the price it was placed at."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.services import ledger_verify
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.services import offers_sync
from marketplace.models import GpuModel, Instance, InvoiceLine, Offer, Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.community.pricing import PriceFallRule, PriceRuleError, price_fall_rule_read
from providers.community.services import MachineInvalid, machine_price_fall_set
from providers.models import Machine
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db
D = Decimal
# Eight H100s at 1.90 a GPU-hour, rented two at a time or more, with a bid floor for interruptible leases.
DIVISIBLE = {**LISTING, "min_gpus_per_lease": 2, "min_bid_per_gpu_hour": D("1.4000")}
FRAGMENT = PriceFallRule(fragment_discount_pct=D(20), floor_pct=D(50))
IDLE = PriceFallRule(idle_after_hours=2, idle_step_pct=D(10), floor_pct=D(50))


@pytest.fixture
def host(fleet):
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)  # a transactional test before this one flushed the seeded rows
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=DIVISIBLE)
    yield agents
    stop_hosts(agents)


def _machine() -> Machine:
    return Machine.objects.get(name="fra-h100-1")


def _prices(fleet, pricing: str = "on_demand") -> dict[int, Decimal]:
    rows = Offer.objects.filter(account=fleet, status="available", pricing_model=pricing)
    return dict(rows.values_list("gpu_count", "price"))


def _place(acme, alice, offer: Offer) -> Order:
    return order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd),
    ).order


def test_a_fragment_left_by_a_lease_sells_at_the_lower_price(
    fleet, host, acme, alice, django_capture_on_commit_callbacks
):
    machine_price_fall_set(machine=_machine(), rule=FRAGMENT)
    assert offers_sync(account_id=fleet.pk).ok
    # Whole and just listed: the list price, and the interruptible offers at the minimum bid.
    assert _prices(fleet) == {2: D("3.8000"), 4: D("7.6000"), 8: D("15.2000")}
    assert _prices(fleet, "spot") == {2: D("2.8000"), 4: D("5.6000"), 8: D("11.2000")}

    with django_capture_on_commit_callbacks(execute=True):
        pair = _place(acme, alice, Offer.objects.get(account=fleet, gpu_count=2, pricing_model="on_demand"))
    assert boot_if_launched(pair, host).state == OrderState.RUNNING
    assert offers_sync(account_id=fleet.pk).ok

    # Six GPUs left: a fragment, 20 % off 1.90 is 1.52 a GPU-hour. The minimum bid stays, an auction's floor.
    assert _prices(fleet) == {2: D("3.0400"), 4: D("6.0800"), 8: D("12.1600")}
    assert _prices(fleet, "spot") == {2: D("2.8000"), 4: D("5.6000"), 8: D("11.2000")}
    assert pair.price_per_hour == D("3.8")  # placed before the fall: its price does not move


def test_a_machine_without_a_rule_keeps_its_list_price_with_a_lease_on_it(
    fleet, host, acme, alice, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        pair = _place(acme, alice, Offer.objects.get(account=fleet, gpu_count=2, pricing_model="on_demand"))
    boot_if_launched(pair, host)
    assert offers_sync(account_id=fleet.pk).ok
    assert _prices(fleet) == {2: D("3.8000"), 4: D("7.6000"), 8: D("15.2000")}


def test_an_idle_machine_steps_down_hour_by_hour_to_its_floor(fleet, host):
    machine = machine_price_fall_set(machine=_machine(), rule=IDLE)
    listed = machine.created_at
    seen = {}
    for hours in (2.5, 3, 4, 5, 30):
        assert offers_sync(account_id=fleet.pk, now=listed + dt.timedelta(hours=hours)).ok
        seen[hours] = _prices(fleet)[8]
    # Listed at 1.90: two hours' grace, then 10 % of the list price an hour, never below half.
    assert seen == {2.5: D("15.2000"), 3: D("13.6800"), 4: D("12.1600"), 5: D("10.6400"), 30: D("7.6000")}
    # Once the on-demand price (7.60 for eight) has fallen below the minimum bid (11.20), nobody would bid:
    # the interruptible offers are withdrawn until the price rises again.
    assert _prices(fleet, "spot") == {}
    assert Offer.objects.filter(account=fleet, pricing_model="spot", status="unavailable").count() == 3


def test_the_idle_clock_starts_again_when_the_last_lease_ends(
    fleet, host, acme, alice, django_capture_on_commit_callbacks
):
    machine = machine_price_fall_set(machine=_machine(), rule=IDLE)
    Machine.objects.filter(pk=machine.pk).update(created_at=timezone.now() - dt.timedelta(days=3))
    assert offers_sync(account_id=fleet.pk).ok
    assert _prices(fleet)[8] == D("7.6000")  # three days idle: at its floor

    with django_capture_on_commit_callbacks(execute=True):
        whole = _place(acme, alice, Offer.objects.get(account=fleet, gpu_count=8, pricing_model="on_demand"))
    assert boot_if_launched(whole, host).state == OrderState.RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=whole)
    ended = Instance.objects.get(order=whole).terminated_at
    assert ended is not None

    assert offers_sync(account_id=fleet.pk, now=ended + dt.timedelta(hours=1)).ok
    assert _prices(fleet)[8] == D("15.2000")  # an hour since the lease ended: inside the two hours' grace
    assert offers_sync(account_id=fleet.pk, now=ended + dt.timedelta(hours=3)).ok
    assert _prices(fleet)[8] == D("13.6800")


def test_an_order_placed_at_the_fallen_price_is_billed_at_it(
    fleet, host, acme, alice, django_capture_on_commit_callbacks
):
    machine_price_fall_set(machine=_machine(), rule=FRAGMENT)
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        first = _place(acme, alice, Offer.objects.get(account=fleet, gpu_count=4, pricing_model="on_demand"))
    boot_if_launched(first, host)
    assert offers_sync(account_id=fleet.pk).ok
    fragment = Offer.objects.get(account=fleet, gpu_count=2, pricing_model="on_demand")
    assert fragment.price_usd == D("3.04")

    with django_capture_on_commit_callbacks(execute=True):
        second = _place(acme, alice, fragment)
    assert boot_if_launched(second, host).state == OrderState.RUNNING
    assert second.price_per_hour == D("3.04")
    # The first lease ends: the machine is no longer cut by it, but the second is the last fragment's
    # buyer and its price is its own.
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=first)
    assert offers_sync(account_id=fleet.pk).ok
    assert Offer.objects.get(pk=fragment.pk).price_usd == D("3.04")  # six of eight still free: a fragment

    Instance.objects.filter(order=second).update(ready_at=timezone.now() - dt.timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=second)
    assert offers_sync(account_id=fleet.pk).ok
    assert Offer.objects.get(pk=fragment.pk).price_usd == D("3.8")  # whole again: the list price

    second.refresh_from_db()
    line = InvoiceLine.objects.get(order=second)
    assert (second.price_per_hour, line.price_per_hour) == (D("3.04"), D("3.04"))
    assert 7200 <= line.seconds <= 7260
    assert line.amount_usd == (D("3.04") * line.seconds / 3600).quantize(D("0.000001"))
    assert ledger_verify().ok


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"fragment_discount_pct": "101"}, "fragment_discount_pct"),
        ({"fragment_discount_pct": "lots"}, "fragment_discount_pct"),
        ({"idle_step_pct": "-5"}, "idle_step_pct"),
        ({"floor_pct": "NaN"}, "floor_pct"),
        ({"idle_after_hours": "2.5"}, "idle_after_hours"),
        ({"idle_after_hours": 10_000}, "idle_after_hours"),
        ({"idle_after_hours": True}, "idle_after_hours"),
    ],
)
def test_a_rule_out_of_range_is_refused_naming_the_field(values, field):
    with pytest.raises(PriceRuleError, match=field) as refused:
        price_fall_rule_read(values)
    assert refused.value.field == field


def test_the_service_refuses_what_the_columns_cannot_hold_and_stores_nothing(fleet, host):
    machine = _machine()
    for rule, named in (
        (PriceFallRule(fragment_discount_pct=D("12.345"), floor_pct=D(50)), "fragment_discount_pct"),
        (PriceFallRule(fragment_discount_pct=D(20)), "floor_pct"),  # a floor of 100 % lets nothing fall
    ):
        with pytest.raises(MachineInvalid, match=f"^{named}: "):
            machine_price_fall_set(machine=machine, rule=rule)
    stored = Machine.objects.get(pk=machine.pk)
    assert stored.price_fall == PriceFallRule()


def test_a_quote_at_the_fallen_price_is_ordered_at_it_after_the_price_moved(
    fleet, host, acme, alice, django_capture_on_commit_callbacks
):
    machine = machine_price_fall_set(machine=_machine(), rule=IDLE)
    Machine.objects.filter(pk=machine.pk).update(created_at=timezone.now() - dt.timedelta(hours=3, minutes=30))
    assert offers_sync(account_id=fleet.pk).ok
    api = APIClient()
    api.force_authenticate(alice)
    demand = {"profile": "training", "gpu_count": 8, "gpu_models": ["H100-SXM5"], "pricing_models": ["on_demand"]}
    quotes = api.post("/api/v1/quotes", demand, format="json").json()["quotes"]
    assert [(q["offer"]["instance_type"], q["price_per_hour"]) for q in quotes] == [
        ("community-8xH100-SXM5", "13.680000")
    ]
    assert offers_sync(account_id=fleet.pk, now=timezone.now() + dt.timedelta(hours=30)).ok
    assert _prices(fleet)[8] == D("7.6000")  # the machine fell further after the quote

    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/orders", {"quote": quotes[0]["id"]}, format="json")

    assert placed.status_code == 201, placed.json()
    assert placed.json()["price_per_hour"] == "13.680000"
    assert Order.objects.get(public_id=placed.json()["id"]).price_per_hour == D("13.68")
