"""Tax rates as data (``data/tax_rates.csv``, one row per country and date a rate took effect, each with the
official page it comes from), the tax on an amount, and the memo that names the rate on a charge's book entry.

The table is read and validated once per process; a bad row stops the load naming its row number, so a typo in
the data fails at start-up rather than on some buyer's invoice. A country without a row (the United States:
state sales taxes on cloud services vary) has no rate, and the invoice says so.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple

from marketplace.money import from_minor, minor_units

RATES_CSV = Path(__file__).parent / "data" / "tax_rates.csv"
COLUMNS = ["country", "name", "rate", "valid_from", "source"]
NO_TAX_MEMO = "tax none"
REVERSE_CHARGE_MARK = "reverse-charge"


class TaxTableError(ValueError):
    """The rates table is malformed; the message names the row (1 is the header)."""


@dataclass(frozen=True)
class TaxRate:
    country: str  # ISO 3166-1 alpha-2
    name: str  # one word, e.g. VAT, GST (it goes into the book entry's memo)
    rate: Decimal  # a fraction: 0.20 is 20 %
    source: str  # the official page stating it
    # The buyer accounts for the tax (EU reverse charge, ``vat_ids``): the rate is 0 and the invoice says so.
    reverse_charge: bool = False


class MemoTax(NamedTuple):
    """What a charge's memo says about its tax."""

    country: str
    name: str
    rate: Decimal
    reverse_charge: bool


def _country_ok(value: str) -> bool:
    return len(value) == 2 and value.isascii() and value.isalpha() and value.isupper()


def _name_ok(value: str) -> bool:
    return 1 <= len(value) <= 16 and value.isascii() and value.isalnum()


def _rate_of(text: str) -> Decimal | None:
    """A rate written as a plain decimal fraction in [0, 1), else None."""
    if not (0 < len(text) <= 12 and text.isascii()) or not all(c.isdigit() or c == "." for c in text):
        return None
    try:
        rate = Decimal(text)
    except InvalidOperation:
        return None
    return rate if rate.is_finite() and Decimal(0) <= rate < Decimal(1) else None


def load_tax_rates(path: Path = RATES_CSV) -> dict[str, list[tuple[dt.date, TaxRate]]]:
    """Each country's rates, oldest first, with the date each took effect. Raises ``TaxTableError``."""
    table: dict[str, list[tuple[dt.date, TaxRate]]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header != COLUMNS:
            raise TaxTableError(f"{path.name} row 1: the header must be {','.join(COLUMNS)}, not {header}")
        for number, row in enumerate(reader, start=2):
            if len(row) != len(COLUMNS):
                raise TaxTableError(f"{path.name} row {number}: {len(COLUMNS)} columns expected, not {len(row)}")
            country, name, rate_text, valid_text, source = (cell.strip() for cell in row)
            rate = _rate_of(rate_text)
            problem = (
                (not _country_ok(country) and f"country {country!r} is not an ISO 3166-1 alpha-2 code")
                or (not _name_ok(name) and f"name {name!r} must be one word of letters and digits")
                or (rate is None and f"rate {rate_text!r} must be a decimal fraction from 0 to below 1")
                or (not source.startswith("https://") and "source must be the https URL of the official page")
            )
            try:
                valid_from = dt.date.fromisoformat(valid_text)
            except ValueError:
                problem = problem or f"valid_from {valid_text!r} is not a YYYY-MM-DD date"
            if problem:
                raise TaxTableError(f"{path.name} row {number}: {problem}")
            assert rate is not None
            rows = table.setdefault(country, [])
            if any(day == valid_from for day, _ in rows):
                raise TaxTableError(f"{path.name} row {number}: {country} already has a rate from {valid_from}")
            rows.append((valid_from, TaxRate(country=country, name=name, rate=rate, source=source)))
    for rows in table.values():
        rows.sort(key=lambda item: item[0])
    return table


@functools.cache
def _table() -> dict[str, list[tuple[dt.date, TaxRate]]]:
    return load_tax_rates()


def tax_rate_for(country: str, *, on: dt.date) -> TaxRate | None:
    """The rate in force in ``country`` on day ``on`` (the latest row that took effect by then); None for a
    country without a row, or a day before its first."""
    found: TaxRate | None = None
    for valid_from, rate in _table().get(country.strip().upper(), []):
        if valid_from > on:
            break
        found = rate
    return found


def tax_minor(amount_minor: int, rate: TaxRate | None, currency: str = "USD") -> int:
    """The tax on one line of ``amount_minor`` at ``rate``, rounded once by the money rule
    (``marketplace.money.minor_units``: half up); 0 without a rate. A total's tax is the sum of its lines'."""
    if rate is None:
        return 0
    return minor_units(from_minor(amount_minor, currency) * rate.rate, currency)


def reverse_charge_rate(country: str) -> TaxRate:
    """No VAT charged: the business buyer in ``country`` accounts for it (Article 196 of Directive 2006/112/EC)."""
    source = "https://eur-lex.europa.eu/legal-content/EN/ALL/?uri=CELEX:32006L0112"
    return TaxRate(country=country, name="VAT", rate=Decimal(0), source=source, reverse_charge=True)


def tax_memo(rate: TaxRate | None) -> str:
    """What a charge's book entry says about its tax: ``tax GB VAT 0.20``, ``tax DE VAT 0 reverse-charge``, or
    ``tax none``."""
    if rate is None:
        return NO_TAX_MEMO
    memo = f"tax {rate.country} {rate.name} {format(rate.rate, 'f')}"
    return f"{memo} {REVERSE_CHARGE_MARK}" if rate.reverse_charge else memo


def tax_memo_parse(memo: str) -> MemoTax | None:
    """(country, name, rate, reverse_charge) from a ``tax_memo``; None for ``tax none`` and for any other text."""
    parts = memo.split(" ") if len(memo) <= 80 else []
    reverse = len(parts) == 5 and parts[4] == REVERSE_CHARGE_MARK
    if reverse:
        parts = parts[:4]
    if len(parts) != 4 or parts[0] != "tax" or not _country_ok(parts[1]) or not _name_ok(parts[2]):
        return None
    rate = _rate_of(parts[3])
    if rate is None or (reverse and rate != 0):
        return None
    return MemoTax(parts[1], parts[2], rate, reverse)
