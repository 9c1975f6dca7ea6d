"""How the portal tells a seller what a machine's price falls do, in words and in the machine's own prices
(issue 39). The prices come from the one rule the market applies (``providers.community.pricing``)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from providers.community.pricing import MachineMoment, PriceFallRule, fallen_price
from providers.models import Machine

# Typeset as the page reads them; written as escapes so no look-alike hides in the source.
TIMES, MINUS, DASH = "\u00d7", "\u2212", "\u2013"
# The rule the page explains with when a machine has none yet: the issue's own example.
SAMPLE_RULE = PriceFallRule(
    fragment_discount_pct=Decimal(20), idle_after_hours=2, idle_step_pct=Decimal(10), floor_pct=Decimal(50)
)
# Long enough idle for any rule to have reached its floor (a step of 0.01 % from 100 % to 0 %).
_AT_FLOOR_HOURS = 10_000.0 + 24 * 366


def usd(value: Decimal) -> str:
    """``$1.60``; four decimals only where cents would hide part of the price (``$1.7125``)."""
    cents = value.quantize(Decimal("0.01"))
    return f"${cents}" if cents == value else f"${value.quantize(Decimal('0.0001'))}"


def pct(value: Decimal) -> str:
    """``10``, ``12.5``: a percentage without trailing zeros."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def example_fragment(gpus: int) -> int:
    """The fragment the example speaks of: about three eighths of the machine (3 of 8), at least one GPU."""
    return max(1, 3 * gpus // 8)


def rule_example(*, rule: PriceFallRule, price: Decimal, gpus: int, divisible: bool) -> str:
    """One line of what ``rule`` does to a machine of ``gpus`` GPUs listed at ``price``, e.g. "8 x $2.00: a 3-GPU
    fragment sells at $1.60; after 2 h idle, -10 %/h to $1.00" (typeset with a times and a minus sign)."""
    parts = []
    if rule.lowers_anything and rule.fragment_discount_pct > 0 and divisible and gpus > 1:
        size = example_fragment(gpus)
        fragment = fallen_price(price, rule, free_gpus=size, total_gpus=gpus, idle_hours=0)
        parts.append(f"a {size}-GPU fragment sells at {usd(fragment)}")
    if rule.lowers_anything and rule.idle_step_pct > 0:
        floor = fallen_price(price, rule, free_gpus=gpus, total_gpus=gpus, idle_hours=_AT_FLOOR_HOURS)
        parts.append(f"after {rule.idle_after_hours} h idle, {MINUS}{pct(rule.idle_step_pct)} %/h to {usd(floor)}")
    if not parts:
        return f"{gpus} {TIMES} {usd(price)}: every GPU sells at {usd(price)}, leased or idle"
    return f"{gpus} {TIMES} {usd(price)}: " + "; ".join(parts)


def rule_summary(rule: PriceFallRule) -> str:
    """The rule in a few words for the machines table: "fragments -20 %; idle after 2 h -10 %/h; floor 50 %"."""
    if not rule.lowers_anything:
        return "no price fall"
    parts = []
    if rule.fragment_discount_pct > 0:
        parts.append(f"fragments {MINUS}{pct(rule.fragment_discount_pct)} %")
    if rule.idle_step_pct > 0:
        parts.append(f"idle after {rule.idle_after_hours} h {MINUS}{pct(rule.idle_step_pct)} %/h")
    parts.append(f"floor {pct(rule.floor_pct)} %")
    return "; ".join(parts)


@dataclass(frozen=True)
class IdleStep:
    hours: str  # "under 3 h", "3-4 h" (an en dash), "from 7 h"
    price: Decimal


def idle_steps(*, rule: PriceFallRule, price: Decimal, gpus: int, limit: int = 8) -> list[IdleStep]:
    """The price of a whole idle machine by hours idle, from the list price to the floor (at most ``limit``
    rows; the last one is the floor). The price steps at each whole hour past ``idle_after_hours``."""
    if not rule.lowers_anything or rule.idle_step_pct <= 0:
        return []
    hour = rule.idle_after_hours + 1
    steps = [IdleStep(f"under {hour} h", price)]
    while len(steps) < limit:
        now = fallen_price(price, rule, free_gpus=gpus, total_gpus=gpus, idle_hours=hour)
        later = fallen_price(price, rule, free_gpus=gpus, total_gpus=gpus, idle_hours=hour + 1)
        if now == later:
            return [*steps, IdleStep(f"from {hour} h", now)]
        steps.append(IdleStep(f"{hour}{DASH}{hour + 1} h", now))
        hour += 1
    floor = fallen_price(price, rule, free_gpus=gpus, total_gpus=gpus, idle_hours=_AT_FLOOR_HOURS)
    return [*steps, IdleStep("then down to", floor)]


def moment_text(moment: MachineMoment) -> str:
    """Where the machine stands now, e.g. "6 of 8 GPUs free: its free GPUs sell at $1.52 a GPU-hour ..."."""
    if moment.free_gpus == 0:
        return f"all {moment.total_gpus} GPUs leased: nothing left to sell now"
    state = f"{moment.free_gpus} of {moment.total_gpus} GPUs free"
    if moment.free_gpus == moment.total_gpus:
        state += f", idle {int(moment.idle_hours)} h"
    return f"{state}: its free GPUs sell at {usd(moment.price)} a GPU-hour from the next offer sync"


@dataclass(frozen=True)
class PriceFallView:
    """What the machine's price-falls page shows."""

    summary: str
    example: str  # this machine under its rule
    sample: str  # the sample rule on a sample machine, for a machine with no rule yet
    steps: list[IdleStep]
    fragment: int  # the example fragment's GPUs
    fragment_price: Decimal
    now: str  # where the machine stands, "" with no rule


def price_fall_view(machine: Machine, moment: MachineMoment) -> PriceFallView:
    rule, price, gpus = machine.price_fall, machine.price_per_gpu_hour, machine.gpu_count
    size = example_fragment(gpus)
    return PriceFallView(
        summary=rule_summary(rule),
        example=rule_example(rule=rule, price=price, gpus=gpus, divisible=machine.divisible),
        sample=rule_example(rule=SAMPLE_RULE, price=Decimal("2.00"), gpus=8, divisible=True),
        steps=idle_steps(rule=rule, price=price, gpus=gpus),
        fragment=size,
        fragment_price=fallen_price(price, rule, free_gpus=min(size, gpus), total_gpus=gpus, idle_hours=0),
        now=moment_text(moment) if rule.lowers_anything else "",
    )
