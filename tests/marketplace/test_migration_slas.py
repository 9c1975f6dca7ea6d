"""Migration 0040 gives offers listed before SLAs theirs at once, not only at their account's next sync."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone

BEFORE = [("marketplace", "0039_fleets"), ("providers", "0010_sla_commitment")]
AFTER = [("marketplace", "0040_slas")]


def test_existing_offers_state_their_sla_and_spot_ones_none(migrate_to):
    from marketplace.catalog.gpu_specs import gpu_models_upsert

    old = migrate_to(BEFORE)
    gpu_models_upsert(old.get_model("marketplace", "GpuModel"))  # a transactional test before may have flushed
    Provider = old.get_model("providers", "Provider")
    ProviderAccount = old.get_model("providers", "ProviderAccount")
    Offer = old.get_model("marketplace", "Offer")
    t4 = old.get_model("marketplace", "GpuModel").objects.get(key="T4")
    provider = Provider.objects.create(name="Old Cloud")
    cloud = ProviderAccount.objects.create(provider=provider, kind="gcp", name="g")
    host = ProviderAccount.objects.create(provider=provider, kind="community", name="h", sla_commitment_pct=Decimal(99))
    now = timezone.now()
    for account, pricing in [(cloud, "on_demand"), (cloud, "spot"), (host, "on_demand")]:
        Offer.objects.create(
            account=account, region="r", zone="z", instance_type="x", pricing_model=pricing, gpu_model=t4,
            gpu_count=1, gpu_memory_gb=16, vcpus=4, memory_gib=16, price=Decimal("0.4"), currency="USD",
            price_usd=Decimal("0.4"), price_per_gpu_usd=0.4, usd_per_tflop_hour=0.01, first_seen_at=now,
            last_seen_at=now,
        )  # fmt: skip

    new = migrate_to(AFTER)
    rows = new.get_model("marketplace", "Offer").objects.order_by("account__name", "pricing_model")
    assert [(o.account.kind, o.pricing_model, o.sla_availability, o.sla_credits[:1]) for o in rows] == [
        ("gcp", "on_demand", Decimal("99.900"), [["99.9", "10"]]),
        ("gcp", "spot", None, []),
        ("community", "on_demand", Decimal("99.000"), [["99.000", "10"]]),
    ]
