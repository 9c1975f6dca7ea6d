"""The AWS adapter under the contract suite."""

from __future__ import annotations

import base64
from typing import Any

import boto3

from providers.aws.adapter import AwsAdapter
from providers.aws.mapping import ORDER_TAG
from providers.types import Credentials, InstanceHandle
from sandboxes.aws.app import AwsSandbox, start_aws_sandbox
from sandboxes.aws.keys import CONTRACT, UNKNOWN_ACCESS_KEY_ID
from tests.providers.contract import ContractTarget, LaunchedView

KIND = "aws"
# moto keeps its state per process, so the contract suite reuses the session sandbox instead of a second one.
SESSION_FIXTURE = "aws_sandbox_server"
ACCESS_KEY = CONTRACT.access_key_id


def start_sandbox() -> AwsSandbox:
    return start_aws_sandbox()


def _order_tag(item: dict[str, Any]) -> str:
    return next((str(t["Value"]) for t in item.get("Tags") or [] if t["Key"] == ORDER_TAG), "")


def launched_view(sandbox: AwsSandbox, handle: InstanceHandle) -> LaunchedView:
    """What EC2 itself answers about the instance: its image and root volume, its ``userData`` attribute
    (base64 on the wire), the public key of its key pair, its security groups' inbound rules and the order
    tag on each of them."""
    ec2 = boto3.client(
        "ec2",
        region_name=handle.region,
        endpoint_url=sandbox.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=CONTRACT.secret_access_key,
    )
    instance = ec2.describe_instances(InstanceIds=[handle.instance_id])["Reservations"][0]["Instances"][0]
    attribute = ec2.describe_instance_attribute(InstanceId=handle.instance_id, Attribute="userData")
    user_data = base64.b64decode(attribute.get("UserData", {}).get("Value", ""))
    root = [
        m["Ebs"]["VolumeId"]
        for m in instance.get("BlockDeviceMappings") or []
        if m["DeviceName"] == instance.get("RootDeviceName")
    ]
    disk_gb = ec2.describe_volumes(VolumeIds=root)["Volumes"][0]["Size"] if root else None
    public_keys: list[str] = []
    resource_tags: list[str] = []
    if instance.get("KeyName"):
        pairs = ec2.describe_key_pairs(KeyNames=[instance["KeyName"]], IncludePublicKey=True)["KeyPairs"]
        public_keys = [" ".join(p["PublicKey"].split()[:2]) for p in pairs]
        resource_tags += [_order_tag(p) for p in pairs]
    group_ids = [g["GroupId"] for g in instance.get("SecurityGroups") or []]
    groups = ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"] if group_ids else []
    ingress = {
        (int(p["FromPort"]), cidr)
        for g in groups
        for p in g.get("IpPermissions") or []
        if p.get("FromPort") is not None and p.get("FromPort") == p.get("ToPort")
        for cidr in [r["CidrIp"] for r in p.get("IpRanges") or []] + [r["CidrIpv6"] for r in p.get("Ipv6Ranges") or []]
    }
    resource_tags += [_order_tag(g) for g in groups]
    return LaunchedView(
        image=str(instance["ImageId"]),
        disk_gb=disk_gb,
        user_data=user_data,
        public_keys=public_keys,
        ingress=ingress,
        resource_tags=resource_tags,
    )


def target(sandbox: AwsSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> AwsAdapter:
        key = ACCESS_KEY if valid else UNKNOWN_ACCESS_KEY_ID
        credentials = Credentials(
            kind=KIND,
            values={"access_key_id": key, "secret_access_key": CONTRACT.secret_access_key},
            endpoint_url=sandbox.url,
        )
        return AwsAdapter(credentials, ["us-east-1"], options)

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=["us-east-1"],
        launch_action="RunInstances",
        read_action="DescribeInstanceTypes",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
        launched=lambda handle: launched_view(sandbox, handle),
        extra={"start_action": "StartInstances"},
    )
