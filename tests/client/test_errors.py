"""API errors reach the caller as BrokerError subclasses with the broker's status, code, message and fields,
and a refused request changes nothing."""

from __future__ import annotations

import uuid

import pytest
from brokerclient import (
    AuthenticationFailed,
    BrokerClient,
    BrokerError,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)

from marketplace.api.tokens import api_token_create
from marketplace.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_unknown_order_is_not_found(broker):
    with pytest.raises(NotFound) as raised:
        broker.order_get(str(uuid.uuid4()))
    assert (raised.value.status, raised.value.code, raised.value.message) == (404, "not_found", "no such order")


def test_invalid_fields_and_queries_name_the_field(broker, aws_account):
    with pytest.raises(InvalidRequest) as raised:
        broker.quote({"profile": "mining", "gpu_count": 0})
    assert (raised.value.status, raised.value.code) == (400, "invalid")
    assert set(raised.value.fields) == {"profile", "gpu_count"}
    assert "profile" in raised.value.describe()

    with pytest.raises(InvalidRequest) as query:
        list(broker.offers("gpu=T4 cuont>=1"))
    assert "cuont" in str(query.value.fields["q"])


def test_a_key_reused_for_another_order_is_a_conflict(broker, t4_offer):
    offer, cap = t4_offer
    broker.order(offer=offer.pk, max_price_per_hour=cap, idempotency_key="batch-7")
    again = broker.order(offer=offer.pk, max_price_per_hour=cap, idempotency_key="batch-7")
    with pytest.raises(Conflict) as raised:
        broker.order(offer=offer.pk, max_price_per_hour=cap + 1, idempotency_key="batch-7")
    assert (raised.value.status, raised.value.code) == (409, "idempotency_conflict")
    assert Order.objects.count() == 1 and again["id"] == str(Order.objects.get().public_id)


def test_a_token_without_the_scope_or_unknown_is_refused(live_server, acme, alice, t4_offer):
    offer, cap = t4_offer
    reader = api_token_create(organization=acme, user=alice, name="reader", scopes=["offers:read"]).raw
    with pytest.raises(PermissionDenied) as denied:
        BrokerClient(live_server.url, reader).order(offer=offer.pk, max_price_per_hour=cap)
    assert denied.value.status == 403 and "orders:place" in denied.value.message
    with pytest.raises(AuthenticationFailed) as unknown:
        next(BrokerClient(live_server.url, "brk_not-a-token").offers())
    assert (unknown.value.status, unknown.value.code) == (401, "token_unknown")
    assert isinstance(unknown.value, BrokerError)
    assert Order.objects.count() == 0
