"""``ProviderAdapter.describe_many``: every adapter against its sandbox, through its real SDK. Known ids come back,
an unknown one is absent (never an error), and a cloud that reads many instances at once does so in
``ceil(n / max)`` requests of its documented maximum, counted where they arrive: at the sandbox.

The sandboxes answer these batched reads as the clouds document them (the references are cited beside each
limit below): many ids in one request, ids they do not know left out, pages, and a refusal past the maximum."""

from __future__ import annotations

import json
import math
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from providers.alibaba.adapter import DESCRIBE_IDS_MAX as ALIBABA_IDS_MAX
from providers.alibaba.client import AlibabaClient
from providers.alibaba.client import ClientSettings as AlibabaSettings
from providers.aws.adapter import DESCRIBE_FILTER_VALUES_MAX
from providers.base import ProviderAdapter
from providers.errors import ProviderError
from providers.gcp.adapter import names_filters
from providers.gcp.mapping import split_instance_id
from providers.tencent.adapter import DESCRIBE_IDS_MAX as TENCENT_IDS_MAX
from providers.tencent.client import ClientSettings as TencentSettings
from providers.tencent.client import TencentClient
from providers.types import InstanceHandle, InstanceState, LaunchSpec
from sandboxes.aws.keys import ALICE, CONTRACT
from tests.providers import alibaba_target, aws_target, tencent_target
from tests.providers.contract import ContractTarget, launchable, settle, spec_for

# The request each sandbox logs for one batched read, and the ids one request may carry (None: the adapter keeps
# the base class's one describe per id).
READ_ACTION = {
    "aws": "DescribeInstances",
    "alibaba": "DescribeInstances",
    "tencent": "DescribeInstances",
    "gcp": "compute.instances.aggregatedList",
    "azure": "VirtualMachines_ListAll",  # every VM of the subscription with statusOnly=true, paged
    "kubernetes": "listPods",  # the broker's pods of every namespace by label, paged
}
IDS_PER_REQUEST = {
    "aws": DESCRIBE_FILTER_VALUES_MAX,
    "alibaba": ALIBABA_IDS_MAX,
    "tencent": TENCENT_IDS_MAX,
    "gcp": None,  # as many names as fit one filter (names_filters)
    "azure": None,
    "kubernetes": None,
}
BATCHING = ("alibaba", "aws", "tencent")  # a documented number of ids per request


def _launched(adapter: ProviderAdapter, spec: LaunchSpec) -> InstanceHandle:
    """Launch and wait, as the contract suite does, until the provider runs the instance."""
    result = settle(adapter, spec)
    assert isinstance(result, InstanceHandle), result
    for _ in range(50):
        if result.state == InstanceState.RUNNING:
            return result
        time.sleep(0.1)
        result = adapter.describe(spec.region, result.instance_id)
    raise AssertionError(f"{result.instance_id} still {result.state} after launch")


def _unknown_ids(kind: str, known: InstanceHandle, count: int) -> list[str]:
    """Ids shaped as the cloud shapes its own, for instances it never had."""
    if kind == "aws":
        return [f"i-{n:017x}" for n in range(1, count + 1)]
    if kind == "tencent":
        return [f"ins-{n:08d}" for n in range(1, count + 1)]
    if kind == "gcp":
        zone = known.instance_id.split("/", 1)[0]
        # As long as the broker's own names (59 characters: mapping.instance_name), so a filter holds as few.
        return [f"{zone}/gb-never-launched-{n:04d}-{'0' * 36}" for n in range(1, count + 1)]
    prefix = known.instance_id[:-4]  # Alibaba's and Azure's: the launched one's, its last four characters changed
    return [f"{prefix}{n:04x}" for n in range(1, count + 2) if f"{prefix}{n:04x}" != known.instance_id][:count]


def only(kind: str) -> pytest.MarkDecorator:
    """Run a test against one cloud's target only (the ``target`` fixture, given that cloud's module)."""
    return pytest.mark.parametrize("target", [f"tests.providers.{kind}_target"], ids=[kind], indirect=True)


def _reads(target: ContractTarget) -> int:
    return len(target.sandbox.calls(READ_ACTION[target.kind]))


