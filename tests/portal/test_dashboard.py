"""The provider dashboard (issue 19): GPUs rented and idle by hour, revenue by day as the payout statements
count it, the leases with the GPU indexes they hold, the interruptible leases against the minimum bid, and
nothing of another provider's."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from decimal import Decimal

import pytest
from django.utils import timezone

from ledger.models import LedgerEntry
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.machines import machine_decide
from marketplace.models import (
    Attempt,
    GpuHold,
    GpuModel,
    Instance,
    InvoiceLine,
    Offer,
    Order,
    OrderState,
    Organization,
)
from marketplace.orders.payouts import payout_statement
from marketplace.portal.dashboard import (
    gpu_days,
    provider_gpu_hours,
    provider_leases,
    provider_machine_bids,
    provider_revenue_by_day,
)
from marketplace.portal.services import machine_listing_create
from providers.models import Machine, MachineState
from tests.hosts import LISTING
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 12, 4, 15, 30, tzinfo=dt.UTC)  # a Friday; the 14 days reach back into November
UNTIL = NOW.replace(minute=0)  # the start of the current hour, the last on the dashboard (so far)
_tokens = itertools.count()


def _machine(org: Organization, name: str, *, gpus: int, now: dt.datetime, **listing: object) -> Machine:
    machine = machine_listing_create(
        organization=org, name=name, listing={**LISTING, "gpu_count": gpus, "min_gpus_per_lease": 1, **listing}
    ).machine
    # Verified and listed ten days ago, so the whole week counts.
    Machine.objects.filter(pk=machine.pk).update(state=MachineState.VERIFIED, created_at=now - dt.timedelta(days=10))
    machine.refresh_from_db()
    return machine


def _offer(machine: Machine, *, gpus: int, pricing: str = "on_demand") -> Offer:
    per_gpu = machine.min_bid_per_gpu_hour if pricing == "spot" else machine.price_per_gpu_hour
    price = per_gpu * gpus
    offer, _ = Offer.objects.get_or_create(
        account=machine.account, region=machine.region, zone=machine.name, instance_type=f"{gpus}x{machine.gpu_model}",
        pricing_model=pricing,
        defaults=dict(
            gpu_model=GpuModel.objects.get(key=machine.gpu_model), gpu_count=gpus, gpu_memory_gb=80, vcpus=12,
            memory_gib=128, price=price, currency="USD", price_usd=price, price_per_gpu_usd=float(per_gpu),
            usd_per_tflop_hour=0.01, capacity=machine.gpu_count // gpus,
            first_seen_at=machine.created_at, last_seen_at=machine.created_at,
        ),
    )  # fmt: skip
    return offer


def _lease(buyer, user, offer: Offer, *, start: dt.datetime, end: dt.datetime | None, holds: list[int] = ()) -> Order:
    """An order that ran on the offer from ``start`` to ``end`` (None: still running), holding GPU ``holds``
    while it runs, with its invoice line when it ended."""
    n = next(_tokens)
    order = Order.objects.create(
        organization=buyer, created_by=user, offer=offer, gpu_model=offer.gpu_model, gpu_count=offer.gpu_count,
        pricing_model=offer.pricing_model, max_price_per_hour=offer.price_usd, price_per_hour=offer.price_usd,
        state=OrderState.RUNNING if end is None else OrderState.TERMINATED, state_changed_at=end or start,
    )  # fmt: skip
    attempt = Attempt.objects.create(order=order, number=1, offer=offer, client_token=f"dash-{n}", started_at=start)
    Instance.objects.create(
        order=order, active=end is None, attempt=attempt, account=offer.account, provider_instance_id=f"i-{n}",
        region=offer.region, zone=offer.zone, instance_type=offer.instance_type, state="running",
        launched_at=start, running_at=start, terminated_at=end,
    )  # fmt: skip
    machine = Machine.objects.get(account=offer.account, name=offer.zone)
    GpuHold.objects.bulk_create(GpuHold(machine=machine, gpu_index=i, attempt=attempt) for i in holds)
    if end is not None:
        seconds = int((end - start).total_seconds())
        InvoiceLine.objects.create(
            organization=buyer, order=order, description=f"{offer.gpu_count}x {offer.gpu_model.key}",
            seconds=seconds, price_per_hour=offer.price_usd, amount_usd=offer.price_usd * seconds / 3600, ended_at=end,
        )  # fmt: skip
    return order


def build_business(petra_org: Organization, q_org: Organization, acme: Organization, alice, now: dt.datetime) -> dict:
    """Petra: an 8-GPU machine always for sale and a 4-GPU one for sale 09:00-12:00 UTC, with leases over the
    last days. Quentin: a machine of the same name, fully rented all week, and a big order ended today."""
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    big = _machine(petra_org, "fra-a", gpus=8, now=now, min_bid_per_gpu_hour=Decimal("0.9500"))
    small = _machine(
        petra_org, "fra-b", gpus=4, now=now, min_bid_per_gpu_hour=Decimal("0.8000"),
        availability=[{"weekdays": list(range(7)), "start": "09:00", "end": "12:00"}],
    )  # fmt: skip
    pair, quad = _offer(big, gpus=2), _offer(big, gpus=4)
    spot = _offer(small, gpus=2, pricing="spot")
    hour = dt.timedelta(hours=1)
    until = now.replace(minute=0, second=0, microsecond=0)
    ended = _lease(acme, alice, pair, start=until - 3 * hour, end=until - 1.5 * hour)  # 12:00-13:30
    running = _lease(acme, alice, quad, start=until - 0.75 * hour, end=None, holds=[2, 3, 4, 5])  # since 14:15
    spot_hour = _lease(acme, alice, spot, start=until - 5 * hour, end=until - 4 * hour)  # 10:00-11:00
    # A spot lease started in the current hour: on the leases' list and in the current hour so far.
    bidding = _lease(acme, alice, spot, start=now - dt.timedelta(minutes=20), end=None, holds=[0, 1])
    yesterday = _lease(acme, alice, pair, start=until - 26 * hour, end=until - 24 * hour)
    november = _lease(acme, alice, quad, start=until - dt.timedelta(days=9, hours=2),
                      end=until - dt.timedelta(days=9))  # fmt: skip
    too_old = _lease(acme, alice, pair, start=until - dt.timedelta(days=15, hours=1),
                     end=until - dt.timedelta(days=15))  # fmt: skip

    q_machine = _machine(q_org, "fra-a", gpus=8, now=now, min_bid_per_gpu_hour=Decimal("0.5000"))
    q_offer = _offer(q_machine, gpus=8)
    q_busy = _lease(acme, alice, q_offer, start=now - dt.timedelta(days=9), end=None, holds=list(range(8)))
    q_ended = _lease(acme, alice, _offer(q_machine, gpus=4), start=until - 4 * hour, end=until - 2 * hour)
    return {
        "provider": petra_org.provider, "ended": ended, "spot_hour": spot_hour, "running": running, "bidding": bidding,
        "yesterday": yesterday, "november": november, "too_old": too_old, "q_busy": q_busy, "q_ended": q_ended,
    }  # fmt: skip


@pytest.fixture
def business(petra_org, quentin, acme, alice):
    return build_business(petra_org, Organization.objects.get(name="Q Compute"), acme, alice, NOW)


def test_gpus_rented_and_idle_are_counted_per_hour_from_each_run_and_its_gpu_count(business):
    day = provider_gpu_hours(provider=business["provider"], now=NOW, hours=24)

    # 23 whole hours, then the current one so far (15:00-15:30), so what runs now shows at once.
    assert len(day) == 24 and day[0].start == UNTIL - dt.timedelta(hours=23) and day[-1].start == UNTIL
    assert [hour.current for hour in day] == [False] * 23 + [True]
    by_hour = {hour.start.hour: (hour.listed, hour.rented, hour.idle) for hour in day}
    assert by_hour[9] == (Decimal("12.0"), Decimal("0.0"), Decimal("12.0"))  # the 4-GPU machine's window opens
    assert by_hour[10] == (Decimal("12.0"), Decimal("2.0"), Decimal("10.0"))  # 2 spot GPUs for the hour
    assert by_hour[11] == (Decimal("12.0"), Decimal("0.0"), Decimal("12.0"))
    assert by_hour[12] == (Decimal("8.0"), Decimal("2.0"), Decimal("6.0"))  # window closed; 2 GPUs all hour
    assert by_hour[13] == (Decimal("8.0"), Decimal("1.0"), Decimal("7.0"))  # 2 GPUs for half of it
    assert by_hour[14] == (Decimal("8.0"), Decimal("3.0"), Decimal("5.0"))  # 4 GPUs for 45 minutes
    # The half hour so far: 4 GPUs all of it, 2 spot GPUs since 15:10.
    assert by_hour[15] == (Decimal("8.0"), Decimal("5.3"), Decimal("2.7"))
    assert (day[-1].listed_gpu_hours, day[-1].rented_gpu_hours.quantize(Decimal("0.001"))) == (
        Decimal("4"), Decimal("2.667"),
    )  # fmt: skip
    # Yesterday 13:00-15:00 two GPUs ran; every other hour of the day only the always-open machine is listed.
    quiet = {h: v for h, v in by_hour.items() if h not in (9, 10, 11, 12, 13, 14, 15)}
    assert quiet == {h: (Decimal("8.0"), Decimal("0.0"), Decimal("8.0")) for h in quiet}
    # Quentin's machine of the same name, rented whole all week, counts for nothing here.


def test_the_week_sums_to_gpu_hours_per_day(business):
    week = provider_gpu_hours(provider=business["provider"], now=NOW, hours=7 * 24)

    days = gpu_days(week)
    assert [d.day for d in days] == [dt.date(2026, 11, 27) + dt.timedelta(days=i) for i in range(8)]
    # 00:00-15:30: 15.5 hours of 8 GPUs, 3 of 4 more; 2 + 2 + 1 + 3 rented, then 2 + 2/3 so far this hour
    today = days[-1]
    assert (today.listed_gpu_hours, today.rented_gpu_hours, today.idle_gpu_hours) == (
        Decimal("136.0"), Decimal("10.7"), Decimal("125.3"),
    )  # fmt: skip
    yesterday = days[-2]  # 24 hours of 8 GPUs, 3 of 4; yesterday's lease ran 13:00-15:00 on 2 GPUs
    assert (yesterday.listed_gpu_hours, yesterday.rented_gpu_hours) == (Decimal("204.0"), Decimal("4.0"))
    assert yesterday.rented_pct == Decimal("2.0")


def test_revenue_by_day_is_the_payout_statements_lines_summed(business):
    provider = business["provider"]

    revenue = provider_revenue_by_day(provider=provider, today=NOW.date(), days=14)

    assert [r.day for r in revenue] == [NOW.date() - dt.timedelta(days=i) for i in range(14)]
    assert {r.currency for r in revenue} == {"USD"}
    lines = (
        payout_statement(provider=provider, month="2026-12").lines
        + payout_statement(provider=provider, month="2026-11").lines
    )
    for r in revenue:
        that_day = [line for line in lines if line.ended_at.date() == r.day]
        assert (r.orders, r.gross, r.commission, r.net) == (
            len(that_day),
            sum((line.gross_usd for line in that_day), Decimal(0)),
            sum((line.commission_usd for line in that_day), Decimal(0)),
            sum((line.net_usd for line in that_day), Decimal(0)),
        )
    by_day = {r.day: r for r in revenue}
    # 1.5 h of 2 GPUs at 1.90 and 1 h of 2 spot GPUs at 0.80; Quentin's order ended today too, and is not Petra's.
    assert by_day[NOW.date()].orders == 2 and by_day[NOW.date()].gross == Decimal("7.30")
    assert by_day[dt.date(2026, 11, 25)].gross == Decimal("15.20")  # November's statement reaches the window
    assert dt.date(2026, 11, 19) not in by_day  # older than 14 days
    assert sum(r.net for r in revenue) + sum(r.commission for r in revenue) == sum(r.gross for r in revenue)


def test_leases_show_the_gpu_indexes_they_hold_and_spot_ones_face_the_minimum_bid(business):
    leases = provider_leases(provider=business["provider"])

    assert [(lease.order_id, lease.machine, lease.gpu_indexes) for lease in leases] == [
        (str(business["bidding"].public_id), "fra-b", (0, 1)),
        (str(business["running"].public_id), "fra-a", (2, 3, 4, 5)),
    ]
    assert leases[1].price_per_hour == Decimal("7.600000") and leases[1].price_per_gpu_hour == Decimal("1.9000")
    bids = provider_machine_bids(provider=business["provider"], leases=leases)
    assert [(b.machine, b.min_bid_per_gpu_hour, [lease.short_id for lease in b.leases]) for b in bids] == [
        ("fra-a", Decimal("0.9500"), []),
        ("fra-b", Decimal("0.8000"), [str(business["bidding"].public_id)[:8]]),
    ]
    assert bids[1].leases[0].price_per_gpu_hour == Decimal("0.8000")


def test_the_page_shows_the_business_and_nothing_of_another_provider(business, petra, quentin, alice):
    page = client_for(petra).get("/provider/dashboard")

    assert page.status_code == 200
    html = page.content.decode()
    running = str(business["running"].public_id)[:8]
    assert f'data-order="{running}"' in html and "GPU 2, GPU 3, GPU 4, GPU 5" in html
    assert "Bidding opens with interruptible bids" in html and "0.8000 USD" in html
    assert str(business["q_busy"].public_id)[:8] not in html and str(business["q_ended"].public_id)[:8] not in html
    assert "0.5000" not in html  # Quentin's minimum bid
    assert "GPU 6, GPU 7" not in html  # Quentin's lease holds all eight
    assert 'href="/provider/dashboard"' in html  # the portal's nav links it
    # The rented/idle charts have a tooltip per hour with both figures
    assert re.search(r"<title>\d{4}-\d\d-\d\d \d\d:00 UTC: \d+ GPUs rented, \d+ idle</title>", html)
    # The leases still running (4 GPUs and 2 spot ones, since before this hour) show in the hour so far.
    current = re.search(r'<tr class="current"><td>[^<]+<span class="muted">\(so far\)</span></td>(.*?)</tr>', html)
    assert current and re.findall(r'<td class="num">([\d.]+)</td>', current.group(1))[1] == "6.0"
    # Quentin's own dashboard shows his lease and none of Petra's; a buyer has no dashboard.
    theirs = client_for(quentin).get("/provider/dashboard").content.decode()
    assert str(business["q_busy"].public_id)[:8] in theirs and running not in theirs
    assert client_for(alice).get("/provider/dashboard").status_code == 404


def test_listed_hours_follow_the_ledgered_state_changes_not_todays_state(petra_org, alice):
    """A machine verified just now was not for sale before; one suspended just now was. The ledger's state
    changes (``machine.verified``, ``machine.suspended``) say when, since the ledger cannot be backdated."""
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    fresh = _machine(petra_org, "fra-new", gpus=8, now=timezone.now())
    Machine.objects.filter(pk=fresh.pk).update(state=MachineState.PENDING, self_test_ok=True)
    retired = _machine(petra_org, "fra-old", gpus=4, now=timezone.now())
    machine_decide(machine=Machine.objects.get(pk=fresh.pk), state=MachineState.VERIFIED, by=alice, reason="checked")
    machine_decide(machine=retired, state=MachineState.SUSPENDED, by=alice, reason="the owner sold it")
    decided = LedgerEntry.objects.filter(kind__startswith="machine.").latest("sequence").created_at

    day = provider_gpu_hours(provider=petra_org.provider, now=decided + dt.timedelta(hours=3), hours=24)

    before = [h.listed for h in day if h.start + dt.timedelta(hours=1) <= decided]
    after = [h.listed for h in day if h.start >= decided]
    assert len(before) >= 20 and set(before) == {Decimal("4.0")}  # only the machine since suspended
    assert len(after) >= 2 and set(after) == {Decimal("8.0")}  # only the machine verified now
