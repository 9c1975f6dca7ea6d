from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer, OfferStatus, PricePoint, QuarantinedOffer
from providers.models import ProviderAccount
from providers.types import OfferQuote, PricingModel
from tests.factories import ProviderAccountFactory

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def account(db) -> ProviderAccount:
    return ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")


def quote(itype: str = "p4de.24xlarge", *, zone: str = "us-east-1a", pricing=PricingModel.ON_DEMAND, **kw):
    fields = {
        "region": "us-east-1",
        "zone": zone,
        "instance_type": itype,
        "pricing_model": pricing,
        "gpu_model": "A100-80GB-SXM4",
        "gpu_count": 8,
        "gpu_memory_gb": 80,
        "vcpus": 96,
        "memory_gib": Decimal("1152"),
        "price": Decimal("27.44705"),
        "currency": "USD",
    }
    fields.update(kw)
    return OfferQuote(**fields)


def test_valid_rows_are_upserted_with_their_price_in_force_since_the_sync(account):
    report = offers_ingest(
        account=account,
        quotes=[quote(), quote(pricing=PricingModel.SPOT, price=Decimal("9.9734"))],
        now=T0,
    )

    assert (report.upserted, report.quarantined, report.price_changes) == (2, 0, 0)
    spot = Offer.objects.get(pricing_model="spot")
    assert (spot.price_usd, spot.gpu_model.key, spot.status) == (Decimal("9.973400"), "A100-80GB-SXM4", "available")
    assert (spot.price_since, spot.first_seen_at) == (T0, T0)
    assert PricePoint.objects.count() == 0  # a first price lives on the offer; points hold replaced prices


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"price": Decimal("0")}, "price 0 is zero or negative"),
        ({"gpu_count": 0}, "impossible GPU count 0"),
        ({"gpu_count": 64}, "impossible GPU count 64"),
        ({"gpu_model": "B300"}, "unknown GPU model 'B300' (no spec sheet)"),
        ({"gpu_memory_gb": 81920}, "GPU memory 81920 looks like MiB, spec is 80 GB"),
        ({"gpu_memory_gb": 40}, "GPU memory 40 GB does not match A100-80GB-SXM4's 80 GB"),
        ({"currency": "EUR"}, "no FX rate for currency 'EUR'"),
        ({"price": Decimal("700")}, "implausible price 700 USD for 8 GPU(s)"),
    ],
)
def test_implausible_rows_are_quarantined_with_the_reason(account, bad, reason):
    report = offers_ingest(account=account, quotes=[quote(**bad)], now=T0)

    assert (report.upserted, report.quarantined) == (0, 1)
    assert Offer.objects.count() == 0
    assert QuarantinedOffer.objects.get().reason == reason


def test_spot_at_or_above_on_demand_is_quarantined(account):
    rows = [
        quote(price=Decimal("10")),
        quote(pricing=PricingModel.SPOT, price=Decimal("10")),
        quote(zone="us-east-1b", price=Decimal("10")),
        quote(zone="us-east-1b", pricing=PricingModel.SPOT, price=Decimal("11")),
    ]

    report = offers_ingest(account=account, quotes=rows, now=T0)

    assert (report.upserted, report.quarantined) == (2, 2)
    reasons = sorted(QuarantinedOffer.objects.values_list("zone", "reason"))
    assert reasons == [
        ("us-east-1a", "spot price 10 is not below on-demand 10"),
        ("us-east-1b", "spot price 11 is not below on-demand 10"),
    ]


def test_resync_updates_in_place_records_changes_and_marks_vanished(account):
    offers_ingest(account=account, quotes=[quote(), quote("p5.48xlarge", gpu_model="H100-SXM5")], now=T0)
    first_id = Offer.objects.get(instance_type="p4de.24xlarge").pk

    t1 = T0 + dt.timedelta(minutes=5)
    report = offers_ingest(account=account, quotes=[quote(price=Decimal("26.00"))], now=t1)

    assert (report.upserted, report.vanished, report.price_changes) == (1, 1, 1)
    p4de = Offer.objects.get(instance_type="p4de.24xlarge")
    assert (p4de.pk, p4de.price, p4de.first_seen_at, p4de.last_seen_at) == (first_id, Decimal("26.000000"), T0, t1)
    assert p4de.price_since == t1
    assert Offer.objects.get(instance_type="p5.48xlarge").status == OfferStatus.UNAVAILABLE
    replaced = PricePoint.objects.get(offer=p4de)
    assert (replaced.observed_at, replaced.price, replaced.price_usd) == (
        T0,
        Decimal("27.447050"),
        Decimal("27.447050"),
    )

    t2 = t1 + dt.timedelta(minutes=5)
    offers_ingest(account=account, quotes=[quote(price=Decimal("25.00"))], now=t2)
    history = PricePoint.objects.filter(offer=p4de).order_by("observed_at").values_list("observed_at", "price")
    assert list(history) == [(T0, Decimal("27.447050")), (t1, Decimal("26.000000"))]
    p4de.refresh_from_db()
    assert (p4de.price, p4de.price_since) == (Decimal("25.000000"), t2)


def test_an_unchanged_price_writes_no_new_price_point(account):
    offers_ingest(account=account, quotes=[quote()], now=T0)
    report = offers_ingest(account=account, quotes=[quote()], now=T0 + dt.timedelta(minutes=5))

    assert report.price_changes == 0
    assert PricePoint.objects.count() == 0
    assert Offer.objects.get().price_since == T0


