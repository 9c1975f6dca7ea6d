"""A launch's boot on Tencent Cloud CVM: keys, firewall, disk, image and user data in CVM's and VPC's own fields,
through the real tencentcloud SDK against the sandbox, and the sandbox refusing what the real APIs refuse.

References (each assertion below names the one it checks):

- RunInstances https://cloud.tencent.com/document/api/213/15730: ``UserData`` "base64-encoded, at most 16 KB";
  ``SystemDisk.DiskSize`` in GB (default 50); ``LoginSettings.KeyIds``; ``SecurityGroupIds``; CVM's error table
  (tencentcloud-sdk-python ``cvm/v20170312/errorcodes.py``) for InvalidParameterValue.InvalidUserDataFormat,
  InvalidParameterValue.TooLong, InvalidParameterValue.KeyPairNotFound, InvalidSecurityGroupId.NotFound and
  LimitExceeded.AssociateUSGLimitExceeded ("at most 5 security groups per instance").
- ImportKeyPair https://cloud.tencent.com/document/api/213/15703: ``KeyName`` of digits, letters and underscores,
  at most 25 characters; ``PublicKey`` in OpenSSH RSA format; ``TagSpecification`` ResourceType ``keypair``.
- DeleteKeyPairs https://cloud.tencent.com/document/api/213/15700: a key pair an instance uses cannot be deleted.
- CreateSecurityGroup https://cloud.tencent.com/document/api/215/15806: a new group denies everything both ways.
- DescribeSecurityGroupLimits https://cloud.tencent.com/document/api/215/41428: 100 rules per security group.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tencentcloud.common import credential
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from tencentcloud.cvm.v20170312 import cvm_client
from tencentcloud.vpc.v20170312 import vpc_client

from providers.boot import lease_file
from providers.errors import ImageUnavailable, ProviderRequestRejected, TransientProviderError
from providers.launch import BootSpec, IngressRule, UserDataMeasure
from providers.tencent import launching
from providers.tencent.adapter import GPU_DRIVER_PRELUDE, TencentAdapter
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.boot import BootMode
from sandboxes.tencent.app import TencentSandbox, start_tencent_sandbox
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

SECRET_ID = "AKIDalice00000000001"
SECRET_KEY = "alice-secret-key"
ORDER = "ord-" + "a1" * 16
OTHER_ORDER = "ord-" + "b2" * 16
ALICE_NET = "203.0.113.0/24"
ALICE_V6 = "2001:db8::/48"
AdapterFactory = Callable[..., TencentAdapter]


class FakeClock:
    """The sandbox's monotonic clock, moved by hand so instance states change exactly when a test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[TencentSandbox, FakeClock]]:
    clock = FakeClock()
    sandbox = start_tencent_sandbox(launch_seconds=10, terminate_seconds=20, retention_seconds=600, clock=clock)
    yield sandbox, clock
    sandbox.stop()


@pytest.fixture
def clock(server: tuple[TencentSandbox, FakeClock]) -> FakeClock:
    return server[1]


@pytest.fixture
def sandbox(server: tuple[TencentSandbox, FakeClock]) -> Iterator[TencentSandbox]:
    box = server[0]
    box.reset()
    box.booter.mode = BootMode.HOLD
    box.register_secret(SECRET_ID, SECRET_KEY)
    yield box
    box.reset()


@pytest.fixture
def adapter(sandbox: TencentSandbox) -> AdapterFactory:
    def build(regions: list[str] | None = None, **options: str) -> TencentAdapter:
        credentials = Credentials(
            kind="tencent", values={"secret_id": SECRET_ID, "secret_key": SECRET_KEY}, endpoint_url=sandbox.url
        )
        return TencentAdapter(
            credentials, regions or ["ap-guangzhou", "ap-beijing"], {"retry_backoff": "0.01", **options}
        )

    return build


