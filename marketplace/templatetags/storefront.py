from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django import template

from marketplace.billing.credit import CURRENCY
from marketplace.money import minor_digits, minor_text, minor_units, money_text, rate_text

register = template.Library()


@register.filter
def get_item(mapping: dict[Any, Any], key: Any) -> Any:
    """``mapping[key]`` in a template, None when absent."""
    return mapping.get(key) if mapping else None


@register.filter
def usd(value: Any, places: int = 2) -> str:
    """A US dollar figure with its currency named once: an amount (two places, the cent) is rounded by the one
    money rule, "1,234.56 USD"; a rate with more places keeps them, "0.5188 USD" (``marketplace.money``). ""
    for None, and the value as it is when it is not a number."""
    if value is None or value == "":
        return ""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    if not amount.is_finite():
        return str(value)
    if int(places) == minor_digits(CURRENCY):
        return money_text(minor_units(amount, CURRENCY), CURRENCY)
    return rate_text(amount, CURRENCY, places=int(places))


@register.filter
def cents(value: Any) -> str:
    """Minor units (cents) as a plain figure, "12.34", in a column whose heading names the currency."""
    try:
        return minor_text(int(value), CURRENCY)
    except (TypeError, ValueError):
        return "" if value is None else str(value)


@register.filter
def cents_usd(value: Any) -> str:
    """Minor units (cents) as money, "12.34 USD" (``marketplace.money.money_text``)."""
    if value is None or value == "":
        return ""
    try:
        cents = int(value)
    except (TypeError, ValueError):
        return str(value)
    return money_text(cents, CURRENCY)


@register.filter
def pct(value: Any) -> str:
    """A percentage without trailing zeros: 99.500 -> "99.5", 100.000 -> "100" ("" for None)."""
    if value is None or value == "":
        return ""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
