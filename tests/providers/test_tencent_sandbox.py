"""The Tencent sandbox itself, driven by the plain Tencent SDK, by raw HTTP and by its control API."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from tencentcloud.common import credential
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from tencentcloud.cvm.v20170312 import cvm_client

from sandboxes.tencent.app import TencentSandbox, start_tencent_sandbox
from sandboxes.tencent.catalogue import REGIONS, load_seed

SECRET_ID = "AKIDcharlie000000001"
SECRET_KEY = "charlie-secret-key"
SOURCE_COMMIT = "8ec072968ccbe6d60a8de2a7d57b4739a6814542"
IMAGE = "img-sbxu2404"


class FakeClock:
    """The sandbox's monotonic clock, moved by hand so state changes are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
def clocked() -> Iterator[tuple[TencentSandbox, FakeClock]]:
    clock = FakeClock()
    sandbox = start_tencent_sandbox(launch_seconds=10, terminate_seconds=20, retention_seconds=600, clock=clock)
    yield sandbox, clock
    sandbox.stop()


def _cvm(
    sandbox: TencentSandbox, region: str = "ap-guangzhou", secret_id: str = SECRET_ID, key: str = SECRET_KEY
) -> Any:
    http = HttpProfile(protocol="http", endpoint=sandbox.url.split("://", 1)[1], reqTimeout=5)
    return cvm_client.CvmClient(credential.Credential(secret_id, key), region, ClientProfile(httpProfile=http))


