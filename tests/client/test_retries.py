"""Retries over real sockets: a proxy on 127.0.0.1 between the client and the live broker drops answers or
refuses requests, and the client must retry without doing anything twice."""

from __future__ import annotations

import socket

import pytest
from brokerclient import BrokerClient, RateLimited, ServerError, Unreachable

from ledger.models import LedgerEntry
from marketplace.models import Order
from tests.client.proxy import Proxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(live_server):
    proxy = Proxy(live_server.url)
    yield proxy
    proxy.close()


def _orders_post(method: str, path: str) -> bool:
    return method == "POST" and path == "/api/v1/orders"


def test_an_order_retried_after_its_answer_was_lost_is_placed_once(proxy, token, t4_offer):
    offer, cap = t4_offer
    proxy.drop(_orders_post)
    waits: list[float] = []
    client = BrokerClient(proxy.url, token, retries=2, sleep=waits.append)

    order = client.order(offer=offer.pk, max_price_per_hour=cap)

    # The first try placed the order and its answer was lost; the retry, with the same key, got that order.
    first, retry = proxy.log
    assert (first.method, first.path, first.status, first.dropped, first.replayed) == (
        "POST", "/api/v1/orders", 201, True, False,
    )  # fmt: skip
    assert (retry.status, retry.dropped, retry.replayed) == (200, False, True)
    assert first.idempotency_key == retry.idempotency_key and first.idempotency_key
    assert len(waits) == 1
    placed = Order.objects.get()
    assert order["id"] == str(placed.public_id) and placed.idempotency_key == first.idempotency_key
    assert LedgerEntry.objects.filter(kind="order.placed").count() == 1


def test_each_new_order_gets_its_own_key(proxy, token, t4_offer):
    offer, cap = t4_offer
    client = BrokerClient(proxy.url, token, retries=0)
    client.order(offer=offer.pk, max_price_per_hour=cap)
    client.order(offer=offer.pk, max_price_per_hour=cap)
    keys = [seen.idempotency_key for seen in proxy.log]
    assert len(set(keys)) == 2 and [seen.status for seen in proxy.log] == [201, 201]
    assert Order.objects.count() == 2


def test_a_503_is_retried_after_its_retry_after(proxy, token, t4_offer):
    offer, cap = t4_offer
    proxy.refuse(_orders_post, 503, {"Retry-After": "7"})
    waits: list[float] = []
    client = BrokerClient(proxy.url, token, retries=2, backoff=0.01, sleep=waits.append)

    client.order(offer=offer.pk, max_price_per_hour=cap)

    assert [(s.status, s.refused) for s in proxy.log] == [(503, True), (201, False)]
    assert proxy.log[0].idempotency_key == proxy.log[1].idempotency_key
    assert waits and waits[0] >= 7
    assert Order.objects.count() == 1


def test_retries_run_out_into_an_error_and_a_long_retry_after_is_not_waited_for(proxy, token, t4_offer):
    offer, cap = t4_offer
    proxy.refuse(_orders_post, 502, times=10)
    waits: list[float] = []
    with pytest.raises(ServerError) as raised:
        BrokerClient(proxy.url, token, retries=2, backoff=0.01, sleep=waits.append).order(
            offer=offer.pk, max_price_per_hour=cap
        )
    assert (raised.value.status, raised.value.code) == (502, "http_502")
    assert len(proxy.log) == 3 and len(waits) == 2

    proxy.log.clear()
    proxy.refuse(lambda m, p: True, 429, {"Retry-After": "3600"})
    with pytest.raises(RateLimited) as limited:
        next(BrokerClient(proxy.url, token, retries=2, sleep=waits.append).offers())
    assert limited.value.status == 429 and len(proxy.log) == 1 and len(waits) == 2  # not waited an hour
    assert Order.objects.count() == 0


def test_a_read_whose_answer_is_dropped_is_retried(proxy, token, aws_account):
    proxy.drop(lambda method, path: path == "/api/v1/offers")
    client = BrokerClient(proxy.url, token, retries=1, sleep=lambda s: None)
    offers = list(client.offers("gpu=T4", limit=2))
    assert len(offers) == 2 and [s.dropped for s in proxy.log] == [True, False]


def test_a_broker_that_never_answers_is_unreachable():
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    waits: list[float] = []
    client = BrokerClient(f"http://127.0.0.1:{port}", "brk_x", retries=2, timeout=2, sleep=waits.append)
    with pytest.raises(Unreachable) as raised:
        client.order_get("anything")
    assert (raised.value.status, raised.value.code) == (0, "unreachable") and len(waits) == 2
