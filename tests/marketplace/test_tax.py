"""Tax rates as data (issue 22): the rate in force on a day, a country without one, half-up rounding, the memo
a charge's book entry carries, and a malformed table refused at load naming its row."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from marketplace.billing.tax import (
    TaxRate,
    TaxTableError,
    load_tax_rates,
    reverse_charge_rate,
    tax_memo,
    tax_memo_parse,
    tax_minor,
    tax_rate_for,
)

GB = TaxRate(country="GB", name="VAT", rate=Decimal("0.20"), source="https://www.gov.uk/vat-rates")


@pytest.mark.parametrize(
    ("country", "day", "rate"),
    [
        ("GB", dt.date(2026, 11, 30), Decimal("0.20")),
        ("gb", dt.date(2026, 11, 30), Decimal("0.20")),
        ("CH", dt.date(2023, 12, 31), Decimal("0.077")),
        ("CH", dt.date(2024, 1, 1), Decimal("0.081")),
        ("SG", dt.date(2023, 6, 1), Decimal("0.08")),
        ("SG", dt.date(2024, 1, 1), Decimal("0.09")),
        ("DE", dt.date(2020, 8, 1), Decimal("0.16")),
        ("DE", dt.date(2021, 1, 1), Decimal("0.19")),
        ("JP", dt.date(2026, 1, 1), Decimal("0.10")),
    ],
)
def test_the_rate_is_the_latest_one_in_force_on_the_day(country, day, rate):
    found = tax_rate_for(country, on=day)

    assert found is not None and found.rate == rate and found.country == country.upper()
    assert found.source.startswith("https://")


def test_a_country_without_a_row_or_a_day_before_its_first_has_no_rate():
    assert tax_rate_for("US", on=dt.date(2026, 11, 1)) is None
    assert tax_rate_for("CH", on=dt.date(2017, 12, 31)) is None
    assert tax_rate_for("", on=dt.date(2026, 11, 1)) is None


def test_every_row_of_the_shipped_table_names_its_official_source():
    table = load_tax_rates()

    asked = "GB DE FR NL IE ES IT SE PL CH NO JP AU NZ SG IN CA".split()
    assert set(asked) <= set(table)
    assert all(rate.source.startswith("https://") for rows in table.values() for _, rate in rows)


@pytest.mark.parametrize(
    ("amount", "expected"),
    [(1000, 200), (2, 0), (3, 1), (7, 1), (8, 2), (12, 2), (-3, -1), (0, 0)],
)
def test_tax_rounds_half_up_to_the_minor_unit(amount, expected):
    # 20 % of 3 is 0.6 -> 1; of 2 it is 0.4 -> 0; of 7 it is 1.4 -> 1; a half rounds up (away from zero).
    assert tax_minor(amount, GB) == expected


def test_an_exact_half_rounds_up():
    half = TaxRate(country="XX", name="T", rate=Decimal("0.5"), source="https://example.org")

    assert (tax_minor(1, half), tax_minor(3, half), tax_minor(-1, half)) == (1, 2, -1)
    assert tax_minor(1000, None) == 0


def test_the_memo_names_the_rate_and_parses_back():
    swiss = tax_rate_for("CH", on=dt.date(2024, 2, 1))

    assert tax_memo(GB) == "tax GB VAT 0.20"
    assert tax_memo(swiss) == "tax CH VAT 0.081"
    assert tax_memo(None) == "tax none"
    assert tax_memo_parse("tax GB VAT 0.20") == ("GB", "VAT", Decimal("0.20"), False)
    assert tax_memo_parse("tax CH VAT 0.081") == ("CH", "VAT", Decimal("0.081"), False)
    assert tax_memo(reverse_charge_rate("DE")) == "tax DE VAT 0 reverse-charge"
    assert tax_memo_parse("tax DE VAT 0 reverse-charge") == ("DE", "VAT", Decimal(0), True)
    malformed = ["tax none", "", "tax GB VAT", "tax gb VAT 0.2", "tax GB VAT 1.5", "tax GB VAT NaN", "x" * 500]
    for other in [*malformed, "tax DE VAT 0.19 reverse-charge", "tax DE VAT 0 reverse"]:
        assert tax_memo_parse(other) is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("GBR,VAT,0.20,2011-01-04,https://www.gov.uk/vat-rates", "row 3: country 'GBR'"),
        ("FR,VAT,20%,2014-01-01,https://example.org", "row 3: rate '20%'"),
        ("FR,VAT,1.20,2014-01-01,https://example.org", "row 3: rate '1.20'"),
        ("FR,VAT,0.20,2014-13-01,https://example.org", "row 3: valid_from '2014-13-01'"),
        ("FR,V A T,0.20,2014-01-01,https://example.org", "row 3: name 'V A T'"),
        ("FR,VAT,0.20,2014-01-01,http://example.org", "row 3: source must be"),
        ("GB,VAT,0.175,2011-01-04,https://example.org", "row 3: GB already has a rate from 2011-01-04"),
        ("FR,VAT,0.20", "row 3: 5 columns expected"),
    ],
)
def test_a_bad_row_stops_the_load_naming_its_number(tmp_path, row, message):
    table = tmp_path / "rates.csv"
    table.write_text(
        f"country,name,rate,valid_from,source\nGB,VAT,0.20,2011-01-04,https://www.gov.uk/vat-rates\n{row}\n"
    )

    with pytest.raises(TaxTableError, match=message):
        load_tax_rates(table)


def test_a_table_with_another_header_is_refused(tmp_path):
    table = tmp_path / "rates.csv"
    table.write_text("country,rate\nGB,0.20\n")

    with pytest.raises(TaxTableError, match="row 1: the header"):
        load_tax_rates(table)