def test_describe_many_answers_the_known_instances_and_leaves_the_unknown_one_out(target):
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    launched = [_launched(adapter, spec_for(offer)) for _ in range(3)]
    ids = [h.instance_id for h in launched]
    unknown = _unknown_ids(target.kind, launched[0], 1)
    target.sandbox.clear_calls()

    answer = adapter.describe_many(offer.region, [*ids, *unknown, ids[0]])

    assert sorted(answer) == sorted(ids)
    # Azure's status-only list carries identity and instance view, not the zone: judged where an answer has one.
    assert {i: (h.instance_id, h.state, h.zone or None) for i, h in answer.items()} == {
        h.instance_id: (h.instance_id, InstanceState.RUNNING, h.zone if target.kind != "azure" else None)
        for h in launched
    }
    per_request = IDS_PER_REQUEST[target.kind]
    if per_request is not None:
        assert _reads(target) == math.ceil(4 / per_request) == 1
    elif target.kind == "gcp":
        # One list for the four names; the name GCP does not list has its operations read (it never had one).
        assert _reads(target) == len(names_filters([i.split("/", 1)[1] for i in [*ids, *unknown]])) == 1
        assert len(target.sandbox.calls("compute.zoneOperations.list")) == 1
    else:  # Azure: one list of the subscription's VMs; Kubernetes: one of the broker's pods; whatever the ids
        assert _reads(target) == 1


@pytest.mark.parametrize("target", [f"tests.providers.{k}_target" for k in BATCHING], ids=list(BATCHING), indirect=True)
def test_describe_many_splits_the_ids_at_the_documented_maximum(target):
    per_request = IDS_PER_REQUEST[target.kind]
    assert per_request is not None
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    known = _launched(adapter, spec_for(offer))
    ids = [known.instance_id, *_unknown_ids(target.kind, known, per_request)]  # one more than a request holds
    target.sandbox.clear_calls()

    answer = adapter.describe_many(offer.region, ids)

    assert list(answer) == [known.instance_id]
    assert _reads(target) == math.ceil(len(ids) / per_request) == 2


@only("gcp")
def test_gcp_describe_many_batches_names_by_the_length_of_their_filter(target):
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    known = _launched(adapter, spec_for(offer))
    unknown = _unknown_ids("gcp", known, 40)
    ids = [known.instance_id, *unknown]
    filters = names_filters(sorted(split_instance_id(offer.region, i)[1] for i in ids))
    target.sandbox.clear_calls()

    answer = adapter.describe_many(offer.region, ids)

    assert list(answer) == [known.instance_id]
    assert _reads(target) == len(filters) == 2  # 24 names of 59 characters fit one filter's 1,500
    assert len(target.sandbox.calls("compute.zoneOperations.list")) == len(unknown)


@only("gcp")
def test_gcp_describe_many_follows_the_pages_of_its_list(target):
    adapter = target.make_adapter(True, {"page_size": "1"})
    offer = launchable(target)
    ids = [_launched(adapter, spec_for(offer)).instance_id for _ in range(3)]
    target.sandbox.clear_calls()

    answer = adapter.describe_many(offer.region, ids)

    assert sorted(answer) == sorted(ids)
    assert _reads(target) == 3  # one page per instance, by nextPageToken


# --- The sandboxes' wire: what each cloud's reference says of these batched reads -------------------------------


def test_aws_sandbox_refuses_more_filter_values_than_ec2_takes_in_one_call(aws_sandbox):
    # "The maximum number of filter values specified on a single call is 200" (EC2's FilterLimitExceeded).
    ec2 = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=aws_sandbox.url,
        aws_access_key_id=ALICE.access_key_id,
        aws_secret_access_key=ALICE.secret_access_key,
    )
    values = [f"i-{n:017x}" for n in range(DESCRIBE_FILTER_VALUES_MAX + 1)]

    with pytest.raises(ClientError) as refused:
        ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": values}])
    within = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": values[:-1]}])

    assert refused.value.response["Error"]["Code"] == "FilterLimitExceeded"
    assert within["Reservations"] == []  # unknown ids in a filter match nothing: no error


