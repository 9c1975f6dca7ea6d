"""Provider rate limits shared across workers (issue 23, providers/ratelimit.py): every cloud's client draws each
HTTP request it sends on the account's bucket in Redis, through the real SDK against the sandboxes.

The buckets live in ``settings.PROVIDER_RATE_LIMIT_REDIS_URL`` (REDIS_URL by default); tests that read them there
are skipped on the embedded defaults, where there is no Redis. Tests that need Redis down or back start their own
``redis-server`` or point at a port nothing listens on.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from providers import ratelimit
from providers.alibaba.client import AlibabaClient
from providers.alibaba.client import ClientSettings as AlibabaSettings
from providers.aws.client import AwsClient
from providers.aws.client import ClientSettings as AwsSettings
from providers.azure.client import AzureClient
from providers.azure.pipeline import ClientSettings as AzureSettings
from providers.errors import TransientProviderError
from providers.gcp.client import ClientSettings as GcpSettings
from providers.gcp.client import GcpClient
from providers.ratelimit import RATE_LIMITED, BucketKey, Limit, RateLimiter
from providers.tencent.client import ClientSettings as TencentSettings
from providers.tencent.client import TencentClient
from providers.types import LaunchSpec, PricingModel
from sandboxes.alibaba.app import AlibabaSandbox
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE, BOB
from sandboxes.azure.app import AzureSandbox
from sandboxes.faults import FaultKind
from sandboxes.gcp.app import GcpSandbox
from sandboxes.tencent.app import TencentSandbox

CLOUDS = ["aws", "azure", "gcp", "alibaba", "tencent"]
TINY_REFILL = 0.001  # a token every 1,000 s: within a test, a taken token stays taken


# ------------------------------------------------------------------------------------- one read per cloud


@dataclass
class Case:
    """One cloud's client for one of two accounts, a read it makes, the bucket that read draws on, and how many
    such requests the sandbox received."""

    read: Callable[[], Any]
    key: BucketKey
    sent: Callable[[], int]


CaseFactory = Callable[..., Case]


@pytest.fixture
def aws_case(aws_sandbox: AwsSandbox) -> CaseFactory:
    def make(account: int = 0, limit: Limit | None = None, **settings: Any) -> Case:
        key_pair = (ALICE, BOB)[account]
        group = "DescribeAvailabilityZones"
        client = AwsClient(
            AwsSettings(
                key_pair.access_key_id,
                key_pair.secret_access_key,
                endpoint_url=aws_sandbox.url,
                rate_limits={group: limit} if limit else None,
                **{"max_attempts": 1, **settings},
            )
        )
        return Case(
            read=lambda: client.call("us-east-1", "describe_availability_zones"),
            key=BucketKey("aws", key_pair.access_key_id, "us-east-1", group),
            sent=lambda: len(aws_sandbox.calls(group)),
        )

    return make


@pytest.fixture
def azure_case(azure_server: AzureSandbox) -> Iterator[CaseFactory]:
    azure_server.reset()
    azure_server.retry_after_s = 0
    clients: list[AzureClient] = []

    def make(account: int = 0, limit: Limit | None = None, **settings: Any) -> Case:
        values = azure_server.demo_credentials
        client_id = ("rate-app-a", "rate-app-b")[account]
        client = AzureClient(
            AzureSettings(
                values["tenant_id"],
                client_id,
                values["client_secret"],
                values["subscription_id"],
                arm_url=azure_server.url,
                authority_url=azure_server.url,
                prices_url=azure_server.url,
                ca_bundle=str(azure_server.cert_path),
                rate_limits={"arm/reads": limit} if limit else None,
                **{"max_attempts": 1, **settings},
            )
        )
        clients.append(client)
        return Case(
            read=lambda: client.usages("eastus"),
            key=BucketKey("azure", f"{values['subscription_id']}/{client_id}", "arm", "arm/reads"),
            sent=lambda: len(azure_server.calls("Usage_List")),
        )

    yield make
    for client in clients:
        client.close()
    azure_server.reset()


@pytest.fixture
def gcp_case(gcp_server: GcpSandbox) -> Iterator[CaseFactory]:
    gcp_server.reset()

    def make(account: int = 0, limit: Limit | None = None, **settings: Any) -> Case:
        project = ("rate-project-a", "rate-project-b")[account]
        key = gcp_server.new_service_account(f"broker@{project}.iam.gserviceaccount.com", project)
        client = GcpClient(
            GcpSettings(
                project_id=project,
                service_account_info=key,
                endpoint_url=gcp_server.url,
                rate_limits={"compute/reads": limit} if limit else None,
                **{"max_attempts": 1, **settings},
            )
        )
        return Case(
            read=lambda: client.regions_get("us-central1"),
            key=BucketKey("gcp", project, "us-central1", "compute/reads"),
            sent=lambda: len(gcp_server.calls("compute.regions.get")),
        )

    yield make
    gcp_server.reset()


@pytest.fixture
def alibaba_case(alibaba_server: AlibabaSandbox) -> Iterator[CaseFactory]:
    alibaba_server.reset()

    def make(account: int = 0, limit: Limit | None = None, **settings: Any) -> Case:
        key_id, secret = (("LTAI5tRateA00001", "rate-secret-a"), ("LTAI5tRateB00001", "rate-secret-b"))[account]
        alibaba_server.register_key(key_id, secret)
        client = AlibabaClient(
            AlibabaSettings(
                key_id,
                secret,
                endpoint_url=alibaba_server.url,
                rate_limits={"DescribeRegions": limit} if limit else None,
                **{"max_attempts": 1, **settings},
            ),
            sleep=lambda _: None,  # the client's own backoff between retries; the limiter's waits are its own
        )
        return Case(
            read=lambda: client.call("cn-shanghai", "DescribeRegions", {"RegionId": "cn-shanghai"}),
            key=BucketKey("alibaba", key_id, "cn-shanghai", "DescribeRegions"),
            sent=lambda: len(alibaba_server.calls("DescribeRegions")),
        )

    yield make
    alibaba_server.reset()


@pytest.fixture
def tencent_case(tencent_server: TencentSandbox) -> Iterator[CaseFactory]:
    tencent_server.reset()

    def make(account: int = 0, limit: Limit | None = None, **settings: Any) -> Case:
        secret_id, secret_key = (("AKIDrate0000000000a1", "rate-key-a"), ("AKIDrate0000000000b1", "rate-key-b"))[
            account
        ]
        tencent_server.register_secret(secret_id, secret_key)
        client = TencentClient(
            TencentSettings(
                secret_id,
                secret_key,
                endpoint_url=tencent_server.url,
                rate_limits={"cvm/DescribeZones": limit} if limit else None,
                **{"max_attempts": 1, "retry_backoff": 0.01, **settings},
            )
        )
        return Case(
            read=lambda: client.call("ap-guangzhou", "DescribeZones"),
            # Tencent counts per access region: the API server reached, here the sandbox's host.
            key=BucketKey("tencent", secret_id, str(client.endpoint), "cvm/DescribeZones"),
            sent=lambda: len(tencent_server.calls("DescribeZones")),
        )

    yield make
    tencent_server.reset()


@pytest.fixture
def case(request: pytest.FixtureRequest, store: redis.Redis) -> Iterator[CaseFactory]:
    """The parametrized cloud's factory; every bucket it hands out starts full (absent) and is removed after."""
    factory: CaseFactory = request.getfixturevalue(f"{request.param}_case")
    made: list[Case] = []

    def make(*args: Any, **kwargs: Any) -> Case:
        built = factory(*args, **kwargs)
        store.delete(built.key.redis_key)
        made.append(built)
        return built

    yield make
    for built in made:
        store.delete(built.key.redis_key)