def _boot(
    *,
    keys: tuple[str, ...] | None = None,
    cidrs: tuple[str, ...] = (ALICE_NET,),
    disk_gb: int | None = 120,
    image: str | None = None,
    script: str | None = None,
) -> BootSpec:
    workload = {"kind": "script", "script": script, "env": []} if script is not None else {"kind": "none"}
    return BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_alice-0123456789abcdefghijklmnopqrstuvwxyz",
        agent_sha256="cd" * 32,
        ssh_keys=parsed(*(keys if keys is not None else (rsa_public(), ed25519_public()))),
        ingress=(IngressRule(port=22, cidrs=cidrs), IngressRule(port=8000, cidrs=cidrs)),
        disk_gb=disk_gb,
        image=image,
        workload=workload,
    )


def _spec(
    boot: BootSpec | None,
    *,
    token: str = f"{ORDER}-a1",
    order_ref: str = ORDER,
    region: str = "ap-guangzhou",
    zone: str = "ap-guangzhou-3",
    image: str | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        region=region,
        zone=zone,
        instance_type="GN7.2XLARGE32",
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token,
        order_ref=order_ref,
        image=image,
        boot=boot,
    )


def _client(sandbox: TencentSandbox, factory: Any, region: str = "ap-guangzhou") -> Any:
    http = HttpProfile(protocol="http", endpoint=sandbox.url.split("://", 1)[1], reqTimeout=5)
    return factory(credential.Credential(SECRET_ID, SECRET_KEY), region, ClientProfile(httpProfile=http))


def _cvm(sandbox: TencentSandbox, region: str = "ap-guangzhou") -> Any:
    return _client(sandbox, cvm_client.CvmClient, region)


def _vpc(sandbox: TencentSandbox, region: str = "ap-guangzhou") -> Any:
    return _client(sandbox, vpc_client.VpcClient, region)


