"""AlibabaAdapter against the ECS sandbox: the real alibabacloud-ecs20140526 SDK over HTTP."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from providers.alibaba.adapter import AlibabaAdapter
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.registry import ADAPTERS, build_adapter
from providers.types import Credentials, InstanceState, LaunchSpec, OfferQuote, PricingModel
from sandboxes.alibaba.app import AlibabaSandbox, start_alibaba_sandbox

AdapterFactory = Callable[..., AlibabaAdapter]
ALICE_SECRET = "alice-secret"
ZONES = ("cn-shanghai-e", "cn-shanghai-f", "cn-shanghai-g")
SEEDED_TYPES = {
    "ecs.gn6i-c4g1.xlarge": "T4",
    "ecs.gn6i-c8g1.2xlarge": "T4",
    "ecs.gn6i-c16g1.4xlarge": "T4",
    "ecs.gn6i-c40g1.10xlarge": "T4",
    "ecs.gn6i-c24g1.24xlarge": "T4",
    "ecs.gn6v-c8g1.2xlarge": "V100-16GB-SXM2",
    "ecs.gn6v-c8g1.16xlarge": "V100-16GB-SXM2",
    "ecs.gn6e-c12g1.3xlarge": "V100-32GB-SXM2",
    "ecs.gn6e-c12g1.24xlarge": "V100-32GB-SXM2",
    "ecs.gn7i-c8g1.2xlarge": "A10",
    "ecs.gn7i-c16g1.4xlarge": "A10",
    "ecs.gn7i-c32g1.32xlarge": "A10",
    "ecs.gn7-c12g1.3xlarge": "A100-40GB-SXM4",
    "ecs.gn7-c13g1.26xlarge": "A100-40GB-SXM4",
    "ecs.gn7e-c16g1.4xlarge": "A100-80GB-SXM4",
    "ecs.gn7e-c16g1.32xlarge": "A100-80GB-SXM4",
    "ecs.ebmgn7e.32xlarge": "A100-80GB-SXM4",
}


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[AlibabaSandbox]:
    sandbox = start_alibaba_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(sandbox_server: AlibabaSandbox) -> Iterator[AlibabaSandbox]:
    sandbox_server.reset()
    sandbox_server.register_key("LTAIALICE", ALICE_SECRET)
    yield sandbox_server
    sandbox_server.reset()


@pytest.fixture
def adapter(sandbox: AlibabaSandbox) -> AdapterFactory:
    """``adapter(regions=[...], access_key_id=..., secret=..., **options)`` -> an ``AlibabaAdapter`` on the sandbox."""

    def build(
        regions: list[str] | None = None,
        access_key_id: str = "LTAIALICE",
        secret: str = ALICE_SECRET,
        **options: str,
    ) -> AlibabaAdapter:
        credentials = Credentials(
            kind="alibaba",
            values={"access_key_id": access_key_id, "access_key_secret": secret},
            endpoint_url=sandbox.url,
        )
        return AlibabaAdapter(credentials, regions or ["cn-shanghai"], options)

    return build


def _spec(
    idempotency_key: str = "ord-1-attempt-1",
    *,
    order_ref: str = "ord-1",
    region: str = "cn-shanghai",
    zone: str = "cn-shanghai-e",
    instance_type: str = "ecs.gn7i-c8g1.2xlarge",
    pricing_model: PricingModel = PricingModel.ON_DEMAND,
    max_price: Decimal | None = None,
    tags: dict[str, str] | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        region=region,
        zone=zone,
        instance_type=instance_type,
        pricing_model=pricing_model,
        client_token=idempotency_key,
        order_ref=order_ref,
        max_price=max_price,
        tags=tags or {},
    )


# --------------------------------------------------------------------------------------------- offers


def test_list_offers_has_one_on_demand_quote_per_stocked_zone_and_type(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    offers = adapter().list_offers()

    # 17 types x 3 zones, less ebmgn7e in -e (WithoutStock) and gn6v-c8g1.16xlarge in -f (not sold there).
    expected = {(t, z) for t in SEEDED_TYPES for z in ZONES} - {
        ("ecs.ebmgn7e.32xlarge", "cn-shanghai-e"),
        ("ecs.gn6v-c8g1.16xlarge", "cn-shanghai-f"),
    }
    assert {(o.instance_type, o.zone) for o in offers} == expected
    assert Counter(o.pricing_model for o in offers) == {PricingModel.ON_DEMAND: 49}
    assert len({o.natural_key for o in offers}) == 49
    assert {o.instance_type: o.gpu_model for o in offers} == SEEDED_TYPES
    assert {(o.region, o.currency) for o in offers} == {("cn-shanghai", "CNY")}
    closing = next(o for o in offers if (o.instance_type, o.zone) == ("ecs.gn7-c13g1.26xlarge", "cn-shanghai-g"))
    assert (closing.extra["stock_status"], closing.capacity) == ("ClosedWithStock", None)


def test_prices_equal_the_seed_and_no_spot_price_is_invented(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    offers = adapter().list_offers()

    seed = {r.instance_type: r.on_demand for r in sandbox.seed}
    assert all(o.price == seed[o.instance_type] for o in offers)
    # The history was asked once per stocked type and was empty: no spot quote at all.
    assert len(sandbox.calls("DescribeSpotPriceHistory")) == 17
    assert not [o for o in offers if o.pricing_model is PricingModel.SPOT]


def test_an_offer_carries_the_whole_mapped_catalogue_entry(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    offers = adapter().list_offers()

    offer = next(
        o for o in offers if o.natural_key == ("cn-shanghai", "cn-shanghai-f", "ecs.gn7-c13g1.26xlarge", "on_demand")
    )
    assert offer == OfferQuote(
        region="cn-shanghai",
        zone="cn-shanghai-f",
        instance_type="ecs.gn7-c13g1.26xlarge",
        pricing_model=PricingModel.ON_DEMAND,
        gpu_model="A100-40GB-SXM4",
        gpu_count=8,
        gpu_memory_gb=40,
        vcpus=104,
        memory_gib=Decimal(756),
        price=Decimal("252.66"),
        currency="CNY",
        capacity=None,
        interconnect="nvlink",
        extra={
            "gpu_spec": "NVIDIA A100",
            "gpu_memory_gib_reported": "40.0",
            "gpu_model_source": "ECS family table (family->GPU not verified, GPU-SPECS.md section 5)",
            "instance_type_family": "ecs.gn7",
            "cpu_architecture": "X86",
            "stock_status": "WithStock",
            "original_price": "252.66",
            "discount_price": "0",
            "price_unit": "Hour",
        },
    )


# Both price answers state their currency, that of the account's site: DescribePrice in PriceInfo.Price.Currency and
# DescribeSpotPriceHistory in a top-level Currency, "China site: CNY. International site: USD." (ECS API reference,
# "DescribePrice", https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice, and
# "DescribeSpotPriceHistory", https://www.alibabacloud.com/help/en/ecs/developer-reference/api-describespotpricehistory,
# response parameter Currency; the same text on alibabacloud_ecs20140526's DescribeSpotPriceHistoryResponseBody).
GN7I = "ecs.gn7i-c8g1.2xlarge"


def test_an_international_account_is_quoted_in_the_usd_its_answers_state(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    recently = datetime.now(UTC) - timedelta(minutes=5)
    sandbox.set_account_site("LTAIALICE", "international")
    sandbox.set_price("cn-shanghai", GN7I, Decimal("1.52"), "USD")
    sandbox.add_spot_price("cn-shanghai", GN7I, "cn-shanghai-e", Decimal("0.41"), currency="USD", timestamp=recently)
    # A China-site point of the same type is not this account's: it must not appear, in either currency.
    sandbox.add_spot_price("cn-shanghai", GN7I, "cn-shanghai-f", Decimal("2.90"), currency="CNY", timestamp=recently)

    offers = adapter().list_offers()

    assert sorted((o.zone, o.pricing_model.value, o.price, o.currency) for o in offers) == [
        ("cn-shanghai-e", "on_demand", Decimal("1.52"), "USD"),
        ("cn-shanghai-e", "spot", Decimal("0.41"), "USD"),
        ("cn-shanghai-f", "on_demand", Decimal("1.52"), "USD"),
        ("cn-shanghai-g", "on_demand", Decimal("1.52"), "USD"),
    ]


def test_a_china_account_is_quoted_in_the_cny_its_answers_state(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    recently = datetime.now(UTC) - timedelta(minutes=5)
    sandbox.add_spot_price("cn-shanghai", GN7I, "cn-shanghai-g", Decimal("2.90"), currency="CNY", timestamp=recently)

    offers = adapter().list_offers()

    spot = [(o.instance_type, o.zone, o.price, o.currency) for o in offers if o.pricing_model is PricingModel.SPOT]
    assert spot == [(GN7I, "cn-shanghai-g", Decimal("2.9"), "CNY")]
    assert {o.currency for o in offers} == {"CNY"}


def test_an_international_account_is_never_quoted_the_china_sites_prices(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.set_account_site("LTAIALICE", "international")

    offers = adapter().list_offers()

    # No USD price was sourced: every stocked (zone, type) was asked and none was priced, in CNY or otherwise.
    assert offers == []
    assert len(sandbox.calls("DescribePrice")) == 49


def test_a_region_without_sourced_prices_offers_nothing(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    # Stock in cn-beijing but no sourced price there: the type is left out, not priced by invention.
    sandbox.set_stock("cn-beijing", "cn-beijing-h", "ecs.gn7i-c8g1.2xlarge", "WithStock")

    offers = adapter(regions=["cn-shanghai", "cn-beijing"]).list_offers()

    assert {o.region for o in offers} == {"cn-shanghai"}
    assert [c.region for c in sandbox.calls("DescribePrice") if c.region == "cn-beijing"] == ["cn-beijing"]
    assert len(sandbox.calls("DescribeInstanceTypes")) == 1


def test_a_zone_that_runs_out_of_stock_drops_its_offer(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.set_stock("cn-shanghai", "cn-shanghai-e", "ecs.gn7i-c8g1.2xlarge", "WithoutStock")

    offers = adapter().list_offers()

    assert sorted(o.zone for o in offers if o.instance_type == "ecs.gn7i-c8g1.2xlarge") == [
        "cn-shanghai-f",
        "cn-shanghai-g",
    ]


# --------------------------------------------------------------------------------------------- launch


def test_launch_describe_and_terminate(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()

    handle = client.launch(_spec(tags={"buyer": "alice"}))

    assert handle.instance_id.startswith("i-uf6")
    assert (handle.region, handle.zone, handle.instance_type, handle.state) == (
        "cn-shanghai",
        "cn-shanghai-e",
        "ecs.gn7i-c8g1.2xlarge",
        InstanceState.PENDING,
    )
    assert handle.tags == {"broker:order": "ord-1", "buyer": "alice"}
    assert (handle.extra["client_token"], handle.extra["spot_strategy"]) == ("ord-1-attempt-1", "NoSpot")
    assert [(i.instance_id, i.client_token, i.image_id) for i in sandbox.instances()] == [
        (handle.instance_id, "ord-1-attempt-1", "ubuntu_22_04_x64_20G_alibase_20240926.vhd")
    ]

    described = client.describe("cn-shanghai", handle.instance_id)
    assert (described.state, described.zone, described.tags) == (InstanceState.RUNNING, "cn-shanghai-e", handle.tags)
    assert described.private_ip is not None and described.launched_at is not None

    released = client.terminate("cn-shanghai", handle.instance_id)
    assert (released.state, released.zone, released.extra["status"]) == (
        InstanceState.TERMINATED,
        "cn-shanghai-e",
        "Released",
    )
    again = client.terminate("cn-shanghai", handle.instance_id)
    assert again.state is InstanceState.TERMINATED
    # The second terminate found nothing to release and made no write.
    assert len(sandbox.calls("DeleteInstances")) == 1
    assert [i.state for i in sandbox.instances()] == ["Deleted"]
    with pytest.raises(ProviderRequestRejected) as caught:
        client.describe("cn-shanghai", handle.instance_id)
    assert caught.value.code == "InvalidInstanceId.NotFound"


def test_a_pending_instance_is_reported_pending_until_it_boots(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.boot_observations = 1
    client = adapter()
    handle = client.launch(_spec())

    assert client.describe("cn-shanghai", handle.instance_id).state is InstanceState.PENDING
    assert client.describe("cn-shanghai", handle.instance_id).state is InstanceState.RUNNING


def test_terminating_an_initializing_instance_is_transient(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.boot_observations = 100
    client = adapter(max_attempts="2")
    handle = client.launch(_spec())

    with pytest.raises(TransientProviderError) as caught:
        client.terminate("cn-shanghai", handle.instance_id)

    assert caught.value.code == "IncorrectInstanceStatus.Initializing"
    assert len(sandbox.calls("DeleteInstances")) == 2
    assert [i.state for i in sandbox.instances()] == ["Pending"]


def test_relaunch_with_the_same_token_returns_the_same_instance(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()

    first = client.launch(_spec())
    second = client.launch(_spec())

    assert second.instance_id == first.instance_id
    assert len(sandbox.calls("RunInstances")) == 2
    assert [i.instance_id for i in sandbox.instances()] == [first.instance_id]


def test_a_reused_token_with_other_parameters_is_rejected(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()
    first = client.launch(_spec())

    with pytest.raises(ProviderRequestRejected) as caught:
        client.launch(_spec(zone="cn-shanghai-f"))

    assert (caught.value.code, caught.value.http_status) == ("IdempotenceParamNotMatch", 400)
    assert [i.instance_id for i in sandbox.instances()] == [first.instance_id]


def test_spot_launches_use_the_spot_strategy(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()

    market = client.launch(_spec("ord-1-a1", pricing_model=PricingModel.SPOT))
    capped = client.launch(_spec("ord-1-a2", pricing_model=PricingModel.SPOT, max_price=Decimal("4.5")))

    assert (market.extra["spot_strategy"], capped.extra["spot_strategy"]) == ("SpotAsPriceGo", "SpotWithPriceLimit")
    assert {i.spot_strategy for i in sandbox.instances()} == {"SpotAsPriceGo", "SpotWithPriceLimit"}
    assert client.describe("cn-shanghai", capped.instance_id).extra["spot_strategy"] == "SpotWithPriceLimit"


def test_image_and_network_options_reach_run_instances(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter(
        image_id="ubuntu_20_04_x64_20G_alibase_20230815.vhd", vswitch_id="vsw-alice", security_group_id="sg-alice"
    )

    handle = client.launch(_spec())

    described = client.describe("cn-shanghai", handle.instance_id)
    assert (described.extra["image_id"], described.extra["vswitch_id"]) == (
        "ubuntu_20_04_x64_20G_alibase_20230815.vhd",
        "vsw-alice",
    )


def test_an_unknown_image_is_final(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    with pytest.raises(ProviderRequestRejected) as caught:
        adapter(image_id="m-doesnotexist").launch(_spec())

    assert (caught.value.code, caught.value.http_status) == ("InvalidImageId.NotFound", 404)


def test_an_invalid_client_token_is_rejected_before_any_call(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    with pytest.raises(ProviderRequestRejected):
        adapter().launch(_spec("t" * 65))

    assert sandbox.calls() == []


def test_find_by_order_finds_tagged_instances_in_every_region(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.set_stock("cn-beijing", "cn-beijing-i", "ecs.gn7i-c8g1.2xlarge", "WithStock")
    client = adapter(regions=["cn-shanghai", "cn-beijing"])
    shanghai = client.launch(_spec("ord-1-a1"))
    beijing = client.launch(_spec("ord-1-a2", region="cn-beijing", zone="cn-beijing-i"))
    client.launch(_spec("ord-2-a1", order_ref="ord-2"))

    found = client.find_by_order("ord-1")

    assert [(h.region, h.instance_id) for h in found] == [
        ("cn-beijing", beijing.instance_id),
        ("cn-shanghai", shanghai.instance_id),
    ]
    assert all(h.tags["broker:order"] == "ord-1" for h in found)
    assert client.find_by_order("ord-404") == []


def test_terminating_an_unknown_instance_is_a_no_op(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    handle = adapter().terminate("cn-shanghai", "i-uf6doesnotexist")

    assert (handle.state, handle.extra) == (InstanceState.TERMINATED, {"status": "Released"})
    assert sandbox.calls("DeleteInstances") == []


# ---------------------------------------------------------------------------------------------- faults


def test_capacity_fault_raises_capacity_unavailable_and_launches_nothing(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.faults.inject("capacity", instance_type="ecs.gn7i-c8g1.2xlarge", zone="cn-shanghai-e", times=1)
    client = adapter()

    with pytest.raises(CapacityUnavailable) as caught:
        client.launch(_spec())

    error = caught.value
    assert (error.code, error.http_status, error.provider, error.retryable) == (
        "OperationDenied.NoStock",
        403,
        "alibaba",
        False,
    )
    assert len(sandbox.calls("RunInstances")) == 1
    assert sandbox.instances() == []
    # The fault was for one call: the broker's retry with the same token now succeeds.
    handle = client.launch(_spec())
    assert [i.instance_id for i in sandbox.instances()] == [handle.instance_id]


def test_a_sold_out_zone_is_a_capacity_miss_without_any_fault(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()

    with pytest.raises(CapacityUnavailable) as no_stock:
        client.launch(_spec("a1", instance_type="ecs.ebmgn7e.32xlarge", zone="cn-shanghai-e"))
    with pytest.raises(CapacityUnavailable) as not_sold:
        client.launch(_spec("a2", instance_type="ecs.gn6v-c8g1.16xlarge", zone="cn-shanghai-f"))

    assert (no_stock.value.code, not_sold.value.code) == (
        "OperationDenied.NoStock",
        "InvalidInstanceType.ZoneNotSupported",
    )
    assert sandbox.instances() == []


@pytest.mark.parametrize("code", ["Zone.NotOnSale", "InvalidResourceType.NotSupported", "InstanceType.Offline"])
def test_other_capacity_codes_from_the_wire(sandbox: AlibabaSandbox, adapter: AdapterFactory, code: str) -> None:
    sandbox.faults.inject("capacity", code=code)

    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status) == (code, 403)
    assert sandbox.instances() == []


def test_quota_fault_raises_quota_exceeded(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("quota", instance_type="ecs.gn7i-c8g1.2xlarge")

    with pytest.raises(QuotaExceeded) as caught:
        adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status) == ("QuotaExceed.ElasticQuota", 403)
    assert sandbox.instances() == []


def test_a_read_throttled_twice_is_retried_and_succeeds(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeRegions", times=2)

    adapter().check_credentials()

    assert len(sandbox.calls("DescribeRegions")) == 3
    assert sandbox.faults.active() == []


def test_a_read_throttled_beyond_max_attempts_is_transient(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeRegions")

    with pytest.raises(TransientProviderError) as caught:
        adapter(max_attempts="2").check_credentials()

    assert (caught.value.code, caught.value.http_status) == ("Throttling.User", 400)
    assert len(sandbox.calls("DescribeRegions")) == 2


def test_a_throttled_launch_is_transient_and_not_retried(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", times=2)

    with pytest.raises(TransientProviderError) as caught:
        adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status, caught.value.retryable) == ("Throttling.User", 400, True)
    assert len(sandbox.calls("RunInstances")) == 1
    assert sandbox.instances() == []


def test_a_read_slower_than_the_read_timeout_is_transient(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("slow", action="DescribeRegions", seconds=3)
    client = adapter(read_timeout="0.3", max_attempts="2")

    started = time.monotonic()
    with pytest.raises(TransientProviderError) as caught:
        client.check_credentials()

    assert caught.value.code == "TransportError"
    assert time.monotonic() - started < 2
    # Reads retry timeouts: two attempts, both timed out.
    assert len(sandbox.calls("DescribeRegions")) == 2


def test_a_launch_that_timed_out_is_recovered_by_its_token(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("slow", seconds=1, times=1)
    client = adapter(read_timeout="0.3")

    with pytest.raises(TransientProviderError) as caught:
        client.launch(_spec())
    assert caught.value.code == "TransportError"

    # ECS finishes the launch the client gave up on; the retry with the same token must find it.
    deadline = time.monotonic() + 5
    while not sandbox.instances() and time.monotonic() < deadline:
        time.sleep(0.05)
    handle = client.launch(_spec())

    assert [i.instance_id for i in sandbox.instances()] == [handle.instance_id]


def test_rejected_credentials_raise_credentials_rejected(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter(access_key_id="bad-LTAI")

    with pytest.raises(CredentialsRejected) as caught:
        client.check_credentials()
    assert (caught.value.code, caught.value.http_status) == ("InvalidAccessKeyId.NotFound", 404)
    with pytest.raises(CredentialsRejected):
        client.list_offers()
    with pytest.raises(CredentialsRejected):
        client.launch(_spec())
    # Credentials errors are final: one request each, no retry.
    assert len(sandbox.calls()) == 3
    assert sandbox.instances() == []


def test_a_wrong_secret_is_a_signature_mismatch(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    with pytest.raises(CredentialsRejected) as caught:
        adapter(secret="not-alices").check_credentials()

    assert (caught.value.code, caught.value.http_status) == ("SignatureDoesNotMatch", 400)


def test_a_credentials_fault_on_launch(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("credentials", times=1)

    with pytest.raises(CredentialsRejected) as caught:
        adapter().launch(_spec())

    assert caught.value.code == "InvalidAccessKeyId.NotFound"
    assert sandbox.instances() == []


def test_a_throttled_catalogue_page_is_retried(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeInstanceTypes", times=1)

    offers = adapter().list_offers()

    assert len(offers) == 49
    assert len(sandbox.calls("DescribeInstanceTypes")) == 2


def test_an_unreachable_endpoint_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    credentials = Credentials(
        kind="alibaba",
        values={"access_key_id": "LTAI", "access_key_secret": "s"},
        endpoint_url=f"http://127.0.0.1:{port}",
    )
    client = AlibabaAdapter(credentials, ["cn-shanghai"], {"connect_timeout": "0.5", "max_attempts": "1"})

    with pytest.raises(TransientProviderError) as caught:
        client.check_credentials()

    assert caught.value.code == "TransportError"


def test_a_malformed_endpoint_url_is_a_final_error() -> None:
    credentials = Credentials(
        kind="alibaba", values={"access_key_id": "LTAI", "access_key_secret": "s"}, endpoint_url="not a url"
    )

    with pytest.raises(ProviderRequestRejected):
        AlibabaAdapter(credentials, ["cn-shanghai"]).check_credentials()


def test_missing_secrets_and_bad_options_are_rejected_at_construction() -> None:
    with pytest.raises(CredentialsRejected):
        AlibabaAdapter(Credentials(kind="alibaba", values={"access_key_id": "LTAI"}), ["cn-shanghai"])
    credentials = Credentials(kind="alibaba", values={"access_key_id": "LTAI", "access_key_secret": "s"})
    with pytest.raises(ValueError, match="read_timeout"):
        AlibabaAdapter(credentials, ["cn-shanghai"], {"read_timeout": "-1"})
    with pytest.raises(ValueError, match="regions"):
        AlibabaAdapter(credentials, [])


def test_the_registry_builds_the_alibaba_adapter() -> None:
    if "alibaba" not in ADAPTERS:
        pytest.skip("providers/registry.py has no 'alibaba' entry yet (added by the lead)")
    credentials = Credentials(kind="alibaba", values={"access_key_id": "LTAI", "access_key_secret": "s"})

    built = build_adapter("alibaba", credentials, ["cn-shanghai"], {"read_timeout": "7"})

    assert isinstance(built, AlibabaAdapter)
    assert (built.kind, built.regions, built.options) == ("alibaba", ("cn-shanghai",), {"read_timeout": "7"})
