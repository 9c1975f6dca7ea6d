"""The AWS sandbox's side of a booted launch, driven by plain boto3: it refuses what EC2 and Systems Manager
refuse (codes and statuses as their references state them), keeps what they keep, and boots instances from
their user data.

References: RunInstances, ImportKeyPair, AuthorizeSecurityGroupIngress, DeleteSecurityGroup and "Error codes
for the Amazon EC2 API" (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/), Systems Manager GetParameter
(https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetParameter.html), Amazon VPC quotas
(https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html) and "Work with instance user data"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from providers.boot import render_boot_script
from providers.launch import BootSpec, IngressRule
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import CHARLIE
from sandboxes.aws.launch import DLAMI_PARAMETER, dlami_id
from sandboxes.boot import BootMode
from tests.sshkeys import ecdsa_public, ed25519_public, parsed

UBUNTU = "ami-785db401"  # one of moto's Canonical images, in every region


def _client(sandbox: AwsSandbox, service: str, region: str = "us-east-1", key: str = CHARLIE.access_key_id) -> Any:
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=sandbox.url,
        aws_access_key_id=key,
        aws_secret_access_key=CHARLIE.secret_access_key,
        config=botocore.config.Config(retries={"total_max_attempts": 1}),
    )


def _error(caught: pytest.ExceptionInfo[botocore.exceptions.ClientError]) -> tuple[str, int]:
    response: Any = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _script() -> bytes:
    boot = BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_charlie-token-0123456789abcdefghijklmnopqrstuv",
        agent_sha256="ef" * 32,
        ssh_keys=parsed(ed25519_public()),
        ingress=(IngressRule(port=22, cidrs=("203.0.113.0/24",)),),
    )
    return render_boot_script(boot, login_user="ubuntu")


def _run(sandbox: AwsSandbox, **params: Any) -> dict[str, Any]:
    request = {"ImageId": UBUNTU, "InstanceType": "g5.xlarge", "MinCount": 1, "MaxCount": 1, **params}
    result: dict[str, Any] = _client(sandbox, "ec2").run_instances(**request)
    return dict(result["Instances"][0])


@pytest.fixture
def held(aws_sandbox: AwsSandbox):
    """The sandbox with booted machines held for the test: nothing phones home."""
    mode, aws_sandbox.booter.mode = aws_sandbox.booter.mode, BootMode.HOLD
    yield aws_sandbox
    aws_sandbox.booter.reset()
    aws_sandbox.booter.mode = mode


# ------------------------------------------------------------------------------------- Systems Manager


def test_the_dlami_parameter_names_an_image_ec2_knows_in_each_region(aws_sandbox: AwsSandbox) -> None:
    east = _client(aws_sandbox, "ssm").get_parameter(Name=DLAMI_PARAMETER)["Parameter"]
    west = _client(aws_sandbox, "ssm", region="us-west-2").get_parameter(Name=DLAMI_PARAMETER)["Parameter"]

    assert (east["Name"], east["Type"], east["Value"]) == (DLAMI_PARAMETER, "String", dlami_id("us-east-1"))
    assert west["Value"] == dlami_id("us-west-2") != east["Value"]
    [image] = _client(aws_sandbox, "ec2").describe_images(ImageIds=[east["Value"]])["Images"]
    assert image["Name"].startswith("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)")
    assert (image["Architecture"], image["RootDeviceName"], image["State"]) == ("x86_64", "/dev/sda1", "available")


def test_an_image_missing_fault_answers_as_a_region_without_the_image(aws_sandbox: AwsSandbox) -> None:
    aws_sandbox.faults.inject("image_missing", region="us-east-1")

    with pytest.raises(botocore.exceptions.ClientError) as parameter:
        _client(aws_sandbox, "ssm").get_parameter(Name=DLAMI_PARAMETER)
    with pytest.raises(botocore.exceptions.ClientError) as image:
        _client(aws_sandbox, "ec2").describe_images(ImageIds=[UBUNTU])
    elsewhere = _client(aws_sandbox, "ssm", region="us-west-2").get_parameter(Name=DLAMI_PARAMETER)

    # GetParameter: ParameterNotFound, HTTP 400. DescribeImages: InvalidAMIID.NotFound, HTTP 400.
    assert _error(parameter) == ("ParameterNotFound", 400)
    assert _error(image) == ("InvalidAMIID.NotFound", 400)
    assert elsewhere["Parameter"]["Value"] == dlami_id("us-west-2")


def test_other_parameters_are_moto_s_and_a_bad_key_is_refused_as_ssm_refuses_it(aws_sandbox: AwsSandbox) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        _client(aws_sandbox, "ssm").get_parameter(Name="/aws/service/no/such/parameter")
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        _client(aws_sandbox, "ssm", key="bad-key").get_parameter(Name=DLAMI_PARAMETER)

    assert _error(missing) == ("ParameterNotFound", 400)
    assert _error(refused) == ("UnrecognizedClientException", 400)


# --------------------------------------------------------------------------------------- RunInstances


def test_user_data_of_exactly_16_kb_is_taken_and_one_byte_more_is_not(aws_sandbox: AwsSandbox) -> None:
    taken = _run(aws_sandbox, UserData=b"#!/bin/bash\n" + b"#" * (16384 - 12))

    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _run(aws_sandbox, UserData=b"#!/bin/bash\n" + b"#" * (16384 - 11))

    # "User data is limited to 16 KB, in raw form, before it is base64-encoded"; EC2 answers
    # InvalidParameterValue "User data is limited to 16384 bytes".
    assert _error(caught) == ("InvalidParameterValue", 400)
    assert "16384 bytes" in str(caught.value)
    assert [i.instance_id for i in aws_sandbox.instances()] == [taken["InstanceId"]]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"ImageId": "ami-0123456789abcdef0"}, "InvalidAMIID.NotFound"),
        ({"ImageId": "image-1"}, "InvalidAMIID.Malformed"),
        ({"KeyName": "broker-ord-nobody"}, "InvalidKeyPair.NotFound"),
        (
            {"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 16385, "VolumeType": "gp3"}}]},
            "InvalidParameterValue",
        ),
        (
            {"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8, "VolumeType": "gp3"}}]},
            "InvalidBlockDeviceMapping",
        ),
    ],
    ids=["unknown-ami", "malformed-ami", "unknown-key-pair", "gp3-too-large", "smaller-than-snapshot"],
)
def test_run_instances_refuses_what_ec2_refuses(aws_sandbox: AwsSandbox, params: dict[str, Any], code: str) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _run(aws_sandbox, **params)

    assert _error(caught) == (code, 400)
    assert aws_sandbox.instances() == []


def test_a_launched_instance_boots_the_agent_its_user_data_names_and_halts_when_terminated(held: AwsSandbox) -> None:
    instance = _run(held, UserData=_script(), InstanceType="p4d.24xlarge", Placement={"AvailabilityZone": "us-east-1a"})
    bare = _run(held)

    machine = held.booter.machine(instance["InstanceId"])
    _client(held, "ec2").terminate_instances(InstanceIds=[instance["InstanceId"]])

    assert machine.lease["login_user"] == "ubuntu"
    assert len(machine.executor.gpus()) == 8
    assert [(r.instance_id, r.outcome) for r in held.booter.records] == [
        (instance["InstanceId"], "booted"),
        (bare["InstanceId"], "no_user_data"),
    ]
    assert held.booter.machines() == []
    with urllib.request.urlopen(f"{held.url}/_sandbox/boots", timeout=5) as answer:  # noqa: S310 - local sandbox
        assert [b["outcome"] for b in json.loads(answer.read())["boots"]] == ["booted", "no_user_data"]


def test_a_boot_silent_fault_leaves_the_machine_running_but_mute(held: AwsSandbox) -> None:
    held.faults.inject("boot_silent", instance_type="g5.xlarge")

    instance = _run(held, UserData=_script())

    assert [(r.instance_id, r.outcome) for r in held.booter.records] == [(instance["InstanceId"], "silent")]
    assert held.booter.machines() == []


# ------------------------------------------------------------------------------ key pairs and groups


def test_import_key_pair_takes_ed25519_and_refuses_ecdsa_and_a_second_pair_of_the_same_name(
    aws_sandbox: AwsSandbox,
) -> None:
    ec2 = _client(aws_sandbox, "ec2")
    ec2.import_key_pair(KeyName="broker-ord-1", PublicKeyMaterial=ed25519_public().encode())

    with pytest.raises(botocore.exceptions.ClientError) as ecdsa:
        ec2.import_key_pair(KeyName="broker-ord-2", PublicKeyMaterial=ecdsa_public().encode())
    with pytest.raises(botocore.exceptions.ClientError) as twice:
        ec2.import_key_pair(KeyName="broker-ord-1", PublicKeyMaterial=ed25519_public().encode())

    # ImportKeyPair "Imports the public key from an RSA or ED25519 key pair".
    assert _error(ecdsa) == ("InvalidKeyPair.Format", 400)
    assert _error(twice) == ("InvalidKeyPair.Duplicate", 400)


def _group(sandbox: AwsSandbox) -> str:
    ec2 = _client(sandbox, "ec2")
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    return str(ec2.create_security_group(GroupName="broker-ord-1", Description="order", VpcId=vpc)["GroupId"])


def test_a_group_holds_60_inbound_rules_per_address_family(aws_sandbox: AwsSandbox) -> None:
    ec2 = _client(aws_sandbox, "ec2")
    group = _group(aws_sandbox)
    ipv4 = [{"CidrIp": f"198.51.{i}.0/24"} for i in range(60)]
    ipv6 = [{"CidrIpv6": f"2001:db8:{i:x}::/48"} for i in range(60)]
    ec2.authorize_security_group_ingress(
        GroupId=group,
        IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": ipv4, "Ipv6Ranges": ipv6}],
    )

    with pytest.raises(botocore.exceptions.ClientError) as caught:
        ec2.authorize_security_group_ingress(
            GroupId=group,
            IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": 80, "ToPort": 80, "Ipv6Ranges": [{"CidrIpv6": "2001:db8:ff::/48"}]}
            ],
        )

    # "Inbound or outbound rules per security group: 60 ... enforced separately for IPv4 rules and IPv6 rules".
    assert _error(caught) == ("RulesPerSecurityGroupLimitExceeded", 400)
    [described] = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"]
    assert [(p["FromPort"], len(p["IpRanges"]), len(p["Ipv6Ranges"])) for p in described["IpPermissions"]] == [
        (22, 60, 60)
    ]


def test_a_group_in_use_cannot_be_deleted_until_its_instance_is_terminated(aws_sandbox: AwsSandbox) -> None:
    ec2 = _client(aws_sandbox, "ec2")
    group = _group(aws_sandbox)
    instance = _run(aws_sandbox, SecurityGroupIds=[group])

    with pytest.raises(botocore.exceptions.ClientError) as in_use:
        ec2.delete_security_group(GroupId=group)
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    ec2.delete_security_group(GroupId=group)
    with pytest.raises(botocore.exceptions.ClientError) as gone:
        ec2.delete_security_group(GroupId=group)

    # DependencyViolation: "The specified object has dependent resources" (EC2 error codes).
    assert _error(in_use) == ("DependencyViolation", 400)
    assert _error(gone) == ("InvalidGroup.NotFound", 400)