def _tokens(store: redis.Redis, key: BucketKey) -> float:
    raw = store.hget(key.redis_key, "tokens")
    assert raw is not None, f"no bucket {key.redis_key} in Redis"
    return float(raw)


# ----------------------------------------------------------------------------------- each cloud is counted


@pytest.mark.parametrize("case", CLOUDS, indirect=True)
def test_each_request_takes_a_token_and_one_past_the_bucket_fails_fast(case: CaseFactory, store: redis.Redis) -> None:
    account = case(limit=Limit(3, TINY_REFILL))

    for _ in range(3):
        account.read()

    assert account.sent() == 3
    left = _tokens(store, account.key)
    assert 0 <= left < 0.01  # all three taken; at most a few seconds of a 1/1000 s refill back
    started = time.monotonic()
    with pytest.raises(TransientProviderError) as raised:
        account.read()
    # The fourth would wait ~1,000 s for its token, far past the call's 90 s deadline: it fails now, retryable,
    # takes nothing and never reaches the cloud.
    assert time.monotonic() - started < 1
    assert (raised.value.code, raised.value.retryable, raised.value.provider) == (
        RATE_LIMITED,
        True,
        account.key.provider,
    )
    assert account.sent() == 3
    assert _tokens(store, account.key) == left


@pytest.mark.parametrize("case", CLOUDS, indirect=True)
def test_a_request_past_the_burst_waits_for_its_token(case: CaseFactory, store: redis.Redis) -> None:
    account = case(limit=Limit(1, 10))  # one at once, then one every 100 ms

    started = time.monotonic()
    for _ in range(3):
        account.read()
    elapsed = time.monotonic() - started

    # Three grants from a bucket of one refilled at 10/s need two refills: at least 200 ms, whoever asks.
    assert elapsed >= 0.2 - 0.005
    assert elapsed < 5
    assert account.sent() == 3
    assert _tokens(store, account.key) < 1


