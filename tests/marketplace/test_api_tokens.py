"""Scoped API tokens: created in the storefront and shown once, stored hashed, limited to their scopes,
revocable, and never crossing organisations."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create, token_hash
from marketplace.models import ApiToken, Organization

pytestmark = pytest.mark.django_db


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_token_is_shown_once_and_stored_hashed(client, alice):
    client.force_login(alice)
    page = client.post("/tokens/", {"name": "ci-pipeline", "scopes": ["offers:read", "orders:place"]})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    raw = page.context["issued"].raw
    assert raw.startswith("brk_") and raw in page.content.decode()
    token = ApiToken.objects.get()
    assert token.token_hash == token_hash(raw) and raw not in json.dumps([token.prefix, token.token_hash])
    assert raw not in client.get("/tokens/").content.decode()  # never again
    assert client.post("/tokens/", {"name": "x", "scopes": []}).context["form"].errors["scopes"]


def test_scopes_limit_what_a_token_may_do(acme, alice, aws_account, django_capture_on_commit_callbacks):
    reader = api_token_create(organization=acme, user=alice, name="reader", scopes=["offers:read"]).raw
    buyer = api_token_create(organization=acme, user=alice, name="buyer", scopes=["offers:read", "orders:place"]).raw
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    body = {"offer": offer.pk, "max_price_per_hour": str(offer.price_usd + Decimal("0.01"))}

    assert _bearer(reader).get("/api/v1/offers", {"q": "gpu=T4"}).status_code == 200
    refused = _bearer(reader).post("/api/v1/orders", body, format="json")
    assert refused.status_code == 403 and "orders:place" in refused.json()["error"]["message"]
    with django_capture_on_commit_callbacks(execute=True):
        placed = _bearer(buyer).post("/api/v1/orders", body, format="json")
    assert placed.status_code == 201
    order_id = placed.json()["id"]
    # Terminating needs instances:manage; the receipt needs ledger:read.
    assert _bearer(buyer).post(f"/api/v1/orders/{order_id}/terminate").status_code == 403
    assert _bearer(buyer).get(f"/api/v1/orders/{order_id}/receipt").status_code == 403
    assert _bearer(buyer).put("/api/v1/budget", {"budget_per_hour": "1"}, format="json").status_code == 403


def test_a_revoked_or_unknown_token_is_refused_and_tokens_stay_in_their_organisation(client, acme, alice, charlie):
    issued = api_token_create(organization=acme, user=alice, name="old", scopes=["offers:read", "orders:place"])
    assert _bearer(issued.raw).get("/api/v1/orders").status_code == 200
    client.force_login(alice)
    client.post(f"/tokens/{issued.token.pk}/revoke")
    assert _bearer(issued.raw).get("/api/v1/orders").status_code == 401
    assert _bearer("brk_not-a-token").get("/api/v1/offers").status_code == 401
    stranger = Client()
    stranger.force_login(charlie)  # another organisation's member cannot revoke or see it
    assert stranger.post(f"/tokens/{issued.token.pk}/revoke").status_code == 404
    assert issued.token.prefix not in stranger.get("/tokens/").content.decode()
    charlies_org = Organization.objects.get(name="Charlie Labs")
    theirs = api_token_create(organization=charlies_org, user=charlie, name="c", scopes=["orders:place"]).raw
    assert _bearer(theirs).get("/api/v1/orders").json()["results"] == []


def test_last_use_is_recorded_to_the_minute_without_a_write_per_request(acme, alice):
    issued = api_token_create(organization=acme, user=alice, name="ci", scopes=["offers:read"])
    client = _bearer(issued.raw)
    assert client.get("/api/v1/offers").status_code == 200
    first = ApiToken.objects.get().last_used_at
    assert first is not None
    client.get("/api/v1/offers")
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=first - dt.timedelta(minutes=2))
    client.get("/api/v1/offers")
    assert ApiToken.objects.get().last_used_at > first
