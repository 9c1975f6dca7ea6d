"""Cluster placement groups: AwsAdapter against the AWS sandbox's placement groups (real boto3 over HTTP).

Wire formats, codes and rules, from AWS's EC2 API reference:
- CreatePlacementGroup: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html
- DescribePlacementGroups: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribePlacementGroups.html
- DeletePlacementGroup ("You must terminate all instances in the placement group before you can delete the
  placement group"): https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeletePlacementGroup.html
- RunInstances Placement.GroupName: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Placement.html
- InvalidPlacementGroup.Duplicate / .Unknown / .InUse: "Error codes for the Amazon EC2 API",
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
- "A cluster placement group can't span multiple Availability Zones":
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups.html; EC2 refuses the launch with
  InvalidPlacementGroup.InUse, "... is in use in another availability zone" (as quoted in
  github.com/hashicorp/terraform/issues/16183).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import botocore.exceptions
import pytest

from providers.aws.adapter import AwsAdapter
from providers.errors import ProviderRequestRejected, TransientProviderError
from providers.types import LaunchSpec, PricingModel
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE

AdapterFactory = Callable[..., AwsAdapter]
GROUP = "gb-0123456789abcdef0123456789abcdef-r1"


def _spec(token: str, *, zone: str = "us-east-1a", group: str | None = GROUP) -> LaunchSpec:
    return LaunchSpec(
        region="us-east-1",
        zone=zone,
        instance_type="p4d.24xlarge",
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token,
        order_ref=f"ord-{token}",
        placement_group=group,
    )


def _ec2(sandbox: AwsSandbox, region: str = "us-east-1") -> Any:
    return boto3.client(
        "ec2",
        region_name=region,
        endpoint_url=sandbox.url,
        aws_access_key_id=ALICE.access_key_id,
        aws_secret_access_key=ALICE.secret_access_key,
    )


def _error_code(call: Callable[[], Any]) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    status = caught.value.response["ResponseMetadata"]["HTTPStatusCode"]
    assert status == 400
    return str(caught.value.response["Error"]["Code"])


def _group_of(sandbox: AwsSandbox, instance_id: str) -> str:
    found = _ec2(sandbox).describe_instances(InstanceIds=[instance_id])
    return str(found["Reservations"][0]["Instances"][0]["Placement"]["GroupName"])


# ------------------------------------------------------------------------------------- the sandbox's wire


def test_create_describe_and_delete_a_group_on_the_wire(aws_sandbox: AwsSandbox) -> None:
    ec2 = _ec2(aws_sandbox)

    created = ec2.create_placement_group(
        GroupName="pg-a",
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": [{"Key": "team", "Value": "ml"}]}],
    )["PlacementGroup"]
    ec2.create_placement_group(GroupName="pg-b", Strategy="spread")

    assert (created["GroupName"], created["Strategy"], created["State"]) == ("pg-a", "cluster", "available")
    assert created["GroupId"].startswith("pg-")
    assert created["GroupArn"].endswith(":placement-group/pg-a")
    assert created["Tags"] == [{"Key": "team", "Value": "ml"}]
    by_name = ec2.describe_placement_groups(Filters=[{"Name": "group-name", "Values": ["pg-a"]}])
    assert [g["GroupName"] for g in by_name["PlacementGroups"]] == ["pg-a"]
    by_tag = ec2.describe_placement_groups(Filters=[{"Name": "tag:team", "Values": ["ml"]}])
    assert [g["GroupName"] for g in by_tag["PlacementGroups"]] == ["pg-a"]
    spread = ec2.describe_placement_groups(Filters=[{"Name": "strategy", "Values": ["spread"]}])
    assert [g["GroupName"] for g in spread["PlacementGroups"]] == ["pg-b"]
    assert [g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]] == ["pg-a", "pg-b"]
    # A filter matching nothing answers an empty set; a name asked for outright must exist.
    assert ec2.describe_placement_groups(Filters=[{"Name": "group-name", "Values": ["nope"]}])["PlacementGroups"] == []
    assert _error_code(lambda: ec2.describe_placement_groups(GroupNames=["nope"])) == "InvalidPlacementGroup.Unknown"
    # Groups are per Region.
    assert _ec2(aws_sandbox, "eu-west-1").describe_placement_groups()["PlacementGroups"] == []

    assert _error_code(lambda: ec2.create_placement_group(GroupName="pg-a", Strategy="cluster")) == (
        "InvalidPlacementGroup.Duplicate"
    )
    ec2.delete_placement_group(GroupName="pg-a")
    assert aws_sandbox.placement_groups.names("us-east-1") == ["pg-b"]
    assert _error_code(lambda: ec2.delete_placement_group(GroupName="pg-a")) == "InvalidPlacementGroup.Unknown"


def test_run_instances_into_an_unknown_group_is_refused_and_launches_nothing(aws_sandbox: AwsSandbox) -> None:
    ec2 = _ec2(aws_sandbox)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    code = _error_code(
        lambda: ec2.run_instances(
            ImageId=image,
            InstanceType="p4d.24xlarge",
            MinCount=1,
            MaxCount=1,
            Placement={"AvailabilityZone": "us-east-1a", "GroupName": "never-made"},
        )
    )

    assert code == "InvalidPlacementGroup.Unknown"
    assert aws_sandbox.instances() == []


def test_reset_forgets_every_group(aws_sandbox: AwsSandbox) -> None:
    _ec2(aws_sandbox).create_placement_group(GroupName="pg-a", Strategy="cluster")

    aws_sandbox.reset()

    assert aws_sandbox.placement_groups.names("us-east-1") == []


# ------------------------------------------------------------------------------------------ the adapter


def test_launches_naming_a_group_make_it_once_and_go_into_it(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()

    first = adapter.launch(_spec("n1"))
    second = adapter.launch(_spec("n2"))

    assert (_group_of(aws_sandbox, first.instance_id), _group_of(aws_sandbox, second.instance_id)) == (GROUP, GROUP)
    groups = _ec2(aws_sandbox).describe_placement_groups(GroupNames=[GROUP])["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"], g["Tags"]) for g in groups] == [
        (GROUP, "cluster", [{"Key": "broker:placement-group", "Value": GROUP}])
    ]
    # The second launch's create was answered Duplicate: the group was there, and it launched all the same.
    assert len(aws_sandbox.calls("CreatePlacementGroup")) == 2
    assert len(aws_sandbox.calls("RunInstances")) == 2


def test_a_launch_without_a_group_names_none(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    handle = aws_adapter().launch(_spec("n1", group=None))

    assert _group_of(aws_sandbox, handle.instance_id) == ""
    assert aws_sandbox.calls("CreatePlacementGroup") == []


def test_a_cluster_group_holding_instances_in_one_zone_refuses_another_zone(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    adapter.launch(_spec("n1", zone="us-east-1a"))

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.launch(_spec("n2", zone="us-east-1b"))

    assert refused.value.code == "InvalidPlacementGroup.InUse"
    assert "in use in another availability zone: us-east-1a" in refused.value.message
    assert [i.zone for i in aws_sandbox.instances()] == ["us-east-1a"]


def test_a_group_is_bound_to_a_zone_only_while_it_holds_instances(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    first = adapter.launch(_spec("n1", zone="us-east-1a"))
    adapter.terminate("us-east-1", first.instance_id)

    moved = adapter.launch(_spec("n2", zone="us-east-1b"))

    assert (moved.zone, _group_of(aws_sandbox, moved.instance_id)) == ("us-east-1b", GROUP)


def test_deleting_a_group_waits_for_its_instances_to_terminate(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    handle = adapter.launch(_spec("n1"))

    with pytest.raises(TransientProviderError) as in_use:
        adapter.delete_placement_group("us-east-1", GROUP)
    assert in_use.value.code == "InvalidPlacementGroup.InUse"
    assert aws_sandbox.placement_groups.names("us-east-1") == [GROUP]

    adapter.terminate("us-east-1", handle.instance_id)
    adapter.delete_placement_group("us-east-1", GROUP)
    assert aws_sandbox.placement_groups.names("us-east-1") == []
    # Gone already: deleting again is a no-op, not an error.
    adapter.delete_placement_group("us-east-1", GROUP)
    assert len(aws_sandbox.calls("DeletePlacementGroup")) == 3


def test_the_aws_adapter_says_it_makes_placement_groups() -> None:
    from providers.base import ProviderAdapter
    from providers.registry import adapter_class

    assert AwsAdapter.placement_groups is True
    assert ProviderAdapter.placement_groups is False
    assert {kind: adapter_class(kind).placement_groups for kind in ("tencent", "gcp", "community")} == {
        "tencent": False,
        "gcp": False,
        "community": False,
    }
