"""Independent machines sold per GPU (issue 19): listings say how they divide, offers come per lease size, and
reservations hold GPU indexes, so two orders never get the same GPU, under real concurrency on PostgreSQL."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.services import ledger_verify
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.selectors import offer_view
from marketplace.catalog.services import offers_sync
from marketplace.matching import Exclusion
from marketplace.models import Attempt, AttemptOutcome, GpuHold, GpuModel, Offer, Order, OrderState
from marketplace.orders.blocks import SOLD_OUT, provider_blocks
from marketplace.orders.reservations import reservation_release, reservation_take
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.portal.forms import MachineForm
from providers.community.services import MachineInvalid, machine_list
from providers.models import Machine
from providers.services import adapter_for_account
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched
from tests.races import race_behind_row_lock, race_same

# Eight H100s rented two at a time or more, at 1.90 a GPU-hour.
DIVISIBLE = {**LISTING, "min_gpus_per_lease": 2}


@pytest.fixture
def divisible_host(fleet):
    if not GpuModel.objects.exists():
        # A transactional test before this one flushed the rows the data migration seeded.
        gpu_models_upsert(GpuModel)
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=DIVISIBLE)
    yield agents
    stop_hosts(agents)


def _offer(fleet, gpus: int) -> Offer:
    return Offer.objects.get(account=fleet, zone="fra-h100-1", gpu_count=gpus, pricing_model="on_demand")


def _place(acme, alice, offer: Offer, *, allow_failover: bool = False) -> Order:
    return order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(
            launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd, allow_failover=allow_failover
        ),
    ).order


def _held(order: Order) -> list[int]:
    return sorted(GpuHold.objects.filter(attempt__order=order).values_list("gpu_index", flat=True))


def _reserved(fleet) -> dict[int, tuple[int | None, int]]:
    rows = Offer.objects.filter(account=fleet, pricing_model="on_demand").values_list(
        "gpu_count", "capacity", "reserved"
    )
    return {gpus: (capacity, reserved) for gpus, capacity, reserved in rows}


def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")


# --- The listing ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_machine_listed_without_a_minimum_is_sold_whole(fleet):
    machine = machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING)).machine

    machine.refresh_from_db()
    assert (machine.min_gpus_per_lease, machine.mig_profiles, machine.divisible) == (8, [], False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change, refusal",
    [
        ({"min_gpus_per_lease": 9}, "min_gpus_per_lease: from 1 to the machine's GPU count"),
        ({"mig_profiles": ["1g.5gb"]}, "mig_profiles: a H100-SXM5 offers 1g.10gb, 1g.20gb"),
        ({"gpu_model": "L4", "mig_profiles": ["1g.10gb"]}, "mig_profiles: a L4 is not partitioned with MIG"),
    ],
)
def test_a_listing_that_divides_beyond_its_gpus_or_names_unknown_mig_profiles_is_refused(fleet, change, refusal):
    with pytest.raises(MachineInvalid, match=refusal):
        machine_list(account=fleet, name="fra-h100-1", listing={**LISTING, **change})
    assert not fleet.machines.exists()


def test_the_portal_form_checks_the_minimum_per_lease_and_the_mig_profiles():
    fields = {
        **{k: str(v) for k, v in LISTING.items()},
        "name": "fra-h100-1",
        "gpu_count": "4",
        "min_gpus_per_lease": "8",
        "mig_profiles": "1g.10gb, 9g.1tb",
    }
    form = MachineForm(fields, gpu_models=[("H100-SXM5", 80)])
    assert not form.is_valid()
    assert form.errors["min_gpus_per_lease"] == ["at most the machine's 4 GPUs"]
    assert form.errors["mig_profiles"][0].endswith("not 9g.1tb")

    form = MachineForm(
        {**fields, "min_gpus_per_lease": "1", "mig_profiles": "1G.10gb,3g.40gb"}, gpu_models=[("H100-SXM5", 80)]
    )
    assert form.is_valid(), form.errors
    assert (form.listing()["min_gpus_per_lease"], form.listing()["mig_profiles"]) == (1, ["1g.10gb", "3g.40gb"])


# --- Offers -------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_divisible_machine_is_offered_once_per_lease_size(fleet, divisible_host):
    offers = adapter_for_account(fleet).list_offers()

    assert sorted((o.instance_type, o.gpu_count, o.price, o.capacity, o.vcpus, o.memory_gib) for o in offers) == [
        ("community-2xH100-SXM5", 2, Decimal("3.8000"), 4, 24, Decimal(256)),
        ("community-4xH100-SXM5", 4, Decimal("7.6000"), 2, 48, Decimal(512)),
        ("community-8xH100-SXM5", 8, Decimal("15.2000"), 1, 96, Decimal(1024)),
    ]


# --- Holds --------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_orders_hold_the_lowest_free_gpus_and_the_agent_is_told_which(
    fleet, divisible_host, acme, alice, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    pair = _offer(fleet, 2)
    with django_capture_on_commit_callbacks(execute=True):
        first = _place(acme, alice, pair)
    # A reservation whose launch has not reached the agent yet: GPUs 2 and 3 look free to the agent.
    pending = Attempt.objects.create(
        order=first, number=100, offer=pair, client_token=f"{first.ref}-pending", started_at=first.created_at
    )
    assert reservation_take(attempt=pending)

    with django_capture_on_commit_callbacks(execute=True):
        second = _place(acme, alice, pair)
    first, second = boot_if_launched(first, divisible_host), boot_if_launched(second, divisible_host)

    assert first.state == second.state == OrderState.RUNNING, (first.state_reason, second.state_reason)
    assert (_held(first), _held(second)) == ([0, 1, 2, 3], [4, 5])
    # Left to itself the agent would have given the second lease GPUs 2 and 3: it was told 4 and 5.
    assert sorted(i.gpu_indexes for i in divisible_host[0].instances.values()) == [(0, 1), (4, 5)]
    # Two GPUs left: one pair, no quad, no whole machine; ranking sees what is left.
    assert _reserved(fleet) == {2: (4, 3), 4: (2, 2), 8: (1, 1)}
    assert offer_view(Offer.objects.get(pk=pair.pk)).capacity == 1

    assert reservation_release(attempt_id=pending.pk) == 2
    assert _reserved(fleet) == {2: (4, 2), 4: (2, 1), 8: (1, 1)}
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=first)
    assert _held(first) == [] and _held(second) == [4, 5]
    assert _reserved(fleet) == {2: (4, 1), 4: (2, 1), 8: (1, 1)}
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=second)
    assert GpuHold.objects.count() == 0
    assert _reserved(fleet) == {2: (4, 0), 4: (2, 0), 8: (1, 0)}
    assert ledger_verify().ok


@pytest.mark.django_db
def test_an_order_the_free_gpus_cannot_fit_fails_over_without_calling_the_agent(
    fleet, divisible_host, acme, alice, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        quad = _place(acme, alice, _offer(fleet, 4))
    whole = _offer(fleet, 8)
    Offer.objects.filter(pk=whole.pk).update(reserved=0)  # a stale count: the holds still decide

    with django_capture_on_commit_callbacks(execute=True):
        refused = _place(acme, alice, whole)

    refused.refresh_from_db()
    assert refused.state == OrderState.FAILED
    attempt = refused.attempts.get()
    assert (attempt.error_class, attempt.provider_code, attempt.reserved) == ("capacity", "listing.sold_out", 0)
    assert _held(refused) == [] and _held(quad) == [0, 1, 2, 3]
    assert len(divisible_host[0].instances) == 1


# --- Concurrency (PostgreSQL) -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_eight_gpus_sold_in_pairs_take_exactly_four_concurrent_orders(fleet, divisible_host, acme, alice):
    _require_postgresql()
    assert offers_sync(account_id=fleet.pk).ok
    pair = _offer(fleet, 2)
    buyers = 6
    # Each committed at once; the eager task then provisions in its thread, racing the others.
    placed, errors = race_same(buyers, lambda: _place(acme, alice, pair).pk)

    assert errors == []
    orders = [boot_if_launched(o, divisible_host) for o in Order.objects.filter(pk__in=placed)]
    running = [o for o in orders if o.state == OrderState.RUNNING]
    assert len(running) == 4, [(o.state, o.state_reason) for o in orders]
    assert sorted(o.state for o in orders) == [OrderState.FAILED] * 2 + [OrderState.RUNNING] * 4
    assert sorted(index for o in running for index in _held(o)) == list(range(8))
    assert all(len(_held(o)) == 2 for o in running)
    assert sorted(i for instance in divisible_host[0].instances.values() for i in instance.gpu_indexes) == list(
        range(8)
    )
    assert _reserved(fleet) == {2: (4, 4), 4: (2, 2), 8: (1, 1)}


@pytest.mark.django_db(transaction=True)
def test_a_burst_that_sells_out_a_machine_blocks_nothing_once_its_gpus_are_free(fleet, divisible_host, acme, alice):
    """Issue 39: the broker's own sold-out refusals used to block the lease size for BROKER_BLOCK_CAPACITY_S, so
    the orders after the burst failed with GPUs idle. The count of free GPUs is exact: it alone decides."""
    _require_postgresql()
    assert offers_sync(account_id=fleet.pk).ok
    pair = _offer(fleet, 2)
    machine = Machine.objects.get(account=fleet, name="fra-h100-1")

    # Given six orders for pairs of eight GPUs, each past the ranking (four pairs free) before any reserves
    placed, errors = race_behind_row_lock(machine, [lambda: _place(acme, alice, pair).pk] * 6)

    assert errors == []
    orders = [boot_if_launched(o, divisible_host) for o in Order.objects.filter(pk__in=placed).order_by("pk")]
    running = [o for o in orders if o.state == OrderState.RUNNING]
    assert sorted(o.state for o in orders) == [OrderState.FAILED] * 2 + [OrderState.RUNNING] * 4
    refused = Attempt.objects.filter(order__in=placed, outcome=AttemptOutcome.FAILED)
    assert sorted(refused.values_list("error_class", "provider_code")) == [("capacity", SOLD_OUT)] * 2
    # No GPU sold twice, in the broker's holds or on the machine
    assert sorted(index for o in running for index in _held(o)) == list(range(8))
    assert sorted(i for instance in divisible_host[0].instances.values() for i in instance.gpu_indexes) == list(
        range(8)
    )
    # Then the refusals block nothing, for any order
    assert provider_blocks(now=timezone.now()) == Exclusion()

    # When two of the pairs are given back
    for order in running[:2]:
        order_terminate(order=order)
    assert _reserved(fleet)[2] == (4, 2)  # two pairs free (which quads that frees depends on who won which GPUs)

    # Then the next two orders run at once, each on its first try, on the GPUs freed
    after = [boot_if_launched(_place(acme, alice, pair), divisible_host) for _ in range(2)]
    assert [(o.state, list(o.attempts.values_list("outcome", flat=True))) for o in after] == [
        (OrderState.RUNNING, [AttemptOutcome.LAUNCHED])
    ] * 2, [o.state_reason for o in after]
    assert sorted(index for o in after + running[2:] for index in _held(o)) == list(range(8))
    assert ledger_verify().ok


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_reservation_waiting_on_the_machine_takes_other_gpus_than_the_one_holding_it(
    fleet, divisible_host, acme, alice
):
    """One transaction holds two GPUs and stays open; a second reservation waits on the machine's row, then
    takes the next two once the first commits, never the same ones."""
    _require_postgresql()
    assert offers_sync(account_id=fleet.pk).ok
    pair = _offer(fleet, 2)
    owner = _place(acme, alice, pair, allow_failover=False)  # holds GPUs 0 and 1
    first, second = (
        Attempt.objects.create(
            order=owner, number=100 + i, offer=pair, client_token=f"{owner.ref}-race{i}", started_at=owner.created_at
        )
        for i in range(2)
    )
    outcome: list[bool] = []
    errors: list[BaseException] = []

    def take_second() -> None:
        try:
            with transaction.atomic():
                outcome.append(reservation_take(attempt=second))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    rival = threading.Thread(target=take_second)
    with transaction.atomic():
        assert reservation_take(attempt=first)
        rival.start()
        while rival.is_alive() and not _waiting_on_a_lock():
            rival.join(timeout=0.01)
        taken_while_held = list(outcome)
    rival.join(timeout=30)

    assert taken_while_held == [] and errors == [] and outcome == [True]
    held = dict(GpuHold.objects.filter(attempt__in=[first, second]).values_list("gpu_index", "attempt_id"))
    assert held == {2: first.pk, 3: first.pk, 4: second.pk, 5: second.pk}
    assert reservation_release(attempt_id=first.pk) == 2
    assert reservation_release(attempt_id=first.pk) == 0
    left = GpuHold.objects.filter(machine__name="fra-h100-1").values_list("gpu_index", flat=True)
    assert sorted(left) == [0, 1, 4, 5]


# --- Migration ----------------------------------------------------------------------------------------------------


def test_machines_listed_before_per_gpu_sales_stay_sold_whole(migrate_to):
    old = migrate_to([("providers", "0003_machine_heartbeat_window")])
    provider = old.get_model("providers", "Provider").objects.create(name="Helga's GPU Farm")
    account = old.get_model("providers", "ProviderAccount").objects.create(
        provider=provider, kind="community", name="fleet", regions=["eu-de"]
    )
    listing = {k: v for k, v in LISTING.items() if k != "gpu_count"}
    Machine = old.get_model("providers", "Machine")
    for name, gpus in (("fra-h100-1", 8), ("fra-h100-2", 4)):
        Machine.objects.create(account=account, name=name, key_id=f"mk_{name}", secret_encrypted="x", gpu_count=gpus,
                               **listing)  # fmt: skip

    new = migrate_to([("providers", "0004_machine_per_gpu_listing")])

    machines = new.get_model("providers", "Machine").objects.order_by("name")
    assert [(m.name, m.min_gpus_per_lease, m.mig_profiles) for m in machines] == [
        ("fra-h100-1", 8, []),
        ("fra-h100-2", 4, []),
    ]


def test_a_lease_size_listed_while_gpus_are_held_starts_with_them_counted(
    fleet, divisible_host, acme, alice, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        placed = _place(acme, alice, _offer(fleet, 4))
    running = boot_if_launched(placed, divisible_host)
    assert running.state == OrderState.RUNNING and _held(running) == [0, 1, 2, 3], running.state_reason

    # The provider now rents single GPUs too: the next sync lists a 1-GPU offer for the first time.
    Machine.objects.filter(account=fleet, name="fra-h100-1").update(min_gpus_per_lease=1)
    assert offers_sync(account_id=fleet.pk).ok

    # Four GPUs are held, so four single GPUs are left, not eight.
    assert _reserved(fleet)[1] == (8, 4)
    assert offer_view(_offer(fleet, 1)).capacity == 4
