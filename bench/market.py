"""A seeded generator of offers and demands shaped like the real catalogue, for the matching benchmark and tests.

Offers are drawn from the sandboxes' real list prices (sandboxes/<kind>/prices.csv: AWS, Azure, GCP, Alibaba
Cloud, Tencent Cloud, with their sources), resold by several accounts per cloud with a little price spread,
on-demand and spot; independent providers add 8-GPU machines sold per GPU (divisible) at a discount, some
of them as MIG slices. ``scarce`` sets stock low enough that demands compete for the good offers.

Assumptions of this generator (not sourced facts): the spread (+-10 %), independent providers' discount
(25-45 % under the cloud per-GPU price), their reliability (0.85-0.97 against 0.97-0.995 for clouds), the
spot interruption rate (0.02-0.1 per hour), the CNY rate (7.2 per USD) and the demand mix below.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
from decimal import Decimal
from pathlib import Path

from marketplace.catalog.regions import jurisdiction_of
from marketplace.matching import Demand, GpuSpec, OfferView, Profile, Tolerance
from providers import gpu_names as g
from providers.gpu_specs import GPU_SPECS

DATA = Path(__file__).resolve().parent.parent / "sandboxes"  # each cloud sandbox keeps its prices.csv
NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
CNY_PER_USD = 7.2

# The price files' GPU names to the GpuModel keys (the SXM part where the clouds sell SXM boards).
_MODEL = {
    "T4": g.T4,
    "A10": g.A10,
    "A10G": g.A10G,
    "L4": g.L4,
    "L40S": g.L40S,
    "V100": g.V100_16_SXM2,
    "V100-32GB": g.V100_32_SXM2,
    "A100": g.A100_40_SXM,
    "A100-80GB": g.A100_80_SXM,
    "H100": g.H100_SXM,
    "H100 NVL": g.H100_NVL,
    "H200": g.H200_SXM,
    "B200": g.B200,
}


def specs() -> dict[str, GpuSpec]:
    def opt(value: Decimal | None) -> float | None:
        return None if value is None else float(value)

    return {
        s["key"]: GpuSpec(
            key=s["key"],
            memory_gb=s["memory_gb"],
            memory_bandwidth_gbs=s["memory_bandwidth_gbs"],
            fp16_dense_tflops=float(s["fp16_dense_tflops"]),
            fp64_tflops=float(s["fp64_tflops"]),
            fp32_tflops=opt(s["fp32_tflops"]),
            fp8_dense_tflops=opt(s["fp8_dense_tflops"]),
            int8_dense_tops=opt(s["int8_dense_tops"]),
            interconnect=s["interconnect"],
            interconnect_gbs=s["interconnect_gbs"],
            video_encoders=s["video_encoders"],
            ecc=s["ecc"],
            verified=s["verified"],
        )
        for s in GPU_SPECS
    }


def _price(text: str, currency: str) -> float | None:
    if not text:
        return None
    value = float(text)
    return value / CNY_PER_USD if currency == "CNY" else value


def catalogue() -> list[tuple[str, str, str, int, float, float | None]]:
    """(provider, region, gpu model key, GPUs, on-demand USD/h, spot USD/h or None) from the seed files."""
    rows: list[tuple[str, str, str, int, float, float | None]] = []
    files = {
        "aws": ("on_demand_usd", "spot_usd", "USD"),
        "azure": ("on_demand_usd", "spot_usd", "USD"),
        "gcp": ("on_demand_usd", "spot_usd", "USD"),
        "alibaba": ("on_demand_cny", "spot_cny", "CNY"),
        "tencent": ("on_demand_cny", "spot_cny", "CNY"),
    }
    for kind, (od, spot, currency) in files.items():
        with open(DATA / kind / "prices.csv", newline="", encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                if kind == "gcp" and r["record"] != "machine":
                    continue
                model = _MODEL.get(r["gpu_model"])
                price = _price(r[od], currency)
                if model is None or price is None or not r["gpu_count"]:
                    continue
                rows.append((kind, r["region"], model, int(r["gpu_count"]), price, _price(r[spot], currency)))
    return rows


_INDEPENDENT_MODELS = (g.T4, g.L4, g.A10, g.L40S, g.A100_80_SXM, g.H100_SXM, g.A100_40_SXM)
_INDEPENDENT_REGIONS = ("us-east-1", "us-west-2", "eu-central-1", "eu-west-1", "ap-northeast-1", "cn-shanghai")
# MIG profiles of an A100 80 GB (1g.10gb and 3g.40gb): a seventh and three sevenths of the card.
# (fraction of the card, memory GB, slices per card)
_MIG = ((1 / 7, 10, 7), (3 / 7, 40, 2))


def offers(n: int, *, seed: int, scarce: bool) -> list[OfferView]:
    rng = random.Random(seed)
    spec = specs()
    rows = catalogue()
    per_gpu = {}
    for _, _, model, count, price, _ in rows:
        per_gpu.setdefault(model, []).append(price / count)
    views: list[OfferView] = []
    for i in range(n):
        account = rng.randrange(40)
        if rng.random() < 0.7:
            kind, region, model, count, od, spot = rng.choice(rows)
            is_spot = spot is not None and rng.random() < 0.35
            price = (spot if is_spot and spot is not None else od) * rng.uniform(0.9, 1.1)
            stock: int | None = rng.choice((0, 1, 1, 2, 3)) if scarce else rng.choice((None, 20, 50))
            views.append(
                OfferView(
                    offer_id=i + 1,
                    account_id=account,
                    provider_kind=kind,
                    region=region,
                    zone=f"{region}-{rng.choice('abc')}",
                    instance_type=f"{model.lower()}x{count}",
                    pricing_model="spot" if is_spot else "on_demand",
                    gpu_model=model,
                    gpu_count=count,
                    gpu_memory_gb=spec[model].memory_gb,
                    price_usd_per_hour=Decimal(f"{price:.4f}"),
                    observed_at=NOW,
                    capacity=stock,
                    spec=spec[model],
                    jurisdiction=jurisdiction_of(kind, region),
                    rdma=count == 8 and spec[model].interconnect == "nvlink",
                    reliability=rng.uniform(0.97, 0.995),
                    interruption_rate_per_hour=rng.uniform(0.02, 0.1) if is_spot else 0.0,
                )
            )
            continue
        model = rng.choice(_INDEPENDENT_MODELS)
        fraction, memory = 1.0, spec[model].memory_gb
        count = 8
        if model == g.A100_80_SXM and rng.random() < 0.4:
            fraction, memory, per_card = rng.choice(_MIG)
            count = per_card * 8
        card_price = min(per_gpu.get(model, [2.0])) * rng.uniform(0.55, 0.75)
        region = rng.choice(_INDEPENDENT_REGIONS)
        free = rng.randint(1, count) if scarce else count
        views.append(
            OfferView(
                offer_id=i + 1,
                account_id=100 + account,
                provider_kind="independent",
                region=region,
                zone=f"{region}-host{i}",
                instance_type=f"{model.lower()}-{count}",
                pricing_model="on_demand",
                gpu_model=model,
                gpu_count=count,
                gpu_memory_gb=memory,
                price_usd_per_hour=Decimal(f"{card_price * fraction * count:.4f}"),
                observed_at=NOW,
                capacity=free,
                spec=spec[model],
                gpu_fraction=fraction,
                divisible=True,
                jurisdiction=jurisdiction_of("aws", region),
                reliability=rng.uniform(0.85, 0.97),
            )
        )
    return views


# Share of demands per profile, and the GPU counts each asks for.
_MIX = (
    (Profile.INFERENCE, 0.30, (1, 1, 1, 1, 2)),
    (Profile.FINE_TUNING, 0.25, (1, 1, 2, 4)),
    (Profile.TRAINING, 0.15, (2, 4, 8, 8)),
    (Profile.RENDERING, 0.12, (1, 1, 2)),
    (Profile.TRANSCODING, 0.10, (1, 1, 2)),
    (Profile.SCIENTIFIC, 0.08, (1, 2, 4)),
)


def demands(n: int, *, seed: int) -> list[Demand]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pick, acc = rng.random(), 0.0
        profile, counts = _MIX[-1][0], _MIX[-1][2]
        for p, share, c in _MIX:
            acc += share
            if pick < acc:
                profile, counts = p, c
                break
        gpu_count = rng.choice(counts)
        memory_sized = profile == Profile.INFERENCE and rng.random() < 0.15
        where = rng.random()
        jurisdictions = frozenset({"EU"}) if where < 0.15 else frozenset({"CN"}) if where < 0.22 else frozenset({"US"})
        if where > 0.45:
            jurisdictions = frozenset()
        out.append(
            Demand(
                demand_id=f"d{i}",
                profile=profile,
                gpu_count=gpu_count,
                total_gpu_memory_gb=rng.choice((8, 16, 20)) if memory_sized else None,
                jurisdictions=jurisdictions,
                duration_hours=round(min(rng.lognormvariate(1.6, 1.0), 168.0), 2),
                interruption_tolerance=rng.choice(
                    (Tolerance.NONE, Tolerance.CHECKPOINTED, Tolerance.CHECKPOINTED, Tolerance.STATELESS)
                ),
            )
        )
    return out