def _call(client: Any, action: str, params: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = client.call_json(action, params)
    return answer["Response"]


def _code(client: Any, action: str, params: dict[str, Any]) -> str:
    with pytest.raises(TencentCloudSDKException) as caught:
        client.call_json(action, params)
    return str(caught.value.get_code())


# ---------------------------------------------------------------------------------------- the wire fields


def test_a_booted_launch_carries_the_boot_in_cvm_and_vpc_fields(sandbox: TencentSandbox, adapter: AdapterFactory):
    tencent = adapter()
    spec = _spec(_boot(cidrs=(ALICE_NET, ALICE_V6)))

    handle = tencent.launch(spec)
    record = sandbox.launched(handle.instance_id)

    # RunInstances UserData: the boot script, base64-encoded on the wire.
    assert base64.b64decode(record.user_data or "") == tencent.user_data(spec)
    # RunInstances SystemDisk.DiskSize, in GB.
    assert record.system_disk == {"DiskType": "CLOUD_PREMIUM", "DiskSize": 120}
    assert record.image_id == "img-sbxu2404"  # the newest public Ubuntu image DescribeImages lists
    # ImportKeyPair takes OpenSSH RSA keys only: the RSA key is the one key pair, named within 25 word characters.
    [key_pair] = record.key_pairs
    assert key_pair["PublicKey"] == parsed(rsa_public())[0].public_key
    assert len(key_pair["KeyName"]) <= 25 and key_pair["KeyName"].replace("_", "").isalnum()
    assert key_pair["Tags"] == [{"Key": "broker:order", "Value": ORDER}]
    assert key_pair["AssociatedInstanceIds"] == [handle.instance_id]
    # The security group (VPC API): tagged with the order, ACCEPT rules for each (port, range) the buyer named,
    # CidrBlock for IPv4 and Ipv6CidrBlock for IPv6, and egress to anywhere, as a new group denies everything.
    [group] = record.security_groups
    assert group["TagSet"] == [{"Key": "broker:order", "Value": ORDER}]
    assert {
        (p["Protocol"], p["Port"], p.get("CidrBlock") or p.get("Ipv6CidrBlock"), p["Action"])
        for p in group["SecurityGroupPolicySet"]["Ingress"]
    } == {("TCP", port, cidr, "ACCEPT") for port in ("22", "8000") for cidr in (ALICE_NET, ALICE_V6)}
    assert {
        (p["Protocol"], p["Port"], p.get("CidrBlock") or p.get("Ipv6CidrBlock"), p["Action"])
        for p in group["SecurityGroupPolicySet"]["Egress"]
    } == {("ALL", "all", "0.0.0.0/0", "ACCEPT"), ("ALL", "all", "::/0", "ACCEPT")}


def test_describe_instances_shows_the_keys_group_and_disk_and_the_attributes_the_user_data(
    sandbox: TencentSandbox, adapter: AdapterFactory
):
    tencent = adapter()
    spec = _spec(_boot())
    handle = tencent.launch(spec)
    record = sandbox.launched(handle.instance_id)
    cvm = _cvm(sandbox)

    described = _call(cvm, "DescribeInstances", {"InstanceIds": [handle.instance_id]})["InstanceSet"][0]
    attributes = _call(
        cvm, "DescribeInstancesAttributes", {"InstanceIds": [handle.instance_id], "Attributes": ["UserData"]}
    )

    assert described["LoginSettings"] == {"KeyIds": [record.key_pairs[0]["KeyId"]]}
    assert described["SecurityGroupIds"] == [record.security_groups[0]["SecurityGroupId"]]
    assert described["SystemDisk"]["DiskSize"] == 120
    assert attributes["InstanceSet"] == [
        {
            "InstanceId": handle.instance_id,
            "Attributes": {"UserData": launching.encode_user_data(tencent.user_data(spec) or b"")},
        }
    ]


def test_keys_the_import_refuses_reach_the_machine_through_the_boot_script(
    sandbox: TencentSandbox, adapter: AdapterFactory
):
    spec = _spec(_boot(keys=(ed25519_public(), ecdsa_public())))

    handle = adapter().launch(spec)
    record = sandbox.launched(handle.instance_id)
    script = base64.b64decode(record.user_data or "").decode()

    assert record.key_pairs == [] and sandbox.key_pairs() == []
    assert ed25519_public().split()[1] in script and ecdsa_public().split()[1] in script
    assert sandbox.calls("ImportKeyPair") == []


def test_the_limits_are_cvms_own():
    limits = TencentAdapter.launch_limits

    assert (limits.user_data_max_bytes, limits.user_data_measure) == (16 * 1024, UserDataMeasure.BASE64)
    assert limits.native_key_types == frozenset({"ssh-rsa"})
    assert limits.ingress_rules_max == 100 - 2  # 100 rules per group, less the two egress rules
    assert "213/15730" in limits.source
    assert TencentAdapter.login_user == "ubuntu"


def test_the_default_image_gets_the_driver_install_and_the_buyers_own_image_does_not(adapter: AdapterFactory):
    tencent = adapter()
    default = _spec(_boot())
    own = _spec(_boot(image="img-sbxu2204"))

    assert GPU_DRIVER_PRELUDE in (tencent.user_data(default) or b"").decode()
    assert "ubuntu-drivers" not in (tencent.user_data(own) or b"").decode()
    checked = subprocess.run(["bash", "-n"], input=tencent.user_data(default), capture_output=True, check=False)
    assert checked.returncode == 0, checked.stderr


# --------------------------------------------------------------------------------------------- limits


def test_user_data_over_16_kb_encoded_is_refused_before_launch_with_a_field_error(adapter: AdapterFactory):
    tencent = adapter()
    near = _spec(_boot(script="#!/bin/bash\n" + "echo 0123456789abcdef\n" * 300))
    over = _spec(_boot(script="#!/bin/bash\n" + "echo 0123456789abcdef\n" * 420))

    problems = tencent.launch_problems(over)

    assert tencent.launch_problems(near) == []
    # Under 16 KB raw, over it once base64-encoded: the encoded field is what RunInstances' 16 KB limit reads.
    assert len(tencent.user_data(over) or b"") < 16384 < len(launching.encode_user_data(tencent.user_data(over) or b""))
    assert [p.field for p in problems] == ["launch.workload"]
    assert "16384" in problems[0].message and "base64" in problems[0].message


def test_user_data_over_the_limit_sent_anyway_is_refused_by_run_instances(
    sandbox: TencentSandbox, adapter: AdapterFactory
):
    spec = _spec(_boot(script="#!/bin/bash\n" + "echo 0123456789abcdef\n" * 620))

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter().launch(spec)

    assert refused.value.code == "InvalidParameterValue.TooLong"
    assert sandbox.instances() == []


def test_run_instances_refuses_user_data_that_is_not_base64(sandbox: TencentSandbox):
    params = {
        "Placement": {"Zone": "ap-guangzhou-3"},
        "InstanceType": "GN7.2XLARGE32",
        "ImageId": "img-sbxu2404",
        "UserData": "#!/bin/bash\necho not encoded",
    }

    assert _code(_cvm(sandbox), "RunInstances", params) == "InvalidParameterValue.InvalidUserDataFormat"
    assert sandbox.instances() == []


@pytest.mark.parametrize("disk_gb", [19, 16385])
def test_a_disk_outside_the_range_is_refused_before_launch_and_by_run_instances(
    sandbox: TencentSandbox, adapter: AdapterFactory, disk_gb: int
):
    spec = _spec(_boot(disk_gb=disk_gb))

    problems = adapter().launch_problems(spec)
    with pytest.raises(ProviderRequestRejected) as refused:
        adapter().launch(spec)

    assert [p.field for p in problems] == ["launch.disk_gb"]
    # The API's answer to an invalid SystemDisk.DiskSize (tencentcloud-sdk-python issue #7).
    assert refused.value.code == "InvalidParameterValue"
    assert f"`{disk_gb}`" in refused.value.message and "SystemDisk.DiskSize" in refused.value.message
    assert sandbox.instances() == []


def test_more_address_ranges_than_a_group_holds_are_refused_before_launch_and_by_vpc(
    sandbox: TencentSandbox, adapter: AdapterFactory
):
    many = tuple(f"198.51.{n}.0/24" for n in range(50))  # 2 ports x 50 ranges = 100 rules, plus 2 egress
    spec = _spec(_boot(cidrs=many))

    problems = adapter().launch_problems(spec)
    with pytest.raises(ProviderRequestRejected) as refused:
        adapter().launch(spec)

    assert [p.field for p in problems] == ["launch.allowed_cidrs"]
    assert refused.value.code == "LimitExceeded.SecurityGroupPolicySet"
    assert sandbox.instances() == []


# ----------------------------------------------------------------------------------------- idempotency


def test_a_repeated_launch_creates_no_second_key_pair_group_or_rule(sandbox: TencentSandbox, adapter: AdapterFactory):
    spec = _spec(_boot())

    first = adapter().launch(spec)
    again = adapter().launch(spec)

    assert again.instance_id == first.instance_id
    assert len(sandbox.instances()) == 1
    assert len(sandbox.key_pairs()) == 1 and len(sandbox.security_groups()) == 1
    policies = sandbox.security_groups()[0]["SecurityGroupPolicySet"]
    assert (len(policies["Ingress"]), len(policies["Egress"])) == (2, 2)
    assert (len(sandbox.calls("ImportKeyPair")), len(sandbox.calls("CreateSecurityGroup"))) == (1, 1)
    assert len(sandbox.calls("CreateSecurityGroupPolicies")) == 2  # one per direction, the first time only


def test_a_launch_whose_rules_were_lost_adds_them_on_the_repeat(sandbox: TencentSandbox, adapter: AdapterFactory):
    sandbox.faults.inject("throttle", action="CreateSecurityGroupPolicies", times=1)
    spec = _spec(_boot())

    with pytest.raises(TransientProviderError):
        adapter().launch(spec)
    handle = adapter().launch(spec)

    [group] = sandbox.security_groups()
    assert len(group["SecurityGroupPolicySet"]["Ingress"]) == 2
    assert sandbox.launched(handle.instance_id).security_groups[0]["SecurityGroupId"] == group["SecurityGroupId"]
    assert len(sandbox.calls("RunInstances")) == 1


def test_a_key_the_account_already_holds_is_used_and_left_alone(
    sandbox: TencentSandbox, adapter: AdapterFactory, clock: FakeClock
):
    """CVM keeps one copy of a public key (InvalidPublicKey.Duplicate): the seller's own import of the buyer's
    key is bound to the instance but never deleted by the order's release."""
    rsa = parsed(rsa_public())[0].public_key
    theirs = _call(_cvm(sandbox), "ImportKeyPair", {"KeyName": "seller_key", "ProjectId": 0, "PublicKey": rsa})["KeyId"]
    tencent = adapter(regions=["ap-guangzhou"])

    handle = tencent.launch(_spec(_boot(keys=(rsa_public(),))))
    clock.now += 10
    tencent.terminate("ap-guangzhou", handle.instance_id)
    clock.now += 20
    remaining = tencent.release_order_resources(ORDER)

    assert [kp["KeyId"] for kp in sandbox.launched(handle.instance_id).key_pairs] == [theirs]
    assert remaining == [] and sandbox.security_groups() == []
    assert [kp["KeyId"] for kp in sandbox.key_pairs()] == [theirs]


# --------------------------------------------------------------------------------------------- release


def test_release_waits_for_the_shutdown_then_deletes_everything_once(
    sandbox: TencentSandbox, adapter: AdapterFactory, clock: FakeClock
):
    tencent = adapter()
    handle = tencent.launch(_spec(_boot()))
    clock.now += 10
    listed = tencent.list_order_resources()
    tencent.terminate("ap-guangzhou", handle.instance_id)

    while_terminating = tencent.release_order_resources(ORDER)
    clock.now += 20
    assert tencent.describe("ap-guangzhou", handle.instance_id).state is InstanceState.TERMINATED
    after_shutdown = tencent.release_order_resources(ORDER)
    again = tencent.release_order_resources(ORDER)

    assert sorted((r.kind, r.region, r.order_ref) for r in listed) == [
        ("key_pair", "ap-guangzhou", ORDER),
        ("security_group", "ap-guangzhou", ORDER),
    ]
    # DeleteKeyPairs and DeleteSecurityGroup refuse while the instance still uses them.
    assert sorted((r.kind, r.resource_id) for r in while_terminating) == sorted((r.kind, r.resource_id) for r in listed)
    assert after_shutdown == [] and again == []
    assert sandbox.key_pairs() == [] and sandbox.security_groups() == []
    assert tencent.list_order_resources() == []


def test_failover_creates_the_resources_in_each_region_and_release_deletes_both(
    sandbox: TencentSandbox, adapter: AdapterFactory, clock: FakeClock
):
    tencent = adapter()
    boot = _boot()
    guangzhou = tencent.launch(_spec(boot))
    beijing = tencent.launch(_spec(boot, token=f"{ORDER}-a2", region="ap-beijing", zone="ap-beijing-6"))
    clock.now += 10
    tencent.terminate("ap-guangzhou", guangzhou.instance_id)
    tencent.terminate("ap-beijing", beijing.instance_id)
    clock.now += 20

    regions = sorted((r.region, r.kind) for r in tencent.list_order_resources())
    remaining = tencent.release_order_resources(ORDER)

    assert regions == [
        ("ap-beijing", "key_pair"),
        ("ap-beijing", "security_group"),
        ("ap-guangzhou", "key_pair"),
        ("ap-guangzhou", "security_group"),
    ]
    assert remaining == [] and tencent.list_order_resources() == []


def test_release_leaves_other_orders_alone(sandbox: TencentSandbox, adapter: AdapterFactory, clock: FakeClock):
    tencent = adapter()
    mine = tencent.launch(_spec(_boot()))
    tencent.launch(_spec(_boot(keys=(rsa_public(bits=4096),)), token=f"{OTHER_ORDER}-a1", order_ref=OTHER_ORDER))
    clock.now += 10
    tencent.terminate("ap-guangzhou", mine.instance_id)
    clock.now += 20

    assert tencent.release_order_resources(ORDER) == []
    assert {r.order_ref for r in tencent.list_order_resources()} == {OTHER_ORDER}


# ----------------------------------------------------------------------------------------------- images


def test_a_missing_default_image_fails_before_anything_is_created(sandbox: TencentSandbox, adapter: AdapterFactory):
    sandbox.faults.inject("image_missing", region="ap-guangzhou")

    with pytest.raises(ImageUnavailable) as missing:
        adapter().launch(_spec(_boot()))

    assert "ap-guangzhou" in str(missing.value)
    assert sandbox.calls("RunInstances") == [] and sandbox.calls("ImportKeyPair") == []
    assert sandbox.instances() == [] and sandbox.security_groups() == []


def test_the_buyers_own_image_must_exist_in_the_region(sandbox: TencentSandbox, adapter: AdapterFactory):
    with pytest.raises(ImageUnavailable) as missing:
        adapter().launch(_spec(_boot(image="img-00000000")))
    handle = adapter().launch(_spec(_boot(image="img-sbxu2204"), token=f"{ORDER}-a2"))

    assert "img-00000000" in str(missing.value) and "ap-guangzhou" in str(missing.value)
    assert sandbox.launched(handle.instance_id).image_id == "img-sbxu2204"
    assert [i.instance_id for i in sandbox.instances()] == [handle.instance_id]


def test_a_launch_without_boot_is_unchanged(sandbox: TencentSandbox, adapter: AdapterFactory):
    handle = adapter().launch(_spec(None))
    record = sandbox.launched(handle.instance_id)

    assert [c.action for c in sandbox.calls()] == ["DescribeImages", "RunInstances"]
    assert (record.user_data, record.key_pairs, record.security_groups) == (None, [], [])
    assert record.system_disk == {"DiskType": "CLOUD_PREMIUM", "DiskSize": 50}


# ---------------------------------------------------------------------------------------------- booting


def test_a_running_instance_boots_the_lease_agent_and_termination_halts_it(
    sandbox: TencentSandbox, adapter: AdapterFactory, clock: FakeClock
):
    tencent = adapter()
    spec = _spec(_boot())
    handle = tencent.launch(spec)

    pending = sandbox.booter.machines()
    clock.now += 10
    running = tencent.describe("ap-guangzhou", handle.instance_id)
    machine = sandbox.booter.machine(handle.instance_id)
    tencent.terminate("ap-guangzhou", handle.instance_id)

    assert pending == []
    assert running.state is InstanceState.RUNNING
    assert machine.lease == lease_file(spec.boot, login_user="ubuntu")  # type: ignore[arg-type]
    assert [g.name for g in machine.executor.gpus()] == ["Tesla T4"]
    assert sandbox.booter.machines() == []


# ---------------------------------------------------------------------------- the sandbox's own refusals


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"KeyName": "a" * 26}, "InvalidKeyPairNameTooLong"),
        ({"KeyName": "alice-laptop"}, "InvalidKeyPairNameIncludeIllegalChar"),
        ({"KeyName": ""}, "InvalidKeyPairNameEmpty"),
        ({"PublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"}, "InvalidPublicKey.Malformed"),
        ({"PublicKey": "ssh-rsa not-base64!"}, "InvalidPublicKey.Malformed"),
    ],
)
def test_import_key_pair_refuses_what_cvm_refuses(sandbox: TencentSandbox, params: dict[str, Any], code: str):
    base = {"KeyName": "alice_laptop", "ProjectId": 0, "PublicKey": rsa_public()}

    assert _code(_cvm(sandbox), "ImportKeyPair", {**base, **params}) == code
    assert sandbox.key_pairs() == []


