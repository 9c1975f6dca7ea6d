"""A seller account's own provider rate limits (issue 23): an option ``rate_limit.<group>`` =
``<capacity>/<refill per second>`` sizes the account's shared bucket for that group, in every worker, through the
real SDKs against the sandboxes; a group the cloud has no bucket for, or a figure that is not two numbers in range,
is refused when the account is connected, naming the option.

The groups and their default figures are each cloud's own, cited in ``providers/ratelimit.py``:
- AWS: "Request throttling for the Amazon EC2 API", https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html
  (a token bucket per API action; "Request a limit increase" is how an account comes to hold other figures);
- Azure: "Understand how Azure Resource Manager throttles requests",
  https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling (reads, writes
  and deletes per subscription and service principal);
- GCP: "Compute Engine rate quotas", https://cloud.google.com/compute/api-quota (per project, per quota group, per
  minute; adjustable by a quota request);
- Alibaba Cloud: "API throttling", ECS developer reference, https://www.alibabacloud.com/help/doc-detail/437902.htm
  (per operation, region and account; the figures live in Quota Center);
- Tencent Cloud: "API 频率限制说明", https://cloud.tencent.com/document/product/1278/109059 (per API, access region
  and sub-account).

The buckets live in ``settings.PROVIDER_RATE_LIMIT_REDIS_URL``; tests that read them there are skipped without it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
import redis

from providers import ratelimit
from providers.alibaba.client import ACTIONS as ALIBABA_CLIENT_ACTIONS
from providers.errors import ProviderRequestRejected, TransientProviderError
from providers.models import Provider, ProviderAccount
from providers.ratelimit import RATE_LIMITED, BucketKey, Limit
from providers.services import AccountInvalid, adapter_for_account, provider_account_connect
from providers.tencent.client import split_endpoint
from providers.types import InstanceHandle, InstanceState
from sandboxes.alibaba.app import AlibabaSandbox
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import CHARLIE
from sandboxes.azure.app import AzureSandbox
from sandboxes.boot import BootMode
from sandboxes.gcp.app import GcpSandbox
from sandboxes.tencent.app import TencentSandbox
from tests.providers.contract import ContractTarget, contract_boot, launchable, settle, spec_for

pytestmark = pytest.mark.django_db

CLOUDS = ["aws", "azure", "gcp", "alibaba", "tencent"]
PROVIDER = "Olga's Careful Clouds"
TINY = "1/0.001"  # one request at once, then one every 1,000 s: a second request in a row cannot be covered
RAISED = "500/50"  # above every default capacity of the groups below


@dataclass
class Cloud:
    """How to connect one account of a cloud to its sandbox, the bucket its credentials check draws on (one
    request per check), and how many such requests the sandbox received."""

    kind: str
    credentials: dict[str, str]
    endpoint_url: str
    regions: list[str]
    options: dict[str, str]
    key: BucketKey
    default: Limit  # the cloud's own figure for the key's group
    sent: Callable[[], int]

    def connect(self, **options: str) -> ProviderAccount:
        return provider_account_connect(
            provider_name=PROVIDER,
            kind=self.kind,
            name=f"{self.kind}-main",
            credentials=self.credentials,
            regions=self.regions,
            endpoint_url=self.endpoint_url,
            options={**self.options, **options},
        )

    @property
    def option(self) -> str:
        return f"rate_limit.{self.key.group}"


def _aws(request: pytest.FixtureRequest) -> Cloud:
    sandbox: AwsSandbox = request.getfixturevalue("aws_sandbox")
    return Cloud(
        kind="aws",
        credentials=CHARLIE.credentials(),
        endpoint_url=sandbox.url,
        regions=["us-east-1"],
        options={},
        key=BucketKey("aws", CHARLIE.access_key_id, "us-east-1", "DescribeAvailabilityZones"),
        default=ratelimit.aws_group("ec2", "DescribeAvailabilityZones", {})[1],
        sent=lambda: len(sandbox.calls("DescribeAvailabilityZones")),
    )


def _azure(request: pytest.FixtureRequest) -> Cloud:
    sandbox: AzureSandbox = request.getfixturevalue("azure_server")
    sandbox.reset()
    credentials = {**sandbox.demo_credentials, "client_id": "careful-app"}
    return Cloud(
        kind="azure",
        credentials=credentials,
        endpoint_url=sandbox.url,
        regions=["eastus"],
        options=sandbox.account_options(),
        # ARM counts per subscription and service principal, reads apart from writes and deletes.
        key=BucketKey("azure", f"{credentials['subscription_id']}/careful-app", "arm", "arm/reads"),
        default=ratelimit.AZURE_LIMITS["arm/reads"],
        sent=lambda: len(sandbox.calls("Usage_List")),
    )


def _gcp(request: pytest.FixtureRequest) -> Cloud:
    sandbox: GcpSandbox = request.getfixturevalue("gcp_server")
    sandbox.reset()
    project = "careful-project"
    key = sandbox.new_service_account(f"broker@{project}.iam.gserviceaccount.com", project)
    return Cloud(
        kind="gcp",
        credentials={"service_account_json": json.dumps(key), "project_id": project},
        endpoint_url=sandbox.url,
        regions=["us-central1"],
        options={},
        key=BucketKey("gcp", project, "us-central1", "compute/reads"),  # regions.get: a read in that region
        default=ratelimit.GCP_LIMITS["compute/reads"],
        sent=lambda: len(sandbox.calls("compute.regions.get")),
    )


def _alibaba(request: pytest.FixtureRequest) -> Cloud:
    sandbox: AlibabaSandbox = request.getfixturevalue("alibaba_server")
    sandbox.reset()
    key_id, secret = "LTAI5tCareful00001", "careful-secret"
    sandbox.register_key(key_id, secret)
    return Cloud(
        kind="alibaba",
        credentials={"access_key_id": key_id, "access_key_secret": secret},
        endpoint_url=sandbox.url,
        regions=["cn-shanghai"],
        options={},
        key=BucketKey("alibaba", key_id, "cn-shanghai", "DescribeRegions"),
        default=ratelimit.alibaba_limit("DescribeRegions"),
        sent=lambda: len(sandbox.calls("DescribeRegions")),
    )


def _tencent(request: pytest.FixtureRequest) -> Cloud:
    sandbox: TencentSandbox = request.getfixturevalue("tencent_server")
    sandbox.reset()
    secret_id, secret_key = "AKIDcareful000000001", "careful-key"
    sandbox.register_secret(secret_id, secret_key)
    return Cloud(
        kind="tencent",
        credentials={"secret_id": secret_id, "secret_key": secret_key},
        endpoint_url=sandbox.url,
        regions=["ap-guangzhou"],
        options={},
        # Tencent counts per access region: the API server reached, here the sandbox's host and port.
        key=BucketKey("tencent", secret_id, str(split_endpoint(sandbox.url)[1]), "cvm/DescribeZones"),
        default=ratelimit.tencent_limit("cvm/DescribeZones"),
        sent=lambda: len(sandbox.calls("DescribeZones")),
    )


CLOUD_BUILDERS: dict[str, Callable[[pytest.FixtureRequest], Cloud]] = {
    "aws": _aws,
    "azure": _azure,
    "gcp": _gcp,
    "alibaba": _alibaba,
    "tencent": _tencent,
}


@pytest.fixture(params=CLOUDS)
def cloud(request: pytest.FixtureRequest) -> Cloud:
    return CLOUD_BUILDERS[request.param](request)


@pytest.fixture
def bucket(cloud: Cloud, store: redis.Redis) -> Iterator[BucketKey]:
    """The cloud's checked bucket, full (absent) at the start and removed after."""
    store.delete(cloud.key.redis_key)
    yield cloud.key
    store.delete(cloud.key.redis_key)