@only("aws")
def test_aws_sandbox_pages_a_filtered_describe_and_fails_instance_ids_for_one_unknown(target):
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    ids = [adapter.launch(spec_for(offer)).instance_id for _ in range(6)]
    ec2 = boto3.client(
        "ec2",
        region_name=offer.region,
        endpoint_url=target.sandbox.url,
        aws_access_key_id=aws_target.ACCESS_KEY,
        aws_secret_access_key=CONTRACT.secret_access_key,
    )
    target.sandbox.clear_calls()

    answer = adapter.describe_many(offer.region, ids)
    # The same ids as InstanceIds, with one EC2 does not know: "If you specify an instance ID that is not valid,
    # an error is returned" (EC2 API reference, DescribeInstances): why describe_many filters instead.
    with pytest.raises(ClientError) as refused:
        ec2.describe_instances(InstanceIds=[*ids, "i-00000000000000001"])
    paginator = ec2.get_paginator("describe_instances")
    pages = list(paginator.paginate(Filters=[{"Name": "instance-id", "Values": ids}], MaxResults=5))

    assert sorted(answer) == sorted(ids)
    assert refused.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"
    assert sorted(i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]) == sorted(ids)
    assert len(pages) == 2  # MaxResults 5 of six instances (one reservation each)
    assert len(target.sandbox.calls("DescribeInstances")) == 1 + 1 + 2


def _alibaba_client(sandbox) -> AlibabaClient:
    settings = AlibabaSettings(
        alibaba_target.VALID_KEY, alibaba_target.VALID_SECRET, endpoint_url=sandbox.url, max_attempts=1
    )
    return AlibabaClient(settings)


@only("alibaba")
def test_alibaba_sandbox_answers_instance_ids_by_pages_and_refuses_more_than_100(target):
    # InstanceIds: "a JSON array that consists of up to 100 instance IDs"; MaxResults/NextToken pages (ECS API
    # reference, DescribeInstances).
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    ids = [_launched(adapter, spec_for(offer)).instance_id for _ in range(3)]
    client = _alibaba_client(target.sandbox)
    region = offer.region
    asked = {"RegionId": region, "InstanceIds": json.dumps([*ids, "i-unknown000000000001"]), "MaxResults": 1}

    items = client.pages(region, "DescribeInstances", asked, "Instances", "Instance")
    with pytest.raises(ProviderError) as refused:
        client.call(region, "DescribeInstances", {**asked, "InstanceIds": json.dumps([f"i-{n}" for n in range(101)])})

    assert sorted(i["InstanceId"] for i in items) == sorted(ids)
    assert len(target.sandbox.calls("DescribeInstances")) >= 3
    assert refused.value.code == "InvalidInstanceIds.Malformed"


@only("tencent")
def test_tencent_sandbox_answers_instance_ids_by_pages_and_refuses_more_than_100(target):
    # InstanceIds: "You can query up to 100 instances in each request"; Offset/Limit pages (CVM API reference,
    # DescribeInstances).
    adapter = target.make_adapter(True, {})
    offer = launchable(target)
    ids = [_launched(adapter, spec_for(offer)).instance_id for _ in range(3)]
    settings = TencentSettings(
        secret_id=tencent_target.SECRET_ID, secret_key=tencent_target.SECRET_KEY, endpoint_url=target.sandbox.url,
        max_attempts=1,
    )  # fmt: skip
    client = TencentClient(settings)
    region = offer.region
    target.sandbox.clear_calls()

    pages = [
        client.call(region, "DescribeInstances", {"InstanceIds": [*ids, "ins-00000001"], "Offset": n, "Limit": 1})
        for n in range(4)
    ]
    with pytest.raises(ProviderError) as refused:
        client.call(region, "DescribeInstances", {"InstanceIds": [f"ins-{n:08d}" for n in range(101)]})

    assert [p["TotalCount"] for p in pages] == [3, 3, 3, 3]
    assert sorted(i["InstanceId"] for p in pages for i in p["InstanceSet"]) == sorted(ids)
    assert refused.value.code == "InvalidParameterValue.LimitExceeded"
