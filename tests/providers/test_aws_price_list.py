"""Issue 18: what the AWS adapter reads from the Price List API (``pricing.get_products``), and how it asks.

- A price dimension states its ``unit`` ("the usage measurement unit for the price") and keys ``pricePerUnit`` by
  currency code ("Reading the service price list file for an AWS service",
  https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/reading-service-price-list-file-for-services.html;
  price lists are denominated in an ISO-4217 ``CurrencyCode``, API reference, PriceList,
  https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_PriceList.html). The broker
  reads only USD per "Hrs"; any other price is refused by name and counted, never quoted.
- A GetProducts ``Filter``'s ``Value`` is a string of at most 1024 characters (API reference, Filter,
  https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_Filter.html; botocore's
  pricing service model: ``Value`` min 1, max 1024), and ANY_OF takes its values comma-separated in it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal

import boto3
import botocore.config
import botocore.exceptions
import pytest

from providers.aws import catalog
from providers.aws.adapter import PRICE_FILTER_VALUE_MAX, PRICE_TYPES_PER_CALL, AwsAdapter, any_of_values
from providers.types import PricingModel
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE

AdapterFactory = Callable[..., AwsAdapter]
REGION = "eu-central-1"


# ------------------------------------------------------------------------------------ unit and currency


def test_a_price_in_another_currency_or_unit_is_refused_with_its_reason(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    aws_sandbox.restate_on_demand(REGION, "g5.xlarge", currency="CNY")
    aws_sandbox.restate_on_demand(REGION, "g4dn.xlarge", unit="Quantity")
    adapter = aws_adapter(regions=[REGION])

    with caplog.at_level(logging.WARNING, logger="providers.aws.adapter"):
        offers = adapter.list_offers()

    # Neither type is quoted at all: a spot quote needs the on-demand price it is checked against.
    assert {o.instance_type for o in offers} == {
        "g6.8xlarge",
        "g6e.48xlarge",
        "p4de.24xlarge",
        "g6f.large",
        "g6f.xlarge",
        "g6f.2xlarge",
        "g6f.4xlarge",
    }
    assert sorted((r.instance_type, r.reason) for r in adapter.price_refusals) == [
        ("g4dn.xlarge", "on-demand price in USD per 'Quantity'; only USD per 'Hrs' is read"),
        ("g5.xlarge", "on-demand price in CNY per 'Hrs'; only USD per 'Hrs' is read"),
    ]
    assert all(r.sku for r in adapter.price_refusals)
    assert sorted(r.getMessage().partition(": Price List product ")[0] for r in caplog.records) == [
        f"aws {REGION}: no quote for g4dn.xlarge",
        f"aws {REGION}: no quote for g5.xlarge",
    ]


def test_the_refusals_are_those_of_the_last_listing(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter(regions=[REGION])
    aws_sandbox.restate_on_demand(REGION, "g5.xlarge", currency="EUR")
    adapter.list_offers()
    assert [r.instance_type for r in adapter.price_refusals] == ["g5.xlarge"]

    aws_sandbox.reset()
    offers = adapter.list_offers()

    assert adapter.price_refusals == []
    assert {o.pricing_model for o in offers if o.instance_type == "g5.xlarge"} == {
        PricingModel.ON_DEMAND,
        PricingModel.SPOT,
    }


def test_a_type_priced_by_another_product_in_usd_per_hour_is_still_quoted() -> None:
    def product(sku: str, unit: str, currency: str) -> dict[str, object]:
        dimension = {"unit": unit, "pricePerUnit": {currency: "1.5"}}
        return {
            "product": {"sku": sku, "attributes": {"instanceType": "g5.xlarge"}},
            "terms": {"OnDemand": {f"{sku}.T": {"priceDimensions": {f"{sku}.T.R": dimension}}}},
        }

    read = catalog.on_demand_usd_by_type([product("A", "Hrs", "CNY"), product("B", "Hrs", "USD")])

    assert (read.prices, read.refused) == ({"g5.xlarge": (Decimal("1.5"), "B")}, [])


# ------------------------------------------------------------------------------------- filter length


def test_any_of_values_stay_within_the_documented_length_and_count() -> None:
    names = [f"p6-b200-{i:04d}.48xlarge" for i in range(300)]  # 21 characters each

    values = any_of_values(names, PRICE_TYPES_PER_CALL, PRICE_FILTER_VALUE_MAX)

    assert all(len(v) <= PRICE_FILTER_VALUE_MAX for v in values)
    assert all(len(v.split(",")) <= PRICE_TYPES_PER_CALL for v in values)
    assert [n for v in values for n in v.split(",")] == names
    assert len(values) == 7  # 46 names of 21 characters (plus commas) fit in 1024, not 47


def test_a_name_longer_than_a_filter_value_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than a Price List filter value"):
        any_of_values(["x" * (PRICE_FILTER_VALUE_MAX + 1)], PRICE_TYPES_PER_CALL, PRICE_FILTER_VALUE_MAX)


def test_the_sandbox_refuses_a_filter_value_over_1024_characters_as_aws_does(aws_sandbox: AwsSandbox) -> None:
    pricing = boto3.client(
        "pricing",
        region_name="us-east-1",
        endpoint_url=aws_sandbox.url,
        aws_access_key_id=ALICE.access_key_id,
        aws_secret_access_key=ALICE.secret_access_key,
        config=botocore.config.Config(retries={"total_max_attempts": 1}),
    )
    at_limit = ",".join(["g5.xlarge"] * 102) + ",g5.2"  # 1024 characters

    assert len(at_limit) == 1024
    pricing.get_products(
        ServiceCode="AmazonEC2", Filters=[{"Type": "ANY_OF", "Field": "instanceType", "Value": at_limit}]
    )
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        pricing.get_products(
            ServiceCode="AmazonEC2", Filters=[{"Type": "ANY_OF", "Field": "instanceType", "Value": at_limit + "l"}]
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "filters.1.member.value" in caught.value.response["Error"]["Message"]


def test_a_long_list_of_types_is_priced_in_values_aws_accepts(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    # 200 names a region could list (long ones, as p6e-gb200.36xlarge is) around the seeded ones: one ANY_OF
    # of 50 such names would be ~1,100 characters.
    padding = [f"p9e-gb900-{i:03d}.36xlarge" for i in range(200)]
    wanted = sorted([*padding, "g5.xlarge", "g6f.large", "p4de.24xlarge"])

    prices = aws_adapter(regions=[REGION])._on_demand_prices(REGION, wanted)

    assert {name: price for name, (price, _) in prices.items()} == {
        "g5.xlarge": Decimal("1.258"),
        "g6f.large": Decimal("0.25261"),
        "p4de.24xlarge": Decimal("34.29122"),
    }
    values = [t for c in aws_sandbox.calls("GetProducts") for t in c.instance_types]
    assert all(len(v) <= PRICE_FILTER_VALUE_MAX for v in values)
    assert sorted(n for v in values for n in v.split(",")) == wanted
