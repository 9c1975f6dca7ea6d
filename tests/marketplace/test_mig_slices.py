"""MIG slices sold on independent machines: each profile a listing offers is an offer of one slice of one GPU,
held as that slice (several per GPU, never overlapping, never on a GPU leased whole), launched on the host
agent as a MIG device the lease alone sees, and released with the order; under real concurrency on PostgreSQL
no GPU is ever over-filled.

NVIDIA's Multi-Instance GPU User Guide ("Supported MIG Profiles",
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): on an H100 80GB a
3g.40gb is 3 of 7 compute slices and 40 GB, and 2 fit on one GPU; a 1g.10gb is 1 of 7 and 10 GB, and 7 fit.
``nvidia-smi mig -lgipp``'s placements: a 3g starts at memory slice 0 or 4 (4 slices), a 1g at any of 0 to 6.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.services import ledger_verify
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.selectors import offer_view
from marketplace.catalog.services import offers_ingest, offers_sync
from marketplace.models import Attempt, GpuHold, GpuModel, GpuSlot, Offer, Order, OrderState, QuarantinedOffer
from marketplace.orders.reservations import reservation_release, reservation_take
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.community.mig import MIG_PROFILE, MIG_TABLES, mig_place
from providers.errors import ProviderRequestRejected
from providers.models import Machine
from providers.services import adapter_for_account
from providers.types import GPU_FRACTION, LaunchSpec, OfferQuote, PricingModel
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import LAUNCH, boot_if_launched
from tests.races import race

# Two H100s at 1.90 a GPU-hour, rented one or both whole, or as 1g.10gb and 3g.40gb slices.
SLICED = {**LISTING, "gpu_count": 2, "vcpus": 28, "memory_gib": 280, "min_gpus_per_lease": 1,
          "mig_profiles": ["1g.10gb", "3g.40gb"]}  # fmt: skip
SLICE_1G = "community-1xH100-SXM5-mig-1g.10gb"
SLICE_3G = "community-1xH100-SXM5-mig-3g.40gb"


@pytest.fixture
def sliced_host(fleet):
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)  # a transactional test before this one flushed what the migration seeded
    agents = start_hosts(fleet, ["fra-h100-s"], lease_threads=False, simulate="H100:80x2", listing=SLICED)
    yield agents
    stop_hosts(agents)


def _offer(fleet, instance_type: str) -> Offer:
    return Offer.objects.get(account=fleet, instance_type=instance_type, pricing_model="on_demand")


def _place(acme, alice, offer: Offer, *, allow_failover: bool = False) -> Order:
    return order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(
            launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd, allow_failover=allow_failover
        ),
    ).order


def _holds(order: Order) -> list[tuple[int, str, int, int, int]]:
    rows = GpuHold.objects.filter(attempt__order=order).order_by("gpu_index", "slot")
    return list(rows.values_list("gpu_index", "mig_profile", "slot", "memory_slices", "compute_slices"))


def _reserved(fleet) -> dict[str, tuple[int | None, int]]:
    rows = Offer.objects.filter(account=fleet, pricing_model="on_demand").values_list(
        "instance_type", "capacity", "reserved"
    )
    return {instance_type: (capacity, reserved) for instance_type, capacity, reserved in rows}


def _seen(order: Order, agents) -> list[str]:
    """What the order's lease names in CUDA_VISIBLE_DEVICES on its host."""
    _, _, agent_id = order.instances.get(active=True).provider_instance_id.partition("/")
    return agents[0].instances[agent_id].executor.environment({}, {})["CUDA_VISIBLE_DEVICES"].split(",")


def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")


