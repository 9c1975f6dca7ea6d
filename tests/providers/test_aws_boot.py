"""A booted AWS launch through the real adapter and boto3 against the sandbox: what each RunInstances field
carries as EC2's API reference defines it, the documented limits, idempotency, release and images.

References cited beside the assertions:
- RunInstances: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html
- ImportKeyPair: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ImportKeyPair.html
- IpPermission: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_IpPermission.html
- EbsBlockDevice: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html
- Work with instance user data: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html
- Amazon VPC quotas: https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html
- Finding the ID of a DLAMI: https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html
- Error codes for the Amazon EC2 API: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import boto3
import pytest

from providers.aws.adapter import AwsAdapter
from providers.errors import ImageUnavailable, ProviderRequestRejected
from providers.launch import BootSpec, IngressRule
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE, BOB
from sandboxes.aws.launch import dlami_id
from sandboxes.boot import BootMode
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

AdapterFactory = Callable[..., AwsAdapter]
ORDER = "ord-0a1b2c3d4e5f"
CIDRS = ("203.0.113.0/24", "2001:db8::/32")


def _boot(**changes: Any) -> BootSpec:
    boot = BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_alice-token-0123456789abcdefghijklmnopqrstuvwxyz",
        agent_sha256="cd" * 32,
        ssh_keys=parsed(ed25519_public(), rsa_public()),
        ingress=(IngressRule(port=22, cidrs=CIDRS), IngressRule(port=8000, cidrs=CIDRS[:1])),
        disk_gb=200,
        workload={"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000], "env": []},
    )
    return replace(boot, **changes)


def _spec(
    token: str = f"{ORDER}-a1", *, region: str = "us-east-1", zone: str = "us-east-1a", **boot: Any
) -> LaunchSpec:
    return LaunchSpec(
        region=region,
        zone=zone,
        instance_type="p4d.24xlarge",
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token,
        order_ref=ORDER,
        boot=_boot(**boot),
    )


def _ec2(sandbox: AwsSandbox, region: str = "us-east-1") -> Any:
    return boto3.client(
        "ec2",
        region_name=region,
        endpoint_url=sandbox.url,
        aws_access_key_id=ALICE.access_key_id,
        aws_secret_access_key=ALICE.secret_access_key,
    )


def _instance(sandbox: AwsSandbox, instance_id: str, region: str = "us-east-1") -> dict[str, Any]:
    result: dict[str, Any] = _ec2(sandbox, region).describe_instances(InstanceIds=[instance_id])
    return dict(result["Reservations"][0]["Instances"][0])


def _groups(sandbox: AwsSandbox, region: str = "us-east-1") -> list[dict[str, Any]]:
    filters = [{"Name": "tag:broker:order", "Values": [ORDER]}]
    return list(_ec2(sandbox, region).describe_security_groups(Filters=filters)["SecurityGroups"])


def _key_pairs(sandbox: AwsSandbox, region: str = "us-east-1") -> list[dict[str, Any]]:
    filters = [{"Name": "tag:broker:order", "Values": [ORDER]}]
    return list(_ec2(sandbox, region).describe_key_pairs(Filters=filters, IncludePublicKey=True)["KeyPairs"])


@pytest.fixture
def held(aws_sandbox: AwsSandbox):
    """The sandbox with booted machines held for the test: nothing phones home."""
    mode, aws_sandbox.booter.mode = aws_sandbox.booter.mode, BootMode.HOLD
    yield aws_sandbox
    aws_sandbox.booter.reset()
    aws_sandbox.booter.mode = mode


# ------------------------------------------------------------------------------------- the wire fields


def test_user_data_is_the_boot_script_base64_encoded_on_the_wire(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()
    spec = _spec()

    handle = adapter.launch(spec)

    # RunInstances UserData: "The user data to make available to the instance", base64-encoded (boto3 encodes
    # it); DescribeInstanceAttribute answers it base64-encoded too.
    wire = _ec2(held).describe_instance_attribute(InstanceId=handle.instance_id, Attribute="userData")
    assert base64.b64decode(wire["UserData"]["Value"]) == adapter.user_data(spec)
    assert adapter.user_data(spec).startswith(b"#!/bin/bash\n")
    assert b"BROKER_LOGIN_USER='ubuntu'" in adapter.user_data(spec)


def test_the_first_importable_key_becomes_the_orders_key_pair(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    spec = _spec()

    handle = aws_adapter().launch(spec)

    # RunInstances KeyName names a key pair ImportKeyPair made from PublicKeyMaterial, tagged through its
    # TagSpecification (ImportKeyPair reference). EC2 imports RSA (1024/2048/4096 bits) and ED25519: the
    # 3072-bit RSA key of this boot reaches the machine through the boot script only.
    assert _instance(held, handle.instance_id)["KeyName"] == f"broker-{ORDER}"
    [pair] = _key_pairs(held)
    assert (pair["KeyName"], pair["KeyType"], pair["PublicKey"]) == (
        f"broker-{ORDER}",
        "ed25519",
        spec.boot.ssh_keys[0].public_key,
    )
    assert pair["Tags"] == [{"Key": "broker:order", "Value": ORDER}]
    assert aws_adapter().native_keys(spec) == (spec.boot.ssh_keys[0],)


def test_a_4096_bit_rsa_key_first_in_line_is_the_one_imported(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    spec = _spec(ssh_keys=parsed(rsa_public(4096), ed25519_public()))

    aws_adapter().launch(spec)

    assert [(p["KeyType"], p["PublicKey"]) for p in _key_pairs(held)] == [("rsa", spec.boot.ssh_keys[0].public_key)]


def test_a_key_ec2_cannot_import_goes_through_the_boot_script_alone(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    spec = _spec(ssh_keys=parsed(ecdsa_public()))

    handle = aws_adapter().launch(spec)

    assert "KeyName" not in _instance(held, handle.instance_id)
    assert held.calls("ImportKeyPair") == []
    assert spec.boot.ssh_keys[0].public_key.encode() in aws_adapter().user_data(spec)


def test_the_firewall_is_the_orders_security_group_with_each_port_and_range(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    handle = aws_adapter().launch(_spec())

    [group] = _groups(held)
    default_vpc = _ec2(held).describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
    # RunInstances SecurityGroupIds; an IpPermission carries IPv4 ranges in IpRanges and IPv6 ranges in
    # Ipv6Ranges (IpPermission reference).
    assert [g["GroupId"] for g in _instance(held, handle.instance_id)["SecurityGroups"]] == [group["GroupId"]]
    assert (group["GroupName"], group["VpcId"]) == (f"broker-{ORDER}", default_vpc["VpcId"])
    assert group["Tags"] == [{"Key": "broker:order", "Value": ORDER}]
    assert sorted(
        (p["IpProtocol"], p["FromPort"], p["ToPort"], tuple(r["CidrIp"] for r in p["IpRanges"]),
         tuple(r["CidrIpv6"] for r in p["Ipv6Ranges"]))
        for p in group["IpPermissions"]
    ) == [
        ("tcp", 22, 22, ("203.0.113.0/24",), ("2001:db8::/32",)),
        ("tcp", 8000, 8000, ("203.0.113.0/24",), ()),
    ]  # fmt: skip


def test_the_root_volume_of_the_image_gets_the_disk_size(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    handle = aws_adapter().launch(_spec(disk_gb=200))

    instance = _instance(held, handle.instance_id)
    image = _ec2(held).describe_images(ImageIds=[instance["ImageId"]])["Images"][0]
    [root] = [m for m in instance["BlockDeviceMappings"] if m["DeviceName"] == image["RootDeviceName"]]
    [volume] = _ec2(held).describe_volumes(VolumeIds=[root["Ebs"]["VolumeId"]])["Volumes"]
    # BlockDeviceMappings on the image's RootDeviceName with Ebs.VolumeSize in GiB and VolumeType gp3
    # (EbsBlockDevice reference), deleted with the instance.
    assert (volume["Size"], volume["VolumeType"], root["Ebs"]["DeleteOnTermination"]) == (200, "gp3", True)


def test_the_default_image_is_the_dlami_the_regions_public_parameter_names(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    handle = aws_adapter().launch(_spec())

    # /aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id
    # ("Finding the ID of a DLAMI"), read with ssm:GetParameter in the launch's region.
    assert handle.extra["image_id"] == dlami_id("us-east-1")
    assert [(c.service, c.action, c.region) for c in held.calls("GetParameter")] == [
        ("ssm", "GetParameter", "us-east-1")
    ]


def test_the_accounts_image_option_and_the_buyers_image_override_the_default(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    by_option = aws_adapter(image_id="ami-1e749f67").launch(_spec(f"{ORDER}-a1"))
    by_buyer = aws_adapter(image_id="ami-1e749f67").launch(_spec(f"{ORDER}-a2", image="ami-785db401"))

    assert (by_option.extra["image_id"], by_buyer.extra["image_id"]) == ("ami-1e749f67", "ami-785db401")
    assert held.calls("GetParameter") == []


def test_the_sandbox_boots_the_lease_agent_with_the_types_gpus(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()
    handle = adapter.launch(_spec())

    machine = held.booter.machine(handle.instance_id)
    adapter.terminate("us-east-1", handle.instance_id)

    assert machine.lease["boot_token"] == _boot().boot_token
    assert [(g.name, g.memory_gb) for g in machine.executor.gpus()] == [("NVIDIA A100-SXM4-40GB", 40)] * 8
    with pytest.raises(KeyError):
        held.booter.machine(handle.instance_id)


# ---------------------------------------------------------------------------------------------- limits


def test_user_data_over_16_kb_raw_is_refused_before_launch(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    spec = _spec(workload={"kind": "script", "script": "#!/bin/bash\n" + "echo x\n" * 2400, "env": []})

    problems = adapter.launch_problems(spec)

    # "User data is limited to 16 KB, in raw form, before it is base64-encoded."
    assert len(adapter.user_data(spec) or b"") > 16384
    assert [p.field for p in problems] == ["launch.workload"]
    assert "16384" in problems[0].message and "instancedata-add-user-data" in problems[0].message
    assert aws_sandbox.calls() == []


def test_user_data_over_16_kb_sent_anyway_is_refused_as_ec2_refuses_it(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    spec = _spec(workload={"kind": "script", "script": "#!/bin/bash\n" + "echo x\n" * 2400, "env": []})

    with pytest.raises(ProviderRequestRejected) as caught:
        aws_adapter().launch(spec)

    assert (caught.value.code, caught.value.http_status) == ("InvalidParameterValue", 400)
    assert "User data is limited to 16384 bytes" in caught.value.message
    assert held.instances() == []


def test_the_firewall_limit_counts_ipv4_and_ipv6_rules_apart(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    ipv4 = tuple(f"198.51.{i}.0/24" for i in range(60))
    ipv6 = tuple(f"2001:db8:{i:x}::/48" for i in range(60))

    # 60 inbound rules per security group, "enforced separately for IPv4 rules and IPv6 rules" (VPC quotas).
    assert adapter.launch_problems(_spec(ingress=(IngressRule(port=22, cidrs=ipv4 + ipv6),))) == []
    problems = adapter.launch_problems(_spec(ingress=(IngressRule(port=22, cidrs=(*ipv4, "192.0.2.0/24")),)))
    assert [p.field for p in problems] == ["launch.allowed_cidrs"]
    assert "61 (port, IPv4 range) pairs" in problems[0].message and "60" in problems[0].message


def test_a_full_firewall_is_launched_and_one_more_rule_is_refused_by_ec2(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    ipv4 = tuple(f"198.51.{i}.0/24" for i in range(60))
    ipv6 = tuple(f"2001:db8:{i:x}::/48" for i in range(60))
    aws_adapter().launch(_spec(ingress=(IngressRule(port=22, cidrs=ipv4 + ipv6),)))
    [group] = _groups(held)

    with pytest.raises(Exception) as caught:
        _ec2(held).authorize_security_group_ingress(
            GroupId=group["GroupId"],
            IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "IpRanges": [{"CidrIp": "192.0.2.0/24"}]}
            ],
        )

    assert caught.value.response["Error"]["Code"] == "RulesPerSecurityGroupLimitExceeded"  # type: ignore[attr-defined]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400  # type: ignore[attr-defined]
    assert len([c for p in _groups(held)[0]["IpPermissions"] for c in p.get("IpRanges", [])]) == 60


def test_a_disk_outside_gp3_sizes_is_refused_before_launch(
    aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()

    # gp3 VolumeSize: 1 - 16,384 GiB (EbsBlockDevice reference).
    assert adapter.launch_problems(_spec(disk_gb=16384)) == []
    assert [p.field for p in adapter.launch_problems(_spec(disk_gb=16385))] == ["launch.disk_gb"]


def test_a_disk_smaller_than_the_images_snapshot_is_refused_before_anything_is_created(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    with pytest.raises(ProviderRequestRejected) as caught:
        aws_adapter().launch(_spec(disk_gb=8))

    # EC2 refuses "Volume of size 8GB is smaller than snapshot" (InvalidBlockDeviceMapping); the adapter says so
    # from DescribeImages' snapshot size before importing a key or creating a group.
    assert caught.value.code == "InvalidBlockDeviceMapping"
    assert "15 GB" in caught.value.message
    assert (held.instances(), _key_pairs(held), _groups(held)) == ([], [], [])


# ---------------------------------------------------------------------------------------- idempotency


def test_a_repeated_launch_creates_no_second_key_pair_group_or_rule(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()

    first = adapter.launch(_spec())
    again = adapter.launch(_spec())

    assert again.instance_id == first.instance_id
    assert [len(held.calls(a)) for a in ("ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress")] == [
        1,
        1,
        1,
    ]
    assert (len(_key_pairs(held)), len(_groups(held)), len(held.instances())) == (1, 1, 1)


def test_a_first_launch_makes_its_key_pair_and_group_without_looking_for_them_first(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_adapter().launch(_spec())

    # Created first, looked up only when EC2 answers that they exist: a first launch reads none of them, and
    # the group goes into the default VPC without asking which it is (CreateSecurityGroup without VpcId). The
    # key pair is imported beside the group's two calls, so its place among them varies.
    ec2 = [c.action for c in held.calls() if c.service == "ec2"]
    assert (ec2[0], ec2[-1]) == ("DescribeImages", "RunInstances")
    assert sorted(ec2[1:-1]) == ["AuthorizeSecurityGroupIngress", "CreateSecurityGroup", "ImportKeyPair"]
    group_calls = [a for a in ec2 if a != "ImportKeyPair"]
    assert group_calls == ["DescribeImages", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress", "RunInstances"]


def test_a_launch_repeated_by_another_adapter_finds_the_orders_resources_and_adds_nothing(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    first = aws_adapter().launch(_spec())

    # A redelivered task builds a new adapter: EC2 answers its ImportKeyPair and CreateSecurityGroup with
    # InvalidKeyPair.Duplicate and InvalidGroup.Duplicate, the group is read back once with its rules, and no
    # rule is missing, so none is added.
    again = aws_adapter().launch(_spec())
    actions = ("ImportKeyPair", "CreateSecurityGroup", "DescribeSecurityGroups", "AuthorizeSecurityGroupIngress")
    counts = [len(held.calls(a)) for a in actions]

    assert again.instance_id == first.instance_id
    assert counts == [2, 2, 1, 1]
    assert (len(_key_pairs(held)), len(_groups(held)), len(held.instances())) == (1, 1, 1)


def test_a_second_attempt_in_the_region_reuses_the_orders_resources(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()

    first = adapter.launch(_spec(f"{ORDER}-a1", zone="us-east-1a"))
    second = adapter.launch(_spec(f"{ORDER}-a2", zone="us-east-1b"))

    assert second.instance_id != first.instance_id
    assert (len(held.calls("ImportKeyPair")), len(held.calls("CreateSecurityGroup"))) == (1, 1)
    assert {g["GroupId"] for g in _instance(held, second.instance_id)["SecurityGroups"]} == {
        _groups(held)[0]["GroupId"]
    }


def test_failing_over_to_another_region_creates_the_resources_there(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter(regions=["us-east-1", "us-west-2"])

    adapter.launch(_spec(f"{ORDER}-a1"))
    adapter.launch(_spec(f"{ORDER}-a2", region="us-west-2", zone="us-west-2a"))

    mine = [(r.region, r.kind) for r in adapter.list_order_resources() if r.order_ref == ORDER]
    assert mine == [
        ("us-east-1", "key_pair"),
        ("us-east-1", "security_group"),
        ("us-west-2", "key_pair"),
        ("us-west-2", "security_group"),
    ]


# -------------------------------------------------------------------------------------------- release


def test_a_group_still_in_use_is_left_for_the_next_sweep_and_then_released(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    adapter = aws_adapter()
    handle = adapter.launch(_spec())
    [group] = _groups(held)

    remaining = adapter.release_order_resources(ORDER)
    # DeleteSecurityGroup answers DependencyViolation while the instance still uses the group.
    assert [(r.kind, r.resource_id, r.order_ref) for r in remaining] == [("security_group", group["GroupId"], ORDER)]
    assert _key_pairs(held) == []

    adapter.terminate("us-east-1", handle.instance_id)
    assert adapter.describe("us-east-1", handle.instance_id).state is InstanceState.TERMINATED
    assert adapter.release_order_resources(ORDER) == []
    assert adapter.release_order_resources(ORDER) == []
    assert [r for r in adapter.list_order_resources() if r.order_ref == ORDER] == []
    assert len(held.calls("DeleteSecurityGroup")) == 2


def test_release_leaves_other_orders_resources_alone(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()
    adapter.launch(_spec())
    other = replace(_spec("ord-bob-a1"), order_ref="ord-bob")
    handle = adapter.launch(other)
    adapter.terminate("us-east-1", handle.instance_id)

    assert adapter.release_order_resources("ord-bob") == []

    assert sorted((r.kind, r.order_ref) for r in adapter.list_order_resources()) == [
        ("key_pair", ORDER),
        ("security_group", ORDER),
    ]


# ---------------------------------------------------------------------------------------------- images


def test_a_missing_default_image_fails_before_anything_is_created(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    held.faults.inject("image_missing", region="us-east-1")

    with pytest.raises(ImageUnavailable) as caught:
        aws_adapter().launch(_spec())

    assert caught.value.code == "ParameterNotFound"
    assert "us-east-1" in str(caught.value)
    assert [c.action for c in held.calls() if c.service == "ec2"] == []
    assert held.instances() == []


def test_a_buyers_image_the_region_lacks_fails_before_anything_is_created(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    with pytest.raises(ImageUnavailable) as caught:
        aws_adapter().launch(_spec(image="ami-0123456789abcdef0"))

    # DescribeImages answers InvalidAMIID.NotFound for an id the region does not hold.
    assert caught.value.code == "InvalidAMIID.NotFound"
    assert "ami-0123456789abcdef0" in str(caught.value) and "us-east-1" in str(caught.value)
    assert [c.action for c in held.calls()] == ["DescribeImages"]


def _image_reads(sandbox: AwsSandbox) -> list[str]:
    return [c.action for c in sandbox.calls() if c.action in ("GetParameter", "DescribeImages")]


def _bob(sandbox: AwsSandbox) -> AwsAdapter:
    values = {"access_key_id": BOB.access_key_id, "secret_access_key": BOB.secret_access_key}
    return AwsAdapter(Credentials(kind="aws", values=values, endpoint_url=sandbox.url), ["us-east-1"], {})


def test_the_regions_default_image_is_read_once_per_account_and_region_for_every_adapter_of_the_process(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_adapter().launch(_spec())
    # The next order's task builds another adapter of the same account: the DLAMI it resolved stands.
    aws_adapter().launch(_spec(f"{ORDER}-a2", zone="us-east-1b"))
    assert _image_reads(held) == ["GetParameter", "DescribeImages"]

    # Another account asks for itself: what one account may launch says nothing of another's.
    _bob(held).launch(_spec(f"{ORDER}-a3"))
    assert _image_reads(held) == ["GetParameter", "DescribeImages"] * 2
    assert len(held.calls("RunInstances")) == 3


def test_a_launch_refused_its_remembered_image_forgets_it_and_the_next_one_reads_it_again(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    aws_adapter().launch(_spec())
    held.faults.inject("image_missing", region="us-east-1")  # withdrawn after the first launch read it

    with pytest.raises(ImageUnavailable) as caught:
        aws_adapter().launch(_spec(f"{ORDER}-a2"))

    # RunInstances was refused the remembered image (InvalidAMIID.NotFound, EC2 error codes) ...
    assert caught.value.code == "InvalidAMIID.NotFound"
    assert _image_reads(held) == ["GetParameter", "DescribeImages"]
    held.faults.clear()
    aws_adapter().launch(_spec(f"{ORDER}-a3"))
    # ... so the next launch asked again, rather than trusting it until it expired.
    assert _image_reads(held) == ["GetParameter", "DescribeImages"] * 2


def test_a_prepared_launch_then_only_starts_its_instance(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()

    adapter.launch_prepare(_spec())

    prepared = [c.action for c in held.calls() if c.service == "ec2"]
    assert sorted(prepared) == [
        "AuthorizeSecurityGroupIngress",
        "CreateSecurityGroup",
        "DescribeImages",
        "ImportKeyPair",
    ]
    assert held.instances() == []
    handle = adapter.launch(_spec())
    assert [c.action for c in held.calls() if c.service == "ec2"][len(prepared) :] == ["RunInstances"]
    assert _instance(held, handle.instance_id)["KeyName"] == f"broker-{ORDER}"
    assert (len(_key_pairs(held)), len(_groups(held))) == (1, 1)


def test_a_launch_the_cloud_would_refuse_is_not_prepared(held: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    adapter = aws_adapter()
    spec = _spec(disk_gb=20_000)  # over gp3's 16,384 GiB (EbsBlockDevice): launch_problems names it

    adapter.launch_prepare(spec)

    assert adapter.launch_problems(spec) and held.calls() == []


# ------------------------------------------------------------------------------------------ bare launch


def test_a_launch_without_a_boot_sends_the_bare_request_it_always_did(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    handle = aws_adapter().launch(replace(_spec(), boot=None))

    calls = [c.action for c in held.calls()]
    instance = _instance(held, handle.instance_id)
    assert calls == ["DescribeImages", "RunInstances"]
    assert handle.extra["image_id"] == "ami-785db401"  # the newest Canonical Ubuntu, as before
    assert "KeyName" not in instance
    user_data = _ec2(held).describe_instance_attribute(InstanceId=handle.instance_id, Attribute="userData")
    assert "Value" not in user_data["UserData"]
    assert held.booter.records[-1].outcome == "no_user_data"


# ---------------------------------------------------------------------------------------------- subnet


def test_a_subnet_option_puts_the_machine_and_its_group_in_that_vpc(
    held: AwsSandbox, aws_adapter: AdapterFactory
) -> None:
    ec2 = _ec2(held)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    adapter = aws_adapter(subnet_id=f"subnet-0000000000000000b, {subnet}")

    handle = adapter.launch(_spec())

    assert _instance(held, handle.instance_id)["SubnetId"] == subnet
    assert _groups(held)[0]["VpcId"] == vpc
    with pytest.raises(ProviderRequestRejected, match="us-east-1b"):
        adapter.launch(_spec(f"{ORDER}-a2", zone="us-east-1b"))
