"""The Alibaba Cloud ECS adapter under the contract suite."""

from __future__ import annotations

import base64
import json
from typing import Any

from providers.alibaba import launching, mapping
from providers.alibaba.adapter import AlibabaAdapter
from providers.alibaba.client import AlibabaClient, ClientSettings
from providers.types import Credentials, InstanceHandle
from sandboxes.alibaba.app import AlibabaSandbox, start_alibaba_sandbox
from tests.providers.contract import ContractTarget, LaunchedView

KIND = "alibaba"
VALID_KEY = "LTAI5tContract0001"
VALID_SECRET = "contract-secret"


def start_sandbox() -> AlibabaSandbox:
    return start_alibaba_sandbox()


def launched_view(sandbox: AlibabaSandbox, handle: InstanceHandle) -> LaunchedView:
    """What ECS answers about the instance, read through the SDK as any ECS client would read it:
    DescribeInstanceAttribute (image, security groups), DescribeUserData (Base64 user data), DescribeDisks (the
    system disk), DescribeInstances (the key pair), DescribeKeyPairs with IncludePublicKey (the key ECS installs),
    DescribeSecurityGroupAttribute (the inbound rules) and the tags of the key pair and of each group."""
    client = AlibabaClient(ClientSettings(VALID_KEY, VALID_SECRET, endpoint_url=sandbox.url, max_attempts=1))
    region, instance_id = handle.region, handle.instance_id
    one = {"RegionId": region, "InstanceId": instance_id}
    attribute = client.call(region, "DescribeInstanceAttribute", {"InstanceId": instance_id})
    user_data = str(client.call(region, "DescribeUserData", one).get("UserData") or "")
    disks = client.call(region, "DescribeDisks", {**one, "DiskType": "system"})["Disks"]["Disk"]
    listed = client.call(region, "DescribeInstances", {"RegionId": region, "InstanceIds": json.dumps([instance_id])})
    key_pair = str(listed["Instances"]["Instance"][0].get("KeyPairName") or "")
    public_keys: list[str] = []
    tags: list[str] = []
    if key_pair:
        pairs = client.call(
            region, "DescribeKeyPairs", {"RegionId": region, "KeyPairName": key_pair, "IncludePublicKey": True}
        )["KeyPairs"]["KeyPair"]
        public_keys = [str(p["PublicKey"]) for p in pairs]
        tags += [mapping.tags_dict(p.get("Tags")).get(mapping.ORDER_TAG, "") for p in pairs]
    ingress: set[tuple[int, str]] = set()
    for group_id in attribute["SecurityGroupIds"]["SecurityGroupId"]:
        rules = client.call(
            region,
            "DescribeSecurityGroupAttribute",
            {"RegionId": region, "SecurityGroupId": group_id, "Direction": "ingress"},
        )
        ingress |= launching.ingress_pairs(rules["Permissions"]["Permission"])
        groups = client.call(region, "DescribeSecurityGroups", {"RegionId": region, "SecurityGroupId": group_id})
        tags += [
            mapping.tags_dict(g.get("Tags")).get(mapping.ORDER_TAG, "")
            for g in groups["SecurityGroups"]["SecurityGroup"]
        ]
    return LaunchedView(
        image=str(attribute["ImageId"]),
        disk_gb=int(disks[0]["Size"]) if disks else None,
        user_data=base64.b64decode(user_data),
        public_keys=public_keys,
        ingress=ingress,
        resource_tags=tags,
    )


def target(sandbox: AlibabaSandbox) -> ContractTarget:
    # Registered after the suite's reset: every contract request then has its ACS3 signature verified in full.
    sandbox.register_key(VALID_KEY, VALID_SECRET)

    def make_adapter(valid: bool, options: dict[str, str]) -> AlibabaAdapter:
        key = VALID_KEY if valid else "bad-LTAI-0001"
        credentials = Credentials(
            kind=KIND, values={"access_key_id": key, "access_key_secret": VALID_SECRET}, endpoint_url=sandbox.url
        )
        return AlibabaAdapter(credentials, ["cn-shanghai"], options)

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=["cn-shanghai"],
        launch_action="RunInstances",
        read_action="DescribeInstanceTypes",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
        launched=lambda handle: launched_view(sandbox, handle),
        extra={"start_action": "StartInstance"},
    )
