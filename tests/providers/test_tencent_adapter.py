"""TencentAdapter against the Tencent sandbox: the real tencentcloud SDK over HTTP on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from werkzeug.wrappers import Response

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.tencent.adapter import TencentAdapter
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, PricingModel
from sandboxes.server import ServerThread
from sandboxes.tencent.app import TencentSandbox, start_tencent_sandbox
from sandboxes.tencent.catalogue import load_seed

AdapterFactory = Callable[..., TencentAdapter]
SECRET_ID = "AKIDalice00000000001"
SECRET_KEY = "alice-secret-key"


@pytest.fixture(scope="module")
def server() -> Iterator[TencentSandbox]:
    sandbox = start_tencent_sandbox(launch_seconds=0.05, terminate_seconds=0.05)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(server: TencentSandbox) -> Iterator[TencentSandbox]:
    server.reset()
    server.register_secret(SECRET_ID, SECRET_KEY)
    yield server
    server.reset()


@pytest.fixture
def adapter(sandbox: TencentSandbox) -> AdapterFactory:
    """``adapter(regions=[...], secret_id=..., secret_key=..., **options)`` -> a ``TencentAdapter`` on the sandbox."""

    def build(
        regions: list[str] | None = None, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY, **options: str
    ) -> TencentAdapter:
        credentials = Credentials(
            kind="tencent", values={"secret_id": secret_id, "secret_key": secret_key}, endpoint_url=sandbox.url
        )
        return TencentAdapter(credentials, regions or ["ap-guangzhou"], {"retry_backoff": "0.01", **options})

    return build


def _spec(
    idempotency_key: str = "ord-1-attempt-1",
    *,
    order_ref: str = "ord-1",
    region: str = "ap-guangzhou",
    zone: str = "ap-guangzhou-3",
    instance_type: str = "GN7.2XLARGE32",
    pricing_model: PricingModel = PricingModel.ON_DEMAND,
    max_price: Decimal | None = None,
    image: str | None = None,
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
        image=image,
        tags=tags or {},
    )


def _settle(adapter: TencentAdapter, handle: InstanceHandle) -> InstanceHandle:
    for _ in range(50):
        if handle.state not in (InstanceState.PENDING, InstanceState.STOPPING):
            return handle
        time.sleep(0.02)
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


# --------------------------------------------------------------------------------------------- offers


def test_list_offers_is_every_selling_zone_of_every_seeded_type(adapter: AdapterFactory) -> None:
    regions = ["ap-guangzhou", "ap-beijing"]
    seed = [r for r in load_seed() if r.region in regions]

    offers = adapter(regions).list_offers()

    assert {(q.region, q.zone, q.instance_type) for q in offers} == {
        (r.region, zone, r.instance_type) for r in seed for zone in r.zones
    }
    assert len(offers) == sum(len(r.zones) for r in seed) == 56
    prices = {(r.region, r.instance_type): r.on_demand for r in seed}
    assert all(q.price == prices[(q.region, q.instance_type)] for q in offers)
    assert {(q.currency, q.pricing_model, q.capacity) for q in offers} == {("CNY", PricingModel.ON_DEMAND, None)}


# CVM's price answers state no currency: ItemPrice has UnitPrice, ChargeUnit, OriginalPrice, DiscountPrice, Discount
# and UnitPriceDiscount, no currency field (CVM API reference, "InquiryPriceRunInstances" and its ItemPrice data type,
# https://www.tencentcloud.com/document/api/213/33248, whose International-site answers are in USD). So the account
# says which site it is on: option ``site``, default china (CNY).
def test_an_international_account_labels_its_prices_usd(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.set_account_site(SECRET_ID, "international")
    sandbox.set_price("ap-guangzhou", "GN7.2XLARGE32", Decimal("1.23"), "USD")

    offers = adapter(site="international").list_offers()

    assert sorted((q.zone, q.instance_type, q.price, q.currency) for q in offers) == [
        ("ap-guangzhou-3", "GN7.2XLARGE32", Decimal("1.23"), "USD"),
        ("ap-guangzhou-4", "GN7.2XLARGE32", Decimal("1.23"), "USD"),
    ]


def test_the_site_option_defaults_to_china_and_refuses_an_unknown_site(adapter: AdapterFactory) -> None:
    assert (adapter().currency, adapter(site="china").currency, adapter(site="international").currency) == (
        "CNY",
        "CNY",
        "USD",
    )
    with pytest.raises(ValueError, match=r"options\.site"):
        adapter(site="mainland")


def test_offers_carry_canonical_gpu_keys_counts_and_interconnects(adapter: AdapterFactory) -> None:
    offers = {q.instance_type: q for q in adapter().list_offers()}

    assert {name: (q.gpu_model, q.gpu_count, q.gpu_memory_gb, q.interconnect) for name, q in offers.items()} == {
        "GT4.4XLARGE96": (gpu_names.A100_40_PCIE, 1, 40, "pcie"),
        "GT4.8XLARGE192": (gpu_names.A100_40_PCIE, 2, 40, "pcie"),
        "GT4.20XLARGE474": (gpu_names.A100_40_PCIE, 4, 40, "pcie"),
        "GT4.41XLARGE948": (gpu_names.A100_40_PCIE, 8, 40, "pcie"),
        "GN10Xp.2XLARGE40": (gpu_names.V100_32_SXM2, 1, 32, "pcie"),
        "GN10Xp.5XLARGE80": (gpu_names.V100_32_SXM2, 2, 32, "nvlink"),
        "GN10Xp.10XLARGE160": (gpu_names.V100_32_SXM2, 4, 32, "nvlink"),
        "GN10Xp.20XLARGE320": (gpu_names.V100_32_SXM2, 8, 32, "nvlink"),
        "GN10X.2XLARGE40": (gpu_names.V100_32_SXM2, 1, 32, "pcie"),
        "GN10X.18XLARGE320": (gpu_names.V100_32_SXM2, 8, 32, "nvlink"),
        "GN7.2XLARGE32": (gpu_names.T4, 1, 16, "pcie"),
        "GN7.8XLARGE128": (gpu_names.T4, 1, 16, "pcie"),
        "GN7.20XLARGE320": (gpu_names.T4, 4, 16, "pcie"),
        "GI3X.8XLARGE64": (gpu_names.T4, 1, 16, "pcie"),
    }
    gt4 = offers["GT4.41XLARGE948"]
    assert (gt4.vcpus, gt4.memory_gib, gt4.extra["gpu_type"], gt4.extra["list_price"]) == (
        164,
        Decimal(948),
        "NVIDIA A100",
        "237.51",
    )


def test_a_zone_that_sells_out_drops_out_of_the_offers(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.set_sold_out("ap-guangzhou", "ap-guangzhou-3", "GN7.2XLARGE32")

    zones = {q.zone for q in adapter().list_offers() if q.instance_type == "GN7.2XLARGE32"}

    assert zones == {"ap-guangzhou-4"}


def test_list_offers_reads_type_configs_once_per_gpu_family(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    adapter().list_offers()

    assert [c.action for c in sandbox.calls()] == ["DescribeZoneInstanceConfigInfos"] + [
        "DescribeInstanceTypeConfigs"
    ] * 5


# ----------------------------------------------------------------------------------------- launching


def test_launch_is_pending_then_running_with_the_order_tag(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    tencent = adapter()

    handle = tencent.launch(_spec(tags={"team": "ml"}))
    running = _settle(tencent, handle)

    assert (handle.state, handle.zone, handle.instance_type) == (
        InstanceState.PENDING,
        "ap-guangzhou-3",
        "GN7.2XLARGE32",
    )
    assert handle.tags == {"broker:order": "ord-1", "team": "ml"}
    assert handle.extra["image_id"] == "img-sbxu2404"  # the newest usable public Ubuntu image
    assert (running.instance_id, running.state, running.tags) == (
        handle.instance_id,
        InstanceState.RUNNING,
        handle.tags,
    )
    assert running.private_ip and running.launched_at
    assert [(i.instance_id, i.charge_type, i.client_token) for i in sandbox.instances()] == [
        (handle.instance_id, "POSTPAID_BY_HOUR", "ord-1-attempt-1")
    ]


def test_relaunch_with_the_same_token_returns_the_same_instance(
    sandbox: TencentSandbox, adapter: AdapterFactory
) -> None:
    first = adapter().launch(_spec())
    again = adapter().launch(_spec())

    assert again.instance_id == first.instance_id
    assert len(sandbox.calls("RunInstances")) == 2
    assert len(sandbox.instances()) == 1


def test_the_image_comes_from_the_spec_then_the_option(adapter: AdapterFactory) -> None:
    from_spec = adapter(image_id="img-sbxc7090").launch(_spec("t-1", image="img-sbxu2204"))
    from_option = adapter(image_id="img-sbxc7090").launch(_spec("t-2"))

    assert (from_spec.extra["image_id"], from_option.extra["image_id"]) == ("img-sbxu2204", "img-sbxc7090")


def test_a_capacity_fault_fails_the_launch_later_as_a_failed_handle(
    sandbox: TencentSandbox, adapter: AdapterFactory
) -> None:
    tencent = adapter()
    sandbox.faults.inject("capacity", instance_type="GN7.2XLARGE32", zone="ap-guangzhou-3")

    handle = tencent.launch(_spec())
    failed = _settle(tencent, handle)

    assert handle.state is InstanceState.PENDING
    assert failed.state is InstanceState.FAILED
    assert (failed.extra["error_class"], failed.extra["error_code"]) == (
        "capacity",
        "ResourceInsufficient.SpecifiedInstanceType",
    )
    assert "out of stock" in failed.extra["error_message"]
    # Nothing to clean up: terminate of a failed launch writes nothing.
    assert tencent.terminate("ap-guangzhou", handle.instance_id).state is InstanceState.FAILED
    assert sandbox.calls("TerminateInstances") == []


@pytest.mark.parametrize(
    "code",
    [
        "ResourceInsufficient.SpecifiedInstanceType",
        "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance",
        "ResourceInsufficient.AvailabilityZoneSoldOut",
        "ResourceInsufficient.InsufficientOfferingMinimum",
        "ResourcesSoldOut.SpecifiedInstanceType",
        "ResourcesSoldOut.AvailableZone",
        "InvalidParameterValue.InsufficientPrice",
    ],
)
def test_synchronous_capacity_codes_raise_capacity_unavailable(
    sandbox: TencentSandbox, adapter: AdapterFactory, code: str
) -> None:
    sandbox.faults.inject("capacity", code=code)

    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec())

    assert caught.value.code == code
    assert sandbox.instances() == []


@pytest.mark.parametrize(
    "code",
    [None, "LimitExceeded.CvmInstanceQuota", "LimitExceeded.SpotQuota", "InstancesQuotaLimitExceeded"],
)
def test_quota_faults_raise_quota_exceeded(sandbox: TencentSandbox, adapter: AdapterFactory, code: str | None) -> None:
    sandbox.faults.inject("quota", code=code)

    with pytest.raises(QuotaExceeded) as caught:
        adapter().launch(_spec())

    assert caught.value.code == (code or "LimitExceeded.InstanceQuota")
    assert sandbox.instances() == []


def test_a_zone_sold_out_in_the_catalogue_is_a_capacity_miss(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec(zone="ap-guangzhou-6"))

    assert caught.value.code == "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance"


def test_spot_needs_a_bid_and_no_tencent_type_is_sold_as_spot(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    with pytest.raises(ProviderRequestRejected):
        adapter().launch(_spec(pricing_model=PricingModel.SPOT))
    assert sandbox.calls("RunInstances") == []

    with pytest.raises(ProviderRequestRejected) as caught:
        adapter().launch(_spec(pricing_model=PricingModel.SPOT, max_price=Decimal("3.5")))
    assert caught.value.code == "UnsupportedOperation.NoInstanceTypeSupportSpot"


@pytest.mark.parametrize(
    "spec",
    [_spec(""), _spec("x" * 65), _spec("with space"), _spec(pricing_model=PricingModel.RESERVED)],
)
def test_invalid_launches_are_rejected_before_any_call(
    sandbox: TencentSandbox, adapter: AdapterFactory, spec: LaunchSpec
) -> None:
    with pytest.raises(ProviderRequestRejected):
        adapter().launch(spec)

    assert sandbox.calls() == []


# ------------------------------------------------------------------------------------------ transients


def test_a_read_throttled_twice_is_retried_and_succeeds(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeZoneInstanceConfigInfos", times=2)

    assert adapter().list_offers()
    assert len(sandbox.calls("DescribeZoneInstanceConfigInfos")) == 3


def test_an_internal_error_on_a_read_is_retried(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeZones", code="InternalError", times=1)

    adapter().check_credentials()

    assert len(sandbox.calls("DescribeZones")) == 2


def test_reads_give_up_after_max_attempts(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", action="DescribeZones", code="RequestLimitExceeded.UinLimitExceeded")

    with pytest.raises(TransientProviderError) as caught:
        adapter(max_attempts="2").check_credentials()

    assert caught.value.code == "RequestLimitExceeded.UinLimitExceeded"
    assert len(sandbox.calls("DescribeZones")) == 2


def test_a_throttled_launch_is_transient_and_not_retried(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("throttle", times=1)

    with pytest.raises(TransientProviderError) as caught:
        adapter().launch(_spec())

    assert caught.value.code == "RequestLimitExceeded"
    assert len(sandbox.calls("RunInstances")) == 1
    assert sandbox.instances() == []


def test_a_read_slower_than_the_read_timeout_is_transient(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("slow", action="DescribeZoneInstanceConfigInfos", seconds=3)

    started = time.monotonic()
    with pytest.raises(TransientProviderError) as caught:
        adapter(read_timeout="0.3", max_attempts="2").list_offers()

    assert caught.value.code == "ClientNetworkError"
    assert time.monotonic() - started < 1.5
    assert len(sandbox.calls("DescribeZoneInstanceConfigInfos")) == 2


def test_a_launch_that_timed_out_is_recovered_by_its_token(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("slow", seconds=0.6, times=1)

    with pytest.raises(TransientProviderError):
        adapter(read_timeout="0.2").launch(_spec())
    time.sleep(0.6)  # the first request is still served after the client gave up on it
    again = adapter().launch(_spec())

    assert [i.instance_id for i in sandbox.instances()] == [again.instance_id]


def test_an_unreachable_endpoint_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    credentials = Credentials("tencent", {"secret_id": SECRET_ID, "secret_key": SECRET_KEY}, f"http://127.0.0.1:{port}")

    with pytest.raises(TransientProviderError) as caught:
        TencentAdapter(
            credentials, ["ap-guangzhou"], {"max_attempts": "1", "connect_timeout": "0.5"}
        ).check_credentials()

    assert caught.value.code == "ClientNetworkError"


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        ("not json", "application/json", MalformedProviderResponse),
        ('{"Response": {"RequestId": "r"}}', "application/json", MalformedProviderResponse),
        ("<html>bad gateway</html>", "text/html", MalformedProviderResponse),
    ],
)
def test_an_unreadable_answer_is_malformed(body: str, content_type: str, expected: type[Exception]) -> None:
    def app(environ: Any, start_response: Any) -> Any:
        return Response(body, status=200, content_type=content_type)(environ, start_response)

    thread = ServerThread(app)
    url = thread.start()
    try:
        credentials = Credentials("tencent", {"secret_id": SECRET_ID, "secret_key": SECRET_KEY}, url)
        with pytest.raises(expected):
            TencentAdapter(credentials, ["ap-guangzhou"], {"max_attempts": "1"}).check_credentials()
    finally:
        thread.stop()


def test_a_gateway_error_status_is_transient() -> None:
    def app(environ: Any, start_response: Any) -> Any:
        return Response("upstream timed out", status=504)(environ, start_response)

    thread = ServerThread(app)
    url = thread.start()
    try:
        credentials = Credentials("tencent", {"secret_id": SECRET_ID, "secret_key": SECRET_KEY}, url)
        with pytest.raises(TransientProviderError) as caught:
            TencentAdapter(credentials, ["ap-guangzhou"], {"max_attempts": "1"}).check_credentials()
    finally:
        thread.stop()

    assert caught.value.code == "ServerNetworkError"


# ----------------------------------------------------------------------------------------- credentials


def test_rejected_credentials_raise_credentials_rejected(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    stranger = adapter(secret_id="bad-id-0001")
    wrong_key = adapter(secret_key="not-alice")

    with pytest.raises(CredentialsRejected) as not_found:
        stranger.check_credentials()
    with pytest.raises(CredentialsRejected) as bad_signature:
        wrong_key.list_offers()
    with pytest.raises(CredentialsRejected):
        stranger.launch(_spec())

    assert not_found.value.code == "AuthFailure.SecretIdNotFound"
    assert bad_signature.value.code == "AuthFailure.SignatureFailure"
    assert len(sandbox.calls("DescribeZoneInstanceConfigInfos")) == 1  # credentials errors are not retried
    assert sandbox.instances() == []


def test_a_credentials_fault_on_launch(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    sandbox.faults.inject("credentials")

    with pytest.raises(CredentialsRejected) as caught:
        adapter().launch(_spec())

    assert caught.value.code == "AuthFailure.UnauthorizedOperation"


def test_missing_secrets_and_bad_options_are_rejected_at_construction() -> None:
    with pytest.raises(CredentialsRejected):
        TencentAdapter(Credentials("tencent", {"secret_id": "AKID"}), ["ap-guangzhou"])
    with pytest.raises(ValueError, match="read_timeout"):
        TencentAdapter(
            Credentials("tencent", {"secret_id": "a", "secret_key": "b"}), ["ap-guangzhou"], {"read_timeout": "0"}
        )
    with pytest.raises(ValueError, match="regions"):
        TencentAdapter(Credentials("tencent", {"secret_id": "a", "secret_key": "b"}), [])
    with pytest.raises(ProviderRequestRejected):
        TencentAdapter(Credentials("tencent", {"secret_id": "a", "secret_key": "b"}, "ftp://x"), ["ap-guangzhou"])


# ------------------------------------------------------------------------------------- describe & co


def test_find_by_order_finds_tagged_instances_in_every_region(adapter: AdapterFactory) -> None:
    tencent = adapter(["ap-guangzhou", "ap-beijing"])
    first = tencent.launch(_spec("a-1", order_ref="ord-42"))
    second = tencent.launch(_spec("a-2", order_ref="ord-42", region="ap-beijing", zone="ap-beijing-6"))
    tencent.launch(_spec("b-1", order_ref="ord-43"))

    found = tencent.find_by_order("ord-42")

    assert [(h.region, h.instance_id) for h in found] == [
        ("ap-beijing", second.instance_id),
        ("ap-guangzhou", first.instance_id),
    ]
    assert tencent.find_by_order("ord-nobody") == []


def test_describe_of_an_unknown_instance_is_final(adapter: AdapterFactory) -> None:
    with pytest.raises(ProviderRequestRejected) as unknown:
        adapter().describe("ap-guangzhou", "ins-00000000")
    with pytest.raises(ProviderRequestRejected) as malformed:
        adapter().describe("ap-guangzhou", "i-0abc")

    assert (unknown.value.code, malformed.value.code) == ("InvalidInstanceId.NotFound", "InvalidInstanceId.Malformed")


def test_terminate_writes_once_and_is_idempotent(sandbox: TencentSandbox, adapter: AdapterFactory) -> None:
    tencent = adapter()
    handle = tencent.launch(_spec())

    stopping = tencent.terminate("ap-guangzhou", handle.instance_id)
    while_terminating = tencent.terminate("ap-guangzhou", handle.instance_id)
    terminated = _settle(tencent, stopping)
    again = tencent.terminate("ap-guangzhou", handle.instance_id)

    assert (stopping.state, stopping.extra["state_name"]) == (InstanceState.STOPPING, "TERMINATING")
    assert while_terminating.state is InstanceState.STOPPING
    assert (terminated.state, terminated.extra["state_name"]) == (InstanceState.TERMINATED, "SHUTDOWN")
    assert again.state is InstanceState.TERMINATED
    assert len(sandbox.calls("TerminateInstances")) == 1
    assert [i.holds_resources for i in sandbox.instances()] == [False]


def test_the_demo_account_signs_with_a_key_the_sandbox_checks(sandbox: TencentSandbox) -> None:
    # The run command's account and the README's portal credentials must pass a sandbox that checks signatures,
    # as Tencent does, not only one that takes any id it does not know.
    from sandboxes.demo import SANDBOX_ACCOUNTS

    demo = SANDBOX_ACCOUNTS["tencent"](sandbox)
    sandbox.set_strict(True)
    credentials = Credentials("tencent", demo.credentials, sandbox.url)

    TencentAdapter(credentials, demo.demo_regions[:1], {"max_attempts": "1"}).check_credentials()
    forged = Credentials("tencent", {**demo.credentials, "secret_key": "guess"}, sandbox.url)
    with pytest.raises(CredentialsRejected):
        TencentAdapter(forged, demo.demo_regions[:1], {"max_attempts": "1"}).check_credentials()
