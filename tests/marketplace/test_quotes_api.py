"""Quotes and procurements over the API, on real rows: ranking, locked prices, expiry, one order per quote."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer, OfferStatus, Order, OrderState, Quote
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, UserFactory, listed_quotes
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db

OD, SPOT = PricingModel.ON_DEMAND, PricingModel.SPOT
# instance type, GPU, count, GB per GPU, USD/h, region, pricing, capacity (None: no known limit)
BOOK = [
    ("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", OD, None),
    ("g5.xlarge", "A10G", 1, 24, "0.4507", "us-east-1", SPOT, None),
    ("g4dn.xlarge", "T4", 1, 16, "0.526", "us-east-1", OD, None),
    ("g5.xlarge", "A10G", 1, 24, "1.258", "eu-west-1", OD, None),
    ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "us-east-1", OD, 1),
    ("p5.48xlarge", "H100-SXM5", 8, 80, "55.04", "us-west-2", OD, 1),
]


def _ingest(account, prices: dict[tuple[str, str, str], str] | None = None, drop: tuple[str, str, str] | None = None):
    """Sync the book as a provider would; ``prices`` overrides by (instance type, region, pricing)."""
    prices = prices or {}
    rows = [
        (itype, gpu, count, mem, prices.get((itype, region, pricing.value), price), region, pricing, capacity)
        for itype, gpu, count, mem, price, region, pricing, capacity in BOOK
        if (itype, region, pricing.value) != drop
    ]
    quotes = listed_quotes(rows)
    report = offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))
    assert report.quarantined == 0, report.reasons


@pytest.fixture
def book(db):
    account = ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")
    _ingest(account)
    return account


@pytest.fixture
def api(alice_bearer) -> APIClient:
    """Alice's client, signed in with a real API token (the header a script would send)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=alice_bearer)
    return client


def _post(client: APIClient, path: str, body: object, **headers: str):
    return client.post(path, data=json.dumps(body), content_type="application/json", **headers)


def _quote(client: APIClient, **demand: object) -> dict:
    response = _post(client, "/api/v1/quotes", demand)
    assert response.status_code == 201, response.content
    return response.json()


def _order(client: APIClient, body: dict, capture, key: str | None = None):
    # Provisioning is another test file's subject: the task is enqueued on commit and not run here.
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with capture(execute=False):
        return _post(client, "/api/v1/orders", body, **headers)


def _offer(itype: str, region: str = "us-east-1", pricing: str = "on_demand") -> Offer:
    return Offer.objects.get(instance_type=itype, region=region, pricing_model=pricing)


# --- Quotes ----------------------------------------------------------------------------------------------


def test_a_workload_gets_ranked_quotes_best_first_each_explained_and_locked(api, book, settings):
    settings.QUOTE_TTL_S = 600
    before = timezone.now()

    body = _quote(api, profile="inference", duration_hours=10)

    quotes = body["quotes"]
    # The inference profile allows only the T4/L4/A10/A10G class: the 8-GPU machines are turned away.
    assert {q["offer"]["gpu_model"] for q in quotes} == {"A10G", "T4"}
    assert body["rejected"] == {"gpu model": 2}
    assert [q["rank"] for q in quotes] == [1, 2, 3, 4]
    scores = [q["score"] for q in quotes]
    assert scores == sorted(scores)
    # Spot wins on cost of useful work even with its interruption risk priced in.
    best = quotes[0]
    assert (best["offer"]["instance_type"], best["offer"]["pricing_model"]) == ("g5.xlarge", "spot")
    assert best["price_per_hour"] == "0.450700"
    assert best["duration_hours"] == "10.00"
    assert best["total_price"] == "4.507000"
    assert Decimal(best["breakdown"]["interruption_cost"]) > 0
    assert Decimal(best["breakdown"]["effective_cost"]) == sum(
        Decimal(best["breakdown"][k]) for k in ("price_cost", "interruption_cost", "reliability_cost")
    )
    assert best["breakdown"]["metric"] == "memory_bandwidth_gbs"
    assert best["reason"].startswith("1x A10G spot on aws us-east-1a: $")
    assert "(best value;" in best["reason"]
    assert all("% over the best" in q["reason"] for q in quotes[1:])
    expires = dt.datetime.fromisoformat(body["expires_at"])
    assert dt.timedelta(seconds=599) < expires - before < dt.timedelta(seconds=610)
    assert {q["expires_at"] for q in quotes} == {body["expires_at"]}
    # The stored rows are the answer: same ids, ranks, prices, one batch.
    stored = list(Quote.objects.filter(batch=body["batch"]).order_by("rank"))
    assert [str(q.public_id) for q in stored] == [q["id"] for q in quotes]
    assert stored[0].price_per_hour == Decimal("0.4507")
    assert stored[0].demand["profile"] == "inference"