def _tokens(store: redis.Redis, key: BucketKey) -> float:
    raw = store.hget(key.redis_key, "tokens")
    assert raw is not None, f"no bucket {key.redis_key} in Redis"
    return float(raw)


def _nothing_saved() -> None:
    assert list(ProviderAccount.objects.filter(provider__name=PROVIDER)) == []
    assert list(Provider.objects.filter(name=PROVIDER)) == []


# ------------------------------------------------------------------------------ the option is the limit used


def test_an_accounts_option_is_the_limit_its_client_draws_on(cloud: Cloud, bucket: BucketKey, store: redis.Redis):
    account = cloud.connect()
    adapter_for_account(account).check_credentials()
    adapter_for_account(account).check_credentials()
    assert cloud.sent() == 2  # the cloud's own default lets two in a row through
    assert cloud.default.capacity - 2 <= _tokens(store, bucket) <= cloud.default.capacity - 1

    account = cloud.connect(**{cloud.option: TINY})  # the operator wants it gentler: the same account, changed
    store.delete(bucket.redis_key)  # as after a quiet while: full (a bucket keeps its level across a change)
    adapter = adapter_for_account(account)
    adapter.check_credentials()
    with pytest.raises(TransientProviderError) as raised:
        adapter.check_credentials()

    # The second check would wait ~1,000 s for its token, past the call's deadline: refused now, retryable, and it
    # never reached the cloud. The bucket the client drew on was sized by the option: one token, taken.
    assert (raised.value.code, raised.value.retryable, raised.value.provider) == (RATE_LIMITED, True, cloud.kind)
    assert cloud.sent() == 3
    assert 0 <= _tokens(store, bucket) < 0.01
    assert ProviderAccount.objects.get(pk=account.pk).options[cloud.option] == TINY