def _call(client: Any, action: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = client.call_json(action, params or {})
    return answer["Response"]


def _code(client: Any, action: str, params: dict[str, Any] | None = None) -> str:
    with pytest.raises(TencentCloudSDKException) as caught:
        client.call_json(action, params or {})
    return str(caught.value.get_code())


def _run(client: Any, idempotency_key: str = "charlie-1", zone: str = "ap-guangzhou-3", **extra: Any) -> list[str]:
    params = {
        "Placement": {"Zone": zone},
        "InstanceType": "GN7.2XLARGE32",
        "ImageId": IMAGE,
        "ClientToken": idempotency_key,
        **extra,
    }
    ids: list[str] = _call(client, "RunInstances", params)["InstanceIdSet"]
    return ids


def _describe(client: Any, instance_id: str) -> dict[str, Any]:
    found: dict[str, Any] = _call(client, "DescribeInstances", {"InstanceIds": [instance_id]})["InstanceSet"][0]
    return found


def _control(sandbox: TencentSandbox, method: str, route: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{sandbox.url}/_sandbox/{route}", data=data, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - the sandbox's local URL
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# ------------------------------------------------------------------------------------------------ seed


def test_the_seed_serves_every_sourced_row_in_three_mainland_regions() -> None:
    seed = load_seed()

    assert len(seed) == 42
    assert {r.region for r in seed} == set(REGIONS) == {"ap-guangzhou", "ap-shanghai", "ap-beijing"}
    for region in REGIONS:
        assert len({r.instance_type for r in seed if r.region == region}) == 14
    assert all(r.spot is None for r in seed)
    assert all(r.source_region == "cn-mainland" for r in seed)
    assert all(f"@{SOURCE_COMMIT}" in r.source and f"[row {r.instance_type}]" in r.source for r in seed)
    assert all("本页参考价格主要以中国大陆地区为主" in r.note and r.region in r.note for r in seed)
    assert all(r.source_date == "commit date not retrievable offline (see md)" for r in seed)
    gn7 = next(r for r in seed if r.instance_type == "GN7.2XLARGE32")
    assert gn7.on_demand == Decimal("8.68")
    assert gn7.source.endswith("doc gives range 7.81 - 8.68; upper bound used")
    # One mainland list price, the same in every region.
    for instance_type in {r.instance_type for r in seed}:
        assert len({r.on_demand for r in seed if r.instance_type == instance_type}) == 1
    assert all(len(r.zones) >= 2 and set(r.all_zones) <= {z.name for z in REGIONS[r.region]} for r in seed)


# ------------------------------------------------------------------------------------------------ wire


def test_errors_come_with_http_200_and_an_error_object(sandbox: TencentSandbox) -> None:
    request = urllib.request.Request(  # noqa: S310 - the sandbox's local URL
        sandbox.url + "/",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json", "X-TC-Action": "DescribeZones", "X-TC-Version": "2017-03-12"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        status, content_type, body = response.status, response.headers["Content-Type"], json.loads(response.read())

    assert (status, content_type) == (200, "application/json")
    assert body["Response"]["Error"]["Code"] == "AuthFailure.SignatureFailure"
    assert body["Response"]["RequestId"]


def test_a_signed_request_with_the_registered_key_is_answered(sandbox: TencentSandbox) -> None:
    zones = _call(_cvm(sandbox, "ap-shanghai"), "DescribeZones")

    assert [z["Zone"] for z in zones["ZoneSet"]] == ["ap-shanghai-2", "ap-shanghai-4", "ap-shanghai-5"]
    assert zones["TotalCount"] == 3


def test_a_wrong_secret_key_fails_the_signature(sandbox: TencentSandbox) -> None:
    assert _code(_cvm(sandbox, key="not-the-key"), "DescribeZones") == "AuthFailure.SignatureFailure"


def test_secret_ids_starting_with_bad_are_not_found(sandbox: TencentSandbox) -> None:
    assert _code(_cvm(sandbox, secret_id="bad-id"), "DescribeZones") == "AuthFailure.SecretIdNotFound"


def test_unregistered_secret_ids_are_trusted_unless_strict(sandbox: TencentSandbox) -> None:
    stranger = _cvm(sandbox, secret_id="AKIDstranger", key="anything")

    assert _call(stranger, "DescribeZones")["TotalCount"] == 3
    sandbox.set_strict(True)
    assert _code(stranger, "DescribeZones") == "AuthFailure.SecretIdNotFound"
    assert _call(_cvm(sandbox), "DescribeZones")["TotalCount"] == 3


def test_a_stale_timestamp_has_expired(sandbox: TencentSandbox) -> None:
    stale = int(time.time()) - 3600
    day = time.strftime("%Y-%m-%d", time.gmtime(stale))
    authorization = (
        f"TC3-HMAC-SHA256 Credential={SECRET_ID}/{day}/cvm/tc3_request, SignedHeaders=content-type;host, "
        f"Signature={'0' * 64}"
    )
    request = urllib.request.Request(  # noqa: S310 - the sandbox's local URL
        sandbox.url + "/",
        data=b"{}",
        method="POST",
        headers={
            "Content-Type": "application/json",
            "X-TC-Action": "DescribeZones",
            "X-TC-Version": "2017-03-12",
            "X-TC-Region": "ap-guangzhou",
            "X-TC-Timestamp": str(stale),
            "Authorization": authorization,
        },
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        body = json.loads(response.read())

    assert body["Response"]["Error"]["Code"] == "AuthFailure.SignatureExpire"


@pytest.mark.parametrize(
    ("region", "action", "code"),
    [("ap-mars", "DescribeZones", "UnsupportedRegion"), ("ap-guangzhou", "CreateImage", "InvalidAction")],
)
def test_unknown_regions_and_actions_are_refused(sandbox: TencentSandbox, region: str, action: str, code: str) -> None:
    assert _code(_cvm(sandbox, region), action) == code


# ------------------------------------------------------------------------------------------- catalogue


def test_catalogue_rows_carry_the_seed_prices_and_mark_sold_out_zones(sandbox: TencentSandbox) -> None:
    rows = _call(_cvm(sandbox, "ap-beijing"), "DescribeZoneInstanceConfigInfos")["InstanceTypeQuotaSet"]
    seed = {r.instance_type: r for r in load_seed() if r.region == "ap-beijing"}

    assert len(rows) == sum(len(r.all_zones) for r in seed.values())
    for row in rows:
        expected = seed[row["InstanceType"]]
        sold_out = row["Zone"] in expected.sold_out_zones
        assert row["InstanceChargeType"] == "POSTPAID_BY_HOUR"
        assert Decimal(str(row["Price"]["UnitPrice"])) == expected.on_demand
        assert (row["Price"]["ChargeUnit"], row["Gpu"], row["Cpu"]) == ("HOUR", expected.gpu_count, expected.vcpus)
        assert (row["Status"], row["StatusCategory"]) == (
            ("SOLD_OUT", "WithoutStock") if sold_out else ("SELL", "EnoughStock")
        )
    assert {(r["Zone"], r["Status"]) for r in rows if r["InstanceType"] == "GN7.2XLARGE32"} == {
        ("ap-beijing-5", "SELL"),
        ("ap-beijing-6", "SELL"),
        ("ap-beijing-7", "SOLD_OUT"),
    }


def test_catalogue_filters_and_with_each_other(sandbox: TencentSandbox) -> None:
    filters = [
        {"Name": "instance-family", "Values": ["GN10Xp", "GT4"]},
        {"Name": "zone", "Values": ["ap-guangzhou-6"]},
        {"Name": "instance-charge-type", "Values": ["POSTPAID_BY_HOUR", "SPOTPAID"]},
    ]
    rows = _call(_cvm(sandbox), "DescribeZoneInstanceConfigInfos", {"Filters": filters})["InstanceTypeQuotaSet"]

    assert sorted(r["InstanceType"] for r in rows) == [
        "GN10Xp.10XLARGE160",
        "GN10Xp.20XLARGE320",
        "GN10Xp.2XLARGE40",
        "GN10Xp.5XLARGE80",
        "GT4.20XLARGE474",
        "GT4.41XLARGE948",
        "GT4.4XLARGE96",
        "GT4.8XLARGE192",
    ]
    spot = [{"Name": "instance-charge-type", "Values": ["SPOTPAID"]}]
    assert _call(_cvm(sandbox), "DescribeZoneInstanceConfigInfos", {"Filters": spot})["InstanceTypeQuotaSet"] == []


# ItemPrice carries no currency field (CVM API reference, "InquiryPriceRunInstances" and its ItemPrice data type,
# https://www.tencentcloud.com/document/api/213/33248), so an International-site account's answer has the same shape
# as a China-site one's: only the amounts (USD) differ.
def test_an_international_account_sees_only_the_usd_prices_set_for_it(sandbox: TencentSandbox) -> None:
    sandbox.set_account_site(SECRET_ID, "international")
    sandbox.set_price("ap-guangzhou", "GN7.2XLARGE32", Decimal("1.23"), "USD")

    rows = _call(_cvm(sandbox), "DescribeZoneInstanceConfigInfos")["InstanceTypeQuotaSet"]

    assert sorted((r["Zone"], r["InstanceType"], r["Status"], r["Price"]["UnitPrice"]) for r in rows) == [
        ("ap-guangzhou-3", "GN7.2XLARGE32", "SELL", 1.23),
        ("ap-guangzhou-4", "GN7.2XLARGE32", "SELL", 1.23),
        ("ap-guangzhou-6", "GN7.2XLARGE32", "SOLD_OUT", 1.23),
    ]
    assert all("Currency" not in r["Price"] for r in rows)
    sandbox.reset()
    sandbox.register_secret(SECRET_ID, SECRET_KEY)
    china = _call(_cvm(sandbox), "DescribeZoneInstanceConfigInfos")["InstanceTypeQuotaSet"]
    assert {r["Price"]["UnitPrice"] for r in china if r["InstanceType"] == "GN7.2XLARGE32"} == {8.68}


def test_type_configs_name_the_gpu_and_take_one_value_per_filter(sandbox: TencentSandbox) -> None:
    client = _cvm(sandbox)
    rows = _call(client, "DescribeInstanceTypeConfigs", {"Filters": [{"Name": "instance-family", "Values": ["GT4"]}]})

    assert {(r["GpuType"], r["GpuMemory"]) for r in rows["InstanceTypeConfigSet"]} == {("NVIDIA A100", 40.0)}
    assert len(rows["InstanceTypeConfigSet"]) == 4 * 3
    two = {"Filters": [{"Name": "instance-family", "Values": ["GT4", "GN7"]}]}
    assert _code(client, "DescribeInstanceTypeConfigs", two) == "InvalidFilterValue.LimitExceeded"
    unknown = {"Filters": [{"Name": "gpu-type", "Values": ["A100"]}]}
    assert _code(client, "DescribeInstanceTypeConfigs", unknown) == "InvalidFilter"


def test_public_images_filter_by_type_and_fuzzy_platform(sandbox: TencentSandbox) -> None:
    client = _cvm(sandbox)
    ubuntu = {
        "Filters": [{"Name": "platform", "Values": ["ubuntu"]}, {"Name": "image-type", "Values": ["PUBLIC_IMAGE"]}]
    }
    private = {"Filters": [{"Name": "image-type", "Values": ["PRIVATE_IMAGE"]}]}

    found = _call(client, "DescribeImages", {**ubuntu, "Limit": 2})
    assert (found["TotalCount"], len(found["ImageSet"])) == (5, 2)
    assert _call(client, "DescribeImages", private)["TotalCount"] == 0
    assert _call(client, "DescribeImages", {"ImageIds": [IMAGE]})["ImageSet"][0]["OsName"].startswith("Ubuntu")


# ------------------------------------------------------------------------------------------- instances


def test_run_instances_is_idempotent_on_client_token_per_region(sandbox: TencentSandbox) -> None:
    guangzhou, beijing = _cvm(sandbox), _cvm(sandbox, "ap-beijing")

    first = _run(guangzhou, "same-token")
    again = _run(guangzhou, "same-token", zone="ap-guangzhou-4")  # other parameters: still the first answer
    elsewhere = _run(beijing, "same-token", zone="ap-beijing-5")

    assert again == first and len(first) == 1
    assert elsewhere != first
    assert [(i.region, i.client_token) for i in sandbox.instances()] == sorted(
        [("ap-guangzhou", "same-token"), ("ap-beijing", "same-token")]
    )


def test_an_instance_goes_pending_running_terminating_shutdown_then_gone(
    clocked: tuple[TencentSandbox, FakeClock],
) -> None:
    sandbox, clock = clocked
    client = _cvm(sandbox)
    [instance_id] = _run(client, TagSpecification=[{"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}])

    pending = _describe(client, instance_id)
    clock.now += 10
    running = _describe(client, instance_id)
    _call(client, "TerminateInstances", {"InstanceIds": [instance_id]})
    terminating = _describe(client, instance_id)
    clock.now += 20
    shutdown = _describe(client, instance_id)
    clock.now += 600
    gone = _call(client, "DescribeInstances", {"InstanceIds": [instance_id]})

    assert (pending["InstanceState"], pending["LatestOperation"], pending["LatestOperationState"]) == (
        "PENDING",
        "RunInstances",
        "OPERATING",
    )
    assert (running["InstanceState"], running["LatestOperationState"]) == ("RUNNING", "SUCCESS")
    assert running["Tags"] == [{"Key": "k", "Value": "v"}]
    assert (terminating["InstanceState"], terminating["LatestOperation"], terminating["LatestOperationState"]) == (
        "TERMINATING",
        "TerminateInstances",
        "OPERATING",
    )
    assert (shutdown["InstanceState"], shutdown["LatestOperationState"]) == ("SHUTDOWN", "SUCCESS")
    assert (gone["TotalCount"], gone["InstanceSet"]) == (0, [])


def test_a_capacity_fault_fails_the_launch_later(clocked: tuple[TencentSandbox, FakeClock]) -> None:
    sandbox, clock = clocked
    client = _cvm(sandbox)
    sandbox.faults.inject("capacity", instance_type="GN7.2XLARGE32", zone="ap-guangzhou-3")

    [instance_id] = _run(client)
    pending = _describe(client, instance_id)
    clock.now += 10
    failed = _describe(client, instance_id)
    clock.now += 600

    assert pending["InstanceState"] == "PENDING"
    assert (failed["InstanceState"], failed["LatestOperationState"]) == ("LAUNCH_FAILED", "FAILED")
    assert failed["LatestOperationErrorMsg"].startswith("ResourceInsufficient.SpecifiedInstanceType: ")
    assert sandbox.instances() == []  # recycled after the retention time


@pytest.mark.parametrize(
    ("kind", "code", "expected"),
    [
        ("capacity", "ResourcesSoldOut.SpecifiedInstanceType", "ResourcesSoldOut.SpecifiedInstanceType"),
        ("capacity", "InvalidParameterValue.InsufficientPrice", "InvalidParameterValue.InsufficientPrice"),
        ("quota", None, "LimitExceeded.InstanceQuota"),
        ("quota", "InstancesQuotaLimitExceeded", "InstancesQuotaLimitExceeded"),
        ("throttle", None, "RequestLimitExceeded"),
        ("credentials", None, "AuthFailure.UnauthorizedOperation"),
    ],
)
def test_faults_with_a_code_and_the_other_kinds_answer_run_instances_at_once(
    sandbox: TencentSandbox, kind: str, code: str | None, expected: str
) -> None:
    sandbox.faults.inject(kind, code=code, times=1)

    assert _code(_cvm(sandbox), "RunInstances", _run_params()) == expected
    assert sandbox.instances() == []
    assert _run(_cvm(sandbox))  # the fault fired once


def _run_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "Placement": {"Zone": "ap-guangzhou-3"},
        "InstanceType": "GN7.2XLARGE32",
        "ImageId": IMAGE,
        "ClientToken": "charlie-x",
    }
    params.update(overrides)
    return params


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"Placement": {"Zone": "ap-guangzhou-6"}}, "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance"),
        ({"Placement": {"Zone": "ap-beijing-5"}}, "InvalidZone.MismatchRegion"),
        ({"InstanceType": "GN99.HUGE"}, "InvalidParameterValue.InstanceTypeNotFound"),
        ({"InstanceType": "GN10X.2XLARGE40"}, "ResourceUnavailable.InstanceType"),  # not in ap-guangzhou-3
        ({"InstanceChargeType": "SPOTPAID"}, "UnsupportedOperation.NoInstanceTypeSupportSpot"),
        ({"InstanceChargeType": "PREPAID"}, "InvalidParameterValue"),
        ({"ImageId": "img-00000000"}, "InvalidImageId.NotFound"),
        ({"ImageId": "ubuntu"}, "InvalidImageId.Malformed"),
        ({"ClientToken": "t" * 65}, "InvalidClientToken.TooLong"),
        ({"Placement": {}}, "MissingParameter"),
        ({"DryRun": True}, "DryRunOperation"),
    ],
)
def test_run_instances_validates_like_cvm(sandbox: TencentSandbox, overrides: dict[str, Any], code: str) -> None:
    assert _code(_cvm(sandbox), "RunInstances", _run_params(**overrides)) == code
    assert sandbox.instances() == []


def test_describe_instances_filters_by_tag_and_paginates(sandbox: TencentSandbox) -> None:
    client = _cvm(sandbox)
    tagged = [{"ResourceType": "instance", "Tags": [{"Key": "broker:order", "Value": "ord-7"}]}]
    ids = [_run(client, f"t-{n}", TagSpecification=tagged)[0] for n in range(3)]
    _run(client, "untagged")
    by_tag = {"Filters": [{"Name": "tag:broker:order", "Values": ["ord-7"]}]}

    first = _call(client, "DescribeInstances", {**by_tag, "Limit": 2})
    rest = _call(client, "DescribeInstances", {**by_tag, "Limit": 2, "Offset": 2})

    assert first["TotalCount"] == rest["TotalCount"] == 3
    assert [i["InstanceId"] for i in first["InstanceSet"] + rest["InstanceSet"]] == ids
    assert _call(client, "DescribeInstances", {"InstanceIds": ["ins-00000000"]})["TotalCount"] == 0
    both = {**by_tag, "InstanceIds": ids[:1]}
    assert _code(client, "DescribeInstances", both) == "InvalidParameterCombination"
    assert _code(client, "DescribeInstances", {"InstanceIds": ["i-123"]}) == "InvalidInstanceId.Malformed"
    assert _call(_cvm(sandbox, "ap-shanghai"), "DescribeInstances")["TotalCount"] == 0


def test_terminating_twice_is_refused_and_unknown_ids_are_not_found(sandbox: TencentSandbox) -> None:
    client = _cvm(sandbox)
    [instance_id] = _run(client)

    _call(client, "TerminateInstances", {"InstanceIds": [instance_id]})

    assert _code(client, "TerminateInstances", {"InstanceIds": [instance_id]}) == (
        "UnsupportedOperation.InstanceStateTerminating"
    )
    assert _code(client, "TerminateInstances", {"InstanceIds": ["ins-00000000"]}) == "InvalidInstanceId.NotFound"
    status = _call(client, "DescribeInstancesStatus", {"InstanceIds": [instance_id]})["InstanceStatusSet"]
    assert status == [{"InstanceId": instance_id, "InstanceState": "TERMINATING"}]


# --------------------------------------------------------------------------------------------- control


def test_faults_stock_and_credentials_are_driven_over_http(sandbox: TencentSandbox) -> None:
    status, created = _control(sandbox, "POST", "faults", {"kind": "throttle", "action": "DescribeZones", "times": 1})
    assert status == 201 and created["faults"][0]["kind"] == "throttle"
    assert _code(_cvm(sandbox), "DescribeZones") == "RequestLimitExceeded"
    assert _control(sandbox, "GET", "faults") == (200, {"faults": []})

    stock = {"region": "ap-guangzhou", "zone": "ap-guangzhou-3", "instance_type": "GN7.2XLARGE32", "sold_out": True}
    assert _control(sandbox, "POST", "stock", stock) == (200, {"sold_out": True})
    assert _code(_cvm(sandbox), "RunInstances", _run_params()) == "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance"
    assert sandbox.zones("ap-guangzhou", "GN7.2XLARGE32") == ["ap-guangzhou-4"]

    status, body = _control(
        sandbox, "PUT", "credentials", {"secret_id": "AKIDdave", "secret_key": "k1", "strict": True}
    )
    assert status == 200 and body["strict"] is True and "AKIDdave" in body["secret_ids"]
    assert _call(_cvm(sandbox, secret_id="AKIDdave", key="k1"), "DescribeZones")["TotalCount"] == 3
    assert _code(_cvm(sandbox, secret_id="AKIDerin", key="k2"), "DescribeZones") == "AuthFailure.SecretIdNotFound"

    _run(_cvm(sandbox), zone="ap-guangzhou-4")
    assert [row[0] for row in _control(sandbox, "GET", "calls")[1]["calls"]][-1] == "RunInstances"
    assert [i["state"] for i in _control(sandbox, "GET", "instances")[1]["instances"]] == ["PENDING"]


def test_reset_forgets_instances_tokens_faults_calls_secrets_and_stock(sandbox: TencentSandbox) -> None:
    client = _cvm(sandbox)
    [first] = _run(client, "token-r")
    sandbox.faults.inject("quota")
    sandbox.set_sold_out("ap-guangzhou", "ap-guangzhou-4", "GN7.2XLARGE32")
    sandbox.set_strict(True)

    sandbox.reset()
    sandbox.register_secret(SECRET_ID, SECRET_KEY)

    assert (sandbox.instances(), sandbox.calls(), sandbox.faults.active()) == ([], [], [])
    assert sandbox.zones("ap-guangzhou", "GN7.2XLARGE32") == ["ap-guangzhou-3", "ap-guangzhou-4"]
    assert _call(_cvm(sandbox, secret_id="AKIDstranger", key="x"), "DescribeZones")["TotalCount"] == 3
    assert _run(client, "token-r") != [first]


def test_concurrent_launches_with_one_token_create_one_instance(sandbox: TencentSandbox) -> None:
    answers: list[list[str]] = []

    def launch() -> None:
        answers.append(_run(_cvm(sandbox), "racing-token"))

    threads = [threading.Thread(target=launch) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(answers) == 5 and all(a == answers[0] for a in answers)
    assert [i.instance_id for i in sandbox.instances()] == answers[0]
