"""Money's one rounding rule and its one way of being shown (issue 35, point 5).

The rule: **an amount is rounded once, to its currency's minor unit, half up (half a cent goes away from zero),
when it becomes a line; a total is the sum of its rounded lines**, never a rounding of the unrounded sum. So
every total shown equals the sum of the lines shown, and the book, the API, the storefront, invoices and
receipts carry the same figures. ``minor_units`` is the only function that rounds an amount (a hold or a cap,
which must cover a charge, rounds up with ``minor_units_covering``, and is never shown as a line); everything
that shows one goes through ``money_text`` (or ``minor_text`` for JSON and CSV), which only formats.

Why half up rather than half to even (banker's rounding): the book has charged every order this way since it
was opened, so the record and what is shown agree without re-posting a single entry; it is what a buyer gets
checking a line by hand, and what tax authorities' invoice rules expect. Half to even only pays off when
rounded figures are rounded again in a sum; here a total is an exact sum of integers, so each line is off by at
most half a minor unit, and that line is what was charged.

A figure names its currency once, by its ISO 4217 code after the amount ("1,234.56 USD"): a "$" beside the code
would say it twice, and alone it would not tell US from other dollars.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

ROUNDING = ROUND_HALF_UP
# Currencies whose minor unit is not a hundredth, from the ISO 4217 list kept by its maintenance agency
# (https://www.six-group.com/en/products-services/financial-information/data-standards.html); every other
# code has two decimals. Stripe's own list of zero-decimal currencies agrees for those it takes
# (https://docs.stripe.com/currencies#zero-decimal).
_DIGITS = {
    **dict.fromkeys(["BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
                     "VUV", "XAF", "XOF", "XPF"], 0),
    **dict.fromkeys(["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"], 3),
    **dict.fromkeys(["CLF", "UYW"], 4),
}  # fmt: skip


def minor_digits(currency: str) -> int:
    """How many decimals ``currency``'s minor unit has (2 for USD, 0 for JPY). Raises ``ValueError`` for text
    that is no ISO 4217 code."""
    if not (len(currency) == 3 and currency.isascii() and currency.isalpha() and currency.isupper()):
        raise ValueError(f"a currency is three upper-case letters (ISO 4217), not {currency!r}")
    return _DIGITS.get(currency, 2)


def minor_units(amount: Decimal, currency: str) -> int:
    """``amount`` (major units, e.g. a metered 0.045 USD) as whole minor units of ``currency`` (5 cents): the one
    place an amount is rounded, half up. Raises ``ValueError`` for an amount that is not a finite Decimal (a
    float has already been rounded in binary)."""
    if not isinstance(amount, Decimal) or not amount.is_finite():
        raise ValueError(f"an amount is a finite Decimal, not {amount!r}")
    return int(amount.scaleb(minor_digits(currency)).to_integral_value(rounding=ROUNDING))


def minor_units_covering(amount: Decimal, currency: str) -> int:
    """The fewest whole minor units that cover ``amount`` (rounded up): for a hold or a cap, which must not fall
    short of the charge it stands for. Never a line or a total shown as owed; those are ``minor_units``."""
    if not isinstance(amount, Decimal) or not amount.is_finite():
        raise ValueError(f"an amount is a finite Decimal, not {amount!r}")
    return int(amount.scaleb(minor_digits(currency)).to_integral_value(rounding=ROUND_CEILING))


def lines_total(lines_minor: Iterable[int]) -> int:
    """A total: the sum of lines already rounded by ``minor_units``."""
    return sum(lines_minor, 0)


def from_minor(amount_minor: int, currency: str) -> Decimal:
    """Minor units back to an exact Decimal amount with the currency's decimals (5 -> Decimal("0.05"))."""
    return Decimal(amount_minor).scaleb(-minor_digits(currency))


def minor_text(amount_minor: int, currency: str) -> str:
    """Minor units as a plain decimal ("-1234.50"), for JSON and CSV, where the currency has a field of its own."""
    return format(from_minor(amount_minor, currency), "f")


def money_text(amount_minor: int, currency: str) -> str:
    """Minor units as a person reads them, the currency named once: "1,234.56 USD", "-0.05 USD", "1,200 JPY"."""
    return f"{from_minor(amount_minor, currency):,f} {currency}"


def rate_text(rate: Decimal, currency: str, *, places: int) -> str:
    """A price per unit (per hour, per GPU-hour) with ``places`` decimals and its currency once: "1.0060 USD".
    A rate is not an amount owed and keeps more decimals than the minor unit; it rounds by the same rule."""
    return f"{rate.quantize(Decimal(1).scaleb(-places), rounding=ROUNDING):,f} {currency}"
