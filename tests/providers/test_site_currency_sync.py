"""An account on a cloud's International site is priced in USD end to end: the adapter labels the quote with the
currency its site bills in, and ingestion converts it at the USD rate, never at the CNY one (about 7x too low).

Sources: Alibaba's DescribePrice (PriceInfo.Price.Currency) and DescribeSpotPriceHistory (Currency) state "China
site: CNY. International site: USD." (ECS API reference,
https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice and
https://www.alibabacloud.com/help/en/ecs/developer-reference/api-describespotpricehistory). Tencent's ItemPrice states
no currency at all ("InquiryPriceRunInstances", https://www.tencentcloud.com/document/api/213/33248), so the
account's ``site`` option says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from marketplace.catalog.services import offers_sync
from marketplace.models import Offer
from providers.services import provider_account_connect
from sandboxes.alibaba.app import AlibabaSandbox
from tests.conftest import TENCENT_TEST_CREDENTIALS

pytestmark = pytest.mark.django_db

PETRA_ALIBABA = {"access_key_id": "LTAIPETRA", "access_key_secret": "petra-alibaba-secret"}
GN7I = "ecs.gn7i-c8g1.2xlarge"


@pytest.fixture
def alibaba(alibaba_server: AlibabaSandbox) -> Iterator[AlibabaSandbox]:
    alibaba_server.reset()
    alibaba_server.register_key(PETRA_ALIBABA["access_key_id"], PETRA_ALIBABA["access_key_secret"])
    yield alibaba_server
    alibaba_server.reset()


def _alibaba_account(sandbox: AlibabaSandbox):
    return provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="alibaba",
        name="alibaba-sandbox",
        credentials=PETRA_ALIBABA,
        regions=["cn-shanghai"],
        endpoint_url=sandbox.url,
    )


def test_an_alibaba_international_account_is_converted_at_the_usd_rate(alibaba: AlibabaSandbox) -> None:
    alibaba.set_account_site(PETRA_ALIBABA["access_key_id"], "international")
    alibaba.set_price("cn-shanghai", GN7I, Decimal("1.52"), "USD")
    recently = datetime.now(UTC) - timedelta(minutes=5)
    alibaba.add_spot_price("cn-shanghai", GN7I, "cn-shanghai-e", Decimal("0.41"), currency="USD", timestamp=recently)
    account = _alibaba_account(alibaba)

    outcome = offers_sync(account_id=account.pk)

    assert outcome.ok, outcome.error
    rows = Offer.objects.filter(account=account).order_by("zone", "pricing_model")
    assert [(o.zone, o.pricing_model, o.currency, o.price_usd) for o in rows] == [
        ("cn-shanghai-e", "on_demand", "USD", Decimal("1.52")),
        ("cn-shanghai-e", "spot", "USD", Decimal("0.41")),
        ("cn-shanghai-f", "on_demand", "USD", Decimal("1.52")),
        ("cn-shanghai-g", "on_demand", "USD", Decimal("1.52")),
    ]


def test_an_alibaba_china_account_is_converted_at_the_cny_rate(alibaba: AlibabaSandbox) -> None:
    recently = datetime.now(UTC) - timedelta(minutes=5)
    alibaba.add_spot_price("cn-shanghai", GN7I, "cn-shanghai-e", Decimal("2.90"), currency="CNY", timestamp=recently)
    account = _alibaba_account(alibaba)

    outcome = offers_sync(account_id=account.pk)

    assert outcome.ok, outcome.error
    spot = Offer.objects.get(account=account, pricing_model="spot")
    assert (spot.currency, spot.price, spot.price_usd) == ("CNY", Decimal("2.9"), Decimal("2.9") * spot.fx_rate)
    assert spot.fx_rate < 1


def test_a_tencent_international_account_is_converted_at_the_usd_rate(tencent_sandbox) -> None:
    tencent_sandbox.set_account_site(TENCENT_TEST_CREDENTIALS["secret_id"], "international")
    tencent_sandbox.set_price("ap-guangzhou", "GN7.2XLARGE32", Decimal("1.23"), "USD")
    account = provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="tencent",
        name="tencent-international",
        credentials=TENCENT_TEST_CREDENTIALS,
        regions=["ap-guangzhou"],
        endpoint_url=tencent_sandbox.url,
        options={"site": "international"},
    )

    outcome = offers_sync(account_id=account.pk)

    assert outcome.ok, outcome.error
    rows = Offer.objects.filter(account=account).order_by("zone")
    assert [(o.zone, o.instance_type, o.currency, o.fx_rate, o.price_usd) for o in rows] == [
        ("ap-guangzhou-3", "GN7.2XLARGE32", "USD", Decimal(1), Decimal("1.23")),
        ("ap-guangzhou-4", "GN7.2XLARGE32", "USD", Decimal(1), Decimal("1.23")),
    ]
