"""The storefront's money figures carry their currency (issue 21, point 3): the ``usd`` template filter."""

from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace.templatetags.storefront import usd


@pytest.mark.parametrize(
    ("value", "places", "shown"),
    [
        (Decimal("12000.5"), 2, "12,000.50 USD"),
        (Decimal("0.51875"), 4, "0.5188 USD"),
        ("7.6", 2, "7.60 USD"),
        (0, 2, "0.00 USD"),
        (None, 2, ""),
        ("n/a", 2, "n/a"),
        (Decimal("NaN"), 2, "NaN"),
    ],
)
def test_a_money_figure_shows_its_currency(value, places, shown):
    assert usd(value, places) == shown