def test_the_profile_defaults_applied_are_shown_and_what_the_buyer_sets_wins(api, book):
    training = _quote(api, profile="training", gpu_count=8)
    inference = _quote(api, profile="inference")
    loosened = _quote(api, profile="training", gpu_count=8, min_gpu_memory_gb=40, min_interconnect_gbs=0)

    assert (training["defaults"]["min_gpu_memory_gb"], training["defaults"]["min_interconnect_gbs"]) == (80, 600)
    assert training["defaults"]["gpu_count"] == 8
    assert [q["offer"]["instance_type"] for q in training["quotes"]] == ["p5.48xlarge", "p4de.24xlarge"]
    assert inference["defaults"]["gpu_models"] == ["A10", "A10G", "L4", "T4"]
    assert inference["defaults"]["interruption_tolerance"] == "checkpointed"
    assert (loosened["defaults"]["min_gpu_memory_gb"], loosened["defaults"]["min_interconnect_gbs"]) == (40, 0)


def test_filters_narrow_the_quotes(api, book):
    eu = _quote(api, profile="inference", jurisdictions=["EU"])
    on_demand = _quote(api, profile="inference", pricing_models=["on_demand"], limit=1)

    assert [(q["offer"]["region"], q["offer"]["instance_type"]) for q in eu["quotes"]] == [("eu-west-1", "g5.xlarge")]
    assert eu["rejected"]["jurisdiction"] == 5  # every offer outside the EU, whatever else it fails
    assert len(on_demand["quotes"]) == 1
    assert on_demand["quotes"][0]["offer"]["pricing_model"] == "on_demand"


def test_with_nothing_feasible_the_answer_is_empty_with_near_misses_and_what_to_relax(api, book):
    body = _quote(api, profile="training", gpu_count=8, max_price_per_hour="10")

    assert body["quotes"] == []
    assert Quote.objects.count() == 0
    assert body["rejected"]["price cap"] == 2
    first, second = body["near_misses"][:2]
    assert (first["instance_type"], first["failed"], first["relax"]) == (
        "p5.48xlarge",
        ["price cap"],
        "raise the hourly cap to $55.04",
    )
    assert (second["instance_type"], second["relax"]) == ("p4de.24xlarge", "raise the hourly cap to $27.45")
    # A miss on several rules names each and what would relax it.
    small = next(m for m in body["near_misses"] if m["gpu_model"] == "A10G")
    assert "size" in small["failed"]
    assert "ask for at most 1 GPUs per node, e.g. 8 nodes x 1 GPUs" in small["relax"]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, {"profile"}),
        ({"profile": "gaming"}, {"profile"}),
        ({"profile": "training", "gpu_count": -1}, {"gpu_count"}),
        ({"profile": "bogus", "gpu_count": 0}, {"profile", "gpu_count"}),
        ({"profile": "training", "gpu_count": 2, "total_gpu_memory_gb": 160}, {"gpu_count"}),
        ({"profile": "training", "gpu_models": ["GTX-1080"]}, {"gpu_models"}),
        ({"profile": "training", "jurisdictions": ["MARS"]}, {"jurisdictions"}),
        ({"profile": "training", "pricing_models": ["free"]}, {"pricing_models"}),
        ({"profile": "training", "duration_hours": 0}, {"duration_hours"}),
        ({"profile": "training", "interruption_tolerance": "sometimes"}, {"interruption_tolerance"}),
        ({"profile": "training", "max_price_per_hour": "-5"}, {"max_price_per_hour"}),
        ({"profile": "training", "limit": 0}, {"limit"}),
    ],
)
def test_a_malformed_demand_gets_400_naming_the_bad_fields_and_stores_nothing(api, book, body, fields):
    response = _post(api, "/api/v1/quotes", body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) == fields
    assert Quote.objects.count() == 0


