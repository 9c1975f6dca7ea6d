"""Dollars for the job (issue 20, point 1): a demand fixes its hours or its work, and the engine ranks and
assigns by what the buyer pays for that, the cost per unit of throughput shown second.

Datasheet figures (dense FP16: A10G 70, L4 121, H100 SXM 989.4 TFLOPS) come from bench/market.py's spec
table, which follows NVIDIA's data sheets.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from marketplace.matching import PROFILES, Amount, Demand, OfferView, Profile, assign, rank
from marketplace.models import Order
from providers import gpu_names as g
from tests.marketplace.test_quotes_api import book  # noqa: F401  (the fixture: a small AWS-like book)
from tests.marketplace.test_ranking import NOW, ids
from tests.marketplace.test_ranking import offer as ranking_offer


def offer(offer_id: int, model: str, price: str, **kw: object) -> OfferView:
    """test_ranking's offer, of one GPU."""
    return ranking_offer(offer_id, model, 1, price, **kw)


def test_a_ten_hour_rental_ranks_the_10_dollar_a10g_above_the_70_dollar_h100() -> None:
    # Given the example: 1 GPU with at least 24 GB for 10 hours, no profile (a rental)
    offers = [offer(1, g.H100_SXM, "70.00"), offer(2, g.A10G, "10.00")]

    ranking = rank(Demand(gpu_count=1, min_gpu_memory_gb=24, duration_hours=10), offers, now=NOW)

    # Then the buyer pays $100 on the A10G and $700 on the H100, whatever the H100's price per TFLOP
    assert ids(ranking) == [2, 1]
    assert ranking.demand.amount == Amount.DURATION
    a10g, h100 = (q.breakdown for q in ranking.quotes)
    assert (a10g.job_hours, a10g.job_cost, a10g.score) == (10.0, Decimal("100.000000"), 100.0)
    assert (h100.job_hours, h100.job_cost) == (10.0, Decimal("700.000000"))
    # The throughput reasoning stays beside it: the H100 is still cheaper per unit of work.
    assert h100.unit_cost < a10g.unit_cost
    assert ranking.quotes[0].reason.startswith("1x A10G on-demand on aws us-east-1a: $100.00 for the job (10 h), ")


def test_fixed_work_prefers_the_lowest_price_times_the_hours_it_takes() -> None:
    # Given 100 hours of work on a reference A10G; the L4 is 121 / 70 times as fast, the H100 989.4 / 70
    offers = [offer(1, g.A10G, "1.00"), offer(2, g.H100_SXM, "8.00"), offer(3, g.L4, "0.80")]
    work = Demand(amount=Amount.WORK, work_hours=100, work_reference_gpu=g.A10G, min_gpu_memory_gb=24)

    ranking = rank(work, offers, now=NOW)

    # Then each costs its price x 100 x 70 / its figure: L4 $46.28, H100 $56.60, A10G $100
    assert ids(ranking) == [3, 2, 1]
    l4, h100, a10g = (q.breakdown for q in ranking.quotes)
    assert l4.job_hours == pytest.approx(100 * 70 / 121) and l4.score == pytest.approx(0.80 * 100 * 70 / 121)
    assert h100.job_hours == pytest.approx(100 * 70 / 989.4) and h100.score == pytest.approx(8.0 * 100 * 70 / 989.4)
    assert (a10g.job_hours, a10g.job_cost) == (100.0, Decimal("100.000000"))
    assert h100.price_cost == (Decimal("8.00") * Decimal(repr(100 * 70 / 989.4))).quantize(Decimal("0.000001"))
    # And the same size bought by the hour is cheapest on the lowest price
    by_the_hour = rank(Demand(amount=Amount.DURATION, duration_hours=100, min_gpu_memory_gb=24), offers, now=NOW)
    assert ids(by_the_hour) == [3, 1, 2]


def test_each_profile_states_its_default_amount_and_work_defaults_to_its_reference_card() -> None:
    assert {p: d.amount for p, d in PROFILES.items()} == {
        Profile.TRAINING: Amount.WORK,
        Profile.FINE_TUNING: Amount.WORK,
        Profile.INFERENCE: Amount.DURATION,
        Profile.SCIENTIFIC: Amount.WORK,
        Profile.RENDERING: Amount.WORK,
        Profile.TRANSCODING: Amount.WORK,
    }
    offers = [offer(1, g.H100_SXM, "8.00")]
    # Fine-tuning's default: 3 hours of work on its reference A100 (312 TFLOPS)
    ranking = rank(Demand(profile=Profile.FINE_TUNING, duration_hours=3), offers, now=NOW)
    assert ranking.demand.amount == Amount.WORK
    assert ranking.quotes[0].breakdown.job_hours == pytest.approx(3 * 312 / 989.4)
    # A buyer's own amount wins over the profile's
    rental = rank(Demand(profile=Profile.FINE_TUNING, duration_hours=3, amount=Amount.DURATION), offers, now=NOW)
    assert rental.demand.amount == Amount.DURATION and rental.quotes[0].breakdown.job_hours == 3.0


