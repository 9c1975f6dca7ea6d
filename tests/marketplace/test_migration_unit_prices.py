"""Migrations 0016-0017 give existing offers their price per GPU-hour and per TFLOP-hour."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

BEFORE = [("marketplace", "0015_webhooks")]
AFTER = [("marketplace", "0017_offer_sale_indexes")]


def test_existing_offers_get_their_unit_prices(migrate_to):
    from marketplace.catalog.gpu_specs import gpu_models_upsert

    old = migrate_to(BEFORE)
    gpu_models_upsert(old.get_model("marketplace", "GpuModel"))  # a transactional test before may have flushed
    Provider = old.get_model("providers", "Provider")
    ProviderAccount = old.get_model("providers", "ProviderAccount")
    GpuModel = old.get_model("marketplace", "GpuModel")
    account = ProviderAccount.objects.create(provider=Provider.objects.create(name="Old Cloud"), kind="aws", name="m")
    now = timezone.now() - dt.timedelta(minutes=1)

    def offer(gpu: str, count: int, price: str) -> None:
        old.get_model("marketplace", "Offer").objects.create(
            account=account, region="us-east-1", zone=f"{gpu}-{count}", instance_type="x", pricing_model="on_demand",
            gpu_model=GpuModel.objects.get(key=gpu), gpu_count=count, gpu_memory_gb=80, vcpus=8, memory_gib=64,
            price=Decimal(price), currency="USD", price_usd=Decimal(price), first_seen_at=now, last_seen_at=now,
        )  # fmt: skip

    offer("H100-SXM5", 8, "55.04")
    offer("T4", 1, "0.526")

    new = migrate_to(AFTER)
    rows = {
        o.gpu_model.key: (o.price_per_gpu_usd, o.usd_per_tflop_hour, o.gpu_model.fp16_dense_tflops)
        for o in new.get_model("marketplace", "Offer").objects.select_related("gpu_model")
    }
    assert rows["H100-SXM5"][0] == pytest.approx(6.88)
    assert rows["T4"][0] == pytest.approx(0.526)
    for per_gpu, per_tflop, tflops in rows.values():
        assert per_tflop == pytest.approx(per_gpu / float(tflops))
