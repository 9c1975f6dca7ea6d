"""The storefront pages, rendered by the real views over real rows."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer, Order
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes
from tests.storefront import order_from_the_page

pytestmark = pytest.mark.django_db


@pytest.fixture
def offers(db):
    account = ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")
    rows = [
        ("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", PricingModel.ON_DEMAND),
        ("g5.xlarge", "A10G", 1, 24, "0.4507", "us-east-1", PricingModel.SPOT),
        ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "us-east-1", PricingModel.ON_DEMAND),
        ("p5.48xlarge", "H100-SXM5", 8, 80, "55.04", "us-west-2", PricingModel.ON_DEMAND),
    ]
    quotes = listed_quotes(rows)
    offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))
    return account


def test_the_offer_page_lists_offers_cheapest_first(offers):
    page = Client().get("/").content.decode()

    assert "4 offers for sale" in page
    assert page.index("0.4507") < page.index("1.0060") < page.index("27.447") < page.index("55.0400")
    assert "Sign in to order" in page


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ({"gpu": "H100-SXM5"}, ["p5.48xlarge"], ["g5.xlarge", "p4de"]),
        ({"count": "8", "region": "us-east-1"}, ["p4de.24xlarge"], ["p5.48xlarge", "g5.xlarge"]),
        ({"pricing": "spot"}, ["0.4507"], ["1.0060", "p4de"]),
        ({"max_price": "2"}, ["0.4507", "1.0060"], ["p4de", "p5.48"]),
    ],
)
def test_the_offer_filters_narrow_the_list(offers, query, shown, hidden):
    # The old filter links are public: they become the search they mean, and the page shows its result.
    page = Client().get("/", query, follow=True).content.decode()

    for text in shown:
        assert text in page
    for text in hidden:
        assert text not in page


def test_a_bad_filter_shows_the_field_error(offers):
    page = Client().get("/", {"count": "0"}).content.decode()

    assert "Ensure this value is greater than or equal to 1." in page


def test_my_orders_needs_a_login(offers):
    response = Client().get("/orders/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_an_order_placed_from_the_page_appears_on_my_orders_with_its_ledger_hash(
    offers, alice, charlie, django_capture_on_commit_callbacks
):
    client = Client()
    client.force_login(alice)
    offer = Offer.objects.get(instance_type="p5.48xlarge")
    nonce = order_from_the_page(client, offer)

    # The sandbox is not running in this test: provisioning fails, which is what the page must then show.
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post("/orders/place", {"nonce": nonce})

    order = Order.objects.get()
    assert (response.status_code, response["Location"]) == (302, f"/orders/{order.public_id}/")
    from ledger.services import ledger_sequence

    ledger_sequence()  # the sequencer process's turn: the order's entry gets its hash
    page = client.get("/orders/").content.decode()
    assert str(order.public_id)[:8] in page
    assert "placed" in page
    assert "p5.48xlarge" in page
    from ledger.models import LedgerEntry

    assert LedgerEntry.objects.get().entry_hash[:16] in page
    stranger = Client()
    stranger.force_login(charlie)
    assert str(order.public_id)[:8] not in stranger.get("/orders/").content.decode()
    assert stranger.post(f"/orders/{order.public_id}/terminate").status_code == 404


def test_a_double_submitted_confirmation_places_one_order(offers, alice, django_capture_on_commit_callbacks):
    client = Client()
    client.force_login(alice)
    offer = Offer.objects.get(instance_type="g5.xlarge", pricing_model="on_demand")
    nonce = order_from_the_page(client, offer)

    with django_capture_on_commit_callbacks(execute=False):
        client.post("/orders/place", {"nonce": nonce})
        client.post("/orders/place", {"nonce": nonce})

    assert Order.objects.count() == 1


def test_a_disabled_account_sells_nothing_in_the_storefront(aws_account):
    from marketplace.catalog.selectors import offer_list

    assert offer_list().filter(account=aws_account).exists()
    aws_account.enabled = False
    aws_account.save(update_fields=["enabled"])
    assert not offer_list().filter(account=aws_account).exists()