@pytest.mark.parametrize("case", CLOUDS, indirect=True)
def test_one_accounts_empty_bucket_does_not_hold_up_another(case: CaseFactory, store: redis.Redis) -> None:
    alice = case(0, Limit(2, TINY_REFILL))
    bob = case(1, Limit(2, TINY_REFILL))
    alice.read()
    alice.read()
    with pytest.raises(TransientProviderError):
        alice.read()

    started = time.monotonic()
    bob.read()
    bob.read()

    assert time.monotonic() - started < 2  # no wait: had bob shared alice's bucket, he would have been refused
    assert alice.key.redis_key != bob.key.redis_key
    assert 0 <= _tokens(store, bob.key) < 0.01
    assert 0 <= _tokens(store, alice.key) < 0.01
    with pytest.raises(TransientProviderError):
        alice.read()


@pytest.mark.parametrize("case", CLOUDS, indirect=True)
def test_a_retried_request_is_counted_again(case: CaseFactory, store: redis.Redis, request: pytest.FixtureRequest):
    cloud = request.node.callspec.params["case"]
    account = case(limit=Limit(10, TINY_REFILL), max_attempts=2)
    action = {
        "aws": "DescribeAvailabilityZones",
        "azure": "Usage_List",
        "gcp": "compute.regions.get",
        "alibaba": "DescribeRegions",
        "tencent": "DescribeZones",
    }[cloud]
    request.getfixturevalue(f"{cloud}_server" if cloud != "aws" else "aws_sandbox").faults.inject(
        FaultKind.THROTTLE, action=action, times=1
    )

    account.read()  # throttled once by the sandbox, then retried by the SDK or the client

    assert account.sent() == 2
    assert 1.99 < 10 - _tokens(store, account.key) < 2.01


def test_each_page_of_a_paged_read_takes_a_token(aws_sandbox: AwsSandbox, store: redis.Redis) -> None:
    group = "DescribeSpotPriceHistory"
    client = AwsClient(
        AwsSettings(
            ALICE.access_key_id,
            ALICE.secret_access_key,
            endpoint_url=aws_sandbox.url,
            rate_limits={group: Limit(1000, TINY_REFILL)},
        )
    )
    key = BucketKey("aws", ALICE.access_key_id, "us-east-1", group)
    store.delete(key.redis_key)
    try:
        rows = client.pages(
            "us-east-1", "describe_spot_price_history", "SpotPriceHistory", InstanceTypes=["g5.xlarge"], MaxResults=2
        )

        pages = len(aws_sandbox.calls(group))
        assert pages > 2 and len(rows) > 2
        assert pages - 0.01 < 1000 - _tokens(store, key) <= pages  # one token a page (less a few ms of refill)
    finally:
        store.delete(key.redis_key)


# ------------------------------------------------------------------------------------------ Redis down