def test_import_key_pair_refuses_a_name_or_a_key_twice_in_a_region(sandbox: TencentSandbox):
    cvm = _cvm(sandbox)
    _call(cvm, "ImportKeyPair", {"KeyName": "alice_laptop", "ProjectId": 0, "PublicKey": rsa_public()})

    same_name = _code(cvm, "ImportKeyPair", {"KeyName": "alice_laptop", "ProjectId": 0, "PublicKey": rsa_public(4096)})
    same_key = _code(cvm, "ImportKeyPair", {"KeyName": "alice_desk", "ProjectId": 0, "PublicKey": rsa_public()})
    elsewhere = _call(
        _cvm(sandbox, "ap-beijing"),
        "ImportKeyPair",
        {"KeyName": "alice_laptop", "ProjectId": 0, "PublicKey": rsa_public()},
    )

    assert (same_name, same_key) == ("InvalidKeyPairName.Duplicate", "InvalidPublicKey.Duplicate")
    assert elsewhere["KeyId"].startswith("skey-")  # key pairs are per region


def test_run_instances_checks_key_pairs_and_security_groups_of_its_region(sandbox: TencentSandbox):
    cvm, vpc = _cvm(sandbox), _vpc(sandbox)
    beijing_group = _call(
        _vpc(sandbox, "ap-beijing"), "CreateSecurityGroup", {"GroupName": "g", "GroupDescription": "d"}
    )
    groups = [
        _call(vpc, "CreateSecurityGroup", {"GroupName": f"g{n}", "GroupDescription": "d"})["SecurityGroup"][
            "SecurityGroupId"
        ]
        for n in range(6)
    ]
    base = {"Placement": {"Zone": "ap-guangzhou-3"}, "InstanceType": "GN7.2XLARGE32", "ImageId": "img-sbxu2404"}

    unknown_key = _code(cvm, "RunInstances", {**base, "LoginSettings": {"KeyIds": ["skey-00000000"]}})
    other_region = _code(
        cvm, "RunInstances", {**base, "SecurityGroupIds": [beijing_group["SecurityGroup"]["SecurityGroupId"]]}
    )
    six_groups = _code(cvm, "RunInstances", {**base, "SecurityGroupIds": groups})

    assert unknown_key == "InvalidParameterValue.KeyPairNotFound"
    assert other_region == "InvalidSecurityGroupId.NotFound"
    assert six_groups == "LimitExceeded.AssociateUSGLimitExceeded"
    assert sandbox.instances() == []


