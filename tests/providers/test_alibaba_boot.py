"""A booted launch on Alibaba Cloud ECS: the adapter delivers keys, firewall, disk, image and boot script in ECS's
own mechanisms through the real SDK, and the sandbox keeps and answers them as the ECS API reference describes.

References (ECS API 2014-05-26, Alibaba Cloud documentation):

- RunInstances, https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-runinstances:
  ``UserData`` Base64, at most 32 KB before encoding (``InvalidUserData.SizeExceeded``, 400); ``SystemDisk.Size``
  20-2048 GiB for the default categories, at least the image size (``InvalidSystemDiskSize.*``, 404);
  ``KeyPairName``; ``SecurityGroupId``; ``VSwitchId``.
- Instance user data, https://www.alibabacloud.com/help/en/ecs/user-guide/overview-of-ecs-instance-user-data:
  "Before user data is encoded in Base64, the user data can only be up to 32 KB in size."
- ImportKeyPair, https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-importkeypair:
  rsa, dsa, ssh-rsa, ssh-dss, ecdsa; ``KeyPair.AlreadyExist``; ``InvalidPublicKeyBody.Malformed``.
- DeleteKeyPairs, https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-deletekeypairs:
  a key pair bound to an instance cannot be deleted (``InvalidParameter.KeypairAlreadyAttachedInstance``, 400).
- AuthorizeSecurityGroup, https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-
  authorizesecuritygroup: ``Permissions.N`` (1-100) with ``IpProtocol``, ``PortRange`` "22/22", ``SourceCidrIp`` or
  ``Ipv6SourceCidrIp``; at most 200 inbound rules per group (``AuthorizationLimitExceed``, 403); an existing rule
  is accepted without being added again.
- DeleteSecurityGroup, https://www.alibabacloud.com/help/en/ecs/developer-reference/api-deletesecuritygroup:
  ``DependencyViolation`` (403) "There is still instance(s) in the specified security group."
- Image families, https://www.alibabacloud.com/help/en/elastic-compute-service/latest/image-family-overview:
  the newest Available image of a family is the one used.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from providers.alibaba import launching, mapping
from providers.alibaba.adapter import AlibabaAdapter
from providers.alibaba.client import AlibabaClient, ClientSettings
from providers.boot import lease_file
from providers.errors import ImageUnavailable, ProviderError, ProviderRequestRejected
from providers.launch import BootSpec, IngressRule, WorkloadKind
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.alibaba.app import AlibabaSandbox, start_alibaba_sandbox
from sandboxes.boot import BootMode
from tests.providers.alibaba_target import launched_view
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

AdapterFactory = Callable[..., AlibabaAdapter]
KEY = "LTAIALICE"
SECRET = "alice-secret"
REGION = "cn-shanghai"
ZONE = "cn-shanghai-e"
TYPE = "ecs.gn7i-c8g1.2xlarge"  # 1x A10 24 GB in the seed
NEWEST_UBUNTU = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
DATED_UBUNTU = "ubuntu_22_04_x64_20G_alibase_20230815.vhd"  # the build the adapter once pinned for bare launches
ORDER = "ord-0123456789abcdef0123456789abcdef"
ALICE_NET = "203.0.113.0/24"
ALICE_NET6 = "2001:db8:1234::/48"


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[AlibabaSandbox]:
    sandbox = start_alibaba_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(sandbox_server: AlibabaSandbox) -> Iterator[AlibabaSandbox]:
    sandbox_server.reset()
    sandbox_server.register_key(KEY, SECRET)
    mode = sandbox_server.booter.mode
    sandbox_server.booter.mode = BootMode.HOLD
    yield sandbox_server
    sandbox_server.booter.mode = mode
    sandbox_server.reset()


@pytest.fixture
def adapter(sandbox: AlibabaSandbox) -> AdapterFactory:
    def build(regions: list[str] | None = None, **options: str) -> AlibabaAdapter:
        credentials = Credentials(
            kind="alibaba", values={"access_key_id": KEY, "access_key_secret": SECRET}, endpoint_url=sandbox.url
        )
        return AlibabaAdapter(credentials, regions or [REGION], options)

    return build


@pytest.fixture
def ecs(sandbox: AlibabaSandbox) -> AlibabaClient:
    """The adapter's own SDK client, for calling the sandbox's ECS API directly."""
    return AlibabaClient(ClientSettings(KEY, SECRET, endpoint_url=sandbox.url, max_attempts=1))


def _boot(
    *,
    keys: tuple[str, ...] | None = None,
    cidrs: tuple[str, ...] = (ALICE_NET,),
    disk_gb: int | None = 100,
    image: str | None = None,
    script: str | None = None,
) -> BootSpec:
    workload: dict[str, Any] = (
        {"kind": WorkloadKind.SCRIPT.value, "script": script, "env": []}
        if script is not None
        else {"kind": WorkloadKind.CONTAINER.value, "image": "vllm/vllm-openai:v0.6.3", "ports": [8000], "env": []}
    )
    return BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_alice-boot-token-0123456789abcdefghijklmnopqrs",
        agent_sha256="cd" * 32,
        ssh_keys=parsed(*(keys if keys is not None else (ed25519_public(), rsa_public()))),
        ingress=(IngressRule(port=22, cidrs=cidrs), IngressRule(port=8000, cidrs=cidrs)),
        disk_gb=disk_gb,
        image=image,
        workload=workload,
    )


def _spec(boot: BootSpec | None, *, token: str = f"{ORDER}-a1", region: str = REGION, zone: str = ZONE) -> LaunchSpec:
    return LaunchSpec(
        region=region,
        zone=zone,
        instance_type=TYPE,
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token,
        order_ref=ORDER,
        boot=boot,
    )


def _actions(sandbox: AlibabaSandbox) -> list[str]:
    return [c.action for c in sandbox.calls()]


# ------------------------------------------------------------------------------------------- the wire fields


def test_a_booted_launch_sends_each_field_as_run_instances_defines_it(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()
    spec = _spec(_boot())

    handle = client.launch(spec)

    (held,) = sandbox.instances()
    # RunInstances UserData: the raw script Base64-encoded.
    assert base64.b64decode(held.user_data) == client.user_data(spec)
    # RunInstances SystemDisk.Size, in GiB.
    assert held.system_disk_gb == 100
    # The newest Available build of the public family acs:ubuntu_22_04_x64 (image family overview).
    assert held.image_id == NEWEST_UBUNTU
    # KeyPairName: one key pair per order and region, named after the order.
    assert held.key_pair_name == f"gpu-broker-{ORDER}"
    # VSwitchId: the zone's default vSwitch; SecurityGroupId: a group of the order's, in that vSwitch's VPC.
    group = sandbox.resources.group(held.security_group_id)
    assert group is not None
    assert (held.vswitch_id, group.vpc_id, group.name) == ("vsw-sandboxuf6e", "vpc-sandboxuf6", f"gpu-broker-{ORDER}")
    assert (handle.extra["image_id"], handle.extra["key_pair_name"], handle.extra["security_group_id"]) == (
        NEWEST_UBUNTU,
        held.key_pair_name,
        held.security_group_id,
    )


def test_the_firewall_lets_in_only_the_buyers_ranges_as_authorize_security_group_rules(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    handle = adapter().launch(_spec(_boot(cidrs=(ALICE_NET, ALICE_NET6))))

    group_id = handle.extra["security_group_id"]
    rules = ecs.call(REGION, "DescribeSecurityGroupAttribute", {"RegionId": REGION, "SecurityGroupId": group_id})[
        "Permissions"
    ]["Permission"]

    # AuthorizeSecurityGroup Permissions.N: PortRange "22/22", IPv4 in SourceCidrIp, IPv6 in Ipv6SourceCidrIp.
    assert sorted((r["PortRange"], r["SourceCidrIp"], r["Ipv6SourceCidrIp"], r["IpProtocol"]) for r in rules) == [
        ("22/22", "", ALICE_NET6, "TCP"),
        ("22/22", ALICE_NET, "", "TCP"),
        ("8000/8000", "", ALICE_NET6, "TCP"),
        ("8000/8000", ALICE_NET, "", "TCP"),
    ]
    assert {(r["Direction"], r["Policy"]) for r in rules} == {("ingress", "Accept")}
    assert launching.ingress_pairs(rules) == {(22, ALICE_NET), (8000, ALICE_NET), (22, ALICE_NET6), (8000, ALICE_NET6)}


def test_the_key_pair_holds_the_first_key_import_key_pair_takes(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    spec = _spec(_boot(keys=(ed25519_public(), rsa_public(), ecdsa_public())))

    adapter().launch(spec)

    pairs = ecs.call(
        REGION, "DescribeKeyPairs", {"RegionId": REGION, "KeyPairName": f"gpu-broker-{ORDER}", "IncludePublicKey": True}
    )["KeyPairs"]["KeyPair"]
    rsa = parsed(rsa_public())[0]
    # ImportKeyPair takes rsa and ecdsa but not ED25519: the RSA key is the first it takes. One key pair binds one key.
    assert [(p["PublicKey"], mapping.tags_dict(p["Tags"])) for p in pairs] == [
        (rsa.public_key, {"broker:order": ORDER})
    ]
    # KeyPairFingerPrint: the RFC 4716 MD5 fingerprint of the key.
    digest = hashlib.md5(rsa.blob, usedforsecurity=False).hexdigest()
    assert pairs[0]["KeyPairFingerPrint"] == ":".join(digest[i : i + 2] for i in range(0, 32, 2))
    # Every key, the ED25519 one included, is in the boot script, which appends them to root's authorized_keys.
    script = base64.b64decode(sandbox.instances()[0].user_data).decode()
    assert all(parsed(line)[0].public_key in script for line in (ed25519_public(), rsa_public(), ecdsa_public()))


def test_an_ed25519_only_launch_imports_no_key_pair_and_still_carries_the_key(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    adapter().launch(_spec(_boot(keys=(ed25519_public(),))))

    assert "ImportKeyPair" not in _actions(sandbox)
    assert sandbox.instances()[0].key_pair_name == ""
    assert parsed(ed25519_public())[0].public_key in base64.b64decode(sandbox.instances()[0].user_data).decode()
    # What ECS answers an ED25519 import: the type is not one ImportKeyPair lists.
    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.call(
            REGION,
            "ImportKeyPair",
            {"RegionId": REGION, "KeyPairName": "alice-ed25519", "PublicKeyBody": ed25519_public()},
        )
    assert (refused.value.code, refused.value.http_status) == ("InvalidPublicKeyBody.Malformed", 400)


def test_the_boot_script_logs_in_as_root_and_installs_the_gpu_driver_first(adapter: AdapterFactory) -> None:
    client = adapter()
    spec = _spec(_boot())

    script = (client.user_data(spec) or b"").decode()

    assert lease_file(spec.boot, login_user="root")["login_user"] == "root"  # type: ignore[arg-type]
    assert client.login_user == "root"
    # The installer Alibaba documents, from the region's mirror named by the instance metadata, before the agent.
    assert "100.100.100.200/latest/meta-data/source-address" in script
    assert f"/opsx/ecs/linux/binary/script/{launching.GPU_INSTALLER}" in script
    assert script.index(launching.GPU_INSTALLER) < script.index("BROKER_LEASE_JSON")


def test_the_launched_view_reads_back_what_the_launch_carried(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()
    spec = _spec(_boot())

    view = launched_view(sandbox, client.launch(spec))

    assert (view.image, view.disk_gb, view.user_data) == (NEWEST_UBUNTU, 100, client.user_data(spec))
    assert view.public_keys == [parsed(rsa_public())[0].public_key]
    assert view.ingress == {(22, ALICE_NET), (8000, ALICE_NET)}
    assert view.resource_tags == [ORDER, ORDER]


# ------------------------------------------------------------------------------------------- size limits


def test_user_data_over_32_kb_before_encoding_is_refused_before_launch(adapter: AdapterFactory) -> None:
    client = adapter()
    limits = client.launch_limits
    base = len(client.user_data(_spec(_boot(script="#!/bin/bash\n"))) or b"")
    # The script grows by exactly the filler's length: fill up to the limit, then one byte past it.
    at_limit = _spec(_boot(script="#!/bin/bash\n" + "x" * (limits.user_data_max_bytes - base)))
    over = _spec(_boot(script="#!/bin/bash\n" + "x" * (limits.user_data_max_bytes - base + 1)))

    assert len(client.user_data(at_limit) or b"") == 32 * 1024
    assert client.launch_problems(at_limit) == []
    problems = client.launch_problems(over)
    assert [p.field for p in problems] == ["launch.workload"]
    assert "32769 bytes" in problems[0].message and "32768" in problems[0].message
    assert (limits.user_data_field, limits.user_data_measure.value) == ("RunInstances UserData", "raw")


def test_user_data_over_the_limit_sent_anyway_is_refused_by_run_instances(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()
    base = len(client.user_data(_spec(_boot(script="#!/bin/bash\n"))) or b"")
    over = _spec(_boot(script="#!/bin/bash\n" + "x" * (32 * 1024 - base + 1)))

    with pytest.raises(ProviderRequestRejected) as refused:
        client.launch(over)

    # RunInstances: InvalidUserData.SizeExceeded, HTTP 400, and nothing launched.
    assert (refused.value.code, refused.value.http_status) == ("InvalidUserData.SizeExceeded", 400)
    assert sandbox.instances() == []


@pytest.mark.parametrize("disk_gb", [19, 2049])
def test_a_system_disk_outside_20_to_2048_gib_is_refused_before_launch(adapter: AdapterFactory, disk_gb: int) -> None:
    problems = adapter().launch_problems(_spec(_boot(disk_gb=disk_gb)))

    assert [p.field for p in problems] == ["launch.disk_gb"]
    assert "20-2048 GB" in problems[0].message


@pytest.mark.parametrize(
    ("size", "code"),
    [("19", "InvalidSystemDiskSize.LessThanMinSize"), ("2049", "InvalidSystemDiskSize.MoreThanMaxSize")],
)
def test_a_system_disk_outside_the_range_sent_anyway_is_refused_by_run_instances(
    sandbox: AlibabaSandbox, ecs: AlibabaClient, size: str, code: str
) -> None:
    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.launch(
            REGION,
            {
                "RegionId": REGION,
                "ZoneId": ZONE,
                "InstanceType": TYPE,
                "ImageId": NEWEST_UBUNTU,
                "SystemDisk": {"Size": size},
            },
        )

    assert (refused.value.code, refused.value.http_status) == (code, 404)
    assert sandbox.instances() == []


def test_more_than_200_inbound_rules_are_refused_before_launch_and_by_the_group(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    cidrs = tuple(f"198.51.{n // 256}.{n % 256}/32" for n in range(101))
    problems = adapter().launch_problems(_spec(_boot(cidrs=cidrs)))  # 2 ports x 101 ranges = 202 rules

    assert [p.field for p in problems] == ["launch.allowed_cidrs"]
    assert "at most 200" in problems[0].message

    group_id = ecs.call(REGION, "CreateSecurityGroup", {"RegionId": REGION, "VpcId": "vpc-sandboxuf6"})[
        "SecurityGroupId"
    ]
    rules = [{"IpProtocol": "tcp", "PortRange": f"{p}/{p}", "SourceCidrIp": ALICE_NET} for p in range(1, 201)]
    for start in (0, 100):
        ecs.call(
            REGION,
            "AuthorizeSecurityGroup",
            {"RegionId": REGION, "SecurityGroupId": group_id, "Permissions": rules[start : start + 100]},
        )
    again = ecs.call(
        REGION, "AuthorizeSecurityGroup", {"RegionId": REGION, "SecurityGroupId": group_id, "Permissions": rules[:1]}
    )
    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.call(
            REGION,
            "AuthorizeSecurityGroup",
            {
                "RegionId": REGION,
                "SecurityGroupId": group_id,
                "Permissions": [{"IpProtocol": "tcp", "PortRange": "443/443", "SourceCidrIp": ALICE_NET}],
            },
        )

    # An existing rule is accepted and not added again; the 201st inbound rule is refused.
    assert "RequestId" in again
    assert (refused.value.code, refused.value.http_status) == ("AuthorizationLimitExceed", 403)
    group = sandbox.resources.group(group_id)
    assert group is not None and len(group.rules) == 200


# ------------------------------------------------------------------------------------------- idempotency


def test_a_repeated_launch_creates_no_second_instance_key_pair_or_group(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()
    spec = _spec(_boot())

    first = client.launch(spec)
    again = client.launch(spec)

    assert again.instance_id == first.instance_id
    assert len(sandbox.instances()) == 1
    assert (len(sandbox.resources.key_pairs()), len(sandbox.resources.groups())) == (1, 1)
    assert (_actions(sandbox).count("ImportKeyPair"), _actions(sandbox).count("CreateSecurityGroup")) == (1, 1)
    assert sorted((r.kind, r.region, r.order_ref) for r in client.list_order_resources()) == [
        ("key_pair", REGION, ORDER),
        ("security_group", REGION, ORDER),
    ]


def test_a_second_attempt_reuses_the_orders_key_pair_and_group_and_another_region_gets_its_own(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.set_stock("cn-beijing", "cn-beijing-h", TYPE, "WithStock")
    client = adapter(regions=[REGION, "cn-beijing"])

    first = client.launch(_spec(_boot()))
    second = client.launch(_spec(_boot(), token=f"{ORDER}-a2"))
    beijing = client.launch(_spec(_boot(), token=f"{ORDER}-a3", region="cn-beijing", zone="cn-beijing-h"))

    assert second.extra["security_group_id"] == first.extra["security_group_id"]
    assert beijing.extra["security_group_id"] != first.extra["security_group_id"]
    assert beijing.extra["vswitch_id"] == "vsw-sandbox2zeh"
    assert sorted((r.kind, r.region) for r in client.list_order_resources()) == [
        ("key_pair", "cn-beijing"),
        ("key_pair", REGION),
        ("security_group", "cn-beijing"),
        ("security_group", REGION),
    ]
    assert len(sandbox.instances()) == 3


def test_create_security_group_with_the_same_client_token_answers_the_same_group(ecs: AlibabaClient) -> None:
    request = {"RegionId": REGION, "VpcId": "vpc-sandboxuf6", "SecurityGroupName": "alice", "ClientToken": "sg-alice"}

    first = ecs.call(REGION, "CreateSecurityGroup", request)["SecurityGroupId"]
    again = ecs.call(REGION, "CreateSecurityGroup", request)["SecurityGroupId"]
    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.call(REGION, "CreateSecurityGroup", {**request, "SecurityGroupName": "bob"})

    assert again == first
    assert refused.value.code == "IdempotenceParamNotMatch"


# ----------------------------------------------------------------------------------------------- release


def test_release_keeps_what_a_live_instance_uses_and_deletes_it_once_the_instance_is_gone(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()
    handle = client.launch(_spec(_boot()))
    client.describe(REGION, handle.instance_id)  # Running, so it can be released

    held = client.release_order_resources(ORDER)
    client.terminate(REGION, handle.instance_id)
    released = client.release_order_resources(ORDER)
    again = client.release_order_resources(ORDER)

    # DeleteSecurityGroup answers DependencyViolation and DeleteKeyPairs KeypairAlreadyAttachedInstance while the
    # instance lives: both are left for the next sweep, not raised.
    assert sorted((r.kind, r.resource_id) for r in held) == [
        ("key_pair", f"gpu-broker-{ORDER}"),
        ("security_group", handle.extra["security_group_id"]),
    ]
    assert (released, again) == ([], [])
    assert client.list_order_resources() == []
    assert (sandbox.resources.key_pairs(), sandbox.resources.groups()) == ([], [])


def test_release_touches_only_the_orders_own_resources(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    client = adapter()
    handle = client.launch(_spec(_boot()))
    client.describe(REGION, handle.instance_id)
    client.terminate(REGION, handle.instance_id)

    assert client.release_order_resources("ord-someone-else") == []
    assert len(client.list_order_resources()) == 2


def test_delete_security_group_in_use_answers_dependency_violation(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    group_id = adapter().launch(_spec(_boot())).extra["security_group_id"]

    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.call(REGION, "DeleteSecurityGroup", {"RegionId": REGION, "SecurityGroupId": group_id})
    with pytest.raises(ProviderRequestRejected) as bound:
        ecs.call(REGION, "DeleteKeyPairs", {"RegionId": REGION, "KeyPairNames": json.dumps([f"gpu-broker-{ORDER}"])})

    assert (refused.value.code, refused.value.http_status) == ("DependencyViolation", 403)
    assert (bound.value.code, bound.value.http_status) == ("InvalidParameter.KeypairAlreadyAttachedInstance", 400)


# ----------------------------------------------------------------------------------------------- images


def test_a_missing_default_image_fails_before_anything_is_created(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.faults.inject("image_missing", region=REGION)

    with pytest.raises(ImageUnavailable) as missing:
        adapter().launch(_spec(_boot()))

    assert REGION in str(missing.value) and launching.DEFAULT_IMAGE_FAMILY in str(missing.value)
    assert sandbox.instances() == []
    assert {"ImportKeyPair", "CreateSecurityGroup", "RunInstances"} & set(_actions(sandbox)) == set()


def test_a_missing_image_in_one_region_leaves_the_other_region_launchable(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.faults.inject("image_missing", region="cn-beijing")

    handle = adapter().launch(_spec(_boot()))

    assert handle.extra["image_id"] == NEWEST_UBUNTU


def test_the_buyers_own_image_is_used_when_it_exists_and_refused_when_it_does_not(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.resources.add_image(REGION, "m-alice-cuda12", size_gb=60)
    client = adapter()

    handle = client.launch(_spec(_boot(image="m-alice-cuda12")))
    with pytest.raises(ImageUnavailable) as missing:
        client.launch(_spec(_boot(image="m-alice-gone"), token=f"{ORDER}-a2"))
    with pytest.raises(ProviderRequestRejected) as small:
        client.launch(_spec(_boot(image="m-alice-cuda12", disk_gb=40), token=f"{ORDER}-a3"))

    assert handle.extra["image_id"] == "m-alice-cuda12"
    assert "m-alice-gone" in str(missing.value) and REGION in str(missing.value)
    # A disk smaller than the image is refused before RunInstances, with ECS's own code for it.
    assert small.value.code == "InvalidSystemDiskSize.LessThanImageSize"
    assert [i.image_id for i in sandbox.instances()] == ["m-alice-cuda12"]


def test_the_image_id_option_overrides_the_family(sandbox: AlibabaSandbox, adapter: AdapterFactory) -> None:
    handle = adapter(image_id="ubuntu_20_04_x64_20G_alibase_20230815.vhd").launch(_spec(_boot()))

    assert handle.extra["image_id"] == "ubuntu_20_04_x64_20G_alibase_20230815.vhd"


# ------------------------------------------------------------------------------------------- bare launches


def test_a_launch_without_boot_carries_only_the_family_image_and_the_account_options(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter(security_group_id="sg-alice", vswitch_id="vsw-alice")

    handle = client.launch(_spec(None))

    assert _actions(sandbox) == ["DescribeImages", "RunInstances"]
    (held,) = sandbox.instances()
    assert (held.image_id, held.user_data, held.key_pair_name, held.security_group_id, held.vswitch_id) == (
        NEWEST_UBUNTU,
        "",
        "",
        "sg-alice",
        "vsw-alice",
    )
    assert "key_pair_name" not in handle.extra and client.launch_problems(_spec(None)) == []


# DescribeImages with ImageFamily answers every build of a public family, and ECS launches the newest Available one
# (ECS API reference, "DescribeImages", ImageFamily and ImageOwnerAlias request parameters,
# https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-describeimages; "Image family
# overview", https://www.alibabacloud.com/help/en/elastic-compute-service/latest/image-family-overview). Dated
# public builds are withdrawn over time, so a bare launch resolves the family instead of pinning a build.
def test_a_bare_launch_survives_the_retirement_of_a_dated_public_image(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    sandbox.resources.retire_image(DATED_UBUNTU)

    handle = adapter().launch(_spec(None))

    assert [(i.instance_id, i.image_id) for i in sandbox.instances()] == [(handle.instance_id, NEWEST_UBUNTU)]
    assert handle.extra["image_id"] == NEWEST_UBUNTU
    (lookup,) = [c for c in sandbox.calls() if c.action == "DescribeImages"]
    assert lookup.region == REGION


def test_a_bare_launch_takes_the_accounts_image_family_and_never_launches_without_one(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    focal = adapter(image_family="acs:ubuntu_20_04_x64").launch(_spec(None))
    with pytest.raises(ImageUnavailable) as missing:
        adapter(image_family="acs:debian_99_x64").launch(_spec(None, token=f"{ORDER}-a2"))

    assert focal.extra["image_id"] == "ubuntu_20_04_x64_20G_alibase_20230815.vhd"
    assert "acs:debian_99_x64" in str(missing.value) and REGION in str(missing.value)
    assert [i.instance_id for i in sandbox.instances()] == [focal.instance_id]


# ----------------------------------------------------------------------------------------------- booting


def test_the_sandbox_boots_the_lease_agent_from_user_data_and_halts_it_on_release(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    client = adapter()
    spec = _spec(_boot())
    handle = client.launch(spec)

    assert client.describe(REGION, handle.instance_id).state is InstanceState.RUNNING
    machine = sandbox.booter.machine(handle.instance_id)
    assert machine.lease == lease_file(spec.boot, login_user="root")  # type: ignore[arg-type]
    assert [g.name for g in machine.executor.gpus()] == ["NVIDIA A10"]

    client.terminate(REGION, handle.instance_id)
    assert sandbox.booter.machines() == []


def test_a_throttled_image_lookup_is_transient_and_launches_nothing(
    adapter: AdapterFactory, sandbox: AlibabaSandbox
) -> None:
    sandbox.faults.inject("throttle", action="DescribeImages", times=5)

    with pytest.raises(ProviderError) as caught:
        adapter(max_attempts="1").launch(_spec(_boot()))

    assert caught.value.code == "Throttling.User" and caught.value.retryable
    assert sandbox.instances() == []


def test_the_launch_spec_image_is_used_when_the_boot_names_none(
    sandbox: AlibabaSandbox, adapter: AdapterFactory
) -> None:
    spec = replace(_spec(_boot()), image="ubuntu_20_04_x64_20G_alibase_20230815.vhd")

    assert adapter().launch(spec).extra["image_id"] == "ubuntu_20_04_x64_20G_alibase_20230815.vhd"


# ------------------------------------------------------------------------------------- the sandbox's refusals


@pytest.mark.parametrize(
    ("fields", "code", "status"),
    [
        ({"UserData": "#!/bin/bash not base64"}, "InvalidUserData.Base64FormatInvalid", 400),
        ({"KeyPairName": "gpu-broker-nobody"}, "InvalidKeyPairName.NotFound", 404),
        ({"SystemDisk": {"Size": "big"}}, "InvalidSystemDiskSize", 404),
        ({"VSwitchId": "vsw-sandboxuf6f"}, "InvalidParameter.Mismatch", 400),
    ],
)
def test_run_instances_refuses_what_ecs_refuses(
    sandbox: AlibabaSandbox, ecs: AlibabaClient, fields: dict[str, Any], code: str, status: int
) -> None:
    request = {"RegionId": REGION, "ZoneId": ZONE, "InstanceType": TYPE, "ImageId": NEWEST_UBUNTU, **fields}

    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.launch(REGION, request)

    assert (refused.value.code, refused.value.http_status) == (code, status)
    assert sandbox.instances() == []


def test_a_deleted_security_group_cannot_be_launched_into(sandbox: AlibabaSandbox, ecs: AlibabaClient) -> None:
    group_id = ecs.call(REGION, "CreateSecurityGroup", {"RegionId": REGION, "VpcId": "vpc-sandboxuf6"})[
        "SecurityGroupId"
    ]
    ecs.call(REGION, "DeleteSecurityGroup", {"RegionId": REGION, "SecurityGroupId": group_id})
    request = {"RegionId": REGION, "ZoneId": ZONE, "InstanceType": TYPE, "ImageId": NEWEST_UBUNTU}

    with pytest.raises(ProviderRequestRejected) as refused:
        ecs.launch(REGION, {**request, "SecurityGroupId": group_id})
    with pytest.raises(ProviderRequestRejected) as gone:
        ecs.call(REGION, "DeleteSecurityGroup", {"RegionId": REGION, "SecurityGroupId": group_id})

    assert (refused.value.code, refused.value.http_status) == ("InvalidSecurityGroupId.NotFound", 404)
    assert (gone.value.code, gone.value.http_status) == ("InvalidSecurityGroupId.NotFound", 404)


def test_describe_user_data_and_disks_answer_a_bare_instance_as_ecs_does(
    sandbox: AlibabaSandbox, adapter: AdapterFactory, ecs: AlibabaClient
) -> None:
    handle = adapter().launch(_spec(None))
    one = {"RegionId": REGION, "InstanceId": handle.instance_id}

    user_data = ecs.call(REGION, "DescribeUserData", one)
    disks = ecs.call(REGION, "DescribeDisks", {**one, "DiskType": "system"})["Disks"]["Disk"]
    attribute = ecs.call(REGION, "DescribeInstanceAttribute", {"InstanceId": handle.instance_id})

    assert (user_data["InstanceId"], user_data["UserData"]) == (handle.instance_id, "")
    # SystemDisk.Size defaults to max{40, image size}.
    assert [(d["Type"], d["Size"], d["InstanceId"]) for d in disks] == [("system", 40, handle.instance_id)]
    assert (attribute["ImageId"], attribute["SecurityGroupIds"]["SecurityGroupId"]) == (
        NEWEST_UBUNTU,
        ["sg-sandboxuf6"],
    )


def test_describe_images_answers_the_newest_build_of_a_family_first(ecs: AlibabaClient) -> None:
    images = ecs.call(
        REGION,
        "DescribeImages",
        {"RegionId": REGION, "ImageFamily": launching.DEFAULT_IMAGE_FAMILY, "ImageOwnerAlias": "system"},
    )["Images"]["Image"]

    assert [i["ImageId"] for i in images] == [NEWEST_UBUNTU, "ubuntu_22_04_x64_20G_alibase_20230815.vhd"]
    assert launching.newest_image(reversed(images)) == images[0]
