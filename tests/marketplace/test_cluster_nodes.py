"""A Kubernetes seller's node is one capacity pool (issue 37): its offers of every size share the units the sync
saw free, holds are taken under the node's lock, and concurrent reservations never place more than it has,
proved on PostgreSQL with real transactions racing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.catalog.services import offers_ingest
from marketplace.models import Attempt, GpuModel, NodeHold, Offer, Order
from marketplace.orders.reservations import cluster_nodes_refresh, reservation_release, reservation_take
from providers.community.mig import MIG_PROFILE
from providers.models import ClusterNode, Provider, ProviderAccount, ProviderKind
from providers.types import GPU_FRACTION, NODE_RESOURCE, NODE_UNITS_FREE, OfferQuote, PricingModel
from tests.races import race

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.5gb"


def _quotes(node: str, free: int, *, mig_free: int | None = None) -> list[OfferQuote]:
    """A node of eight A100-80GB sold 1, 2, 4 and 8 at a time, and a MIG node's 1g.5gb slices, as the
    adapter's ``list_offers`` states them (capacity: the leases of a size the free units hold)."""
    quotes = [
        OfferQuote(
            region="eu-central",
            zone=node,
            instance_type=f"k8s-gpu-{n}",
            pricing_model=PricingModel.ON_DEMAND,
            gpu_model="A100-80GB-SXM4",
            gpu_count=n,
            gpu_memory_gb=80,
            vcpus=12 * n,
            memory_gib=Decimal(100 * n),
            price=Decimal("1.90") * n,
            currency="USD",
            capacity=free // n,
            extra={NODE_RESOURCE: GPU, NODE_UNITS_FREE: free, "node": node},
        )
        for n in (1, 2, 4, 8)
    ]
    if mig_free is not None:
        quotes.append(
            OfferQuote(
                region="eu-central",
                zone=f"{node}-mig",
                instance_type="k8s-mig-1g.5gb",
                pricing_model=PricingModel.ON_DEMAND,
                gpu_model="A100-40GB-SXM4",
                gpu_count=1,
                gpu_memory_gb=5,
                vcpus=2,
                memory_gib=Decimal(16),
                price=Decimal("0.30"),
                currency="USD",
                capacity=mig_free,
                extra={NODE_RESOURCE: MIG, NODE_UNITS_FREE: mig_free, MIG_PROFILE: "1g.5gb", GPU_FRACTION: 1 / 7},
            )
        )
    return quotes


def _sync(account: ProviderAccount, quotes: list[OfferQuote]) -> None:
    now = timezone.now()
    report = offers_ingest(account=account, quotes=quotes, now=now)
    assert report.quarantined == 0, report.reasons
    cluster_nodes_refresh(account_id=account.pk, quotes=quotes, now=now)


@pytest.fixture
def cluster(db, acme, alice):
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)  # a transactional test before this one flushed the seeded rows
    provider = Provider.objects.create(name="Neocloud GmbH")
    account = ProviderAccount.objects.create(
        provider=provider, kind=ProviderKind.KUBERNETES, name="fra-1", regions=["eu-central"]
    )
    _sync(account, _quotes("gpu-a100-0", 8, mig_free=14))
    return account


def _offer(account, instance_type: str, zone: str = "gpu-a100-0") -> Offer:
    return Offer.objects.get(account=account, zone=zone, instance_type=instance_type)


def _attempts(acme, alice, offer: Offer, count: int) -> list[Attempt]:
    order = Order.objects.create(
        organization=acme, created_by=alice, offer=offer, gpu_model=offer.gpu_model, gpu_count=offer.gpu_count,
        pricing_model=offer.pricing_model, max_price_per_hour=offer.price_usd, price_per_hour=offer.price_usd,
        state_changed_at=timezone.now(),
    )  # fmt: skip
    return [
        Attempt.objects.create(
            order=order, number=i + 1, offer=offer, client_token=f"{order.ref}-k{i}", started_at=order.created_at
        )
        for i in range(count)
    ]


def _reserved(account, zone: str = "gpu-a100-0") -> dict[str, tuple[int | None, int]]:
    rows = Offer.objects.filter(account=account, zone=zone).values_list("instance_type", "capacity", "reserved")
    return {kind: (capacity, reserved) for kind, capacity, reserved in rows}