def test_security_group_policies_take_one_direction_and_at_most_100_rules(sandbox: TencentSandbox):
    vpc = _vpc(sandbox)
    group_id = _call(vpc, "CreateSecurityGroup", {"GroupName": "g", "GroupDescription": "d"})["SecurityGroup"][
        "SecurityGroupId"
    ]
    rule = {"Protocol": "TCP", "Port": "22", "CidrBlock": ALICE_NET, "Action": "ACCEPT"}

    both = _code(
        vpc,
        "CreateSecurityGroupPolicies",
        {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {"Ingress": [rule], "Egress": [rule]}},
    )
    _call(
        vpc,
        "CreateSecurityGroupPolicies",
        {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {"Ingress": [rule] * 100}},
    )
    over = _code(
        vpc, "CreateSecurityGroupPolicies", {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {"Egress": [rule]}}
    )
    exclusive = _code(
        vpc,
        "CreateSecurityGroupPolicies",
        {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {"Egress": [{**rule, "Ipv6CidrBlock": "::/0"}]}},
    )

    icmp_port = _code(
        vpc,
        "CreateSecurityGroupPolicies",
        {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {"Egress": [{**rule, "Protocol": "ICMP"}]}},
    )

    # CreateSecurityGroupPolicies (https://cloud.tencent.com/document/api/215/15807): one direction per request;
    # CidrBlock and Ipv6CidrBlock are exclusive; a port goes with TCP or UDP only. 100 rules per group
    # (DescribeSecurityGroupLimits).
    assert (both, exclusive, icmp_port) == ("InvalidParameter",) * 3
    assert over == "LimitExceeded.SecurityGroupPolicySet"