# --- Orders from quotes ----------------------------------------------------------------------------------


def test_an_order_from_a_quote_pays_the_locked_price_after_the_offer_price_moved(
    api, book, django_capture_on_commit_callbacks
):
    quote = _quote(api, profile="training", gpu_count=8)["quotes"][1]
    assert (quote["offer"]["instance_type"], quote["price_per_hour"]) == ("p4de.24xlarge", "27.447050")
    _ingest(book, prices={("p4de.24xlarge", "us-east-1", "on_demand"): "40.00"})
    offer = _offer("p4de.24xlarge")
    assert offer.price_usd == Decimal("40")

    response = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks)

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["quote"], body["offer"], body["state"]) == (quote["id"], offer.pk, "placed")
    assert body["price_per_hour"] == body["max_price_per_hour"] == "27.447050"
    order = Order.objects.get()
    assert order.price_per_hour == Decimal("27.44705")
    assert str(order.quote.public_id) == quote["id"]
    placed = LedgerEntry.objects.get(subject=f"order:{order.public_id}", kind="order.placed")
    payload = json.loads(placed.payload)
    assert payload["quote"] == quote["id"]
    assert Decimal(payload["price_usd_per_hour"]) == Decimal("27.44705")
    # Ordered without a quote, the same offer costs what it costs now.
    direct = _order(api, {"offer": offer.pk}, django_capture_on_commit_callbacks).json()
    assert direct["price_per_hour"] == "40.000000"
    assert direct["quote"] is None


def test_an_expired_quote_is_410_and_places_nothing(api, book, django_capture_on_commit_callbacks):
    quote = _quote(api, profile="inference")["quotes"][0]
    Quote.objects.filter(public_id=quote["id"]).update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    response = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks)

    assert response.status_code == 410
    error = response.json()["error"]
    assert error["code"] == "quote_expired"
    assert "ask for a new one" in error["message"]
    assert Order.objects.count() == 0
    assert not LedgerEntry.objects.exists()


def test_a_quote_places_one_order_only(api, book, bob, django_capture_on_commit_callbacks):
    quote = _quote(api, profile="inference")["quotes"][0]
    teammate = APIClient()
    teammate.force_authenticate(bob)

    first = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks)
    again = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks)
    by_teammate = _order(teammate, {"quote": quote["id"]}, django_capture_on_commit_callbacks)

    assert first.status_code == 201
    assert (again.status_code, again.json()["error"]["code"]) == (409, "quote_used")
    assert by_teammate.status_code == 409
    assert Order.objects.count() == 1
    assert LedgerEntry.objects.filter(kind="order.placed").count() == 1


def test_a_retry_with_the_same_idempotency_key_replays_the_order_from_the_quote(
    api, book, django_capture_on_commit_callbacks
):
    quote = _quote(api, profile="inference")["quotes"][0]

    first = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks, key="q-1")
    again = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks, key="q-1")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    assert Order.objects.count() == 1


def test_a_teammate_may_order_the_organisations_quote_but_a_stranger_gets_404(
    api, book, bob, charlie, django_capture_on_commit_callbacks
):
    quote = _quote(api, profile="inference")["quotes"][0]
    stranger, teammate = APIClient(), APIClient()
    stranger.force_authenticate(charlie)
    teammate.force_authenticate(bob)

    refused = _order(stranger, {"quote": quote["id"]}, django_capture_on_commit_callbacks)
    unknown = _order(api, {"quote": "00000000-0000-4000-8000-000000000000"}, django_capture_on_commit_callbacks)

    assert (refused.status_code, refused.json()["error"]["code"]) == (404, "quote_not_found")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "quote_not_found")
    assert Order.objects.count() == 0
    accepted = _order(teammate, {"quote": quote["id"]}, django_capture_on_commit_callbacks)
    assert accepted.status_code == 201
    assert Order.objects.get().created_by == bob


def test_a_quote_for_an_offer_withdrawn_since_is_refused(api, book, django_capture_on_commit_callbacks):
    quote = _quote(api, profile="inference", pricing_models=["spot"])["quotes"][0]
    _ingest(book, drop=("g5.xlarge", "us-east-1", "spot"))
    assert _offer("g5.xlarge", pricing="spot").status == OfferStatus.UNAVAILABLE

    response = _order(api, {"quote": quote["id"]}, django_capture_on_commit_callbacks)

    assert (response.status_code, response.json()["error"]["code"]) == (409, "offer_not_orderable")
    assert Order.objects.count() == 0


