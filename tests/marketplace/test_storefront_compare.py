"""Comparing 2 to 6 chosen offers side by side: columns, the best of each row, errors a buyer can act on, and
nothing but the public catalogue on the page."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer, OfferStatus
from marketplace.web.compare import comparison
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes

pytestmark = pytest.mark.django_db


@pytest.fixture
def offers(db) -> dict[str, Offer]:
    account = ProviderAccountFactory(provider__name="Petra Cloud Resale", name="petra-main")
    rows = [
        ("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", PricingModel.ON_DEMAND),
        ("g5.xlarge", "A10G", 1, 24, "0.4507", "us-east-1", PricingModel.SPOT),
        ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "eu-west-1", PricingModel.ON_DEMAND),
        ("p5.48xlarge", "H100-SXM5", 8, 80, "55.04", "us-west-2", PricingModel.ON_DEMAND),
    ]
    offers_ingest(account=account, quotes=listed_quotes(rows), now=timezone.now() - dt.timedelta(seconds=5))
    found = Offer.objects.select_related("gpu_model")
    return {
        "a10g": found.get(instance_type="g5.xlarge", pricing_model="on_demand"),
        "a10g-spot": found.get(instance_type="g5.xlarge", pricing_model="spot"),
        "a100": found.get(instance_type="p4de.24xlarge"),
        "h100": found.get(instance_type="p5.48xlarge"),
    }


def _ids(*offers: Offer) -> str:
    return ",".join(str(o.pk) for o in offers)


def _row(rows, label):
    return next(r for r in rows if r.label == label)


def test_the_comparison_sets_offers_side_by_side_and_marks_each_rows_best(offers):
    chosen = [offers["a10g"], offers["a10g-spot"], offers["h100"]]

    columns, rows = comparison([o.pk for o in chosen], now=timezone.now())

    assert [c.offer.pk for c in columns] == [o.pk for o in chosen]
    assert [c.on_sale for c in columns] == [True, True, True]
    assert [r.label for r in rows] == [
        "Provider", "Region", "Jurisdiction", "Instance type", "Pricing", "GPU model", "GPUs", "Memory per GPU",
        "Interconnect", "vCPUs", "RAM", "Price per hour", "Price per GPU-hour", "Price per FP16 TFLOP-hour",
        "Reliability", "Spot saving",
    ]  # fmt: skip
    assert [c.text for c in _row(rows, "Jurisdiction").cells] == ["US", "US", "US"]
    assert [c.text for c in _row(rows, "Price per hour").cells] == ["1.0060 USD", "0.4507 USD", "55.0400 USD"]
    assert [c.best for c in _row(rows, "Price per hour").cells] == [False, True, False]
    assert [c.best for c in _row(rows, "GPUs").cells] == [False, False, True]
    assert [c.best for c in _row(rows, "Memory per GPU").cells] == [False, False, True]
    # Per dense FP16 TFLOP-hour the A10G spot (0.4507 / 70) still undercuts the H100 (55.04 / 8 x its 989.4).
    h100_tflops = offers["h100"].gpu_model.fp16_dense_tflops * 8
    assert _row(rows, "Price per FP16 TFLOP-hour").cells[2].text == f"{Decimal('55.04') / h100_tflops:.5f} USD"
    assert [c.best for c in _row(rows, "Price per FP16 TFLOP-hour").cells] == [False, True, False]
    # The spot offer saves against its on-demand twin; the on-demand offers have no saving to show.
    assert [c.text for c in _row(rows, "Spot saving").cells] == ["—", "55 % vs on-demand", "—"]
    # No launches yet anywhere: no reliability figure to compare, so none is "best".
    assert [(c.text, c.best) for c in _row(rows, "Reliability").cells] == [("no launches yet", False)] * 3
    # Equal values everywhere have no best.
    assert not any(c.best for c in _row(rows, "vCPUs").cells)


def test_the_compare_page_renders_the_columns_with_order_buttons(offers, alice):
    client = Client()
    client.force_login(alice)

    response = client.get("/compare", {"ids": _ids(offers["a10g"], offers["a100"], offers["h100"])})

    assert response.status_code == 200
    page = response.content.decode()
    for name in ("g5.xlarge", "p4de.24xlarge", "p5.48xlarge", "A100-80GB-SXM4", "EU", "Price per FP16 TFLOP-hour"):
        assert name in page
    # Each "Order" opens the order's configure step for that offer.
    assert page.count('href="/orders/new?offer=') == 3
    assert f'href="/orders/new?offer={offers["h100"].pk}"' in page
    assert page.count('class="best"') >= 6
    assert "<script>" not in page  # the content security policy allows no inline code


def test_the_offers_pages_ticked_boxes_reach_the_comparison(offers):
    client = Client()
    offers_page = client.get("/").content.decode()
    assert offers_page.count('name="ids"') == 4
    assert 'id="compare-form"' in offers_page and 'action="/compare"' in offers_page

    # The checkboxes submit ?ids=1&ids=2, the shared link form is ?ids=1,2: both work.
    response = client.get("/compare", {"ids": [offers["a10g"].pk, offers["a10g-spot"].pk]})

    assert response.status_code == 200
    assert response.content.decode().count("<code>g5.xlarge</code>") == 2


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (None, "choose at least 2 offers to compare (0 chosen)"),
        ("{a10g}", "choose at least 2 offers to compare (1 chosen)"),
        ("{a10g},{a10g}", "choose at least 2 offers to compare (1 chosen)"),
        ("{a10g},{h100},{a100},{a10g-spot},99991,99992,99993", "compare at most 6 offers at a time (7 chosen)"),
        ("{a10g},h100", "offer ids are whole numbers; &#x27;h100&#x27; is not one"),
        ("{a10g},-3", "offer ids are whole numbers; &#x27;-3&#x27; is not one"),
        ("{a10g},99991", "no offer with id 99991"),
    ],
)
def test_a_wrong_choice_is_explained(offers, ids, message):
    query = {} if ids is None else {"ids": ids.format(**{k: v.pk for k, v in offers.items()})}

    response = Client().get("/compare", query)

    assert response.status_code == 400
    page = response.content.decode()
    assert f"Cannot compare these offers: {message}." in page
    assert "<table" not in page


def test_an_offer_no_longer_for_sale_is_shown_as_such_and_cannot_be_ordered(offers, alice):
    Offer.objects.filter(pk=offers["a10g-spot"].pk).update(status=OfferStatus.UNAVAILABLE)
    chosen = [offers["a10g"], offers["a10g-spot"], offers["h100"]]

    columns, rows = comparison([o.pk for o in chosen], now=timezone.now())
    client = Client()
    client.force_login(alice)
    page = client.get("/compare", {"ids": _ids(*chosen)}).content.decode()

    assert [c.on_sale for c in columns] == [True, False, True]
    # The cheapest per hour is gone: the best one can still order is the on-demand A10G.
    assert [c.best for c in _row(rows, "Price per hour").cells] == [True, False, False]
    assert "no longer for sale" in page and "1 of them is no longer for sale" in page
    assert page.count('href="/orders/new?offer=') == 2
    assert f'href="/orders/new?offer={offers["a10g-spot"].pk}"' not in page


def test_a_stale_offer_counts_as_no_longer_for_sale(offers):
    Offer.objects.filter(pk=offers["h100"].pk).update(last_seen_at=timezone.now() - dt.timedelta(days=2))

    columns, _ = comparison([offers["a10g"].pk, offers["h100"].pk], now=timezone.now())

    assert [c.on_sale for c in columns] == [True, False]


def test_the_comparison_shows_nothing_private(offers, charlie, django_capture_on_commit_callbacks):
    from marketplace.orders.services import PlaceRequest, order_place
    from tests.leases import LAUNCH

    # A stranger's order on one of the offers: neither it nor the provider's account may show.
    with django_capture_on_commit_callbacks(execute=False):
        order = order_place(
            organization=charlie.memberships.get().organization,
            user=charlie,
            request=PlaceRequest(offer_id=offers["h100"].pk, launch=LAUNCH),
        ).order

    response = Client().get("/compare", {"ids": _ids(offers["a10g"], offers["h100"])})

    page = response.content.decode()
    assert response.status_code == 200
    for secret in ("petra-main", "Petra Cloud Resale", str(order.public_id), "Charlie Labs", "charlie"):
        assert secret not in page
    assert "Sign in to order" in page and "/orders/new" not in page
    assert not re.search(r"reserved|capacity", page, re.IGNORECASE)