def test_an_account_whose_cloud_raised_its_limit_gets_the_bigger_bucket(
    cloud: Cloud, bucket: BucketKey, store: redis.Redis
):
    account = cloud.connect(**{cloud.option: RAISED})

    adapter_for_account(account).check_credentials()

    # A full bucket of 500, less the one token taken (and at most a little refill since): more than the cloud's
    # default capacity for this group could ever hold.
    assert cloud.default.capacity < 499 <= _tokens(store, bucket) <= 499.5
    assert cloud.sent() == 1


def test_a_tiny_bucket_refuses_every_worker_not_just_the_one_that_emptied_it(
    cloud: Cloud, bucket: BucketKey, store: redis.Redis
):
    account = cloud.connect(**{cloud.option: TINY})
    adapter_for_account(account).check_credentials()

    # Another worker builds its own adapter (and its own SDK clients) from the stored account: the same bucket.
    with pytest.raises(TransientProviderError) as raised:
        adapter_for_account(ProviderAccount.objects.get(pk=account.pk)).check_credentials()

    assert raised.value.code == RATE_LIMITED
    assert cloud.sent() == 1


# ----------------------------------------------------------------------------------- refused at connection


OTHER_CLOUDS_GROUP = {
    "aws": "compute/reads",
    "azure": "DescribeInstances",
    "gcp": "arm/reads",
    "alibaba": "cvm/DescribeZones",
    "tencent": "DescribeRegions",
}


def test_a_group_the_cloud_has_no_bucket_for_is_refused_at_connection(cloud: Cloud) -> None:
    for group in ("NoSuchBucket", OTHER_CLOUDS_GROUP[cloud.kind]):
        with pytest.raises(AccountInvalid) as raised:
            cloud.connect(**{f"rate_limit.{group}": "10/1"})

        message = str(raised.value)
        assert message.startswith(f"options.rate_limit.{group}: {cloud.kind} has no request bucket {group!r}")
        assert cloud.key.group in message  # the valid groups are listed
        assert "providers.ratelimit.ACCOUNT_GROUPS" in message
    _nothing_saved()
    assert cloud.sent() == 0


def test_a_misspelt_group_is_refused_with_the_one_meant() -> None:
    with pytest.raises(AccountInvalid, match=r"^options\.rate_limit\.DescribeInstnaces: .*'DescribeInstances'\?"):
        provider_account_connect(
            provider_name=PROVIDER,
            kind="aws",
            name="aws-main",
            credentials=CHARLIE.credentials(),
            regions=["us-east-1"],
            options={"rate_limit.DescribeInstnaces": "200/40"},
        )
    _nothing_saved()


def test_the_broker_wide_prices_bucket_is_no_accounts_to_size() -> None:
    with pytest.raises(AccountInvalid, match=r"^options\.rate_limit\.prices: azure's 'prices' bucket is the whole"):
        provider_account_connect(
            provider_name=PROVIDER,
            kind="azure",
            name="azure-main",
            credentials={"tenant_id": "t", "client_id": "c", "client_secret": "s", "subscription_id": "sub"},
            regions=["eastus"],
            options={"rate_limit.prices": "1000/1000"},
        )
    _nothing_saved()


def test_an_independent_fleet_has_no_rate_limits_to_set() -> None:
    with pytest.raises(AccountInvalid, match=r"^options\.rate_limit\.RunInstances: community accounts have no"):
        provider_account_connect(
            provider_name=PROVIDER,
            kind="community",
            name="fleet",
            credentials={},
            regions=["eu-de"],
            options={"rate_limit.RunInstances": "5/2"},
        )
    _nothing_saved()