def test_a_cap_below_the_locked_price_is_refused(api, book, django_capture_on_commit_callbacks):
    quote = _quote(api, profile="inference")["quotes"][0]

    response = _order(api, {"quote": quote["id"], "max_price_per_hour": "0.40"}, django_capture_on_commit_callbacks)

    assert (response.status_code, response.json()["error"]["code"]) == (409, "offer_not_orderable")
    assert Order.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "offer"),
        ({"offer": 1, "quote": "00000000-0000-4000-8000-000000000000"}, "offer"),
        ({"quote": "not-a-uuid"}, "quote"),
        ({"quote": None}, "quote"),
    ],
)
def test_an_order_needs_exactly_one_of_offer_or_quote(api, book, body, field, django_capture_on_commit_callbacks):
    response = _order(api, body, django_capture_on_commit_callbacks)

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert Order.objects.count() == 0


# --- Procurements ----------------------------------------------------------------------------------------


def test_a_procurement_shares_limited_capacity_and_explains_every_demand(api, book, django_capture_on_commit_callbacks):
    # Two 8-GPU machines, one of each, for three 8-GPU training jobs; a fourth wants EU data residency.
    demands = [
        {"id": "pretrain", "profile": "training", "gpu_count": 8, "duration_hours": 24},
        {"id": "ablation", "profile": "training", "gpu_count": 8, "duration_hours": 2},
        {"id": "sweep", "profile": "training", "gpu_count": 8, "duration_hours": 1},
        {"id": "eu-only", "profile": "training", "gpu_count": 8, "jurisdictions": ["EU"]},
        {"id": "serve", "profile": "inference"},
    ]

    response = _post(api, "/api/v1/procurements", {"demands": demands, "time_limit": 2})

    assert response.status_code == 201, response.content
    body = response.json()
    rows = {a["demand"]: a for a in body["assignments"]}
    assert list(rows) == [d["id"] for d in demands]
    assert body["placed"] == 3
    placed = [r for r in rows.values() if r["quote"] is not None]
    # Capacity is respected: each 8-GPU machine (capacity 1) goes to one job only.
    big = [r["quote"]["offer"]["instance_type"] for r in placed if r["quote"]["offer"]["gpu_count"] == 8]
    assert sorted(big) == ["p4de.24xlarge", "p5.48xlarge"]
    # The long job gains most from the faster machine; one of the short ones is left out, with the reason.
    assert rows["pretrain"]["quote"]["offer"]["instance_type"] == "p5.48xlarge"
    unplaced = [d for d, r in rows.items() if r["quote"] is None]
    assert sorted(unplaced) == ["eu-only", "sweep"] or sorted(unplaced) == ["ablation", "eu-only"]
    left_out = next(d for d in unplaced if d != "eu-only")
    assert rows[left_out]["reason"] == "its feasible offers' capacity went to demands of the batch that gain more"
    assert rows["eu-only"]["reason"].startswith("no offer fits: mostly ")
    assert "jurisdiction" in rows["eu-only"]["reason"]
    for r in placed:
        assert r["reason"] == r["quote"]["reason"]
        assert r["quote"]["expires_at"] == body["expires_at"]
    # The total is the sum of the placed quotes' effective costs; the bound is below the objective.
    assert Decimal(body["total_cost"]) == sum(Decimal(r["quote"]["breakdown"]["effective_cost"]) for r in placed)
    assert body["lower_bound"] <= body["objective"] * (1 + 1e-9)
    assert 0 <= body["gap"] <= 1
    assert body["gap"] == pytest.approx((body["objective"] - body["lower_bound"]) / body["objective"], abs=1e-9)
    assert body["method"]
    assert isinstance(body["optimal"], bool)
    assert Quote.objects.filter(batch=body["batch"]).count() == 3
    # Each placed demand's quote can be ordered at its locked price.
    ordered = _order(api, {"quote": rows["pretrain"]["quote"]["id"]}, django_capture_on_commit_callbacks)
    assert ordered.status_code == 201
    assert ordered.json()["price_per_hour"] == rows["pretrain"]["quote"]["price_per_hour"]


