"""One offer, and its price history, through the API: for tools that watch a price before they buy."""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer
from providers.services import adapter_for_account

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(acme, alice) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {_token(acme, alice, ['offers:read'])}")
    return client


def _token(acme, alice, scopes) -> str:
    return api_token_create(organization=acme, user=alice, name="t", scopes=scopes).raw


def test_one_offer_reads_as_it_does_in_the_list(api, aws_account):
    listed = api.get("/api/v1/offers", {"limit": 1}).json()["results"][0]

    assert api.get(f"/api/v1/offers/{listed['id']}").json() == listed
    for missing in ("999999999", "abc", "٣", "9" * 30):
        response = api.get(f"/api/v1/offers/{missing}")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_the_price_history_shows_each_price_from_when_it_took_effect(api, aws_account):
    quotes = adapter_for_account(aws_account).list_offers()
    offer = Offer.objects.filter(account=aws_account, pricing_model="spot").order_by("id").first()
    key = (offer.region, offer.zone, offer.instance_type, offer.pricing_model)
    first_seen = offer.price_since
    changed_at = first_seen + dt.timedelta(hours=1)
    cheaper = [dataclasses.replace(q, price=q.price / 2) if q.natural_key == key else q for q in quotes]
    offers_ingest(account=aws_account, quotes=cheaper, now=changed_at)

    body = api.get(f"/api/v1/offers/{offer.pk}/prices", {"days": "7"}).json()

    assert body["offer"] == offer.pk
    prices = [(p["from"], Decimal(p["price_usd"])) for p in body["prices"]]
    assert [price for _, price in prices] == [offer.price_usd, (offer.price / 2).quantize(Decimal("0.000001"))]
    assert dt.datetime.fromisoformat(prices[1][0].replace("Z", "+00:00")) == changed_at
    assert dt.datetime.fromisoformat(prices[0][0].replace("Z", "+00:00")) == first_seen  # first seen in the window


def test_days_out_of_range_is_a_400_naming_it_and_the_scope_is_needed(api, acme, alice, aws_account):
    offer = Offer.objects.filter(account=aws_account).first()
    for days in ("0", "366", "week"):
        response = api.get(f"/api/v1/offers/{offer.pk}/prices", {"days": days})
        assert response.status_code == 400 and "days" in response.json()["error"]["fields"]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {_token(acme, alice, ['orders:place'])}")
    assert other.get(f"/api/v1/offers/{offer.pk}").status_code == 403
