"""Every offer states its SLA (issue 38, part 3): a cloud's published single-instance figure and tiers, none on
spot, an independent host's or cluster's chosen figure never below the market's floor; set on ingestion and
shown by the offers API and page."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer
from marketplace.sla.published import (
    CLOUD_SLAS,
    Tier,
    TiersMalformed,
    credit_tier,
    offer_sla,
    standard_tiers,
    tiers_from_json,
)
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes

pytestmark = pytest.mark.django_db

FLOOR = Decimal("95.0")


def test_each_cloud_states_its_published_single_instance_figure():
    # AWS: "Amazon Compute Service Level Agreement", Instance-Level SLA, https://aws.amazon.com/compute/sla/
    # Azure: "SLA for Virtual Machines", single instance on Premium SSD,
    #   https://azure.microsoft.com/support/legal/sla/virtual-machines/
    # Google: "Compute Engine Service Level Agreement (SLA)", a single instance of all other families,
    #   https://cloud.google.com/compute/sla
    # Alibaba: "Elastic Compute Service (ECS) Service Level Agreement", single instance (a secondary listing only)
    # Tencent: "Cloud Virtual Machine Service Level Agreement" (not confirmed; see marketplace/sla/published.py)
    figures = {kind: sla.availability_pct for kind, sla in CLOUD_SLAS.items()}
    assert figures == {
        "aws": Decimal("99.500"),
        "azure": Decimal("99.900"),
        "gcp": Decimal("99.900"),
        "alibaba": Decimal("99.975"),
        "tencent": Decimal("99.975"),
    }
    assert CLOUD_SLAS["aws"].tiers == (
        Tier(Decimal("99.5"), Decimal(10)),
        Tier(Decimal("99.0"), Decimal(30)),
        Tier(Decimal("95.0"), Decimal(100)),
    )
    for kind, sla in CLOUD_SLAS.items():
        assert "https://" in sla.source, kind
        # The first tier starts at the committed figure: any shortfall earns a credit.
        assert sla.tiers[0].below_pct == sla.availability_pct, kind


def test_spot_offers_carry_no_sla_on_any_kind():
    for kind in ("aws", "azure", "gcp", "alibaba", "tencent", "community", "kubernetes"):
        assert offer_sla(kind=kind, pricing_model="spot", seller_pct=Decimal(99), floor_pct=FLOOR) is None


def test_a_hosts_figure_is_its_sellers_choice_but_never_below_the_floor():
    chosen = offer_sla(kind="community", pricing_model="on_demand", seller_pct=Decimal("99.2"), floor_pct=FLOOR)
    assert chosen is not None
    assert (chosen.availability_pct, chosen.tiers) == (Decimal("99.200"), standard_tiers(Decimal("99.200")))
    low = offer_sla(kind="kubernetes", pricing_model="on_demand", seller_pct=Decimal(90), floor_pct=FLOOR)
    unset = offer_sla(kind="community", pricing_model="on_demand", seller_pct=None, floor_pct=FLOOR)
    assert low is not None and unset is not None
    assert (low.availability_pct, unset.availability_pct) == (Decimal("95.000"), Decimal("95.000"))


def test_the_credit_tier_is_the_lowest_threshold_the_measurement_is_below():
    tiers = CLOUD_SLAS["aws"].tiers
    assert credit_tier(tiers, Decimal("99.5")) is None
    assert credit_tier(tiers, Decimal("100")) is None
    assert credit_tier(tiers, Decimal("99.4999")) == tiers[0]
    assert credit_tier(tiers, Decimal("99.0")) == tiers[0]
    assert credit_tier(tiers, Decimal("98.99")) == tiers[1]
    assert credit_tier(tiers, Decimal("0")) == tiers[2]
    assert tiers_from_json(CLOUD_SLAS["aws"].credits_json()) == tiers
    assert tiers_from_json([]) == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not a list", "must be a list"),
        ([["99", {"x": 1}]], "tier 1 must be"),
        ([["99", "10"], ["NaN", "10"]], "tier 2 must hold percentages"),
        ([["ninety", "10"]], "not a number"),
        ([["99", "150"]], "from 0 to 100"),
        ([["99", "10"]] * 11, "at most 10"),
    ],
)
def test_malformed_stored_tiers_are_refused_loudly_not_read_as_no_credit(raw, message):
    with pytest.raises(TiersMalformed, match=message):
        tiers_from_json(raw)


def test_cloud_offers_state_their_sla_on_ingestion_and_spot_ones_none(aws_account):
    on_demand = aws_account.offers.filter(pricing_model="on_demand")
    spot = aws_account.offers.filter(pricing_model="spot")
    assert on_demand.exists() and spot.exists()
    assert set(on_demand.values_list("sla_availability", "sla_source")) == {
        (Decimal("99.500"), CLOUD_SLAS["aws"].source)
    }
    assert on_demand.first().sla_credits == [["99.5", "10"], ["99.0", "30"], ["95.0", "100"]]
    assert set(spot.values_list("sla_availability", "sla_source")) == {(None, "")}
    assert list(spot.first().sla_credits) == []


def test_a_sellers_new_commitment_reaches_its_offers_at_the_next_sync(db):
    account = ProviderAccountFactory(kind="community")
    quotes = listed_quotes([("g5.xlarge", "A10G", 1, 24, "0.40", "eu-west-1", PricingModel.ON_DEMAND, 1)])
    report = offers_ingest(account=account, quotes=quotes, now=timezone.now())
    assert report.quarantined == 0, report.reasons
    assert Offer.objects.get(account=account).sla_availability == Decimal("95.000")
    account.sla_commitment_pct = Decimal("99.5")
    account.save(update_fields=["sla_commitment_pct"])
    offers_ingest(account=account, quotes=quotes, now=timezone.now())
    offer = Offer.objects.get(account=account)
    assert offer.sla_availability == Decimal("99.500")
    assert offer.sla_credits == [["99.500", "10"], ["98.500", "25"], ["94.500", "100"]]


def test_the_offers_api_and_page_show_the_sla(aws_account, alice):
    client = APIClient()
    client.force_authenticate(alice)
    rows = client.get("/api/v1/offers", {"limit": 500}).json()["results"]
    by_pricing = {row["pricing_model"]: row["sla"] for row in rows}
    assert by_pricing["spot"] is None
    assert by_pricing["on_demand"] == {
        "availability_pct": "99.500",
        "credits": [["99.5", "10"], ["99.0", "30"], ["95.0", "100"]],
        "source": CLOUD_SLAS["aws"].source,
    }
    page = Client()
    page.force_login(alice)
    page = page.get(reverse("storefront:offers")).content.decode()
    assert '<td class="num nowrap" data-label="SLA">' in page
    assert "99.5 %" in page
