"""The offers page as one search: the box and the controls edit one query whose address is ``?q=&sort=&page=``;
offers of one instance type in several zones are one row; pages beyond the first; empty and refused searches
say what to do."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from decimal import Decimal
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.catalog.query import offers_query, parse
from marketplace.catalog.selectors import offer_groups
from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer
from marketplace.web.forms import OfferFilterForm
from marketplace.web.search import PAGE_SIZE, controls_from, merge
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes

pytestmark = pytest.mark.django_db

ON_DEMAND, SPOT = PricingModel.ON_DEMAND, PricingModel.SPOT


@pytest.fixture(autouse=True)
def _regions_read_afresh():
    """The query module keeps the regions on sale for 30 s; each test's catalogue is its own, so none may see the
    regions another test left."""
    from marketplace.catalog import query

    query._regions_cache.update(at=-query._REGIONS_TTL_S, pairs=())
    yield
    query._regions_cache.update(at=-query._REGIONS_TTL_S, pairs=())


def _zones(row: tuple, prices: dict[str, str]) -> list:
    """One quote of ``row`` per zone, at that zone's price."""
    (quote,) = listed_quotes([row])
    return [dataclasses.replace(quote, zone=zone, price=Decimal(price)) for zone, price in prices.items()]


@pytest.fixture
def catalogue(db):
    """A10G in three zones at three prices, its spot twin in one, an A100 box and an H100 box."""
    account = ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")
    quotes = [
        *_zones(("g5.xlarge", "A10G", 1, 24, "0", "us-east-1", ON_DEMAND),
                {"us-east-1b": "1.10", "us-east-1a": "1.006", "us-east-1c": "1.20"}),
        *listed_quotes([
            ("g5.xlarge", "A10G", 1, 24, "0.4507", "us-east-1", SPOT),
            ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "eu-west-1", ON_DEMAND),
            ("p5.48xlarge", "H100-SXM5", 8, 80, "55.04", "us-west-2", ON_DEMAND),
        ]),
    ]  # fmt: skip
    offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))
    return account


def _query_of(response) -> dict[str, list[str]]:
    assert response.status_code == 302
    return parse_qs(urlsplit(response["Location"]).query)


# --- 1. One search --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "query"),
    [
        ({"gpu": "A10G", "pricing": "on_demand"}, "gpu=A10G pricing=on_demand"),
        ({"gpu": "", "count": "8", "region": "us-east-1", "pricing": "", "max_price": ""}, "count>=8 region=us-east-1"),
        ({"max_price": "2.50"}, "price<=2.5"),
        ({"provider": "aws", "pricing": "spot"}, "pricing=spot provider=aws"),
    ],
)
def test_an_old_filter_link_becomes_the_search_it_means(catalogue, params, query):
    response = Client().get("/", params)

    assert _query_of(response) == {"q": [query]}


def test_submitting_the_controls_rewrites_their_terms_and_keeps_the_rest_of_the_box(catalogue):
    # The page was showing "gpu=A10G reliability>0.9 count>=1"; the buyer sets 8 GPUs and a spot price, and
    # also typed a provider into the box.
    shown = "gpu=A10G reliability>0.9 count>=1"
    params = {"prev": shown, "q": shown + " provider=aws", "gpu": "A10G", "count": "8", "pricing": "spot",
              "region": "", "provider": "", "max_price": "", "sort": "gpuprice"}  # fmt: skip

    query = _query_of(Client().get("/", params))

    assert query == {"q": ["gpu=A10G reliability>0.9 count>=8 provider=aws pricing=spot"], "sort": ["gpuprice"]}


def test_editing_the_box_wins_over_controls_it_no_longer_matches(catalogue):
    # The controls still show gpu=A10G (from "prev"); the buyer rewrote the box to ask for H100s.
    params = {"prev": "gpu=A10G", "q": "gpu=H100-SXM5", "gpu": "A10G", "count": "", "region": "", "pricing": "",
              "provider": "", "max_price": ""}  # fmt: skip

    assert _query_of(Client().get("/", params)) == {"q": ["gpu=H100-SXM5"]}