# --- Offers -------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_listed_profile_is_offered_as_its_share_of_one_gpu(fleet, sliced_host):
    offers = adapter_for_account(fleet).list_offers()

    sliced = sorted(
        (o.instance_type, o.pricing_model, o.gpu_count, o.gpu_memory_gb, o.extra[GPU_FRACTION], o.price, o.capacity,
         o.vcpus, o.memory_gib, o.extra[MIG_PROFILE])
        for o in offers if MIG_PROFILE in o.extra
    )  # fmt: skip
    # 1.90 x 1/7 = 0.27142..., 1.90 x 3/7 = 0.81428...; 7 and 2 per GPU; the host's 28 CPUs and 280 GiB by share.
    assert sliced == [
        (SLICE_1G, PricingModel.ON_DEMAND, 1, 10, 1 / 7, Decimal("0.2714"), 14, 2, Decimal(20), "1g.10gb"),
        (SLICE_3G, PricingModel.ON_DEMAND, 1, 40, 3 / 7, Decimal("0.8143"), 4, 6, Decimal(60), "3g.40gb"),
    ]
    whole = sorted((o.instance_type, o.capacity) for o in offers if MIG_PROFILE not in o.extra)
    assert whole == [("community-1xH100-SXM5", 2), ("community-2xH100-SXM5", 1)]

    assert offers_sync(account_id=fleet.pk).ok
    three = _offer(fleet, SLICE_3G)
    # Ingestion keeps the share: the catalogue shows it as a fraction, ranks it per whole card.
    assert (three.gpu_fraction, three.gpu_share, three.cards, three.gpu_memory_gb) == (Fraction(3, 7), "3/7",
                                                                                       Fraction(3, 7), 40)  # fmt: skip
    assert three.price_per_gpu_usd == pytest.approx(0.8143 * 7 / 3)
    assert offer_view(three).gpu_fraction == pytest.approx(3 / 7)
    assert not QuarantinedOffer.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change, reason",
    [
        ({"extra": {GPU_FRACTION: 3 / 7, MIG_PROFILE: "9g.1tb"}}, "MIG profile '9g.1tb' is not one a H100-SXM5 offers"),
        ({"gpu_memory_gb": 17}, "MIG 3g.40gb has 40 GB, not 17"),
        ({"extra": {GPU_FRACTION: 0.5, MIG_PROFILE: "3g.40gb"}}, "MIG 3g.40gb is 3/7 of a GPU, not a fraction of 0.5"),
        ({"gpu_count": 2}, "MIG slice of 2 GPUs: a 3g.40gb is one slice of one GPU"),
    ],
)
def test_a_slice_row_that_does_not_match_its_profile_is_quarantined_with_the_reason(fleet, change, reason):
    fields = {"region": "eu-de", "zone": "fra-h100-s", "instance_type": SLICE_3G, "gpu_model": "H100-SXM5",
              "pricing_model": PricingModel.ON_DEMAND, "gpu_count": 1, "gpu_memory_gb": 40, "vcpus": 6,
              "memory_gib": Decimal(60), "price": Decimal("0.8143"), "currency": "USD", "capacity": 4,
              "extra": {GPU_FRACTION: 3 / 7, MIG_PROFILE: "3g.40gb"}}  # fmt: skip

    report = offers_ingest(account=fleet, quotes=[OfferQuote(**{**fields, **change})], now=timezone.now())

    assert (report.upserted, report.quarantined) == (0, 1)
    assert list(QuarantinedOffer.objects.values_list("reason", flat=True)) == [reason]
    assert not Offer.objects.filter(account=fleet).exists()


# --- Holds and launches -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_slice_order_runs_on_a_mig_device_its_lease_alone_sees_and_a_second_packs_beside_it(
    fleet, sliced_host, acme, alice, client, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        three = _place(acme, alice, _offer(fleet, SLICE_3G))
    with django_capture_on_commit_callbacks(execute=True):
        one = _place(acme, alice, _offer(fleet, SLICE_1G))
    three, one = boot_if_launched(three, sliced_host), boot_if_launched(one, sliced_host)

    assert three.state == one.state == OrderState.RUNNING, (three.state_reason, one.state_reason)
    # The 1g packs onto GPU 0 beside the 3g (memory slices 0-3), at the lowest free placement: slice 4.
    assert (_holds(three), _holds(one)) == ([(0, "3g.40gb", 0, 4, 3)], [(0, "1g.10gb", 4, 1, 1)])
    assert sorted(GpuSlot.objects.values_list("gpu_index", "slot")) == [(0, s) for s in range(5)]
    host = sliced_host[0]
    devices = host.devices.mig_instances()[0]
    assert sorted(i.mig_profile for i in host.instances.values()) == ["1g.10gb", "3g.40gb"]
    assert sorted((_seen(three, sliced_host), _seen(one, sliced_host))) == sorted([[d] for d in devices])
    assert _seen(three, sliced_host) != _seen(one, sliced_host)
    assert three.instance.instance_type == SLICE_3G
    # The buyer's order page says what was rented: a share of one card, not a whole GPU.
    client.force_login(alice)
    assert "3/7 of one H100-SXM5" in client.get(f"/orders/{three.public_id}/").content.decode()
    # What is left: GPU 1 whole, or 2 more 3g (on GPU 1) or 9 more 1g (slices 5, 6 of GPU 0 and 7 on GPU 1).
    assert _reserved(fleet) == {
        "community-1xH100-SXM5": (2, 1),
        "community-2xH100-SXM5": (1, 1),
        SLICE_3G: (4, 2),
        SLICE_1G: (14, 5),
    }

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=three)
    assert _holds(three) == [] and _holds(one) == [(0, "1g.10gb", 4, 1, 1)]
    assert host.devices.mig_instances()[0] == _seen(one, sliced_host)  # the 3g's MIG device is destroyed
    assert _reserved(fleet)[SLICE_3G] == (4, 1)  # GPU 0 fits a 3g again, at slice 0
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=one)
    assert not GpuHold.objects.exists() and not GpuSlot.objects.exists()
    assert host.devices.mig_instances() == {}
    assert {reserved for _, reserved in _reserved(fleet).values()} == {0}
    assert ledger_verify().ok