def _item(errors: list | dict, index: int) -> dict:
    """One demand's errors: DRF lists them by position, or keys only the bad ones by index."""
    return errors[index] if isinstance(errors, list) else errors[str(index)]


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ({}, lambda f: "demands" in f),
        ({"demands": []}, lambda f: "demands" in f),
        ({"demands": [{"profile": "training"}, {"profile": "mining"}]}, lambda f: _item(f["demands"], 1)["profile"]),
        ({"demands": [{"profile": "training", "gpu_count": -2}]}, lambda f: _item(f["demands"], 0)["gpu_count"]),
        ({"demands": [{"profile": "training"}], "time_limit": 600}, lambda f: "time_limit" in f),
    ],
)
def test_a_malformed_procurement_gets_400_and_stores_nothing(api, book, body, check):
    response = _post(api, "/api/v1/procurements", body)

    assert response.status_code == 400
    assert check(response.json()["error"]["fields"])
    assert Quote.objects.count() == 0


@pytest.mark.parametrize(("limit", "cap"), [(30, 5.0), (5.01, 5.0), (3, 2.0)])
def test_a_solver_time_limit_above_the_brokers_cap_is_a_400_naming_the_range(api, book, limit, cap, settings):
    settings.PROCUREMENT_TIME_LIMIT_S = cap

    response = _post(api, "/api/v1/procurements", {"demands": [{"profile": "training"}], "time_limit": limit})

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"time_limit": [f"must be from 0.5 to {cap:g} seconds"]}
    assert Quote.objects.count() == 0


def test_a_solver_time_limit_at_the_cap_is_taken(api, book, settings):
    settings.PROCUREMENT_TIME_LIMIT_S = 2.0

    response = _post(api, "/api/v1/procurements", {"demands": [{"profile": "training"}], "time_limit": 2})

    assert response.status_code == 201, response.json()


# --- Access ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/quotes", {"profile": "inference"}),
        ("/api/v1/procurements", {"demands": [{"profile": "inference"}]}),
        ("/api/v1/orders", {"quote": "00000000-0000-4000-8000-000000000000"}),
    ],
)
def test_anonymous_and_bad_token_requests_are_refused(book, path, body):
    anonymous = _post(APIClient(), path, body)
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    assert anonymous.status_code in (401, 403)
    assert "error" in anonymous.json()
    assert _post(forged, path, body).status_code == 401
    assert Quote.objects.count() == 0


def test_a_user_of_no_buyer_organisation_cannot_ask_for_quotes(book):
    client = APIClient()
    client.force_authenticate(UserFactory(username="drifter"))

    response = _post(client, "/api/v1/quotes", {"profile": "inference"})

    assert response.status_code == 403
    assert Quote.objects.count() == 0


# --- Provisioning an order placed from a quote ---------------------------------------------------------------


def test_an_order_from_a_quote_launches_the_quoted_offer_at_the_locked_price(
    alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    client = APIClient()
    client.force_authenticate(alice)
    quote = _quote(client, profile="inference", pricing_models=["on_demand"], limit=1)["quotes"][0]
    offer = Offer.objects.get(pk=quote["offer"]["id"])
    # The provider raises this offer's price after the quote was given.
    raised = offer.price_usd * 2
    Offer.objects.filter(pk=offer.pk).update(price=raised, price_usd=raised)

    with django_capture_on_commit_callbacks(execute=True):
        response = _post(client, "/api/v1/orders", {"quote": quote["id"]})

    assert response.status_code == 201
    order = boot_if_launched(Order.objects.get(), aws_sandbox)
    assert order.state == OrderState.RUNNING
    assert order.offer_id == offer.pk
    assert order.price_per_hour == Decimal(quote["price_per_hour"])


def test_the_defaults_shown_are_the_ones_applied(api, book):
    # Inference prefers 24 GB cards, but none holds 80 GB per GPU: the preference is dropped, and shown so.
    body = _quote(api, profile="inference", min_gpu_memory_gb=80)
    assert body["defaults"]["gpu_models"] == []
    assert {q["offer"]["gpu_model"] for q in body["quotes"]} <= {"A100-80GB-SXM4", "H100-SXM5"}
    assert _quote(api, profile="inference")["defaults"]["gpu_models"] == ["A10", "A10G", "L4", "T4"]
