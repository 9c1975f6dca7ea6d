"""The seller's price falls for fragments and idle hours (providers/community/pricing.py)."""

from decimal import Decimal

import pytest

from providers.community.pricing import NO_FALL, PriceFallRule, PriceRuleError, fallen_price

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