FORMAT = "is not <capacity>/<refill per second> written with the digits 0-9"
CAPACITY = "is not from 1 to 100000"
REFILL = "per second is not above 0 and at most 100000"
BAD_FIGURES = [
    ("fast", FORMAT),
    ("5", FORMAT),
    ("5/", FORMAT),
    ("/5", FORMAT),
    ("5/5/5", FORMAT),
    ("1e3/5", FORMAT),  # an exponent
    ("5/1E2", FORMAT),
    ("nan/5", FORMAT),
    ("5/inf", FORMAT),
    ("Infinity/1", FORMAT),
    ("-5/5", FORMAT),  # no sign
    ("+5/5", FORMAT),
    ("5/-1", FORMAT),
    (" 5/5", FORMAT),
    ("5 / 5", FORMAT),
    ("1_000/5", FORMAT),  # float() would read it as 1000
    ("0x10/5", FORMAT),
    ("\u0665/5", FORMAT),  # ARABIC-INDIC DIGIT FIVE: int() and float() would read it as 5
    ("\uff15/5", FORMAT),  # FULLWIDTH DIGIT FIVE
    ("5./5", FORMAT),
    (".5/5", FORMAT),
    ("0/5", CAPACITY),
    ("0.5/5", CAPACITY),  # a request takes a whole token: a bucket must hold one
    ("100001/5", CAPACITY),
    ("5/0", REFILL),
    ("5/0.000", REFILL),
    ("5/100000.5", REFILL),
    ("1" * 41, "41 characters; give <capacity>/<refill per second>"),
    ("9" * 5000 + "/1", "5002 characters"),
]


@pytest.mark.parametrize(("value", "reason"), BAD_FIGURES, ids=[repr(v[:12]) for v, _ in BAD_FIGURES])
def test_a_figure_that_is_not_two_numbers_in_range_is_refused_at_connection(value: str, reason: str) -> None:
    with pytest.raises(AccountInvalid) as raised:
        provider_account_connect(
            provider_name=PROVIDER,
            kind="aws",
            name="aws-main",
            credentials=CHARLIE.credentials(),
            regions=["us-east-1"],
            options={"rate_limit.DescribeAvailabilityZones": value},
        )

    message = str(raised.value)
    assert message.startswith("options.rate_limit.DescribeAvailabilityZones: ")
    assert reason in message
    assert len(message) < 300  # an absurd value is not repeated back
    _nothing_saved()


def test_each_clouds_bad_figure_is_refused_too(cloud: Cloud) -> None:
    with pytest.raises(AccountInvalid, match=rf"^options\.{cloud.option}: '1e9/1' {FORMAT}"):
        cloud.connect(**{cloud.option: "1e9/1"})
    _nothing_saved()


def test_figures_at_the_bounds_and_an_empty_value_are_accepted(aws_sandbox: AwsSandbox) -> None:
    options = {
        "rate_limit.DescribeAvailabilityZones": "100000/100000",
        "rate_limit.RunInstances": "1/0.001",
        "rate_limit.RunInstances/instances": "1000.5/2.25",
        "rate_limit.DescribeInstances/unfiltered": "",  # unset: the default applies
    }
    account = provider_account_connect(
        provider_name=PROVIDER,
        kind="aws",
        name="aws-main",
        credentials=CHARLIE.credentials(),
        regions=["us-east-1"],
        endpoint_url=aws_sandbox.url,
        options=options,
    )

    assert ProviderAccount.objects.get(pk=account.pk).options == options
    assert ratelimit.limits_from_options(options, "aws") == {
        "DescribeAvailabilityZones": ratelimit.Limit(100000, 100000),
        "RunInstances": ratelimit.Limit(1, 0.001),
        "RunInstances/instances": ratelimit.Limit(1000.5, 2.25),
    }