def test_clearing_a_control_drops_its_term(catalogue):
    params = {"prev": "gpu=A10G count>=8", "q": "gpu=A10G count>=8", "gpu": "A10G", "count": ""}

    assert _query_of(Client().get("/", params)) == {"q": ["gpu=A10G"]}


def test_a_search_fills_the_controls_it_can_express_and_holds_the_others(catalogue):
    page = Client().get("/", {"q": "gpu=a10g count=1 price<40 region=us-east-1 reliability>0.5"})

    form = page.context["form"]
    assert form.initial == {"gpu": "A10G", "region": "us-east-1"}
    # count=1 is not "at least", price<40 not "at most", reliability>0.5 not "at least": those controls say the
    # box holds them.
    assert {n for n, f in form.fields.items() if f.disabled} == {"count", "max_price", "reliability"}
    html = page.content.decode()
    assert "set in the search box: count=1" in html and "set in the search box: price&lt;40" in html
    assert '<option value="A10G" selected>A10G</option>' in html


def test_a_gpu_family_is_a_choice_when_it_has_several_variants():
    form = OfferFilterForm()
    keys = ["H100-PCIE", "H100-SXM5", "T4"]
    form.fields["gpu"].choices = [("", "any"), ("H100", "H100 (any variant)"), *((k, k) for k in keys)]

    state = controls_from(parse("gpu=h100"), form)

    assert (state.values, state.held) == ({"gpu": "H100"}, {})
    assert controls_from(parse("gpu=H100,T4"), form).held == {"gpu": ["gpu=H100,T4"]}


@pytest.mark.parametrize(
    ("text", "before", "after", "merged"),
    [
        ("", {}, {"gpu": "T4", "count": 4}, "gpu=T4 count>=4"),
        ("price<40 gpu=T4", {"gpu": "T4"}, {"gpu": "L4"}, "price<40 gpu=L4"),
        ("price<40", {}, {"max_price": Decimal("35.5000")}, "price<=35.5"),
        ("count=2 count<=8", {}, {}, "count=2 count<=8"),
        ("region=EU", {"region": "eu"}, {"region": "EU"}, "region=EU"),
        ("gpu=T4", {"gpu": "T4"}, {"gpu": None}, ""),
    ],
)
def test_merge_rewrites_only_the_controls_that_changed(text, before, after, merged):
    assert merge(text, before=before, after=after) == merged
    assert parse(merged) is not None  # what the controls write, the language reads


def test_a_refused_control_value_is_shown_next_to_it_and_nothing_is_redirected(catalogue):
    response = Client().get("/", {"q": "gpu=A10G", "count": "0", "region": "us east"})

    assert response.status_code == 200
    html = response.content.decode()
    assert "Ensure this value is greater than or equal to 1." in html
    assert "no spaces" in html


def test_the_search_form_is_one_form_whose_address_is_the_query(catalogue):
    html = Client().get("/", {"q": "gpu=A10G", "sort": "gpuprice"}).content.decode()

    forms = re.findall(r"<form [^>]*>", html)
    assert len([f for f in forms if 'class="filters' in f]) == 1
    assert '<input type="hidden" name="prev" value="gpu=A10G">' in html
    assert '<option value="gpuprice" selected>' in html


# --- 2. Grouped offers ----------------------------------------------------------------------------------------


def test_one_row_per_instance_type_region_and_pricing_with_its_zones_and_spread(catalogue):
    response = Client().get("/", {"q": "gpu=A10G"})

    rows = response.context["rows"]
    assert [(g.lead.pricing_model, g.zones) for g in rows.groups] == [
        ("spot", ["us-east-1a"]),
        ("on_demand", ["us-east-1a", "us-east-1b", "us-east-1c"]),
    ]
    assert (rows.offer_total, rows.group_total) == (4, 2)
    html = response.content.decode()
    assert "in 3 zones" in html
    # The cheapest zone's price first, then the spread, on one line.
    spread = '<span class="spread muted small" title="the dearest of its 3 zones">\u20131.2000</span>'
    assert f'<td class="num money" data-label="USD/h">1.0060{spread}' in html
    cheapest = Offer.objects.get(zone="us-east-1a", pricing_model="on_demand")
    assert html.count('name="ids"') == 2 and f'name="ids" value="{cheapest.pk}"' in html
    assert "4 offers for sale in 2 rows" in html