@pytest.mark.django_db
def test_a_whole_gpu_order_never_gets_a_sliced_gpu(fleet, sliced_host, acme, alice, django_capture_on_commit_callbacks):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        one = _place(acme, alice, _offer(fleet, SLICE_1G))
    whole_machine = _offer(fleet, "community-2xH100-SXM5")
    Offer.objects.filter(pk=whole_machine.pk).update(reserved=0)  # a stale count: the holds still decide

    with django_capture_on_commit_callbacks(execute=True):
        refused = _place(acme, alice, whole_machine)
    with django_capture_on_commit_callbacks(execute=True):
        single = _place(acme, alice, _offer(fleet, "community-1xH100-SXM5"))

    refused.refresh_from_db()
    assert refused.state == OrderState.FAILED
    assert refused.attempts.get().provider_code == "listing.sold_out"
    single = boot_if_launched(single, sliced_host)
    assert single.state == OrderState.RUNNING
    assert (_holds(one), _holds(single)) == ([(0, "1g.10gb", 0, 1, 1)], [(1, "", 0, 8, 7)])
    assert _seen(single, sliced_host) == ["1"]
    # Nor does a slice go on a GPU leased whole: a 3g packs beside the 1g, and then has room nowhere.
    with django_capture_on_commit_callbacks(execute=True):
        packed = _place(acme, alice, _offer(fleet, SLICE_3G))
    packed = boot_if_launched(packed, sliced_host)
    assert packed.state == OrderState.RUNNING and _holds(packed) == [(0, "3g.40gb", 4, 4, 3)]
    with django_capture_on_commit_callbacks(execute=True):
        full = _place(acme, alice, _offer(fleet, SLICE_3G))
    full.refresh_from_db()
    assert full.state == OrderState.FAILED and _holds(full) == []


@pytest.mark.django_db
def test_a_slice_of_a_profile_the_machine_no_longer_lists_is_held_nowhere_and_never_launched(fleet, sliced_host):
    assert offers_sync(account_id=fleet.pk).ok
    three = _offer(fleet, SLICE_3G)
    Machine.objects.filter(account=fleet).update(gpu_model="A100-40GB-SXM4")  # a 3g.40gb no GPU of it has
    order = Order(offer=three)
    attempt = Attempt(order=order, offer=three)

    assert reservation_take(attempt=attempt) is False
    assert not GpuHold.objects.exists()

    adapter = adapter_for_account(fleet)
    spec = LaunchSpec(region="eu-de", zone="fra-h100-s", instance_type=SLICE_3G, pricing_model=PricingModel.ON_DEMAND,
                      client_token="t-1", order_ref="ord-1", offer_extra={MIG_PROFILE: "4g.40gb"},
                      gpu_indexes=(0,))  # fmt: skip
    with pytest.raises(ProviderRequestRejected, match=r"does not offer MIG profile '4g\.40gb'") as refused:
        adapter.launch(spec)
    assert refused.value.code == "mig_profile_unlisted"
    assert sliced_host[0].instances == {}


