"""The offer search language: parsing with errors that point at the term, and filtering real offers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.catalog.query import QueryError, offers_search, parse


def test_a_query_parses_into_terms():
    terms = parse("gpu=H100,a100 count>=8  region=eu price<40 pricing=spot reliability>0.95")
    assert [(t.field, t.op, t.value, t.column) for t in terms] == [
        ("gpu", "=", ("H100", "a100"), 1),
        ("count", ">=", Decimal(8), 15),
        ("region", "=", "eu", 25),
        ("price", "<", Decimal(40), 35),
        ("pricing", "=", "spot", 44),
        ("reliability", ">", Decimal("0.95"), 57),
    ]


@pytest.mark.parametrize(
    "text, column, term, reason",
    [
        ("gpu=H100 cuont>=8", 10, "cuont>=8", "unknown field 'cuont'"),
        ("count>=eight", 1, "count>=eight", "count compares with a number"),
        ("gpu>H100", 1, "gpu>H100", "gpu takes = or !=, not >"),
        ("pricing=cheap", 1, "pricing=cheap", "pricing is on_demand or spot"),
        ("reliability>95", 1, "reliability>95", "share from 0 to 1"),
        ("H100", 1, "H100", "field, operator, value"),
        ("price<", 1, "price<", "needs a value"),
        ("provider=oracle", 1, "provider=oracle", "provider is one of aws"),
    ],
)
def test_a_wrong_term_is_named_with_its_column(text, column, term, reason):
    with pytest.raises(QueryError) as error:
        parse(text)
    assert (error.value.column, error.value.term) == (column, term)
    assert reason in error.value.reason


@pytest.mark.django_db
def test_searches_filter_and_sort_the_offers_for_sale(aws_account, tencent_account):
    now = timezone.now()
    found = offers_search("gpu=T4 count=1 pricing=on_demand", now=now, sort="price")
    assert found and all((o.gpu_model.key, o.gpu_count, o.pricing_model) == ("T4", 1, "on_demand") for o in found)
    assert [o.price_usd for o in found] == sorted(o.price_usd for o in found)
    china = offers_search("region=cn", now=now)
    assert china and {o.account.kind for o in china} == {"tencent"}
    assert not offers_search("region=cn provider=aws", now=now)
    assert all(o.region == "eu-west-1" for o in offers_search("region=eu-west-1", now=now))
    cheap = offers_search("gpuprice<=1 count>=4", now=now, sort="gpuprice")
    assert cheap and all(o.price_usd / o.gpu_count <= 1 and o.gpu_count >= 4 for o in cheap)
    assert offers_search("reliability>=0.95", now=now) and not offers_search("reliability>0.96", now=now)
    assert {o.gpu_model.key for o in offers_search("gpu!=T4 count=1", now=now)}.isdisjoint({"T4"})
    by_tflops = offers_search("gpu=A100,H100", now=now, sort="tflops")
    per_tflop = [o.price_usd / (o.gpu_count * o.gpu_model.fp16_dense_tflops) for o in by_tflops]
    assert per_tflop == sorted(per_tflop)


@pytest.mark.django_db
def test_the_api_and_the_storefront_speak_the_same_language(alice, client, aws_account):
    api = APIClient()
    api.force_authenticate(alice)
    ok = api.get("/api/v1/offers", {"q": "gpu=T4 pricing=spot", "sort": "gpuprice"})
    assert ok.status_code == 200 and {r["pricing_model"] for r in ok.json()["results"]} == {"spot"}
    bad = api.get("/api/v1/offers", {"q": "gpu=T4 cuont>=8"})
    assert bad.status_code == 400
    assert "unknown field 'cuont'" in bad.json()["error"]["fields"]["q"][0]
    assert "column 8" in bad.json()["error"]["fields"]["q"][0]

    client.force_login(alice)
    page = client.get("/", {"q": "gpu=T4 cuont>=8"}).content.decode()
    assert "unknown field" in page and "column 8" in page and "cuont&gt;=8" in page
    page = client.get("/", {"q": "gpu=T4 pricing=spot"})
    assert page.status_code == 200 and all(o.pricing_model == "spot" for o in page.context["offers"])


@pytest.mark.django_db
def test_a_listing_whose_every_unit_is_held_is_not_for_sale_until_one_is_released(alice):
    import datetime as dt

    from marketplace.catalog.services import offers_ingest
    from marketplace.models import Offer
    from providers.types import PricingModel
    from tests.factories import ProviderAccountFactory, listed_quotes

    rows = [("box-8x", "A100-80GB-SXM4", 8, 80, "9.5", "us-east-1", PricingModel.ON_DEMAND, 2)]
    offers_ingest(account=ProviderAccountFactory(), quotes=listed_quotes(rows), now=timezone.now() - dt.timedelta(1))
    listing = Offer.objects.get()
    Offer.objects.update(last_seen_at=timezone.now())
    api = APIClient()
    api.force_authenticate(alice)

    def listed() -> bool:
        ids = [row["id"] for row in api.get("/api/v1/offers", {"q": "count>=8"}).json()["results"]]
        return listing.pk in ids and listing in offers_search("count>=8", now=timezone.now())

    assert listed()
    Offer.objects.update(reserved=2)
    assert not listed() and not api.get("/api/v1/offers").json()["results"]
    Offer.objects.update(reserved=1)
    assert listed()