def test_a_row_quarantined_later_leaves_the_market_and_a_fixed_one_returns(account):
    offers_ingest(account=account, quotes=[quote()], now=T0)
    offers_ingest(account=account, quotes=[quote(price=Decimal("0"))], now=T0 + dt.timedelta(minutes=1))

    assert Offer.objects.get().status == OfferStatus.UNAVAILABLE
    assert QuarantinedOffer.objects.count() == 1

    offers_ingest(account=account, quotes=[quote()], now=T0 + dt.timedelta(minutes=2))

    assert Offer.objects.get().status == OfferStatus.AVAILABLE
    assert QuarantinedOffer.objects.count() == 0


def test_ingestion_is_bulk_whatever_the_row_count(account, django_assert_max_num_queries):
    rows = [quote(f"type-{i}.xlarge", zone=f"us-east-1{z}") for i in range(200) for z in "abc"]

    # Batches, not rows: SQLite caps the variables per statement, so 600 rows take a few dozen queries at most.
    with django_assert_max_num_queries(40):
        report = offers_ingest(account=account, quotes=rows, now=T0)

    assert report.upserted == 600
    assert Offer.objects.count() == 600


def test_a_cny_price_is_converted_with_the_stored_rate_and_keeps_its_currency(account):
    from marketplace.models import FxRate

    FxRate.objects.update_or_create(
        currency="CNY", defaults={"usd_per_unit": Decimal("0.14"), "source": "test", "as_of": T0.date()}
    )

    offers_ingest(account=account, quotes=[quote(price=Decimal("277.93"), currency="CNY")], now=T0)

    offer = Offer.objects.get()
    assert (offer.price, offer.currency, offer.fx_rate, offer.price_usd) == (
        Decimal("277.930000"),
        "CNY",
        Decimal("0.14000000"),
        Decimal("38.910200"),
    )


def test_fx_set_validates_and_stores_the_rate(db, capsys):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from marketplace.models import FxRate

    call_command("fx", "set", "cny", "0.1385", "--source", "a bank's published rate", "--as-of", "2026-12-01")
    rate = FxRate.objects.get(currency="CNY")
    assert (rate.usd_per_unit, str(rate.as_of)) == (Decimal("0.13850000"), "2026-12-01")
    with pytest.raises(CommandError, match="not a number"):
        call_command("fx", "set", "CNY", "lots", "--source", "x")
    with pytest.raises(CommandError, match="3-letter ISO code"):
        call_command("fx", "set", "USD", "1", "--source", "x")


def test_two_accounts_ingested_in_one_transaction_keep_their_own_rows(account):
    from django.db import transaction

    other = ProviderAccountFactory(provider__name="Other Seller", name="other")

    with transaction.atomic():
        offers_ingest(account=account, quotes=[quote()], now=T0)
        offers_ingest(account=other, quotes=[quote("p5.48xlarge", gpu_model="H100-SXM5")], now=T0)

    assert sorted(Offer.objects.values_list("account__name", "instance_type")) == [
        ("main", "p4de.24xlarge"),
        ("other", "p5.48xlarge"),
    ]
    assert list(Offer.objects.values_list("price_since", flat=True).distinct()) == [T0]


@pytest.fixture
def committed_account(transactional_db) -> ProviderAccount:
    """An account for tests whose ingestion must commit on its own, outside the test's transaction."""
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    if not GpuModel.objects.exists():
        # A transactional test before this one flushed the rows the data migration seeded.
        gpu_models_upsert(GpuModel)
    return ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")


def test_ingestion_outside_a_transaction_writes_every_part(committed_account):
    account = committed_account
    offers_ingest(account=account, quotes=[quote(), quote("p5.48xlarge", gpu_model="H100-SXM5")], now=T0)

    t1 = T0 + dt.timedelta(minutes=5)
    report = offers_ingest(
        account=account, quotes=[quote(price=Decimal("26.00")), quote("g5.xlarge", gpu_count=0)], now=t1
    )

    assert (report.upserted, report.quarantined, report.vanished, report.price_changes) == (1, 1, 1, 1)
    assert sorted(Offer.objects.values_list("instance_type", "status", "price_since")) == [
        ("p4de.24xlarge", "available", t1),
        ("p5.48xlarge", "unavailable", T0),
    ]
    assert list(PricePoint.objects.values_list("offer__instance_type", "observed_at", "price")) == [
        ("p4de.24xlarge", T0, Decimal("27.447050"))
    ]
    assert QuarantinedOffer.objects.get().reason == "impossible GPU count 0"


def test_a_row_the_database_refuses_leaves_the_previous_sync_untouched(committed_account):
    from django.db import DataError, connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores any integer; the overflow exists only on PostgreSQL")
    account = committed_account
    offers_ingest(account=account, quotes=[quote(), quote("p5.48xlarge", gpu_model="H100-SXM5")], now=T0)
    offers_ingest(
        account=account,
        quotes=[quote(), quote("p5.48xlarge", gpu_model="H100-SXM5"), quote("x", price=Decimal(0))],
        now=T0,
    )

    with pytest.raises(DataError):
        offers_ingest(
            account=account, quotes=[quote(price=Decimal("26.00"), vcpus=2**40)], now=T0 + dt.timedelta(minutes=5)
        )

    assert sorted(Offer.objects.values_list("instance_type", "status", "price")) == [
        ("p4de.24xlarge", "available", Decimal("27.447050")),
        ("p5.48xlarge", "available", Decimal("27.447050")),
    ]
    assert PricePoint.objects.count() == 0
    assert list(Offer.objects.values_list("price_since", flat=True).distinct()) == [T0]
    assert QuarantinedOffer.objects.get().instance_type == "x"
