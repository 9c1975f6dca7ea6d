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

``quotes_fallen`` applies a machine's fall to the offers the ``community`` adapter built for it: every on-demand
offer of its GPUs (each lease size, each MIG slice) at the fallen GPU-hour price. Interruptible offers keep the
seller's minimum bid, which is an auction's floor and not a list price; one the fallen on-demand price has
reached is left out, since nobody bids more for an interruptible lease than a firm one costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from fractions import Fraction

from providers.community.mig import MIG_PROFILE, mig_profile
from providers.types import OfferQuote, PricingModel

_PRICE_QUANTUM = Decimal("0.0001")
_HUNDRED = Decimal(100)
MAX_IDLE_AFTER_HOURS = 24 * 366


class PriceRuleError(ValueError):
    """A rule's field is out of range; the message names the field, and so does ``field``."""

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.field = field


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
                raise PriceRuleError(f"{name} must be a percentage from 0 to 100, not {value}", field=name)
        hours = self.idle_after_hours
        if isinstance(hours, bool) or not isinstance(hours, int) or not 0 <= hours <= MAX_IDLE_AFTER_HOURS:
            raise PriceRuleError(
                f"idle_after_hours must be 0 to {MAX_IDLE_AFTER_HOURS}, not {hours}", field="idle_after_hours"
            )

    @property
    def lowers_anything(self) -> bool:
        return self.floor_pct < _HUNDRED and (self.fragment_discount_pct > 0 or self.idle_step_pct > 0)


NO_FALL = PriceFallRule()


_PCT_FIELDS = ("fragment_discount_pct", "idle_step_pct", "floor_pct")


def price_fall_rule_read(values: Mapping[str, object]) -> PriceFallRule:
    """The rule a form or a JSON body states: each field text or a number, a field absent, null or empty
    keeping its default (no fall). Raises ``PriceRuleError`` naming the first field that is not a number in
    range, so the portal and the API refuse the same values with the same words."""
    fields: dict[str, object] = {}
    for name in _PCT_FIELDS:
        raw = values.get(name)
        if raw is None or raw == "":
            continue
        if isinstance(raw, bool) or not isinstance(raw, str | int | float | Decimal):
            raise PriceRuleError(f"{name} must be a percentage from 0 to 100", field=name)
        try:
            fields[name] = Decimal(str(raw).strip())
        except ArithmeticError:
            raise PriceRuleError(
                f"{name} must be a percentage from 0 to 100, not {str(raw)[:32]!r}", field=name
            ) from None
    raw = values.get("idle_after_hours")
    if raw is not None and raw != "":
        text = str(raw).strip()
        if (
            isinstance(raw, bool)
            or not isinstance(raw, str | int)
            or not (text.isascii() and text.isdigit() and len(text) <= 8)
        ):
            raise PriceRuleError(
                f"idle_after_hours must be a whole number of hours from 0 to {MAX_IDLE_AFTER_HOURS}, not {text[:32]!r}",
                field="idle_after_hours",
            )
        fields["idle_after_hours"] = int(text)
    return PriceFallRule(**fields)  # type: ignore[arg-type]


def fallen_price(
    list_price: Decimal, rule: PriceFallRule, *, free_gpus: int, total_gpus: int, idle_hours: float
) -> Decimal:
    """The per-GPU-hour price of a machine's free GPUs now, under the seller's ``rule``.

    ``idle_hours`` is how long no GPU of the machine has been leased (0 while any is); a machine with every GPU
    free is whole, never a fragment.
    """
    if not 0 <= free_gpus <= total_gpus or total_gpus <= 0:
        raise PriceRuleError(f"free_gpus {free_gpus} must be within the machine's {total_gpus} GPUs", field="free_gpus")
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


def slice_price(price_per_gpu_hour: Decimal, share: Fraction) -> Decimal:
    """One MIG slice's price: the GPU-hour price times the slice's share of the GPU, rounded half up to the
    listing's four decimals (the ``community`` adapter's slice offers and their falls alike)."""
    return (price_per_gpu_hour * share.numerator / share.denominator).quantize(_PRICE_QUANTUM, ROUND_HALF_UP)


@dataclasses.dataclass(frozen=True)
class MachineMoment:
    """What one machine's price falls by now: its listing's GPU-hour price and rule, its GPUs nobody holds, and
    how long none of them has been leased (0 while any is)."""

    list_price: Decimal
    rule: PriceFallRule
    free_gpus: int
    total_gpus: int
    idle_hours: float

    @property
    def price(self) -> Decimal:
        return fallen_price(
            self.list_price, self.rule, free_gpus=self.free_gpus, total_gpus=self.total_gpus, idle_hours=self.idle_hours
        )


def quotes_fallen(quotes: Sequence[OfferQuote], moments: Mapping[str, MachineMoment]) -> list[OfferQuote]:
    """``quotes`` of independent machines with each machine's fall applied (``moments`` by machine name, the
    quotes' zone); quotes of machines without a moment pass unchanged. On-demand quotes are priced from the
    fallen GPU-hour price as the adapter prices them from the list price; an interruptible quote the fallen
    on-demand price of its lease size has reached is left out."""
    fallen: list[OfferQuote] = []
    on_demand: dict[tuple[str, str], Decimal] = {}
    for quote in quotes:
        moment = moments.get(quote.zone)
        if moment is None or quote.pricing_model != PricingModel.ON_DEMAND:
            fallen.append(quote)
            continue
        price = moment.price
        profile = quote.extra.get(MIG_PROFILE)
        if profile:
            shape = mig_profile(quote.gpu_model, str(profile))
            new = quote.price if shape is None else slice_price(price, shape.share)
        else:
            new = price * quote.gpu_count
        on_demand[(quote.zone, quote.instance_type)] = new
        fallen.append(dataclasses.replace(quote, price=new))
    return [
        q
        for q in fallen
        if q.pricing_model != PricingModel.SPOT
        or q.zone not in moments
        or q.price < on_demand.get((q.zone, q.instance_type), q.price + 1)
    ]
