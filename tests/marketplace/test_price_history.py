"""Price history per instance type and region, and the savings a pricing model gives, where buyers decide."""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.catalog.history import price_history, spot_savings
from marketplace.models import Offer, PricePoint
from marketplace.web.charts import price_chart

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"


def _svgs(html: str) -> list[ET.Element]:
    """Every chart in ``html``, parsed: each must be well-formed XML on its own."""
    return [ET.fromstring(svg) for svg in re.findall(r'<svg [^>]*class="chart.*?</svg>', html, flags=re.DOTALL)]  # noqa: S314


def _texts(svg: ET.Element) -> list[str]:
    return [t.text or "" for t in svg.iter(f"{SVG}text")]


def _hover_titles(svg: ET.Element) -> list[str]:
    return [t.text or "" for g in svg.iter(f"{SVG}g") if g.get("class") == "hover" for t in g.iter(f"{SVG}title")]


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
    drawing = price_chart(series, instance_type="g4dn.xlarge", since=since, until=now)
    wide = _svgs(drawing)[0]
    tips = [t for t in _hover_titles(wide) if t.startswith(f"{spot.zone} spot:")]
    assert tips == [
        f"{spot.zone} spot: ${spot.price_usd:.4f}/h from {since:%Y-%m-%d %H:%M} UTC",
        f"{spot.zone} spot: $0.3000/h from {now - dt.timedelta(days=2):%Y-%m-%d %H:%M} UTC",
    ]


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
    # The offers page has one row per instance type, region and pricing model: it shows its cheapest zone's saving.
    lead = Offer.objects.filter(account=aws_account, instance_type="g4dn.xlarge", region="us-east-1",
                                pricing_model="spot").order_by("price_usd", "id")[0]  # fmt: skip
    page = client.get("/", {"gpu": "T4", "pricing": "spot"}, follow=True).content.decode()
    assert f"saves {spot_savings([lead])[lead.pk]} % vs on-demand" in page
    prices = client.get(f"/offers/{spot.pk}/prices", {"days": "7"})
    assert prices.status_code == 200 and prices.context["saving"] is not None
    assert "price-chart" in prices.content.decode()
    assert client.get("/offers/999999/prices").status_code == 404


def test_the_price_chart_reads_without_help_axes_with_units_utc_ticks_a_legend_and_a_tooltip_per_price(
    aws_account, client
):
    spot = _t4(aws_account, "spot")
    now = timezone.now()
    PricePoint.objects.create(offer=spot, observed_at=now - dt.timedelta(days=5), price=Decimal("0.41"),
                              currency="USD", price_usd=Decimal("0.41"))  # fmt: skip
    Offer.objects.filter(pk=spot.pk).update(price_since=now - dt.timedelta(days=1))
    offers = Offer.objects.filter(account=aws_account, instance_type="g4dn.xlarge", region="us-east-1")

    response = client.get(f"/offers/{spot.pk}/prices", {"days": "7"})

    assert response.status_code == 200
    charts = _svgs(response.content.decode())
    assert [c.get("class") for c in charts] == ["chart wide", "chart narrow"]
    for svg in charts:
        assert svg.get("role") == "img" and svg.get("width") == "100%" and svg.get("height") is None
        title_id, desc_id = svg.get("aria-labelledby").split()
        assert svg.find(f"{SVG}title").get("id") == title_id and svg.find(f"{SVG}desc").get("id") == desc_id
        assert svg.find(f"{SVG}title").text == "Price history of g4dn.xlarge"
        assert "one line per zone and pricing model" in svg.find(f"{SVG}desc").text
        assert svg.find(f".//{SVG}style") is None  # matplotlib's would restyle the whole page
        texts = _texts(svg)
        assert "Price (USD/h)" in texts and "Time (UTC)" in texts and "$0.00" in texts
        # Ticks over a week are dates: "Nov 29" or, on the first of a month, the month alone.
        assert any(re.fullmatch(r"[A-Z][a-z]{2}( \d\d)?", t) for t in texts)
        legend = {f"{o.zone} {'spot' if o.pricing_model == 'spot' else 'on-demand'}" for o in offers}
        assert legend <= set(texts)
        tips = _hover_titles(svg)
        assert len(tips) == response.context["points"]
        assert f"{spot.zone} spot: $0.4100/h from {now - dt.timedelta(days=5):%Y-%m-%d %H:%M} UTC" in tips
        assert f"{spot.zone} spot: ${spot.price_usd:.4f}/h from {now - dt.timedelta(days=1):%Y-%m-%d %H:%M} UTC" in tips


def test_a_hostile_zone_name_is_drawn_as_text_never_as_markup_or_a_formula(aws_account, client):
    spot = _t4(aws_account, "spot")
    hostile = "<script>alert(1)</script>$x^2$&amp;"
    Offer.objects.filter(pk=spot.pk).update(zone=hostile)

    response = client.get(f"/offers/{spot.pk}/prices", {"days": "1"})

    page = response.content.decode()
    assert response.status_code == 200
    assert "<script>alert" not in page
    for svg in _svgs(page):
        assert f"{hostile} spot" in _texts(svg)  # the legend shows it verbatim, no mathtext
        assert any(t.startswith(f"{hostile} spot: $") for t in _hover_titles(svg))
        assert not [e for e in svg.iter() if e.tag.rsplit("}", 1)[-1] in ("script", "foreignObject")]
