"""The seller's price falls for fragments and idle hours (providers/community/pricing.py)."""

import dataclasses
from decimal import Decimal
from fractions import Fraction

import pytest

from providers.community.mig import MIG_PROFILE
from providers.community.pricing import (
    NO_FALL,
    MachineMoment,
    PriceFallRule,
    PriceRuleError,
    fallen_price,
    quotes_fallen,
    slice_price,
)
from providers.types import GPU_FRACTION, OfferQuote, PricingModel

D = Decimal
RULE = PriceFallRule(fragment_discount_pct=D(20), idle_after_hours=2, idle_step_pct=D(10), floor_pct=D(50))


def test_no_rule_keeps_the_list_price() -> None:
    assert fallen_price(D("2.00"), NO_FALL, free_gpus=3, total_gpus=8, idle_hours=99) == D("2.00")


def test_a_fragment_sells_below_the_list_price_and_a_whole_busy_machine_does_not() -> None:
    assert fallen_price(D("2.00"), RULE, free_gpus=3, total_gpus=8, idle_hours=0) == D("1.6000")
    assert fallen_price(D("2.00"), RULE, free_gpus=0, total_gpus=8, idle_hours=0) == D("2.0000")


def test_idle_hours_lower_the_price_step_by_step_down_to_the_floor() -> None:
    prices = [fallen_price(D("2.00"), RULE, free_gpus=8, total_gpus=8, idle_hours=h) for h in (0, 2.5, 3, 4, 30)]
    assert prices == [D("2.0000"), D("2.0000"), D("1.8000"), D("1.6000"), D("1.0000")]


def test_the_result_rounds_down_to_the_price_column() -> None:
    rule = PriceFallRule(fragment_discount_pct=D("33.33"), floor_pct=D(0))
    assert fallen_price(D("0.9999"), rule, free_gpus=1, total_gpus=2, idle_hours=0) == D("0.6666")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"fragment_discount_pct": D(101)}, "fragment_discount_pct"),
        ({"idle_step_pct": D("-1")}, "idle_step_pct"),
        ({"floor_pct": D("NaN")}, "floor_pct"),
        ({"idle_after_hours": -1}, "idle_after_hours"),
        ({"idle_after_hours": True}, "idle_after_hours"),
    ],
)
def test_a_rule_out_of_range_is_refused_naming_its_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(PriceRuleError, match=named):
        PriceFallRule(**fields)  # type: ignore[arg-type]


def test_free_gpus_beyond_the_machine_are_refused() -> None:
    with pytest.raises(PriceRuleError, match="free_gpus"):
        fallen_price(D("1"), RULE, free_gpus=9, total_gpus=8, idle_hours=0)


def _quote(instance_type: str, gpus: int, price: str, model: PricingModel = PricingModel.ON_DEMAND, **extra):
    return OfferQuote(region="eu-de", zone="fra-h100-1", instance_type=instance_type, pricing_model=model,
                      gpu_model="H100-SXM5", gpu_count=gpus, gpu_memory_gb=80, vcpus=12, memory_gib=D(128),
                      price=D(price), currency="USD", capacity=1, extra=extra)  # fmt: skip


def test_a_machines_quotes_fall_together_and_a_bid_the_price_reached_is_left_out() -> None:
    quotes = [
        _quote("community-2xH100-SXM5", 2, "4.0000"),
        _quote("community-2xH100-SXM5", 2, "3.3000", PricingModel.SPOT),
        _quote("community-1xH100-SXM5-mig-3g.40gb", 1, "0.8571", **{MIG_PROFILE: "3g.40gb", GPU_FRACTION: 3 / 7}),
        dataclasses.replace(_quote("community-2xH100-SXM5", 2, "5.0000"), zone="another-machine"),
    ]
    fragment = MachineMoment(list_price=D("2.00"), rule=RULE, free_gpus=3, total_gpus=8, idle_hours=0)

    fallen = quotes_fallen(quotes, {"fra-h100-1": fragment})

    # 1.60 a GPU-hour: the pair at 3.20, at or below the 3.30 bid, which is left out; the 3/7 slice at
    # 1.60 x 3/7 rounded half up; the other machine untouched.
    assert [(q.zone, q.instance_type, q.pricing_model, q.price) for q in fallen] == [
        ("fra-h100-1", "community-2xH100-SXM5", PricingModel.ON_DEMAND, D("3.2000")),
        ("fra-h100-1", "community-1xH100-SXM5-mig-3g.40gb", PricingModel.ON_DEMAND, D("0.6857")),
        ("another-machine", "community-2xH100-SXM5", PricingModel.ON_DEMAND, D("5.0000")),
    ]
    assert slice_price(D("2.00"), Fraction(3, 7)) == D("0.8571")  # the adapter's own slice price, unfallen
