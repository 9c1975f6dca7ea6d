"""Rate limits per token: a token past its limit gets 429 with Retry-After; other tokens and users do not."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def limited(settings, throttle_mid_window):
    settings.API_RATES = {"read": "3/min", "write": "2/min"}
    cache.clear()
    yield
    cache.clear()


def _bearer(acme, user, name):
    raw = api_token_create(organization=acme, user=user, name=name, scopes=["offers:read", "orders:place"]).raw
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_token_past_its_limit_is_refused_with_retry_after(limited, acme, alice):
    first, second = _bearer(acme, alice, "ci"), _bearer(acme, alice, "dashboard")
    assert [first.get("/api/v1/offers").status_code for _ in range(3)] == [200] * 3
    refused = first.get("/api/v1/offers")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "throttled"
    assert 0 < int(refused["Retry-After"]) <= 60
    # Another token of the same organisation and the same person signed in keep their own buckets.
    assert second.get("/api/v1/offers").status_code == 200
    session = APIClient()
    session.force_authenticate(alice)
    assert session.get("/api/v1/offers").status_code == 200


def test_writes_are_counted_apart_from_reads(limited, acme, alice):
    client = _bearer(acme, alice, "ci")
    writes = [client.post("/api/v1/quotes", {"profile": "inference"}, format="json").status_code for _ in range(3)]
    assert writes[:2] == [201, 201] and writes[2] == 429
    assert client.get("/api/v1/offers").status_code == 200


def test_anonymous_callers_are_limited_by_address(limited):
    public = APIClient()
    assert [public.get("/api/v1/ledger/key").status_code for _ in range(3)] == [200] * 3
    assert public.get("/api/v1/ledger/key").status_code == 429