def test_deleting_unknown_key_pairs_and_groups_is_not_found(sandbox: TencentSandbox):
    assert _code(_cvm(sandbox), "DeleteKeyPairs", {"KeyIds": ["skey-00000000"]}) == "InvalidKeyPairId.NotFound"
    assert (
        _code(_vpc(sandbox), "DeleteSecurityGroup", {"SecurityGroupId": "sg-00000000"})
        == "InvalidSecurityGroupID.NotFound"
    )


def test_describe_filters_key_pairs_and_groups_by_tag(sandbox: TencentSandbox):
    cvm, vpc = _cvm(sandbox), _vpc(sandbox)
    tags = [{"Key": "broker:order", "Value": ORDER}]
    _call(
        cvm,
        "ImportKeyPair",
        {
            "KeyName": "k1",
            "ProjectId": 0,
            "PublicKey": rsa_public(),
            "TagSpecification": [{"ResourceType": "keypair", "Tags": tags}],
        },
    )
    _call(cvm, "ImportKeyPair", {"KeyName": "k2", "ProjectId": 0, "PublicKey": rsa_public(4096)})
    _call(vpc, "CreateSecurityGroup", {"GroupName": "g1", "GroupDescription": "d", "Tags": tags})
    _call(vpc, "CreateSecurityGroup", {"GroupName": "g2", "GroupDescription": "d"})
    by_tag = [{"Name": "tag:broker:order", "Values": [ORDER]}]

    keys = _call(cvm, "DescribeKeyPairs", {"Filters": by_tag})
    groups = _call(vpc, "DescribeSecurityGroups", {"Filters": by_tag, "Offset": "0", "Limit": "100"})

    assert [k["KeyName"] for k in keys["KeyPairSet"]] == ["k1"] and keys["TotalCount"] == 1
    assert [g["SecurityGroupName"] for g in groups["SecurityGroupSet"]] == ["g1"] and groups["TotalCount"] == 1