def _dead_redis_url() -> str:
    """A Redis URL on a local port nothing listens on (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "providers.ratelimit" and r.levelno == logging.WARNING]


def test_provisioning_goes_on_when_redis_is_down(
    aws_sandbox: AwsSandbox, aws_adapter: Callable[..., Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.PROVIDER_RATE_LIMIT_REDIS_URL = _dead_redis_url()
    caplog.set_level(logging.WARNING, logger="providers.ratelimit")
    adapter = aws_adapter()
    spec = LaunchSpec(
        region="us-east-1",
        zone="us-east-1a",
        instance_type="p4d.24xlarge",
        pricing_model=PricingModel.ON_DEMAND,
        client_token="ord-rl-attempt-1",
        order_ref="ord-rl",
    )

    handle = adapter.launch(spec)
    assert [i.instance_id for i in aws_sandbox.instances()] == [handle.instance_id]
    adapter.terminate("us-east-1", handle.instance_id)

    # The launch's reads, its RunInstances and the terminate all went out, each having tried Redis (or skipped it).
    assert len(aws_sandbox.calls("RunInstances")) == 1
    assert len(aws_sandbox.calls("TerminateInstances")) == 1
    warned = _warnings(caplog)
    assert len(warned) == 1
    assert "Redis at 127.0.0.1" in warned[0].getMessage() and "per process" in warned[0].getMessage()


def test_the_in_process_buckets_still_limit_while_redis_is_down(
    aws_case: CaseFactory, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.PROVIDER_RATE_LIMIT_REDIS_URL = _dead_redis_url()
    account = aws_case(limit=Limit(2, TINY_REFILL))

    account.read()
    account.read()
    with pytest.raises(TransientProviderError) as raised:
        account.read()

    assert raised.value.code == RATE_LIMITED
    assert account.sent() == 2
    assert len(_warnings(caplog)) == 1


def test_a_dead_redis_is_reported_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    limiter = RateLimiter(_dead_redis_url(), clock=lambda: now[0], redis_retry_s=0)
    draw = [(BucketKey("aws", "warned", "us-east-1", "DescribeImages"), Limit(100, 20), 1.0)]
    caplog.set_level(logging.WARNING, logger="providers.ratelimit")

    seen = []
    for moment in (1000.0, 1001.0, 1030.0, 1059.9, 1060.0, 1061.0, 1125.0):
        now[0] = moment
        grant = limiter.take(draw, max_wait_s=10)
        assert (grant.granted, grant.shared) == (True, False)
        seen.append(len(_warnings(caplog)))

    assert seen == [1, 1, 1, 1, 2, 2, 3]


@pytest.fixture
def own_redis() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start (and restart) a private redis-server on a free port; every one started is stopped after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(server)
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:  # until it answers (state, not a fixed sleep); bounded
            try:
                if client.ping():
                    return server
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    start.url = f"redis://127.0.0.1:{port}/0"  # type: ignore[attr-defined]
    yield start
    for server in started:
        server.terminate()
        server.wait(timeout=10)


def test_the_shared_buckets_come_back_with_redis(
    own_redis: Callable[[], subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="providers.ratelimit")
    server = own_redis()
    limiter = RateLimiter(own_redis.url, redis_retry_s=0)  # type: ignore[attr-defined]
    draw = [(BucketKey("gcp", "back", "global", "billing"), Limit(30, 4.5), 1.0)]
    assert limiter.take(draw, max_wait_s=10).shared

    server.terminate()
    server.wait(timeout=10)
    down = limiter.take(draw, max_wait_s=10)
    own_redis()
    back = limiter.take(draw, max_wait_s=10)

    assert (down.granted, down.shared) == (True, False)
    assert (back.granted, back.shared) == (True, True)
    assert len(_warnings(caplog)) == 1


# ------------------------------------------------------------------------------------------- the figures


def test_aws_requests_draw_on_their_actions_category() -> None:
    assert ratelimit.aws_group("ec2", "DescribeInstances", {}) == ("DescribeInstances/unfiltered", Limit(50, 10))
    assert ratelimit.aws_group("ec2", "DescribeInstances", {"Filters": [{"Name": "x"}]}) == (
        "DescribeInstances",
        Limit(100, 20),
    )
    assert ratelimit.aws_group("ec2", "DescribeImages", {}) == ("DescribeImages", Limit(100, 20))
    assert ratelimit.aws_group("ec2", "RunInstances", {}) == ("RunInstances", Limit(5, 2))
    assert ratelimit.aws_group("ec2", "CreateSecurityGroup", {}) == ("CreateSecurityGroup", Limit(50, 5))
    assert ratelimit.aws_group("ssm", "GetParameter", {}) == ("ssm/parameters", Limit(40, 40))
    assert ratelimit.aws_group("pricing", "GetProducts", {}) == ("pricing/GetProducts", Limit(10, 5))


def test_gcp_requests_draw_on_their_region_or_the_global_group() -> None:
    compute = "/compute/v1/projects/p"
    assert ratelimit.gcp_group("GET", f"{compute}/zones/us-central1-a/instances/vm") == ("us-central1", "compute/reads")
    assert ratelimit.gcp_group("POST", f"{compute}/zones/europe-west4-b/instances") == (
        "europe-west4",
        "compute/writes",
    )
    assert ratelimit.gcp_group("GET", f"{compute}/regions/us-east1") == ("us-east1", "compute/reads")
    assert ratelimit.gcp_group("GET", f"{compute}/aggregated/machineTypes") == ("global", "compute/global-reads")
    assert ratelimit.gcp_group("DELETE", f"{compute}/global/firewalls/fw") == ("global", "compute/global-writes")
    assert ratelimit.gcp_group("GET", "/v1/services/6F81-5844-456A/skus") == ("global", "billing")


def test_a_window_counted_limit_never_passes_its_count_in_one_window() -> None:
    limit = Limit.per_window(1500, 60)
    assert limit.capacity + limit.refill_per_s * 60 == pytest.approx(1500)
    tencent = ratelimit.tencent_limit("cvm/RunInstances")
    assert tencent.capacity + tencent.refill_per_s * 1 == pytest.approx(10)


def test_an_accounts_own_figures_come_from_its_options() -> None:
    assert ratelimit.limits_from_options({"rate_limit.DescribeInstances": "200/40", "region": "x"}, "aws") == {
        "DescribeInstances": Limit(200, 40)
    }
    with pytest.raises(ValueError, match=r"options\.rate_limit\.RunInstances"):
        ratelimit.limits_from_options({"rate_limit.RunInstances": "fast"}, "aws")
    with pytest.raises(ValueError, match=r"options\.rate_limit\.RunInstances"):
        ratelimit.limits_from_options({"rate_limit.RunInstances": "5/0"}, "aws")