def test_the_sync_records_each_nodes_free_units_per_resource(cluster):
    assert dict(ClusterNode.objects.filter(account=cluster).values_list("name", "units")) == {
        "gpu-a100-0": {GPU: 8},
        "gpu-a100-0-mig": {MIG: 14},
    }


def test_a_hold_on_one_size_leaves_the_other_sizes_what_still_fits(cluster, acme, alice):
    (two,) = _attempts(acme, alice, _offer(cluster, "k8s-gpu-2"), 1)
    assert reservation_take(attempt=two)
    (four,) = _attempts(acme, alice, _offer(cluster, "k8s-gpu-4"), 1)
    assert reservation_take(attempt=four)

    # 2 GPUs are left of 8: one 2-GPU lease or two 1-GPU leases, no 4 or 8.
    assert _reserved(cluster) == {"k8s-gpu-1": (8, 6), "k8s-gpu-2": (4, 3), "k8s-gpu-4": (2, 2), "k8s-gpu-8": (1, 1)}
    (eight,) = _attempts(acme, alice, _offer(cluster, "k8s-gpu-8"), 1)
    assert not reservation_take(attempt=eight)
    assert not NodeHold.objects.filter(attempt=eight).exists()

    assert reservation_release(attempt_id=four.pk) == 4
    assert reservation_release(attempt_id=four.pk) == 0  # idempotent
    assert _reserved(cluster)["k8s-gpu-4"] == (2, 1)


def test_mig_slices_are_a_pool_of_their_own(cluster, acme, alice):
    slices = _attempts(acme, alice, _offer(cluster, "k8s-mig-1g.5gb", zone="gpu-a100-0-mig"), 15)

    taken = [reservation_take(attempt=a) for a in slices]

    assert taken == [True] * 14 + [False]
    assert _reserved(cluster, "gpu-a100-0-mig") == {"k8s-mig-1g.5gb": (14, 14)}
    assert _reserved(cluster)["k8s-gpu-8"] == (1, 0)  # the whole GPUs are untouched


def test_a_sync_that_sees_fewer_free_units_keeps_the_holds_and_shrinks_what_is_left(cluster, acme, alice):
    (two,) = _attempts(acme, alice, _offer(cluster, "k8s-gpu-2"), 1)
    assert reservation_take(attempt=two)

    # Someone else's pod took 4 GPUs on the node: 4 are free of pods the broker did not place.
    _sync(cluster, _quotes("gpu-a100-0", 4))

    assert _reserved(cluster) == {"k8s-gpu-1": (4, 2), "k8s-gpu-2": (2, 1), "k8s-gpu-4": (1, 1), "k8s-gpu-8": (0, 0)}
    assert NodeHold.objects.get(attempt=two).units == 2

    # The node is cordoned: it leaves the sync, keeps its row and its hold, and takes nothing more.
    _sync(cluster, _quotes("gpu-b", 8))
    assert ClusterNode.objects.get(account=cluster, name="gpu-a100-0").units == {}
    (one,) = _attempts(acme, alice, _offer(cluster, "k8s-gpu-1"), 1)
    assert not reservation_take(attempt=one)
    assert reservation_release(attempt_id=two.pk) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_place_more_than_the_node_has_free(cluster, acme, alice):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    # Twelve transactions for 2 GPUs each against 8 free, mixed with six for 1 GPU, all released at once.
    attempts = _attempts(acme, alice, _offer(cluster, "k8s-gpu-2"), 12) + _attempts(
        acme, alice, _offer(cluster, "k8s-gpu-1"), 6
    )

    def take(attempt: Attempt):
        def work() -> tuple[int, bool]:
            with transaction.atomic():
                return attempt.offer.gpu_count, reservation_take(attempt=attempt)

        return work

    taken, errors = race([take(a) for a in attempts])

    assert errors == []
    assert len(taken) == 18
    held = sum(NodeHold.objects.filter(node__name="gpu-a100-0").values_list("units", flat=True))
    assert held == sum(gpus for gpus, got in taken if got) == 8
    assert sum(Attempt.objects.filter(pk__in=[a.pk for a in attempts]).values_list("reserved", flat=True)) == 8
    assert _reserved(cluster) == {"k8s-gpu-1": (8, 8), "k8s-gpu-2": (4, 4), "k8s-gpu-4": (2, 2), "k8s-gpu-8": (1, 1)}
