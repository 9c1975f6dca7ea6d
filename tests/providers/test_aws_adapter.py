"""AwsAdapter against the AWS sandbox: the real boto3 over HTTP, moto behind the sandbox layer."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal

import pytest

from providers.aws.adapter import AwsAdapter
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.registry import build_adapter
from providers.types import Credentials, InstanceState, LaunchSpec, OfferQuote, PricingModel
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE, BOB, UNKNOWN_ACCESS_KEY_ID

AdapterFactory = Callable[..., AwsAdapter]

EU_CENTRAL_TYPES_AND_ZONES = {
    ("g4dn.xlarge", "eu-central-1a"),
    ("g4dn.xlarge", "eu-central-1b"),
    ("g4dn.xlarge", "eu-central-1c"),
    ("g5.xlarge", "eu-central-1a"),
    ("g5.xlarge", "eu-central-1b"),
    ("g5.xlarge", "eu-central-1c"),
    ("g6.8xlarge", "eu-central-1a"),
    ("g6.8xlarge", "eu-central-1b"),
    ("g6.8xlarge", "eu-central-1c"),
    ("g6e.48xlarge", "eu-central-1a"),
    ("g6e.48xlarge", "eu-central-1b"),
    ("g6e.48xlarge", "eu-central-1c"),
    ("p4de.24xlarge", "eu-central-1a"),
    ("p4de.24xlarge", "eu-central-1c"),
}
# The fractional L4s seeded in eu-central-1: on demand only (no spot price seeded), in the two zones the
# sandbox offers every seeded type in.
EU_CENTRAL_SLICES_AND_ZONES = {
    (name, zone)
    for name in ("g6f.large", "g6f.xlarge", "g6f.2xlarge", "g6f.4xlarge")
    for zone in ("eu-central-1a", "eu-central-1b")
}
US_EAST_SEEDED_TYPES = {
    "g4dn.xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "g5.16xlarge",
    "g6.4xlarge",
    "g6.8xlarge",
    "g6e.2xlarge",
    "g6e.24xlarge",
    "g6e.48xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.4xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
}


def _spec(
    idempotency_key: str = "ord-1-attempt-1",
    *,
    order_ref: str = "ord-1",
    region: str = "us-east-1",
    zone: str = "us-east-1a",
    instance_type: str = "p4d.24xlarge",
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


def test_list_offers_in_eu_central_1_has_one_quote_per_zone_type_and_model(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    offers = aws_adapter(regions=["eu-central-1"]).list_offers()

    assert Counter(o.pricing_model for o in offers) == {PricingModel.ON_DEMAND: 22, PricingModel.SPOT: 14}
    on_demand = {(o.instance_type, o.zone) for o in offers if o.pricing_model is PricingModel.ON_DEMAND}
    spot = {(o.instance_type, o.zone) for o in offers if o.pricing_model is PricingModel.SPOT}
    assert on_demand == EU_CENTRAL_TYPES_AND_ZONES | EU_CENTRAL_SLICES_AND_ZONES
    assert spot == EU_CENTRAL_TYPES_AND_ZONES
    assert len({o.natural_key for o in offers}) == 36
    assert {o.instance_type: o.gpu_model for o in offers} == {
        "g4dn.xlarge": "T4",
        "g5.xlarge": "A10G",
        "g6.8xlarge": "L4",
        "g6e.48xlarge": "L40S",
        "p4de.24xlarge": "A100-80GB-SXM4",
        "g6f.large": "L4",
        "g6f.xlarge": "L4",
        "g6f.2xlarge": "L4",
        "g6f.4xlarge": "L4",
    }


def test_on_demand_and_spot_prices_equal_the_seed(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    offers = aws_adapter(regions=["eu-central-1"]).list_offers()

    seed = {r.instance_type: r for r in aws_sandbox.seed if r.region == "eu-central-1"}
    for offer in offers:
        if offer.pricing_model is PricingModel.ON_DEMAND:
            assert offer.price == seed[offer.instance_type].on_demand
        else:
            assert offer.price == aws_sandbox.spot_price("eu-central-1", offer.instance_type, offer.zone)
            assert offer.price < seed[offer.instance_type].on_demand
    spot = {(o.instance_type, o.zone): o.price for o in offers if o.pricing_model is PricingModel.SPOT}
    # The seed's spot prices, observed in euc1-az1 (= eu-central-1a) and euc1-az2 (= eu-central-1b).
    assert spot[("p4de.24xlarge", "eu-central-1a")] == Decimal("8.8218")
    assert spot[("g5.xlarge", "eu-central-1a")] == Decimal("0.6178")
    assert spot[("g4dn.xlarge", "eu-central-1b")] == Decimal("0.267")
    assert spot[("g6.8xlarge", "eu-central-1b")] == Decimal("0.8038")
    assert spot[("g6e.48xlarge", "eu-central-1a")] == Decimal("14.7989")


def test_an_offer_carries_the_whole_mapped_catalogue_entry(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    offers = aws_adapter(regions=["eu-central-1"]).list_offers()

    offer = next(o for o in offers if o.natural_key == ("eu-central-1", "eu-central-1a", "p4de.24xlarge", "on_demand"))
    assert offer == OfferQuote(
        region="eu-central-1",
        zone="eu-central-1a",
        instance_type="p4de.24xlarge",
        pricing_model=PricingModel.ON_DEMAND,
        gpu_model="A100-80GB-SXM4",
        gpu_count=8,
        gpu_memory_gb=80,
        vcpus=96,
        memory_gib=Decimal(1152),
        price=Decimal("34.29122"),
        currency="USD",
        capacity=None,
        interconnect="nvlink",
        extra={
            "gpu_name": "A100",
            "gpu_manufacturer": "NVIDIA",
            "gpu_memory_mib": 81920,
            "network_performance": "4x 100 Gigabit",
            "efa_supported": True,
            "architectures": ["x86_64"],
            "network_gbps": 400.0,
            "price_sku": offer.extra["price_sku"],
        },
    )


def test_us_east_1_offers_only_priced_types_with_their_gpu_keys(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    offers = aws_adapter(regions=["us-east-1"]).list_offers()

    # moto offers ~50 GPU types in us-east-1 (p5e among them); only the 15 seeded ones have a price.
    assert {o.instance_type for o in offers} == US_EAST_SEEDED_TYPES
    models = {o.instance_type: (o.gpu_model, o.gpu_count, o.gpu_memory_gb, o.interconnect) for o in offers}
    assert models["p4de.24xlarge"] == ("A100-80GB-SXM4", 8, 80, "nvlink")
    assert models["p4d.24xlarge"] == ("A100-40GB-SXM4", 8, 40, "nvlink")
    assert models["g5.12xlarge"] == ("A10G", 4, 24, "pcie")
    assert models["p5en.48xlarge"] == ("H200-SXM", 8, 141, "nvlink")
    assert models["p6-b200.48xlarge"] == ("B200", 8, 180, "nvlink")
    assert models["p5.4xlarge"] == ("H100-SXM5", 1, 80, "pcie")
    # p5.4xlarge has no spot price in the seed: on-demand quotes only.
    assert {o.pricing_model for o in offers if o.instance_type == "p5.4xlarge"} == {PricingModel.ON_DEMAND}
    # p6-b200 is offered only in us-east-1c by moto; the sandbox adds its seed spot zone use1-az6 (us-east-1a).
    assert sorted(o.zone for o in offers if o.instance_type == "p6-b200.48xlarge" and o.pricing_model == "spot") == [
        "us-east-1a",
        "us-east-1c",
    ]


def test_unknown_gpus_keep_the_raw_name(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    offers = aws_adapter(regions=["us-west-2"]).list_offers()

    b300 = {o.gpu_model for o in offers if o.instance_type == "p6-b300.48xlarge"}
    assert b300 == {"B300"}
    assert {o.gpu_memory_gb for o in offers if o.instance_type == "p6-b300.48xlarge"} == {268}


# --------------------------------------------------------------------------------------------- launch


def test_launch_describe_and_terminate(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()

    handle = adapter.launch(_spec(tags={"buyer": "alice"}))

    assert handle.instance_id.startswith("i-")
    assert (handle.region, handle.zone, handle.instance_type, handle.state) == (
        "us-east-1",
        "us-east-1a",
        "p4d.24xlarge",
        InstanceState.PENDING,
    )
    assert handle.tags == {"broker:order": "ord-1", "buyer": "alice"}
    assert (handle.extra["lifecycle"], handle.extra["client_token"]) == ("on-demand", "ord-1-attempt-1")
    assert [(i.instance_id, i.client_token) for i in aws_sandbox.instances()] == [
        (handle.instance_id, "ord-1-attempt-1")
    ]

    described = adapter.describe("us-east-1", handle.instance_id)
    assert (described.instance_id, described.state) == (handle.instance_id, InstanceState.RUNNING)

    terminating = adapter.terminate("us-east-1", handle.instance_id)
    assert (terminating.state, terminating.extra["state_name"]) == (InstanceState.STOPPING, "shutting-down")
    terminated = adapter.terminate("us-east-1", handle.instance_id)
    assert terminated.state is InstanceState.TERMINATED
    # The second terminate saw a terminated instance and made no write.
    assert len(aws_sandbox.calls("TerminateInstances")) == 1


def test_relaunch_with_the_same_token_returns_the_same_instance(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()

    first = adapter.launch(_spec())
    second = adapter.launch(_spec())

    assert second.instance_id == first.instance_id
    assert len(aws_sandbox.calls("RunInstances")) == 2
    assert [i.instance_id for i in aws_sandbox.instances()] == [first.instance_id]


def test_a_reused_token_with_other_parameters_is_rejected(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()
    first = adapter.launch(_spec())

    with pytest.raises(ProviderRequestRejected) as caught:
        adapter.launch(_spec(zone="us-east-1b"))

    assert caught.value.code == "IdempotentParameterMismatch"
    assert [i.instance_id for i in aws_sandbox.instances()] == [first.instance_id]


def test_spot_launch_uses_the_spot_market(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    handle = aws_adapter().launch(_spec(pricing_model=PricingModel.SPOT, max_price=Decimal("12.5")))

    assert handle.extra["lifecycle"] == "spot"
    assert [(i.lifecycle, i.zone) for i in aws_sandbox.instances()] == [("spot", "us-east-1a")]


def test_spot_max_price_below_the_zone_price_is_a_capacity_miss(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    # use1-az4 is us-east-1d, where the seed's p4de spot price (9.9734) was observed.
    spec = _spec(
        instance_type="p4de.24xlarge", zone="us-east-1d", pricing_model=PricingModel.SPOT, max_price=Decimal("9")
    )

    with pytest.raises(CapacityUnavailable) as caught:
        aws_adapter().launch(spec)

    assert (caught.value.code, caught.value.http_status) == ("SpotMaxPriceTooLow", 400)
    assert aws_sandbox.instances() == []


def test_the_default_image_is_the_newest_ubuntu_in_the_sandbox(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    handle = aws_adapter().launch(_spec())

    # moto ships Canonical's trusty (14.04) and xenial (16.04) images; xenial is the newest.
    assert handle.extra["image_id"] == "ami-785db401"


def test_the_image_option_overrides_the_lookup(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    handle = aws_adapter(image_id="ami-1e749f67").launch(_spec())

    assert handle.extra["image_id"] == "ami-1e749f67"
    assert aws_sandbox.calls("DescribeImages") == []


def test_an_invalid_client_token_is_rejected_before_any_call(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    with pytest.raises(ProviderRequestRejected):
        aws_adapter().launch(_spec("t" * 65))

    assert aws_sandbox.calls() == []


def test_describe_of_an_unknown_instance_is_final(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    with pytest.raises(ProviderRequestRejected) as caught:
        aws_adapter().describe("us-east-1", "i-0123456789abcdef0")

    assert caught.value.code == "InvalidInstanceID.NotFound"


def test_find_by_order_finds_tagged_instances_in_every_region(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter(regions=["us-east-1", "eu-central-1"])
    east = adapter.launch(_spec("ord-1-a1"))
    frankfurt = adapter.launch(
        _spec("ord-1-a2", region="eu-central-1", zone="eu-central-1b", instance_type="g5.xlarge")
    )
    adapter.launch(_spec("ord-2-a1", order_ref="ord-2"))

    found = adapter.find_by_order("ord-1")

    assert [(h.region, h.instance_id) for h in found] == [
        ("eu-central-1", frankfurt.instance_id),
        ("us-east-1", east.instance_id),
    ]
    assert all(h.tags["broker:order"] == "ord-1" for h in found)
    assert adapter.find_by_order("ord-404") == []


# ---------------------------------------------------------------------------------------------- faults


def test_capacity_fault_raises_capacity_unavailable_and_launches_nothing(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_sandbox.faults.inject("capacity", instance_type="p4d.24xlarge", zone="us-east-1a", times=1)
    adapter = aws_adapter()

    with pytest.raises(CapacityUnavailable) as caught:
        adapter.launch(_spec())

    error = caught.value
    assert (error.code, error.http_status, error.provider, error.retryable) == (
        "InsufficientInstanceCapacity",
        500,
        "aws",
        False,
    )
    assert "p4d.24xlarge" in error.message
    # botocore would retry a 500; the launch client sends exactly one request.
    assert len(aws_sandbox.calls("RunInstances")) == 1
    assert aws_sandbox.instances() == []

    # The fault was for one call: the broker's retry with the same token now succeeds.
    handle = adapter.launch(_spec())
    assert [i.instance_id for i in aws_sandbox.instances()] == [handle.instance_id]


def test_capacity_fault_only_hits_its_zone(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    aws_sandbox.faults.inject("capacity", instance_type="p4d.24xlarge", zone="us-east-1a")
    adapter = aws_adapter()

    with pytest.raises(CapacityUnavailable):
        adapter.launch(_spec("ord-1-a1"))
    handle = adapter.launch(_spec("ord-1-a2", zone="us-east-1c"))

    assert [(i.instance_id, i.zone) for i in aws_sandbox.instances()] == [(handle.instance_id, "us-east-1c")]


@pytest.mark.parametrize("code", ["InsufficientCapacity", "InsufficientHostCapacity", "Unsupported"])
def test_other_capacity_codes_from_the_wire(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory, code: str) -> None:
    aws_sandbox.faults.inject("capacity", code=code)

    with pytest.raises(CapacityUnavailable) as caught:
        aws_adapter().launch(_spec())

    assert caught.value.code == code
    assert aws_sandbox.instances() == []


def test_quota_fault_raises_quota_exceeded(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    aws_sandbox.faults.inject("quota", instance_type="p4d.24xlarge")

    with pytest.raises(QuotaExceeded) as caught:
        aws_adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status) == ("VcpuLimitExceeded", 400)
    assert aws_sandbox.instances() == []


def test_a_read_throttled_twice_is_retried_and_succeeds(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    aws_sandbox.faults.inject("throttle", action="DescribeAvailabilityZones", times=2)

    aws_adapter().check_credentials()

    assert len(aws_sandbox.calls("DescribeAvailabilityZones")) == 3
    assert aws_sandbox.faults.active() == []


def test_a_throttled_launch_is_transient_and_not_retried_by_the_sdk(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_sandbox.faults.inject("throttle", times=2)

    with pytest.raises(TransientProviderError) as caught:
        aws_adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status, caught.value.retryable) == ("RequestLimitExceeded", 503, True)
    assert len(aws_sandbox.calls("RunInstances")) == 1
    assert aws_sandbox.instances() == []


def test_a_read_slower_than_the_read_timeout_is_transient(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    aws_sandbox.faults.inject("slow", action="DescribeAvailabilityZones", seconds=3)
    adapter = aws_adapter(read_timeout="0.5", max_attempts="2")

    started = time.monotonic()
    with pytest.raises(TransientProviderError) as caught:
        adapter.check_credentials()

    assert caught.value.code == "ReadTimeoutError"
    assert time.monotonic() - started < 2.9
    # Reads retry timeouts: two attempts, both timed out.
    assert len(aws_sandbox.calls("DescribeAvailabilityZones")) == 2


def test_a_launch_that_timed_out_is_recovered_by_its_token(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_sandbox.faults.inject("slow", seconds=1, times=1)
    adapter = aws_adapter(read_timeout="0.3")

    with pytest.raises(TransientProviderError) as caught:
        adapter.launch(_spec())
    assert caught.value.code == "ReadTimeoutError"

    # AWS finishes the launch the client gave up on; the retry with the same token must find it.
    deadline = time.monotonic() + 5
    while not aws_sandbox.instances() and time.monotonic() < deadline:
        time.sleep(0.05)
    handle = adapter.launch(_spec())

    assert [i.instance_id for i in aws_sandbox.instances()] == [handle.instance_id]


def test_rejected_credentials_raise_credentials_rejected(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter(access_key_id=UNKNOWN_ACCESS_KEY_ID)

    with pytest.raises(CredentialsRejected) as caught:
        adapter.check_credentials()
    assert (caught.value.code, caught.value.http_status) == ("AuthFailure", 401)
    with pytest.raises(CredentialsRejected):
        adapter.list_offers()
    with pytest.raises(CredentialsRejected):
        adapter.launch(_spec())

    assert aws_sandbox.instances() == []


def test_only_listed_access_keys_are_accepted_when_a_list_is_set(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_sandbox.accept_access_keys({BOB.access_key_id})

    aws_adapter(access_key_id=BOB.access_key_id).check_credentials()
    with pytest.raises(CredentialsRejected):
        aws_adapter(access_key_id=ALICE.access_key_id).check_credentials()


def test_a_credentials_fault_on_launch(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    aws_sandbox.faults.inject("credentials", times=1)

    with pytest.raises(CredentialsRejected) as caught:
        aws_adapter().launch(_spec())

    assert caught.value.code == "AuthFailure"
    assert aws_sandbox.instances() == []


def test_a_throttled_price_list_is_retried(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    unthrottled = aws_adapter(regions=["eu-central-1"]).list_offers()
    calls = len(aws_sandbox.calls("GetProducts"))
    aws_sandbox.faults.inject("throttle", action="GetProducts", times=1)

    offers = aws_adapter(regions=["eu-central-1"]).list_offers()

    assert len(offers) == len(unthrottled) == 36
    # ANY_OF queries price the region in a few calls; the throttled answer costs exactly one more.
    assert calls <= 2
    assert len(aws_sandbox.calls("GetProducts")) == 2 * calls + 1


def test_an_unreachable_endpoint_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    credentials = Credentials(
        kind="aws", values={"access_key_id": "AKID", "secret_access_key": "s"}, endpoint_url=f"http://127.0.0.1:{port}"
    )
    adapter = AwsAdapter(credentials, ["us-east-1"], {"connect_timeout": "0.5", "max_attempts": "1"})

    with pytest.raises(TransientProviderError) as caught:
        adapter.check_credentials()

    assert caught.value.code == "EndpointConnectionError"


def test_a_malformed_endpoint_url_is_a_final_error() -> None:
    credentials = Credentials(
        kind="aws", values={"access_key_id": "AKID", "secret_access_key": "s"}, endpoint_url="not a url"
    )

    with pytest.raises(ProviderRequestRejected):
        AwsAdapter(credentials, ["us-east-1"]).check_credentials()


def test_the_registry_builds_the_aws_adapter() -> None:
    credentials = Credentials(kind="aws", values={"access_key_id": "AKID", "secret_access_key": "s"})

    adapter = build_adapter("aws", credentials, ["eu-west-1"], {"read_timeout": "7"})

    assert isinstance(adapter, AwsAdapter)
    assert (adapter.kind, adapter.regions, adapter.options) == ("aws", ("eu-west-1",), {"read_timeout": "7"})


def test_missing_secrets_are_rejected_at_construction() -> None:
    with pytest.raises(CredentialsRejected):
        AwsAdapter(Credentials(kind="aws", values={"access_key_id": "AKID"}), ["us-east-1"])
