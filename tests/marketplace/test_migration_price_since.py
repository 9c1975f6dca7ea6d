"""Migration 0020 moves each offer's price in force from its newest price point onto the offer, and back."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.utils import timezone

BEFORE = [("marketplace", "0019_offer_sale_indexes_filter_columns")]
AFTER = [("marketplace", "0020_offer_price_since")]


def test_the_newest_point_becomes_price_since_and_earlier_points_stay(migrate_to):
    from marketplace.catalog.gpu_specs import gpu_models_upsert

    old = migrate_to(BEFORE)
    gpu_models_upsert(old.get_model("marketplace", "GpuModel"))  # a transactional test before may have flushed
    Provider = old.get_model("providers", "Provider")
    ProviderAccount = old.get_model("providers", "ProviderAccount")
    GpuModel = old.get_model("marketplace", "GpuModel")
    Offer = old.get_model("marketplace", "Offer")
    PricePoint = old.get_model("marketplace", "PricePoint")
    account = ProviderAccount.objects.create(provider=Provider.objects.create(name="Old Cloud"), kind="aws", name="m")
    first = timezone.now() - dt.timedelta(days=10)
    changed_at = first + dt.timedelta(days=3)

    def offer(zone: str, price: str) -> object:
        return Offer.objects.create(
            account=account, region="us-east-1", zone=zone, instance_type="x", pricing_model="on_demand",
            gpu_model=GpuModel.objects.get(key="T4"), gpu_count=1, gpu_memory_gb=16, vcpus=4, memory_gib=16,
            price=Decimal(price), currency="USD", price_usd=Decimal(price), price_per_gpu_usd=float(price),
            usd_per_tflop_hour=0.01, first_seen_at=first, last_seen_at=first,
        )  # fmt: skip

    changed, steady = offer("a", "0.40"), offer("b", "0.52")
    offer("c", "0.60")  # never changed, no point: its first sighting is when its price took effect
    for o, at, price in [(changed, first, "0.52"), (changed, changed_at, "0.40"), (steady, first, "0.52")]:
        PricePoint.objects.create(offer=o, observed_at=at, price=Decimal(price), currency="USD",
                                  price_usd=Decimal(price))  # fmt: skip

    new = migrate_to(AFTER)
    offers = {o.zone: o for o in new.get_model("marketplace", "Offer").objects.all()}
    assert {z: o.price_since for z, o in offers.items()} == {"a": changed_at, "b": first, "c": first}
    points = new.get_model("marketplace", "PricePoint").objects.values_list("offer__zone", "observed_at", "price")
    assert list(points) == [("a", first, Decimal("0.520000"))]

    old = migrate_to(BEFORE)
    points = old.get_model("marketplace", "PricePoint").objects.order_by("offer__zone", "observed_at")
    assert [(p.offer.zone, p.observed_at, p.price) for p in points] == [
        ("a", first, Decimal("0.520000")),
        ("a", changed_at, Decimal("0.400000")),
        ("b", first, Decimal("0.520000")),
        ("c", first, Decimal("0.600000")),
    ]