@pytest.mark.django_db
def test_the_database_refuses_overlapping_slices_and_a_whole_gpu_over_a_slice(
    fleet, sliced_host, acme, alice, django_capture_on_commit_callbacks
):
    assert offers_sync(account_id=fleet.pk).ok
    with django_capture_on_commit_callbacks(execute=True):
        order = _place(acme, alice, _offer(fleet, SLICE_3G))  # holds memory slices 0-3 of GPU 0
    machine = Machine.objects.get(account=fleet)
    attempt = order.attempts.get()

    def insert(**fields) -> None:
        with transaction.atomic():
            hold = GpuHold.objects.create(machine=machine, attempt=attempt, **fields)
            GpuSlot.objects.bulk_create(
                GpuSlot(hold=hold, machine=machine, gpu_index=hold.gpu_index, slot=s)
                for s in range(hold.slot, hold.slot + hold.memory_slices)
            )

    overlapping = {"gpu_index": 0, "mig_profile": "1g.10gb", "slot": 3, "memory_slices": 1, "compute_slices": 1}
    for fields in (overlapping, {"gpu_index": 0}):  # a 1g on slice 3; GPU 0 whole
        with pytest.raises(IntegrityError):
            insert(**fields)
    # An 8th compute slice: a 1g at memory slice 7, where none of NVIDIA's placements for it starts.
    with pytest.raises(IntegrityError):
        insert(gpu_index=1, mig_profile="1g.10gb", slot=7, memory_slices=1, compute_slices=1)
    assert _holds(order) == [(0, "3g.40gb", 0, 4, 3)]


# --- Concurrency (PostgreSQL) -------------------------------------------------------------------------------------


def _race(attempts: list[Attempt]) -> dict[int, bool]:
    """Every attempt's reservation at once, each in its own transaction and connection."""

    def take(attempt: Attempt) -> tuple[int, bool]:
        with transaction.atomic():
            return attempt.pk, reservation_take(attempt=attempt)

    taken, errors = race([lambda a=a: take(a) for a in attempts])
    assert errors == []
    return dict(taken)


def _attempts(order: Order, offers: list[Offer]) -> list[Attempt]:
    return [
        Attempt.objects.create(
            order=order, number=100 + n, offer=offer, client_token=f"{order.ref}-race{n}", started_at=order.created_at
        )
        for n, offer in enumerate(offers)
    ]


def _gpu_fill() -> dict[int, tuple[int, list[int]]]:
    """GPU index -> (compute slices held, memory slices held, sorted)."""
    fill: dict[int, tuple[int, list[int]]] = {}
    for index, slot, size, compute in GpuHold.objects.values_list("gpu_index", "slot", "memory_slices",
                                                                  "compute_slices"):  # fmt: skip
        held, slots = fill.get(index, (0, []))
        fill[index] = (held + compute, sorted([*slots, *range(slot, slot + size)]))
    return fill


@pytest.mark.django_db(transaction=True)
def test_concurrent_slice_orders_take_exactly_the_slices_two_gpus_hold(fleet, sliced_host, acme, alice):
    _require_postgresql()
    assert offers_sync(account_id=fleet.pk).ok
    three = _offer(fleet, SLICE_3G)
    owner = _place(acme, alice, three)  # one 3g held already (GPU 0, slices 0-3)

    outcome = _race(_attempts(owner, [three] * 5))

    assert sorted(outcome.values()) == [False] * 2 + [True] * 3
    assert _gpu_fill() == {0: (6, list(range(8))), 1: (6, list(range(8)))}
    assert GpuSlot.objects.count() == 16
    assert _reserved(fleet)[SLICE_3G] == (4, 4)
    assert {index: reserved for index, (_, reserved) in _reserved(fleet).items() if "mig" not in index} == {
        "community-1xH100-SXM5": 2,
        "community-2xH100-SXM5": 1,
    }