def test_a_reference_gpu_without_a_datasheet_is_refused_by_name() -> None:
    demand = Demand(amount=Amount.WORK, work_hours=5, work_reference_gpu=g.MI300X)
    with pytest.raises(ValueError, match="work_reference_gpu 'MI300X': no datasheet figure"):
        rank(demand, [offer(1, g.A10G, "1.00")], now=NOW)
    with pytest.raises(ValueError, match="work_hours must be above zero"):
        Demand(amount=Amount.WORK, work_hours=0)


def test_the_batch_minimises_dollars_for_the_jobs() -> None:
    # Given two rentals and one A10G and one H100, one instance each
    offers = [offer(1, g.A10G, "10.00", capacity=1), offer(2, g.H100_SXM, "70.00", capacity=1)]
    demands = [
        Demand(demand_id="long", duration_hours=10, min_gpu_memory_gb=24),
        Demand(demand_id="short", duration_hours=1, min_gpu_memory_gb=24),
    ]

    result = assign(demands, offers, now=NOW, time_limit=2)

    # Then the long rental takes the cheap hour and the objective is the dollars spent: 10 x $10 + 1 x $70
    placed = {a.demand.demand_id: a.quote.offer.offer_id for a in result.demands if a.quote}
    assert placed == {"long": 1, "short": 2}
    assert result.total_cost == Decimal("170.000000")
    assert result.objective == pytest.approx(170.0)


# --- The quotes API -----------------------------------------------------------------------------------------


@pytest.fixture
def api(alice_bearer) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=alice_bearer)
    return client


def _post(client: APIClient, body: object):
    return client.post("/api/v1/quotes", data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_quotes_answer_with_the_job_cost_first_and_the_default_amount_shown(api, book) -> None:  # noqa: F811
    response = _post(api, {"profile": "inference", "duration_hours": 10})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["defaults"]["amount"] == "duration"
    best = body["quotes"][0]
    assert list(best)[:4] == ["id", "rank", "job_cost", "job_hours"]
    assert best["job_hours"] == 10.0
    assert Decimal(best["job_cost"]) == Decimal(best["breakdown"]["effective_cost"])
    assert [Decimal(q["job_cost"]) for q in body["quotes"]] == sorted(Decimal(q["job_cost"]) for q in body["quotes"])


@pytest.mark.django_db
def test_a_fixed_work_quote_runs_for_the_hours_the_work_takes_on_its_card(api, book) -> None:  # noqa: F811
    # Given 10 hours of inference work on an A10G (600 GB/s); the T4 has 320 GB/s
    response = _post(
        api,
        {
            "profile": "inference",
            "amount": "work",
            "work_hours": 10,
            "work_reference_gpu": "A10G",
            "pricing_models": ["on_demand"],
        },
    )

    assert response.status_code == 201, response.content
    quotes = {q["offer"]["gpu_model"]: q for q in response.json()["quotes"]}
    t4 = quotes["T4"]
    assert t4["job_hours"] == pytest.approx(10 * 600 / 320)
    assert t4["duration_hours"] == "18.75"
    assert t4["total_price"] == format((Decimal("0.526") * Decimal("18.75")).quantize(Decimal("0.000001")), "f")


@pytest.mark.django_db
def test_work_fields_on_a_demand_that_fixes_its_hours_are_refused_by_name(api, book) -> None:  # noqa: F811
    response = _post(api, {"profile": "inference", "work_hours": 10})

    assert response.status_code == 400
    error = response.json()["error"]
    assert "work_hours" in error["fields"]
    assert "applies to amount 'work'" in json.dumps(error)


@pytest.mark.django_db
@pytest.mark.usefixtures("book")
def test_an_order_from_a_work_quote_is_not_stopped_at_the_estimate(api, django_capture_on_commit_callbacks) -> None:
    # The hours fixed work takes on a card come from datasheets; a slower real job must not be cut off there.
    work = _post(api, {"profile": "inference", "amount": "work", "work_hours": 10, "pricing_models": ["on_demand"]})
    rental = _post(api, {"profile": "inference", "duration_hours": 10, "pricing_models": ["on_demand"]})
    assert (work.json()["defaults"]["amount"], rental.json()["defaults"]["amount"]) == ("work", "duration")

    with django_capture_on_commit_callbacks(execute=False):
        from_work = api.post("/api/v1/orders", {"quote": work.json()["quotes"][0]["id"]}, format="json")
        from_rental = api.post("/api/v1/orders", {"quote": rental.json()["quotes"][0]["id"]}, format="json")

    assert from_work.status_code == from_rental.status_code == 201, (from_work.content, from_rental.content)
    assert Order.objects.get(public_id=from_work.json()["id"]).duration_hours is None
    assert Order.objects.get(public_id=from_rental.json()["id"]).duration_hours == Decimal("10")
