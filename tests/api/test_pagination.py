"""Cursor pagination: every row once, in order, whatever the page size, ties and rows arriving between pages."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.models import Offer, Order

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _walk(api, path, params, *, limit):
    """Every page of a listing, following next_cursor; returns the ids and the pages' sizes."""
    ids, sizes, cursor = [], [], None
    while True:
        response = api.get(path, {**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.json()
        body = response.json()
        ids += [row["id"] for row in body["results"]]
        sizes.append(len(body["results"]))
        cursor = body["next_cursor"]
        assert (cursor is None) == (body["next"] is None)
        if cursor is None:
            return ids, sizes


def _tie(offer: Offer, copies: int) -> None:
    """Offers at exactly ``offer``'s price, so the ordering must fall back on the id."""
    zone = offer.zone
    for i in range(copies):
        offer.pk, offer.zone = None, f"{zone}-tie{i}"
        offer.save()


@pytest.mark.parametrize("sort", ["price", "gpuprice", "tflops", "score"])
@pytest.mark.parametrize("limit", [1, 7, 500])
def test_pages_cover_the_listing_once_in_order(api, aws_account, tencent_account, sort, limit):
    _tie(Offer.objects.order_by("price_usd").first(), 4)
    everything = api.get("/api/v1/offers", {"sort": sort, "limit": 500}).json()
    assert everything["next_cursor"] is None
    expected = [row["id"] for row in everything["results"]]
    assert len(expected) > 20
    ids, sizes = _walk(api, "/api/v1/offers", {"sort": sort}, limit=limit)
    assert ids == expected
    assert all(size == limit for size in sizes[:-1]) and 0 < sizes[-1] <= limit


def test_a_search_pages_like_the_plain_listing(api, aws_account, tencent_account):
    expected = [row["id"] for row in api.get("/api/v1/offers", {"q": "count>=2", "limit": 500}).json()["results"]]
    ids, _ = _walk(api, "/api/v1/offers", {"q": "count>=2"}, limit=3)
    assert ids == expected and len(ids) > 3
    assert all(o.gpu_count >= 2 for o in Offer.objects.filter(pk__in=ids))


def test_rows_arriving_between_pages_are_neither_repeated_nor_lost(api, aws_account):
    first = api.get("/api/v1/offers", {"limit": 5}).json()
    seen = [row["id"] for row in first["results"]]
    cheapest = Offer.objects.get(pk=seen[0])
    _tie(cheapest, 1)  # sorts before the cursor: a later page must not show it
    priciest = Offer.objects.order_by("-price_usd").first()
    _tie(priciest, 1)  # sorts after: a later page must show it
    rest, _ = _walk(api, "/api/v1/offers", {"cursor": first["next_cursor"]}, limit=100)
    assert not set(rest) & set(seen)
    newest = Offer.objects.order_by("-id")[:2]
    assert newest[0].pk in rest and newest[1].pk not in rest


@pytest.mark.parametrize("cursor", ["garbage", "eyJ0IjoieCIsInYiOlsiMSIsIjIiXX0", "eyJ0Ijp7fX0", "%%%", "e30"])
def test_a_cursor_that_is_not_one_is_refused_by_name(api, aws_account, cursor):
    response = api.get("/api/v1/offers", {"cursor": cursor})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert "not a cursor of this listing" in response.json()["error"]["fields"]["cursor"][0]


def test_a_cursor_belongs_to_its_listing(api, aws_account):
    by_price = api.get("/api/v1/offers", {"limit": 2}).json()["next_cursor"]
    other_sort = api.get("/api/v1/offers", {"limit": 2, "sort": "gpuprice", "cursor": by_price})
    other_search = api.get("/api/v1/offers", {"limit": 2, "q": "count>=2", "cursor": by_price})
    assert other_sort.status_code == other_search.status_code == 400


@pytest.mark.parametrize("limit", ["0", "501", "ten", "-1", "²", "\uff11\uff10"])
def test_a_limit_out_of_range_is_refused(api, aws_account, limit):
    response = api.get("/api/v1/offers", {"limit": limit})
    assert response.status_code == 400 and "limit" in response.json()["error"]["fields"]


def test_orders_page_newest_first_and_stay_in_their_organisation(api, acme, alice, charlie, aws_account):
    offer = Offer.objects.order_by("price_usd").first()
    for _ in range(5):
        placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json")
        assert placed.status_code == 201, placed.json()
    ids, sizes = _walk(api, "/api/v1/orders", {}, limit=2)
    assert sizes == [2, 2, 1]
    expected = [str(o.public_id) for o in Order.objects.filter(organization=acme).order_by("-id")]
    assert ids == expected
    stranger = APIClient()
    stranger.force_authenticate(charlie)
    assert stranger.get("/api/v1/orders").json()["results"] == []


@pytest.mark.parametrize("sort", ["price", "gpuprice", "tflops"])
def test_a_search_for_several_models_merges_one_walk_per_model_in_order(api, aws_account, tencent_account, sort):
    from django.utils import timezone

    from marketplace.catalog.query import SORTS, gpu_partitions, offers_query, rows_in_order

    search = "gpu=T4,A10G,A100"
    assert len(gpu_partitions(search, "price")) > 2
    queryset = offers_query(search, now=timezone.now(), sort=sort)
    everything = list(queryset)
    assert rows_in_order(queryset, gpu_partitions(search, "price"), 10_000) == everything
    expected = [o.pk for o in sorted(everything, key=lambda o: (getattr(o, SORTS[sort]), o.pk))]
    ids, _ = _walk(api, "/api/v1/offers", {"q": search, "sort": sort}, limit=4)
    assert ids == expected and len(ids) > 8


@pytest.mark.parametrize("value", ["²", "\uff11\uff10", "-1"])
def test_the_ledger_lists_refuse_digits_int_cannot_read(value):
    public = APIClient()
    for path, name in [("/api/v1/ledger/checkpoints", "limit"), ("/api/v1/ledger/leaves", "start")]:
        response = public.get(path, {name: value})
        assert response.status_code == 400 and name in response.json()["error"]["fields"]


def test_score_weighs_the_price_per_tflop_by_reliability(api, aws_account, tencent_account):
    from django.utils import timezone

    from marketplace.catalog.selectors import account_reliability
    from marketplace.models import Attempt, AttemptOutcome

    offer = aws_account.offers.order_by("price_usd").first()
    placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json").json()
    order = Order.objects.get(public_id=placed["id"])
    for number in range(2, 12):  # ten launches the AWS account failed for its own reasons
        Attempt.objects.create(
            order=order, number=number, offer=offer, client_token=f"{order.ref}-x{number}", started_at=timezone.now(),
            outcome=AttemptOutcome.FAILED, error_class="final",
        )  # fmt: skip
    reliability = account_reliability()
    assert reliability[aws_account.pk] < 0.8
    ids, _ = _walk(api, "/api/v1/offers", {"sort": "score"}, limit=7)
    offers = Offer.objects.in_bulk(ids)
    scores = [offers[i].usd_per_tflop_hour / reliability.get(offers[i].account_id, 0.95) for i in ids]
    assert scores == sorted(scores) and len(ids) > 20
    by_tflops = [row["id"] for row in api.get("/api/v1/offers", {"sort": "tflops", "limit": 500}).json()["results"]]
    assert ids != by_tflops  # the unreliable account's offers moved down