@pytest.mark.django_db(transaction=True)
def test_concurrent_mixed_slices_never_overfill_a_gpu_nor_share_a_memory_slice(fleet, sliced_host, acme, alice):
    _require_postgresql()
    assert offers_sync(account_id=fleet.pk).ok
    one, three = _offer(fleet, SLICE_1G), _offer(fleet, SLICE_3G)
    owner = _place(acme, alice, one)
    wanted = [one, three, one, one, three, one, three, one, one, three, one, one]

    outcome = _race(_attempts(owner, wanted))

    fill = _gpu_fill()
    assert all(compute <= 7 and len(slots) == len(set(slots)) <= 8 for compute, slots in fill.values()), fill
    taken = GpuSlot.objects.values_list("gpu_index", "slot")
    assert sorted(taken) == sorted((index, slot) for index, (_, slots) in fill.items() for slot in slots)
    # Nobody was refused while room was left for what they asked.
    profiles = MIG_TABLES["H100-SXM5"]
    occupancy = {index: set(slots) for index, (_, slots) in fill.items()}
    for attempt in Attempt.objects.filter(pk__in=[pk for pk, ok in outcome.items() if not ok]):
        assert mig_place(occupancy, profiles[attempt.offer.extra[MIG_PROFILE]], 2) is None
    held = GpuHold.objects.filter(attempt__in=[pk for pk, ok in outcome.items() if ok]).count()
    # 20 compute slices asked beside the 1 held, of the 14 two GPUs have: some were refused, each holds one.
    assert held == sum(outcome.values()) and not all(outcome.values())

    for pk in outcome:
        reservation_release(attempt_id=pk)
    assert _holds(owner) == [(0, "1g.10gb", 0, 1, 1)] and GpuSlot.objects.count() == 1


# --- Migration ----------------------------------------------------------------------------------------------------


def test_holds_made_before_slices_keep_their_gpus_whole(migrate_to):
    old = migrate_to([("marketplace", "0025_bids")])
    now = timezone.now()
    provider = old.get_model("providers", "Provider").objects.create(name="Helga's GPU Farm")
    account = old.get_model("providers", "ProviderAccount").objects.create(
        provider=provider, kind="community", name="fleet", regions=["eu-de"]
    )
    listing = {k: v for k, v in LISTING.items() if k != "gpu_count"}
    machine = old.get_model("providers", "Machine").objects.create(
        account=account, name="fra-h100-1", key_id="mk_fra", secret_encrypted="x", gpu_count=8, min_gpus_per_lease=2,
        **listing,
    )  # fmt: skip
    gpu = old.get_model("marketplace", "GpuModel").objects.get_or_create(
        key="H100-SXM5",
        defaults={"vendor": "NVIDIA", "name": "H100", "memory_gb": 80, "memory_bandwidth_gbs": 3350,
                  "fp16_dense_tflops": 989, "fp64_tflops": 34, "interconnect": "NVLink", "interconnect_gbs": 900},
    )[0]  # fmt: skip
    offer = old.get_model("marketplace", "Offer").objects.create(
        account=account, region="eu-de", zone="fra-h100-1", instance_type="community-2xH100-SXM5",
        pricing_model="on_demand", gpu_model=gpu, gpu_count=2, gpu_memory_gb=80, vcpus=24, memory_gib=256,
        price=Decimal("3.8"), currency="USD", price_usd=Decimal("3.8"), price_per_gpu_usd=1.9, usd_per_tflop_hour=0.002,
        capacity=4, reserved=1, first_seen_at=now, last_seen_at=now,
    )  # fmt: skip
    org = old.get_model("marketplace", "Organization").objects.create(name="Acme Research", kind="buyer")
    user = old.get_model("auth", "User").objects.create(username="alice")
    order = old.get_model("marketplace", "Order").objects.create(
        organization=org, created_by=user, offer=offer, gpu_model=gpu, gpu_count=2, pricing_model="on_demand",
        max_price_per_hour=Decimal("3.8"), price_per_hour=Decimal("3.8"), state="running", state_changed_at=now,
    )  # fmt: skip
    attempt = old.get_model("marketplace", "Attempt").objects.create(
        order=order, number=1, offer=offer, client_token="ord-1-a1", started_at=now, reserved=2
    )
    for index in (2, 3):
        old.get_model("marketplace", "GpuHold").objects.create(machine=machine, gpu_index=index, attempt=attempt)

    new = migrate_to([("marketplace", "0026_mig_slices")])

    holds = new.get_model("marketplace", "GpuHold").objects.order_by("gpu_index")
    assert [(h.gpu_index, h.mig_profile, h.slot, h.memory_slices, h.compute_slices) for h in holds] == [
        (2, "", 0, 8, 7),
        (3, "", 0, 8, 7),
    ]
    slots = new.get_model("marketplace", "GpuSlot").objects.values_list("gpu_index", "slot")
    assert sorted(slots) == [(index, slot) for index in (2, 3) for slot in range(8)]
