"""Price history per instance type and region, and the savings a pricing model gives, where buyers decide."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.catalog.history import chart, price_history, spot_savings
from marketplace.models import Offer, PricePoint

pytestmark = pytest.mark.django_db


def _t4(aws_account, pricing_model):
    return aws_account.offers.filter(
        instance_type="g4dn.xlarge", region="us-east-1", pricing_model=pricing_model
    ).order_by("zone")[0]


def test_history_holds_each_price_until_the_next_and_starts_at_the_price_then(aws_account):
    spot = _t4(aws_account, "spot")
    now = timezone.now()
    # Two earlier prices: one that ended before the window opened and one in force when it opened.
    PricePoint.objects.create(offer=spot, observed_at=now - dt.timedelta(days=60), price=Decimal("0.50"),
                              currency="USD", price_usd=Decimal("0.50"))  # fmt: skip
    PricePoint.objects.create(offer=spot, observed_at=now - dt.timedelta(days=40), price=spot.price,
                              currency=spot.currency, price_usd=spot.price_usd)  # fmt: skip
    Offer.objects.filter(pk=spot.pk).update(
        price=Decimal("0.30"), price_usd=Decimal("0.30"), price_since=now - dt.timedelta(days=2)
    )
    since = now - dt.timedelta(days=30)
    series = price_history(account_id=aws_account.pk, instance_type="g4dn.xlarge", region="us-east-1", since=since)
    (line,) = [s for s in series if s.zone == spot.zone and s.pricing_model == "spot"]
    assert [p for _, p in line.points] == [spot.price_usd, Decimal("0.30")]
    assert line.points[0][0] == since  # the price in force when the window opens
    geometry = chart(series, since=since, until=now)
    drawn = next(ln for ln in geometry["lines"] if ln["zone"] == spot.zone and ln["pricing_model"] == "spot")
    assert drawn["points"].count(",") == 4  # start, step across, change, held to the right edge
    assert drawn["latest"] == Decimal("0.30")


def test_a_price_unchanged_through_the_window_is_one_level_line_and_a_new_offer_starts_when_first_seen(aws_account):
    spot, on_demand = _t4(aws_account, "spot"), _t4(aws_account, "on_demand")
    now = timezone.now()
    since = now - dt.timedelta(days=7)
    Offer.objects.filter(pk=spot.pk).update(price_since=now - dt.timedelta(days=90))
    PricePoint.objects.create(offer=spot, observed_at=now - dt.timedelta(days=120), price=Decimal("0.50"),
                              currency="USD", price_usd=Decimal("0.50"))  # fmt: skip
    series = price_history(account_id=aws_account.pk, instance_type="g4dn.xlarge", region="us-east-1", since=since)
    lines = {(s.zone, s.pricing_model): s.points for s in series}
    assert lines[(spot.zone, "spot")] == [(since, spot.price_usd)]
    assert lines[(on_demand.zone, "on_demand")] == [(on_demand.price_since, on_demand.price_usd)]
    assert on_demand.price_since > since


def test_spot_offers_show_what_they_save_against_on_demand(aws_account, client):
    spot, on_demand = _t4(aws_account, "spot"), _t4(aws_account, "on_demand")
    cheapest_on_demand = min(
        Offer.objects.filter(account=aws_account, instance_type="g4dn.xlarge", region="us-east-1",
                             pricing_model="on_demand").values_list("price_usd", flat=True)
    )  # fmt: skip
    saving = spot_savings([spot, on_demand])
    assert saving == {spot.pk: int((1 - spot.price_usd / cheapest_on_demand) * 100)} and 0 < saving[spot.pk] < 100
    page = client.get("/", {"gpu": "T4", "pricing": "spot"}).content.decode()
    assert f"saves {saving[spot.pk]} % vs on-demand" in page
    prices = client.get(f"/offers/{spot.pk}/prices", {"days": "7"})
    assert prices.status_code == 200 and prices.context["saving"] is not None
    assert "price-chart" in prices.content.decode()
    assert client.get("/offers/999999/prices").status_code == 404
