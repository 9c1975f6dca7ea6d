from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django import template

from marketplace.billing.credit import money

register = template.Library()


@register.filter
def get_item(mapping: dict[Any, Any], key: Any) -> Any:
    """``mapping[key]`` in a template, None when absent."""
    return mapping.get(key) if mapping else None


@register.filter
def usd(value: Any, places: int = 2) -> str:
    """A money figure with its currency, "$1,234.56 USD" (``places`` decimals, rounded half-even as Decimal
    does); "" for None, and the value as it is when it is not a number."""
    if value is None or value == "":
        return ""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    if not amount.is_finite():
        return str(value)
    return f"${amount:,.{int(places)}f} USD"


@register.filter
def cents_usd(value: Any) -> str:
    """Minor units (cents) as money, "$12.34 USD" (``marketplace.billing.credit.money``)."""
    if value is None or value == "":
        return ""
    try:
        cents = int(value)
    except (TypeError, ValueError):
        return str(value)
    return money(cents)