def test_each_zone_of_a_row_can_be_ordered_by_a_signed_in_buyer(catalogue, alice):
    client = Client()
    client.force_login(alice)

    html = client.get("/", {"q": "gpu=A10G pricing=on_demand"}).content.decode()

    for offer in Offer.objects.filter(instance_type="g5.xlarge", pricing_model="on_demand"):
        assert f'href="/orders/new?offer={offer.pk}" title="order in {offer.zone}"' in html
    lead = Offer.objects.get(zone="us-east-1a", pricing_model="on_demand")
    assert f'href="/orders/new?offer={lead.pk}" title="in us-east-1a, the cheapest of its zones">Order</a>' in html


def test_rows_follow_the_chosen_sort_by_their_cheapest_zone(catalogue):
    now = timezone.now()

    by_hour = offer_groups(offers_query("", now=now, sort="price"), offset=0, limit=10).groups
    by_gpu = offer_groups(offers_query("", now=now, sort="gpuprice"), offset=0, limit=10).groups

    assert [g.lead.instance_type for g in by_hour] == ["g5.xlarge", "g5.xlarge", "p4de.24xlarge", "p5.48xlarge"]
    assert [g.lead.instance_type for g in by_hour] == [g.lead.instance_type for g in by_gpu]
    per_gpu = [g.lead.price_per_gpu_usd for g in by_gpu]
    assert per_gpu == sorted(per_gpu)


@pytest.mark.parametrize("sort", ["price", "gpuprice", "tflops", "score"])
def test_every_sort_pages_grouped_rows(catalogue, sort):
    response = Client().get("/", {"q": "count>=1", "sort": sort})

    assert response.status_code == 200
    assert response.context["rows"].group_total == 4 and response.context["sort"] == sort


def test_independent_machines_are_rows_of_their_own(db):
    account = ProviderAccountFactory(kind="community")
    quotes = _zones(("community-1xA10G", "A10G", 1, 24, "0", "eu", ON_DEMAND), {"box-1": "0.5", "box-2": "0.6"})
    offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))

    groups = offer_groups(offers_query("", now=timezone.now()), offset=0, limit=10).groups

    assert [g.zones for g in groups] == [["box-1"], ["box-2"]]


# --- 3. Pages -------------------------------------------------------------------------------------------------


@pytest.fixture
def many(db):
    """PAGE_SIZE + 7 instance types, each in two zones: PAGE_SIZE + 7 rows, twice as many offers."""
    account = ProviderAccountFactory(provider__name="Many Cloud", name="many")
    quotes = []
    for i in range(PAGE_SIZE + 7):
        price = f"{1 + i // 3}.00"  # ties in price: the order must still be total
        quotes += _zones((f"x{i:03}.large", "T4", 1, 16, "0", "us-east-1", ON_DEMAND), {"z1": price, "z2": price + "5"})
    offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))
    return account


def test_the_pager_walks_every_row_once_in_a_stable_order(many):
    client = Client()
    first = client.get("/", {"q": "gpu=T4"})
    second = client.get("/", {"q": "gpu=T4", "page": "2"})

    assert (first.context["page"], first.context["pages"]) == (1, 2)
    html = first.content.decode()
    assert f"{2 * (PAGE_SIZE + 7)} offers for sale in {PAGE_SIZE + 7} rows, page 1 of 2" in html
    assert f"Page 1 of 2 · rows 1\u2013{PAGE_SIZE} of {PAGE_SIZE + 7}" in html
    assert 'href="?q=gpu%3DT4&amp;page=2" rel="next"' in html
    assert 'rel="prev"' not in html
    assert 'href="?q=gpu%3DT4" rel="prev"' in second.content.decode()
    seen = [g.lead.instance_type for r in (first, second) for g in r.context["rows"].groups]
    assert len(seen) == len(set(seen)) == PAGE_SIZE + 7
    again = [g.lead.instance_type for g in client.get("/", {"q": "gpu=T4"}).context["rows"].groups]
    assert again == seen[:PAGE_SIZE]


