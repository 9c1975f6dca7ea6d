"""The offer search language: parsing with errors that point at the term, and filtering real offers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.catalog.query import QueryError, offers_search, parse


def test_a_query_parses_into_terms():
    terms = parse("gpu=H100,a100 count>=8  region=eu price<40 pricing=spot reliability>0.95")
    assert [(t.field, t.op, t.value, t.column) for t in terms] == [
        ("gpu", "=", ("H100", "a100"), 1),
        ("count", ">=", Decimal(8), 15),
        ("region", "=", "eu", 25),
        ("price", "<", Decimal(40), 35),
        ("pricing", "=", "spot", 44),
        ("reliability", ">", Decimal("0.95"), 57),
    ]


@pytest.mark.parametrize(
    "text, column, term, reason",
    [
        ("gpu=H100 cuont>=8", 10, "cuont>=8", "unknown field 'cuont'"),
        ("count>=eight", 1, "count>=eight", "count compares with a number"),
        ("gpu>H100", 1, "gpu>H100", "gpu takes = or !=, not >"),
        ("pricing=cheap", 1, "pricing=cheap", "pricing is on_demand or spot"),
        ("reliability>95", 1, "reliability>95", "share from 0 to 1"),
        ("H100", 1, "H100", "field, operator, value"),
        ("price<", 1, "price<", "needs a value"),
        ("provider=oracle", 1, "provider=oracle", "provider is one of aws"),
    ],
)
def test_a_wrong_term_is_named_with_its_column(text, column, term, reason):
    with pytest.raises(QueryError) as error:
        parse(text)
    assert (error.value.column, error.value.term) == (column, term)
    assert reason in error.value.reason


@pytest.mark.django_db
def test_searches_filter_and_sort_the_offers_for_sale(aws_account, tencent_account):
    now = timezone.now()
    found = offers_search("gpu=T4 count=1 pricing=on_demand", now=now, sort="price")
    assert found and all((o.gpu_model.key, o.gpu_count, o.pricing_model) == ("T4", 1, "on_demand") for o in found)
    assert [o.price_usd for o in found] == sorted(o.price_usd for o in found)
    china = offers_search("region=cn", now=now)
    assert china and {o.account.kind for o in china} == {"tencent"}
    assert not offers_search("region=cn provider=aws", now=now)
    assert all(o.region == "eu-west-1" for o in offers_search("region=eu-west-1", now=now))
    cheap = offers_search("gpuprice<=1 count>=4", now=now, sort="gpuprice")
    assert cheap and all(o.price_usd / o.gpu_count <= 1 and o.gpu_count >= 4 for o in cheap)
    assert offers_search("reliability>=0.95", now=now) and not offers_search("reliability>0.96", now=now)
    assert {o.gpu_model.key for o in offers_search("gpu!=T4 count=1", now=now)}.isdisjoint({"T4"})
    by_tflops = offers_search("gpu=A100,H100", now=now, sort="tflops")
    per_tflop = [o.price_usd / (o.gpu_count * o.gpu_model.fp16_dense_tflops) for o in by_tflops]
    assert per_tflop == sorted(per_tflop)


@pytest.mark.django_db
def test_the_api_and_the_storefront_speak_the_same_language(alice, client, aws_account):
    api = APIClient()
    api.force_authenticate(alice)
    ok = api.get("/api/v1/offers", {"q": "gpu=T4 pricing=spot", "sort": "gpuprice"})
    assert ok.status_code == 200 and {r["pricing_model"] for r in ok.json()["results"]} == {"spot"}
    bad = api.get("/api/v1/offers", {"q": "gpu=T4 cuont>=8"})
    assert bad.status_code == 400
    assert "unknown field 'cuont'" in bad.json()["error"]["fields"]["q"][0]
    assert "column 8" in bad.json()["error"]["fields"]["q"][0]

    client.force_login(alice)
    page = client.get("/", {"q": "gpu=T4 cuont>=8"}).content.decode()
    assert "unknown field" in page and "column 8" in page and "cuont&gt;=8" in page
    page = client.get("/", {"q": "gpu=T4 pricing=spot"})
    assert page.status_code == 200 and all(o.pricing_model == "spot" for o in page.context["offers"])


@pytest.mark.django_db
def test_a_listing_whose_every_unit_is_held_is_not_for_sale_until_one_is_released(alice):
    import datetime as dt

    from marketplace.catalog.services import offers_ingest
    from marketplace.models import Offer
    from providers.types import PricingModel
    from tests.factories import ProviderAccountFactory, listed_quotes

    rows = [("box-8x", "A100-80GB-SXM4", 8, 80, "9.5", "us-east-1", PricingModel.ON_DEMAND, 2)]
    offers_ingest(account=ProviderAccountFactory(), quotes=listed_quotes(rows), now=timezone.now() - dt.timedelta(1))
    listing = Offer.objects.get()
    Offer.objects.update(last_seen_at=timezone.now())
    api = APIClient()
    api.force_authenticate(alice)

    def listed() -> bool:
        ids = [row["id"] for row in api.get("/api/v1/offers", {"q": "count>=8"}).json()["results"]]
        return listing.pk in ids and listing in offers_search("count>=8", now=timezone.now())

    assert listed()
    Offer.objects.update(reserved=2)
    assert not listed() and not api.get("/api/v1/offers").json()["results"]
    Offer.objects.update(reserved=1)
    assert listed()


def test_the_columns_of_the_offer_list_have_terms():
    terms = parse("seller=Helga's_GPU_Farm free>=2 gpumem>=80 vcpu>=16 ram>=64 disk>=500 net>=25 perf>=100.5")
    assert [(t.field, t.op, t.value) for t in terms] == [
        ("seller", "=", "Helga's_GPU_Farm"),
        ("free", ">=", Decimal(2)),
        ("mem", ">=", Decimal(80)),
        ("vcpu", ">=", Decimal(16)),
        ("ram", ">=", Decimal(64)),
        ("disk", ">=", Decimal(500)),
        ("net", ">=", Decimal(25)),
        ("perf", ">=", Decimal("100.5")),
    ]
    assert terms[2].text == "gpumem>=80"  # an alias keeps the text the buyer wrote


@pytest.mark.parametrize(
    "text, term, reason",
    [
        ("vcpu>=many", "vcpu>=many", "vcpu compares with a number from 0 to 100000 (vCPUs)"),
        ("free>=-1", "free>=-1", "free compares with a number from 0 to 1024 (free GPUs)"),
        ("net>=1e999", "net>=1e999", "net compares with a number from 0 to 100000 (Gbit/s)"),
        ("disk>10000001", "disk>10000001", "disk compares with a number from 0 to 10000000 (GB)"),
        ("ram<=lots", "ram<=lots", "ram compares with a number from 0 to 1000000 (GiB)"),
        ("perf>fast", "perf>fast", "perf compares with a number from 0 to 1000000 (dense FP16 TFLOPS per USD/h)"),
        ("seller>acme", "seller>acme", "seller takes = or !=, not >"),
        ("seller=" + "x" * 121, "seller=" + "x" * 33 + "…", "a seller's name is at most 120 characters"),
    ],
)
def test_a_wrong_term_for_a_new_column_is_refused_saying_what_is_wrong(text, term, reason):
    with pytest.raises(QueryError) as error:
        parse("gpu=H100 " + text)
    assert (error.value.column, error.value.term) == (10, term)
    assert reason in error.value.reason


@pytest.fixture
def machine_on_sale(fleet):
    """One of Helga's 8x H100 machines (96 vCPU, 1024 GiB, 4000 GB disk, 100 Gbit/s) on sale whole."""
    from marketplace.catalog.services import offers_sync
    from tests.hosts import start_hosts, stop_hosts

    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False)
    assert offers_sync(account_id=fleet.pk).ok
    yield
    stop_hosts(agents)


