"""The ranking: cost of useful work per profile, its breakdown and reasons, and near misses."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from decimal import Decimal

import pytest

from bench.market import specs
from marketplace.matching import (
    PROFILES,
    Demand,
    Exclusion,
    OfferBook,
    OfferView,
    Profile,
    Tolerance,
    effective_requirements,
    rank,
)
from marketplace.matching.scoring import RESTART_HOURS, STATELESS_RESTART_HOURS
from providers import gpu_names as g

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
SPECS = specs()


def offer(offer_id: int, model: str, gpus: int, price: str, **kw: object) -> OfferView:
    fields: dict[str, object] = {
        "offer_id": offer_id,
        "account_id": 1,
        "provider_kind": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": f"type-{offer_id}",
        "pricing_model": "on_demand",
        "gpu_model": model,
        "gpu_count": gpus,
        "gpu_memory_gb": SPECS[model].memory_gb,
        "price_usd_per_hour": Decimal(price),
        "observed_at": NOW,
        "spec": SPECS[model],
        "jurisdiction": "US",
    }
    fields.update(kw)
    return OfferView(**fields)  # type: ignore[arg-type]


def ids(ranking: object) -> list[int]:
    return [q.offer.offer_id for q in ranking.quotes]  # type: ignore[attr-defined]


def test_paying_for_idle_gpus_is_counted_and_shown() -> None:
    # Per GPU the 8-GPU machine is cheaper, but a 2-GPU job pays for all eight.
    offers = [offer(1, g.A100_80_SXM, 8, "32.00"), offer(2, g.A100_80_SXM, 2, "10.00")]
    ranking = rank(Demand(gpu_count=2, duration_hours=3), offers, now=NOW)
    assert ids(ranking) == [2, 1]
    big = ranking.quotes[1].breakdown
    assert big.price_cost == Decimal("96.000000")
    assert big.wasted_cost == Decimal("72.000000")  # 6 of 8 GPUs idle for 3 hours at $4/GPU-hour
    assert big.gpus_paid == 8 and big.gpus_used == 2
    assert "pays for 6 idle GPU(s), $72.00" in ranking.quotes[1].reason
    assert ranking.quotes[0].breakdown.wasted_cost == 0


def test_throughput_beats_a_lower_price() -> None:
    # H100 SXM costs twice the A100 per GPU-hour but gives 989.4 / 312 = 3.2x the dense FP16.
    offers = [offer(1, g.A100_80_SXM, 1, "4.00"), offer(2, g.H100_SXM, 1, "8.00")]
    ranking = rank(Demand(profile=Profile.FINE_TUNING, gpu_count=1), offers, now=NOW)
    assert ids(ranking) == [2, 1]
    h100, a100 = (q.breakdown for q in ranking.quotes)
    assert h100.metric == "fp16_dense_tflops"
    assert h100.useful_throughput == pytest.approx(989.4)
    # Fine-tuning fixes the work (an hour on an A100): the H100 does it in 312 / 989.4 of an hour.
    assert h100.unit_cost == pytest.approx(8.0 / 989.4 / 1.0)
    assert a100.unit_cost == pytest.approx(4.0 / 312.0)
    assert h100.score == pytest.approx(8.0 * 312.0 / 989.4) and a100.score == pytest.approx(4.0)
    assert "best value" in ranking.quotes[0].reason
    assert "over the best" in ranking.quotes[1].reason


def test_training_defaults_need_80_gb_and_nvlink() -> None:
    offers = [
        offer(1, g.A100_40_SXM, 8, "20.00"),  # 40 GB: too small
        offer(2, g.H100_PCIE, 8, "30.00"),  # 80 GB but PCIe between the cards
        offer(3, g.H100_SXM, 8, "98.00"),
    ]
    ranking = rank(Demand(profile=Profile.TRAINING, gpu_count=8), offers, now=NOW)
    assert ids(ranking) == [3]
    assert ranking.rejected == {"gpu memory": 1, "interconnect": 1}
    assert ranking.defaults is PROFILES[Profile.TRAINING]
    assert ranking.demand.min_gpu_memory_gb == 80 and ranking.demand.min_interconnect_gbs == 600
    # A buyer's own figures win over the profile's.
    relaxed = rank(
        Demand(profile=Profile.TRAINING, gpu_count=8, min_gpu_memory_gb=40, min_interconnect_gbs=0),
        offers,
        now=NOW,
    )
    assert sorted(ids(relaxed)) == [1, 2, 3]


def test_one_gpu_needs_no_interconnect() -> None:
    ranking = rank(Demand(profile=Profile.TRAINING, gpu_count=1), [offer(1, g.H100_PCIE, 1, "4.00")], now=NOW)
    assert ids(ranking) == [1]


def test_inference_prefers_cheap_low_latency_cards_unless_they_cannot_hold_the_model() -> None:
    offers = [offer(1, g.H100_SXM, 1, "2.00"), offer(2, g.L4, 1, "0.80"), offer(3, g.T4, 1, "0.53")]
    ranking = rank(Demand(profile=Profile.INFERENCE), offers, now=NOW)
    assert set(ids(ranking)) == {2, 3}
    assert ranking.rejected == {"gpu model": 1}
    big_model = effective_requirements(Demand(profile=Profile.INFERENCE, min_gpu_memory_gb=80), SPECS)
    assert big_model.gpu_models == frozenset()
    assert ids(rank(Demand(profile=Profile.INFERENCE, min_gpu_memory_gb=80), offers, now=NOW)) == [1]


def test_scientific_needs_fp64_and_ecc() -> None:
    offers = [offer(1, g.L40S, 1, "1.00"), offer(2, g.A100_80_SXM, 1, "4.00"), offer(3, g.H100_SXM, 1, "8.00")]
    ranking = rank(Demand(profile=Profile.SCIENTIFIC), offers, now=NOW)
    assert ids(ranking) == [3]  # the A100's 9.7 FP64 TFLOPS and the L40S's 1.4 are under the default 10
    assert ranking.rejected == {"fp64": 2}
    assert ranking.quotes[0].breakdown.metric == "fp64_tflops"
    no_ecc = dataclasses.replace(SPECS[g.H100_SXM], ecc=False)
    ranking = rank(Demand(profile=Profile.SCIENTIFIC), [offer(4, g.H100_SXM, 1, "8.00", spec=no_ecc)], now=NOW)
    assert ranking.quotes == () and ranking.rejected == {"ecc": 1}


def test_transcoding_needs_hardware_encoders() -> None:
    offers = [offer(1, g.A100_80_SXM, 1, "1.00"), offer(2, g.L4, 1, "0.80")]
    ranking = rank(Demand(profile=Profile.TRANSCODING), offers, now=NOW)
    assert ids(ranking) == [2]
    assert ranking.rejected["video encoders"] == 1
    assert ranking.quotes[0].breakdown.useful_throughput == 2  # the L4 has two NVENC


def test_spot_risk_follows_the_jobs_tolerance() -> None:
    spot = offer(1, g.A100_80_SXM, 1, "1.00", pricing_model="spot", interruption_rate_per_hour=0.1)
    on_demand = offer(2, g.A100_80_SXM, 1, "1.50")
    hours = 10.0

    def quote(tolerance: Tolerance, checkpoint: float = 2.0) -> object:
        demand = Demand(duration_hours=hours, interruption_tolerance=tolerance, checkpoint_interval_hours=checkpoint)
        return rank(demand, [spot, on_demand], now=NOW)

    strict = quote(Tolerance.NONE)
    assert ids(strict) == [2] and strict.rejected == {"interruption": 1}  # type: ignore[attr-defined]
    checkpointed = quote(Tolerance.CHECKPOINTED).quotes[0].breakdown  # type: ignore[attr-defined]
    # The extra hours paid at $1/h: five 2-hour segments at 0.1 interruptions/hour, each taking
    # e^{λR} (e^{λτ} - 1) / λ in expectation (Daly 2006; marketplace/matching/interruptions.py), minus the 10 h.
    segment = math.exp(0.1 * RESTART_HOURS) * math.expm1(0.1 * 2.0) / 0.1
    assert checkpointed.interruption_cost == Decimal(str(round(4 * segment + segment - hours, 6)))
    stateless = quote(Tolerance.STATELESS).quotes[0].breakdown  # type: ignore[attr-defined]
    # Stateless loses only a restart per interruption: W e^{λR}, the continuous-checkpoint limit.
    extra = hours * math.exp(0.1 * STATELESS_RESTART_HOURS) - hours
    assert stateless.interruption_cost == Decimal(str(round(extra, 6)))
    assert stateless.interruption_cost < checkpointed.interruption_cost
    assert checkpointed.effective_cost == checkpointed.price_cost + checkpointed.interruption_cost
    # A checkpoint every 40 hours loses the whole 10-hour run per interruption: spot becomes the dearer.
    rare = quote(Tolerance.CHECKPOINTED, checkpoint=40.0)
    assert ids(rare)[0] == 2


def test_unreliable_provider_costs_more() -> None:
    offers = [offer(1, g.L4, 1, "1.00", reliability=0.5), offer(2, g.L4, 1, "1.20", reliability=1.0)]
    ranking = rank(Demand(duration_hours=1), offers, now=NOW)
    assert ids(ranking) == [2, 1]
    assert ranking.quotes[1].breakdown.reliability_cost == Decimal("1.000000")  # 1/0.5 - 1 times $1
    assert "provider reliability $1.00" in ranking.quotes[1].reason


def test_jurisdictions_and_regions() -> None:
    offers = [
        offer(1, g.L4, 1, "0.5"),
        offer(2, g.L4, 1, "0.9", region="europe-west4", zone="europe-west4-a", jurisdiction="EU"),
        offer(3, g.L4, 1, "0.7", region="cn-shanghai", zone="cn-shanghai-b", jurisdiction="CN"),
    ]
    assert ids(rank(Demand(jurisdictions=frozenset({"EU"})), offers, now=NOW)) == [2]
    assert ids(rank(Demand(jurisdictions=frozenset({"CN"})), offers, now=NOW)) == [3]
    assert ids(rank(Demand(regions=frozenset({"us-east-1", "cn-shanghai"})), offers, now=NOW)) == [1, 3]


def test_fractional_gpus_and_divisible_machines() -> None:
    mig = offer(
        1,
        g.A100_80_SXM,
        56,
        "28.00",  # 56 slices of 1/7 card at $0.50 each
        gpu_memory_gb=10,
        gpu_fraction=1 / 7,
        divisible=True,
        capacity=56,
        provider_kind="independent",
    )
    whole = offer(2, g.A100_80_SXM, 1, "4.00")
    shared = offer(3, g.A100_80_SXM, 8, "24.00", divisible=True, capacity=3, provider_kind="independent")
    # A count means whole cards (issue 20): this buyer says a slice will do.
    assert rank(Demand(gpu_count=1, min_gpu_memory_gb=10), [mig], now=NOW).rejected == {"whole cards": 1}
    small = Demand(gpu_count=1, min_gpu_memory_gb=10, fractions=True)
    ranking = rank(small, [mig, whole, shared], now=NOW)
    by_id = {q.offer.offer_id: q for q in ranking.quotes}
    slice_quote = by_id[1]
    assert slice_quote.breakdown.price_per_hour == Decimal("0.500000")
    assert slice_quote.breakdown.useful_throughput == pytest.approx(312 / 7)
    assert slice_quote.units == 1 and slice_quote.breakdown.wasted_cost == 0
    assert "(0.142857 of a card each)" in slice_quote.reason
    # One GPU of the shared machine: an eighth of its price, and no idle GPUs paid for.
    assert by_id[3].breakdown.price_per_hour == Decimal("3.000000")
    assert by_id[3].breakdown.wasted_cost == 0
    # Four GPUs do not fit the three left on the shared machine.
    four = rank(Demand(gpu_count=4, min_gpu_memory_gb=10), [shared], now=NOW)
    assert four.quotes == () and four.rejected == {"capacity": 1}


def test_size_by_total_memory() -> None:
    offers = [offer(1, g.A100_80_SXM, 4, "16.00", divisible=True, capacity=4), offer(2, g.A100_40_SXM, 8, "20.0")]
    ranking = rank(Demand(total_gpu_memory_gb=160), offers, now=NOW)
    by_id = {q.offer.offer_id: q for q in ranking.quotes}
    assert by_id[1].units == 2 and by_id[1].breakdown.gpus_used == 2  # 2 x 80 GB
    assert by_id[2].breakdown.gpus_used == 4  # 4 x 40 GB of the 8-GPU machine


def test_price_caps_and_near_misses() -> None:
    offers = [offer(1, g.L4, 1, "0.80"), offer(2, g.L4, 1, "0.95"), offer(3, g.T4, 1, "0.60", region="eu-west-1")]
    ranking = rank(
        Demand(max_price_per_hour=Decimal("0.50"), regions=frozenset({"us-east-1"}), duration_hours=2),
        offers,
        now=NOW,
    )
    assert ranking.quotes == ()
    assert ranking.rejected == {"price cap": 3, "region": 1}
    first = ranking.near_misses[0]
    assert first.offer.offer_id == 1 and first.failed == ("price cap",)
    assert first.relax == "raise the hourly cap to $0.80"
    assert ranking.near_misses[-1].failed == ("region", "price cap")
    per_job = rank(Demand(max_price_per_job=Decimal("1.00"), duration_hours=2), offers, now=NOW)
    # Misses breaking as many rules come cheapest job first: a rental fixes the hours, so the T4 before the
    # faster but dearer L4.
    assert per_job.quotes == () and per_job.near_misses[0].relax == "raise the job cap to $1.20"
    assert per_job.near_misses[1].relax == "raise the job cap to $1.60"


def test_stale_and_excluded_offers_are_not_sold() -> None:
    old = offer(1, g.L4, 1, "0.5", observed_at=NOW - dt.timedelta(hours=2))
    fresh = offer(2, g.L4, 1, "0.6")
    tried = offer(3, g.L4, 1, "0.55")
    ranking = rank(
        Demand(),
        [old, fresh, tried],
        now=NOW,
        max_age=dt.timedelta(minutes=30),
        exclusion=Exclusion(offer_ids=frozenset({3})),
    )
    assert ids(ranking) == [2]
    assert ranking.rejected == {"stale price": 1, "excluded": 1}


def test_a_book_ranks_like_the_offers_it_holds() -> None:
    offers = [offer(i, m, 1, p) for i, (m, p) in enumerate([(g.T4, "0.5"), (g.L4, "0.8"), (g.A10G, "1.0")], 1)]
    book = OfferBook.from_views(offers)
    demand = Demand(profile=Profile.INFERENCE)
    assert ids(rank(demand, book, now=NOW)) == ids(rank(demand, offers, now=NOW))
    assert len(rank(demand, book, now=NOW, limit=2).quotes) == 2