@pytest.mark.parametrize(("asked", "shown"), [("99", 2), ("0", 1), ("-1", 1), ("two", 1), ("1" * 30, 1)])
def test_a_page_out_of_range_shows_the_nearest_page(many, asked, shown):
    response = Client().get("/", {"q": "gpu=T4", "page": asked})

    assert response.status_code == 200 and response.context["page"] == shown


# --- 5. Empty and refused searches ----------------------------------------------------------------------------


def test_a_refused_search_shows_the_parsers_message_and_no_empty_result(catalogue):
    html = Client().get("/", {"q": "gpu=A10G cuont>=8"}).content.decode()

    assert "unknown field &#x27;cuont&#x27;" in html and "at column 10: <code>cuont&gt;=8</code>" in html
    assert 'aria-invalid="true"' in html
    assert html.count(" disabled") >= len(OfferFilterForm.base_fields)  # the controls wait for a search that parses
    assert "No offer" not in html and "0 offers" not in html and "<table" not in html


def test_an_empty_search_says_which_term_to_relax(catalogue):
    response = Client().get("/", {"q": "gpu=H100-SXM5 region=eu price<100"})

    html = response.content.decode()
    assert "No offer for sale matches all of <code>gpu=H100-SXM5 region=eu price&lt;100</code>" in html
    relax = [(r.term, r.alone, r.without) for r in response.context["relaxations"]]
    # Dropping region=eu finds the US H100; dropping the GPU finds the EU A100; the price alone keeps all six.
    assert relax == [("gpu=H100-SXM5", 1, 1), ("region=eu", 1, 1), ("price<100", 6, 0)]
    assert 'href="/?q=region%3Deu+price%3C100">search without <code>gpu=H100-SXM5</code></a>' in html
    assert 'id="clear-search"' in html


def test_the_api_search_is_unchanged_by_the_pages_grouping(catalogue, alice):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(alice)

    results = api.get("/api/v1/offers", {"q": "gpu=A10G pricing=on_demand"}).json()["results"]

    assert [r["zone"] for r in results] == ["us-east-1a", "us-east-1b", "us-east-1c"]


def test_the_column_controls_write_their_terms_and_a_search_fills_them(catalogue):
    params = {"prev": "gpu=A10G", "q": "gpu=A10G", "gpu": "A10G", "vcpu": "16", "ram": "64", "net": "25",
              "reliability": "0.9", "max_gpuprice": "2.5", "free": "", "seller": "Petra_Cloud_Resale"}  # fmt: skip

    assert _query_of(Client().get("/", params)) == {
        "q": ["gpu=A10G seller=Petra_Cloud_Resale vcpu>=16 ram>=64 net>=25 reliability>=0.9 gpuprice<=2.5"]
    }

    page = Client().get("/", {"q": "gpu=A10G vcpu>=16 ram>=64 net>=25 seller=petra_cloud_resale free>=1.5"})
    form = page.context["form"]
    assert form.initial == {"gpu": "A10G", "vcpu": 16, "ram": 64, "net": Decimal(25), "seller": "Petra_Cloud_Resale"}
    # A fraction of a GPU is no whole number the free control can show: the box holds it, and "More filters" opens.
    assert form.fields["free"].disabled and page.context["more_open"]
    assert 'id="more-filters" open' in page.content.decode()
    assert not Client().get("/", {"q": "gpu=A10G"}).context["more_open"]


def test_a_malformed_column_control_is_refused_naming_it(catalogue):
    page = Client().get("/", {"prev": "", "q": "", "vcpu": "many", "reliability": "2"})

    assert page.status_code == 200
    errors = page.context["form"].errors
    assert set(errors) == {"vcpu", "reliability"}
    assert page.context["more_open"]