def test_a_change_to_a_bad_figure_is_refused_and_keeps_the_accounts_options(aws_sandbox: AwsSandbox) -> None:
    def connect(value: str) -> ProviderAccount:
        return provider_account_connect(
            provider_name=PROVIDER,
            kind="aws",
            name="aws-main",
            credentials=CHARLIE.credentials(),
            regions=["us-east-1"],
            endpoint_url=aws_sandbox.url,
            options={"rate_limit.DescribeInstances": value},
        )

    account = connect("200/40")
    with pytest.raises(AccountInvalid, match=r"^options\.rate_limit\.DescribeInstances: the refill 0 per second"):
        connect("200/0")

    assert ProviderAccount.objects.get(pk=account.pk).options == {"rate_limit.DescribeInstances": "200/40"}


def test_an_account_stored_with_a_bad_figure_is_reported_misconfigured(aws_sandbox: AwsSandbox) -> None:
    account = provider_account_connect(
        provider_name=PROVIDER,
        kind="aws",
        name="aws-main",
        credentials=CHARLIE.credentials(),
        regions=["us-east-1"],
        endpoint_url=aws_sandbox.url,
    )
    # Options written before these checks existed (or by hand): building the adapter runs the same check.
    ProviderAccount.objects.filter(pk=account.pk).update(options={"rate_limit.DescribeImages": "nan/nan"})

    with pytest.raises(ProviderRequestRejected) as raised:
        adapter_for_account(ProviderAccount.objects.get(pk=account.pk))

    assert f"account {account.pk} is misconfigured: options.rate_limit.DescribeImages: 'nan/nan'" in str(raised.value)
    assert aws_sandbox.calls() == []


# ------------------------------------------------------------------ every bucket drawn is one an account names


def test_the_alibaba_groups_are_the_operations_its_client_sends() -> None:
    assert ratelimit.ACCOUNT_GROUPS["alibaba"] == frozenset(ALIBABA_CLIENT_ACTIONS) | {"RunInstances/instances"}


def _drawn_since(store: redis.Redis, kind: str, since_us: int) -> set[str]:
    """The groups of the ``kind`` buckets drawn on since ``since_us`` (Redis's clock), read from the buckets."""
    groups: set[str] = set()
    for key in store.scan_iter(match=f"{ratelimit.KEY_PREFIX}:{kind}:*", count=1000):
        at = store.hget(key, "at")
        if at is not None and int(at) >= since_us:
            groups.add(key.decode().rsplit(":", 1)[1])  # a group has no ':'; a Tencent region (host:port) may
    return groups


@pytest.fixture
def held(target: ContractTarget) -> Iterator[ContractTarget]:
    """The contract target with booted machines held instead of phoning home."""
    booter = target.sandbox.booter
    mode = booter.mode
    booter.mode = BootMode.HOLD
    yield target
    booter.reset()
    booter.mode = mode


def test_every_bucket_a_clouds_requests_draw_on_is_one_its_accounts_may_size(
    held: ContractTarget, store: redis.Redis
) -> None:
    """An account may name only ``ACCOUNT_GROUPS``: this walks an account through what the broker does with it
    (check, sync, quota check, a booted launch, polls, listing, terminate, release) and reads back from Redis every
    bucket drawn on meanwhile, so a new call whose bucket no account could size fails here."""
    seconds, micros = store.time()
    since = seconds * 1_000_000 + micros
    adapter = held.make_adapter(True, {})
    spec = replace(spec_for(launchable(held)), boot=contract_boot())

    adapter.check_credentials()
    assert adapter.list_offers()
    adapter.quota_check(spec)
    handle = settle(adapter, spec)
    assert isinstance(handle, InstanceHandle), handle
    adapter.describe_many(spec.region, [handle.instance_id])
    adapter.find_by_order(spec.order_ref)
    adapter.list_order_resources()
    stopped = adapter.terminate(spec.region, handle.instance_id)
    for _ in range(100):  # until the cloud says it is gone (state, bounded)
        if stopped.state == InstanceState.TERMINATED:
            break
        time.sleep(0.1)
        try:
            stopped = adapter.describe(spec.region, handle.instance_id)
        except ProviderRequestRejected:  # a cloud that forgets a released instance at once (ECS)
            break
    if adapter.release_order_resources(spec.order_ref):
        adapter.release_order_resources(spec.order_ref)

    drawn = _drawn_since(store, held.kind, since) - ratelimit.BROKER_WIDE_GROUPS.get(held.kind, frozenset())
    assert drawn, f"{held.kind}: no bucket was drawn on"
    assert drawn <= ratelimit.ACCOUNT_GROUPS[held.kind], drawn - ratelimit.ACCOUNT_GROUPS[held.kind]