@pytest.mark.django_db
def test_the_new_terms_filter_real_offers(aws_account, machine_on_sale):
    now = timezone.now()

    def kinds(text: str) -> set[str]:
        return {o.account.kind for o in offers_search(text, now=now)}

    big = offers_search("vcpu>=48 ram>=384", now=now)
    assert big and all(o.vcpus >= 48 and o.memory_gib >= 384 for o in big)
    assert {o.gpu_memory_gb for o in offers_search("gpumem>=80", now=now)} >= {80}
    assert all(o.gpu_memory_gb >= 80 for o in offers_search("gpumem>=80", now=now))
    # The machine's disk is known; a cloud's is sized at launch, so a disk term leaves cloud offers in.
    assert kinds("disk>=4000") == {"aws", "community"} and kinds("disk>4000") == {"aws"}
    # Free GPUs are known of the machine only: a cloud's offer matches no free term.
    assert kinds("free>=8") == {"community"} and kinds("free>8") == set()
    # The machine's link and AWS's published figures ("100 Gigabit", "Up to 25 Gigabit").
    fast = offers_search("net>=100", now=now)
    assert {o.account.kind for o in fast} == {"aws", "community"}
    assert all(o.extra.get("network_gbps", 100) >= 100 for o in fast)
    assert {o.account.kind for o in offers_search("net!=100", now=now)} == {"aws"}
    assert kinds("seller=helga's_gpu_farm") == {"community"} and "community" not in kinds("seller!=Helga's_GPU_Farm")
    # Performance per dollar is dense FP16 TFLOPS per USD/h: the inverse of the per-TFLOP-hour price.
    cheap = offers_search("perf>=200", now=now)
    assert cheap and all(1 / o.usd_per_tflop_hour >= 200 for o in cheap)
    assert len(cheap) < len(offers_search("", now=now))


@pytest.mark.django_db
def test_the_offers_page_reads_its_columns_in_as_many_queries_for_many_rows_as_for_few(
    client, aws_account, machine_on_sale
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = {}
    # Both searches hold cloud and machine rows, on demand and spot (whose savings and bids cost a query each).
    for q in ("count>=8", ""):
        with CaptureQueriesContext(connection) as queries:
            page = client.get("/", {"q": q})
        counts[len(page.context["offers"])] = len(queries)
    few, many = sorted(counts)
    assert many >= 2 * few  # the searches differ in rows, not in the work per row
    assert counts[few] == counts[many]