def test_the_mapping_names_key_pairs_per_order_and_key_within_cvms_rules():
    rsa = parsed(rsa_public())[0].public_key

    name = launching.key_pair_name(ORDER, rsa)

    assert name == launching.key_pair_name(ORDER, rsa + " alice@laptop")
    assert name != launching.key_pair_name(OTHER_ORDER, rsa)
    assert len(name) == 25 and name.startswith("brk_") and name.replace("_", "").isalnum()
    assert launching.ingress_policies([IngressRule(port=443, cidrs=(ALICE_V6,))]) == [
        {"Protocol": "TCP", "Port": "443", "Ipv6CidrBlock": ALICE_V6, "Action": "ACCEPT"}
    ]
    present = [{**launching.EGRESS_POLICIES[0], "PolicyIndex": 0, "PolicyDescription": ""}]
    assert launching.missing_policies(launching.EGRESS_POLICIES, present) == [launching.EGRESS_POLICIES[1]]


def test_the_control_api_shows_key_pairs_and_security_groups(sandbox: TencentSandbox, adapter: AdapterFactory):
    adapter().launch(_spec(_boot()))

    with urllib.request.urlopen(f"{sandbox.url}/_sandbox/key_pairs", timeout=5) as answer:  # noqa: S310 - local
        key_pairs = json.loads(answer.read())["key_pairs"]
    with urllib.request.urlopen(f"{sandbox.url}/_sandbox/security_groups", timeout=5) as answer:  # noqa: S310
        groups = json.loads(answer.read())["security_groups"]

    assert [kp["Tags"] for kp in key_pairs] == [[{"Key": "broker:order", "Value": ORDER}]]
    assert [len(g["SecurityGroupPolicySet"]["Ingress"]) for g in groups] == [2]
