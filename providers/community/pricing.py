"""Price falls a seller accepts for an independent machine: its leftover fragments and its idle hours sell cheaper.

A machine listed at ``price_per_gpu_hour`` keeps that price while it is whole and busy. Two rules, both the
seller's choice (none by default), lower the price of what would otherwise sit unsold:

- **fragment**: when some of its GPUs are leased and some are free, the free ones are a fragment that only a
  small job can use; they sell ``fragment_discount_pct`` below the list price.
- **idle**: after ``idle_after_hours`` with no GPU of the machine leased, the price falls by
  ``idle_step_pct`` for every further hour idle.

Both together never take the price below ``floor_pct`` of the list price, and the result is rounded down to a
hundredth of a cent (the machine's price column holds four decimals). Pure: no database, no clock; the catalogue
and the market benchmark call it alike.
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_DOWN, Decimal

_PRICE_QUANTUM = Decimal("0.0001")
_HUNDRED = Decimal(100)


class PriceRuleError(ValueError):
    """A rule's field is out of range; the message names the field."""


@dataclasses.dataclass(frozen=True)
class PriceFallRule:
    """What a seller accepts; every percentage is of the list price, 0 to 100."""

    fragment_discount_pct: Decimal = Decimal(0)
    idle_after_hours: int = 0
    idle_step_pct: Decimal = Decimal(0)
    floor_pct: Decimal = Decimal(100)

    def __post_init__(self) -> None:
        for name in ("fragment_discount_pct", "idle_step_pct", "floor_pct"):
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite() or not 0 <= value <= _HUNDRED:
                raise PriceRuleError(f"{name} must be a percentage from 0 to 100, not {value!r}")
        if isinstance(self.idle_after_hours, bool) or not 0 <= self.idle_after_hours <= 24 * 366:
            raise PriceRuleError(f"idle_after_hours must be 0 to {24 * 366}, not {self.idle_after_hours!r}")

    @property
    def lowers_anything(self) -> bool:
        return self.floor_pct < _HUNDRED and (self.fragment_discount_pct > 0 or self.idle_step_pct > 0)


NO_FALL = PriceFallRule()


def fallen_price(
    list_price: Decimal, rule: PriceFallRule, *, free_gpus: int, total_gpus: int, idle_hours: float
) -> Decimal:
    """The per-GPU-hour price of a machine's free GPUs now, under the seller's ``rule``.

    ``idle_hours`` is how long no GPU of the machine has been leased (0 while any is); a machine with every GPU
    free is whole, never a fragment.
    """
    if not 0 <= free_gpus <= total_gpus or total_gpus <= 0:
        raise PriceRuleError(f"free_gpus {free_gpus} must be within the machine's {total_gpus} GPUs")
    if not rule.lowers_anything:
        return list_price
    off = Decimal(0)
    if 0 < free_gpus < total_gpus:
        off += rule.fragment_discount_pct
    if free_gpus == total_gpus and rule.idle_step_pct > 0:
        hours_past = int(max(0.0, idle_hours) - rule.idle_after_hours)
        if hours_past > 0:
            off += rule.idle_step_pct * hours_past
    share = max(rule.floor_pct, _HUNDRED - off) / _HUNDRED
    return (list_price * share).quantize(_PRICE_QUANTUM, rounding=ROUND_DOWN)
