"""What an Azure launch carries (``providers.launch.BootSpec``) in Azure's own fields, through azure-mgmt-compute and
azure-mgmt-network against the HTTPS sandbox, read back from the sandbox's ARM-shaped state.

Sources, cited again beside each assertion:

- [VM REST] Virtual Machines - Create Or Update, https://learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update
  (``osProfile.customData``: base64, "decoded to a binary array ... The maximum length of the binary array is
  65535 bytes"; ``linuxConfiguration.ssh.publicKeys[{path, keyData}]``; ``storageProfile.osDisk.diskSizeGB``;
  ``networkInterfaceConfigurations[].properties.networkSecurityGroup``).
- [SSH keys] Detailed steps: Create and manage SSH keys for authentication to a Linux VM in Azure,
  https://learn.microsoft.com/azure/virtual-machines/linux/create-ssh-keys-detailed (RSA of 2048+ bits, Ed25519).
- [Disks] Introduction to Azure managed disks, https://learn.microsoft.com/azure/virtual-machines/managed-disks-overview
  ("OS disk ... has a maximum capacity of 4,095 GiB").
- [NSG limits] Azure subscription and service limits, Networking limits, https://learn.microsoft.com/azure/azure-resource-manager/management/azure-subscription-service-limits
  ("NSG rules per NSG: 1,000").
- [NSG rules] Network security groups overview, https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview
  (priority "a number between 100 and 4096"; direction, access, protocol per rule).
- [HPC images] Configure and optimize VMs, https://learn.microsoft.com/azure/virtual-machines/configure (Ubuntu-HPC
  images "come preconfigured with the NVIDIA GPU drivers"), and github.com/Azure/azhpc-images
  (``microsoft-dsvm:ubuntu-hpc:2204:latest``).
"""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from providers.azure import launching
from providers.azure.adapter import AzureAdapter
from providers.boot import lease_file
from providers.errors import ImageUnavailable, ProviderRequestRejected
from providers.launch import BootSpec, IngressRule, WorkloadKind
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.azure.app import AzureSandbox
from sandboxes.azure.network import ingress_pairs
from sandboxes.boot import BootMode
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

REGIONS = ["eastus", "southcentralus", "westus", "westus3"]
SUB = "00000000-0000-0000-0000-0000000005b0"
LAUNCH = "VirtualMachines_CreateOrUpdate"
NSG_PUT = "NetworkSecurityGroups_CreateOrUpdate"
CIDRS = ("203.0.113.0/24", "2001:db8::/48")


@pytest.fixture
def sandbox(azure_server) -> AzureSandbox:
    azure_server.reset()
    azure_server.booter.mode = BootMode.HOLD
    yield azure_server
    azure_server.reset()


@pytest.fixture
def adapter(sandbox):
    def build(regions: list[str] | None = None, **options: str) -> AzureAdapter:
        values = {**sandbox.demo_credentials, "client_id": "petra-app"}
        credentials = Credentials(kind="azure", values=values, endpoint_url=sandbox.url)
        merged = {**sandbox.account_options(), "polling_interval": "0.02", **options}
        return AzureAdapter(credentials, regions or REGIONS, merged)

    return build


def _boot(**overrides) -> BootSpec:
    values = {
        "broker_url": "https://broker.example",
        "boot_token": "bt_azure-token-0123456789abcdefghijklmnopqrstuvwxyz",
        "agent_sha256": "cd" * 32,
        "ssh_keys": parsed(ed25519_public(), rsa_public(), ecdsa_public()),
        "ingress": (IngressRule(port=22, cidrs=CIDRS), IngressRule(port=8000, cidrs=CIDRS[:1])),
        "disk_gb": 128,
        "workload": {"kind": WorkloadKind.SCRIPT.value, "script": "#!/bin/bash\necho hi\n", "env": []},
    }
    values.update(overrides)
    return BootSpec(**values)


def _spec(attempt: str = "ord-alice-a1", boot: BootSpec | None = None, **overrides) -> LaunchSpec:
    values = {
        "region": "eastus",
        "zone": "eastus-2",
        "instance_type": "Standard_NC4as_T4_v3",
        "pricing_model": PricingModel.ON_DEMAND,
        "client_token": attempt,
        "order_ref": attempt.rsplit("-", 1)[0],
        "boot": _boot() if boot is None else boot,
    }
    values.update(overrides)
    return LaunchSpec(**values)


def _properties(sandbox: AzureSandbox, instance_id: str) -> dict:
    return sandbox.vm_request(instance_id)["properties"]


def _nsg_of(sandbox: AzureSandbox, instance_id: str):
    nic = _properties(sandbox, instance_id)["networkProfile"]["networkInterfaceConfigurations"][0]
    return sandbox.network_security_group(nic["properties"]["networkSecurityGroup"]["id"])


# --------------------------------------------------------------------------------------------- the fields


def test_the_boot_script_is_custom_data_base64_of_the_raw_script(adapter, sandbox):
    az = adapter()
    spec = _spec()

    handle = az.launch(spec)
    os_profile = _properties(sandbox, handle.instance_id)["osProfile"]

    # [VM REST] OSProfile.customData: "a base-64 encoded string of custom data", decoded to the file the VM reads.
    assert base64.b64decode(os_profile["customData"], validate=True) == az.user_data(spec)
    assert lease_file(spec.boot, login_user="azureuser")["boot_token"] in az.user_data(spec).decode()


def test_rsa_and_ed25519_keys_go_to_the_login_users_authorized_keys_and_every_key_to_the_script(adapter, sandbox):
    az = adapter()
    spec = _spec()

    handle = az.launch(spec)
    os_profile = _properties(sandbox, handle.instance_id)["osProfile"]
    linux = os_profile["linuxConfiguration"]

    # [SSH keys] RSA (2048+ bits) and Ed25519 are the types Azure installs; [VM REST] SshPublicKey {path, keyData}.
    assert os_profile["adminUsername"] == az.login_user == "azureuser"
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": key.public_key}
        for key in spec.boot.ssh_keys
        if key.key_type in ("ssh-ed25519", "ssh-rsa")
    ]
    assert az.launch_limits.native_key_types == frozenset({"ssh-rsa", "ssh-ed25519"})
    assert ecdsa_public().split()[1] in az.user_data(spec).decode()


def test_a_launch_whose_keys_azure_does_not_take_carries_a_placeholder_no_one_holds(adapter, sandbox):
    az = adapter()
    spec = _spec(boot=_boot(ssh_keys=parsed(ecdsa_public())))

    handle = az.launch(spec)
    [key] = _properties(sandbox, handle.instance_id)["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]

    # ARM refuses a Linux profile with password login off and no key ([VM REST] LinuxConfiguration).
    assert key["keyData"].startswith("ssh-ed25519 ")
    assert key["keyData"] != ecdsa_public()
    assert ecdsa_public().split()[1] in az.user_data(spec).decode()
    assert handle.state == InstanceState.RUNNING


def test_the_disk_size_is_the_os_disks_disk_size_gb(adapter, sandbox):
    handle = adapter().launch(_spec(boot=_boot(disk_gb=512)))

    # [VM REST] storageProfile.osDisk.diskSizeGB overrides the image's disk size.
    assert _properties(sandbox, handle.instance_id)["storageProfile"]["osDisk"]["diskSizeGB"] == 512


def test_without_a_disk_size_the_image_decides(adapter, sandbox):
    handle = adapter().launch(_spec(boot=_boot(disk_gb=None)))

    assert "diskSizeGB" not in _properties(sandbox, handle.instance_id)["storageProfile"]["osDisk"]


def test_the_default_image_is_microsofts_ubuntu_hpc_image_at_its_latest_version(adapter, sandbox):
    handle = adapter().launch(_spec())

    # [HPC images] the Ubuntu-HPC image ships the NVIDIA driver; "latest" is resolved by Azure at create.
    assert _properties(sandbox, handle.instance_id)["storageProfile"]["imageReference"] == {
        "publisher": "microsoft-dsvm",
        "offer": "ubuntu-hpc",
        "sku": "2204",
        "version": "latest",
    }
    assert sandbox.calls("VirtualMachineImages_List")[0].region == "eastus"


def test_the_buyers_image_and_then_the_accounts_option_win_over_the_default(adapter, sandbox):
    buyer = adapter().launch(_spec(boot=_boot(image="microsoft-dsvm:ubuntu-hpc:2404:24.04.2025050601")))
    account = adapter(image="Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest").launch(_spec("ord-bob-a1"))

    assert _properties(sandbox, buyer.instance_id)["storageProfile"]["imageReference"]["sku"] == "2404"
    assert _properties(sandbox, account.instance_id)["storageProfile"]["imageReference"]["offer"] == (
        "0001-com-ubuntu-server-jammy"
    )
    assert [c.action for c in sandbox.calls() if c.action.startswith("VirtualMachineImages")] == [
        "VirtualMachineImages_Get",
        "VirtualMachineImages_List",
    ]


def test_a_managed_image_of_the_account_in_the_region_is_used_by_id(adapter, sandbox):
    image_id = f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/images/vllm"
    sandbox.images.add_managed_image(image_id, "eastus")

    handle = adapter().launch(_spec(boot=_boot(image=image_id)))

    assert _properties(sandbox, handle.instance_id)["storageProfile"]["imageReference"] == {"id": image_id}
    assert len(sandbox.calls("Images_Get")) == 1


def test_the_firewall_is_a_network_security_group_on_the_nic_with_one_rule_per_port_and_range(adapter, sandbox):
    spec = _spec()

    handle = adapter().launch(spec)
    nsg = _nsg_of(sandbox, handle.instance_id)

    # [VM REST] networkInterfaceConfigurations[].properties.networkSecurityGroup; [NSG rules] each rule's fields.
    assert (nsg.name, nsg.location, nsg.tags) == ("nsg-ord-alice-eastus", "eastus", {"broker:order": "ord-alice"})
    assert ingress_pairs(nsg) == {(22, CIDRS[0]), (22, CIDRS[1]), (8000, CIDRS[0])}
    assert [r["properties"]["priority"] for r in nsg.rules] == [100, 101, 102]
    assert {
        (r["properties"]["direction"], r["properties"]["access"], r["properties"]["protocol"]) for r in nsg.rules
    } == {("Inbound", "Allow", "Tcp")}
    assert not any(r["properties"]["sourceAddressPrefix"] in ("*", "0.0.0.0/0", "Internet") for r in nsg.rules)


def test_the_sandbox_boots_the_lease_agent_from_the_custom_data(adapter, sandbox):
    az = adapter()
    spec = _spec()

    handle = az.launch(spec)
    machine = sandbox.booter.machine(handle.instance_id)
    az.terminate("eastus", handle.instance_id)

    assert machine.lease == lease_file(spec.boot, login_user=az.login_user)
    assert [g.name for g in machine.executor.gpus()] == ["Tesla T4"]
    with pytest.raises(KeyError):
        sandbox.booter.machine(handle.instance_id)


# ---------------------------------------------------------------------------------------------- limits


def _script_of(size: int) -> str:
    return "#!/bin/bash\n" + "x" * size


def test_custom_data_over_65535_raw_bytes_is_refused_before_launch(adapter):
    az = adapter()
    base = len(az.user_data(_spec(boot=_boot(workload={"kind": "script", "script": "", "env": []}))))
    fits = _spec(boot=_boot(workload={"kind": "script", "script": "x" * (65535 - base), "env": []}))
    over = _spec(boot=_boot(workload={"kind": "script", "script": "x" * (65536 - base), "env": []}))

    # [VM REST] "The maximum length of the binary array is 65535 bytes": the decoded (raw) script counts.
    assert len(az.user_data(fits)) == 65535
    assert az.launch_problems(fits) == []
    [problem] = az.launch_problems(over)
    assert problem.field == "launch.workload"
    assert "65536 bytes" in problem.message and "osProfile.customData takes at most 65535" in problem.message


def test_custom_data_over_the_limit_sent_anyway_is_refused_as_arm_refuses_it(adapter, sandbox):
    az = adapter()
    spec = _spec(boot=_boot(workload={"kind": "script", "script": _script_of(70000), "env": []}))

    with pytest.raises(ProviderRequestRejected) as refused:
        az.launch(spec)

    # ARM: 400 InvalidParameter "Custom data in OSProfile must be in Base64 encoding and with a maximum length of
    # 87380 characters." (87,380 = base64 length of 65,535 bytes; the answer quoted in Azure/aks-engine#1663).
    assert (refused.value.code, refused.value.http_status) == ("InvalidParameter", 400)
    assert "maximum length of 87380 characters" in refused.value.message
    assert sandbox.instances() == []


def test_a_disk_over_4095_gb_is_refused_before_launch_and_by_the_sandbox(adapter, sandbox):
    az = adapter()
    spec = _spec(boot=_boot(disk_gb=4096))

    # [Disks] "This disk has a maximum capacity of 4,095 GiB."
    assert az.launch_limits.disk_gb_max == 4095
    assert [p.field for p in az.launch_problems(spec)] == ["launch.disk_gb"]
    assert az.launch_problems(_spec(boot=_boot(disk_gb=4095))) == []
    with pytest.raises(ProviderRequestRejected) as refused:
        az.launch(spec)
    assert (refused.value.code, refused.value.http_status) == ("InvalidParameter", 400)
    assert sandbox.instances() == []


def test_a_disk_smaller_than_the_images_is_refused_by_arm(adapter, sandbox):
    with pytest.raises(ProviderRequestRejected) as refused:
        adapter().launch(_spec(boot=_boot(disk_gb=20)))

    # ARM: 409 OperationNotAllowed, target osDisk.diskSizeGB (Azure/azure-sdk-for-python#23051); not quota, not spot.
    assert (refused.value.code, refused.value.http_status) == ("OperationNotAllowed", 409)
    assert "smaller than the size of the corresponding disk in the VM image" in refused.value.message


def test_more_than_1000_port_and_range_pairs_are_refused_before_launch_and_by_arm(adapter, sandbox):
    cidrs = tuple(f"198.51.{i // 256}.{i % 256}/32" for i in range(1001))
    spec = _spec(boot=_boot(ingress=(IngressRule(port=22, cidrs=cidrs),)))
    az = adapter()

    # [NSG limits] "NSG rules per NSG: 1,000"; the broker writes one rule per (port, address range).
    assert az.launch_limits.ingress_rules_max == 1000
    assert [p.field for p in az.launch_problems(spec)] == ["launch.allowed_cidrs"]
    with pytest.raises(ProviderRequestRejected) as refused:
        az.launch(spec)
    assert (refused.value.code, refused.value.http_status) == ("SecurityRuleCountLimitReached", 400)
    assert sandbox.network.all() == []
    assert sandbox.calls(LAUNCH) == []


def test_a_launch_the_account_cannot_make_calls_nothing(adapter, sandbox):
    with pytest.raises(ProviderRequestRejected, match="subnet_id"):
        adapter(subnet_id="").launch(_spec())

    assert sandbox.calls() == []


def test_a_boot_launch_needs_no_account_login_key(adapter, sandbox):
    handle = adapter(ssh_public_key="").launch(_spec())

    assert handle.state == InstanceState.RUNNING


def test_an_image_that_is_no_azure_image_is_a_field_problem():
    adapter = AzureAdapter(
        Credentials("azure", {"tenant_id": "t", "client_id": "c", "client_secret": "s", "subscription_id": "u"}),
        ["eastus"],
    )

    [problem] = adapter.launch_problems(_spec(boot=_boot(image="ami-0123456789abcdef0")))

    assert problem.field == "launch.image"


# ------------------------------------------------------------------------------------- idempotency, regions


def test_a_repeated_launch_creates_no_second_vm_or_security_group(adapter, sandbox):
    az = adapter()
    spec = _spec()

    first = az.launch(spec)
    again = az.launch(spec)

    assert again.instance_id == first.instance_id
    assert len(sandbox.instances()) == 1
    assert [n.name for n in sandbox.network.all()] == ["nsg-ord-alice-eastus"]
    assert (len(sandbox.calls(LAUNCH)), len(sandbox.calls(NSG_PUT))) == (1, 1)


def test_a_second_attempt_in_the_same_region_reuses_the_orders_security_group(adapter, sandbox):
    az = adapter()

    az.launch(_spec("ord-alice-a1"))
    az.launch(_spec("ord-alice-a2", zone="eastus-1"))

    assert len(sandbox.instances()) == 2
    assert len(sandbox.network.all()) == 1
    assert len(sandbox.calls(NSG_PUT)) == 1


def test_failover_to_another_region_makes_the_security_group_there(adapter, sandbox):
    az = adapter()

    az.launch(_spec("ord-alice-a1"))
    az.launch(_spec("ord-alice-a2", region="westus", zone="westus", instance_type="Standard_NC6s_v3"))

    assert [(n.name, n.location) for n in sandbox.network.all()] == [
        ("nsg-ord-alice-eastus", "eastus"),
        ("nsg-ord-alice-westus", "westus"),
    ]
    assert {(r.kind, r.region) for r in az.list_order_resources()} == {
        ("network_security_group", "eastus"),
        ("network_security_group", "westus"),
    }


# ------------------------------------------------------------------------------------------------ release


def test_release_deletes_the_orders_groups_once_their_vms_are_gone(adapter, sandbox):
    az = adapter()
    handle = az.launch(_spec())
    az.launch(_spec("ord-bob-a1"))

    in_use = az.release_order_resources("ord-alice")
    az.terminate("eastus", handle.instance_id)
    released = az.release_order_resources("ord-alice")
    again = az.release_order_resources("ord-alice")

    # ARM refuses to delete a group a NIC still uses: 400 InUseNetworkSecurityGroupCannotBeDeleted.
    assert [(r.kind, r.order_ref, r.extra["name"]) for r in in_use] == [
        ("network_security_group", "ord-alice", "nsg-ord-alice-eastus")
    ]
    assert released == [] and again == []
    assert [r.order_ref for r in az.list_order_resources()] == ["ord-bob"]


def test_listing_resources_sees_only_tagged_groups_in_the_accounts_regions(adapter, sandbox):
    adapter().launch(_spec("ord-carol-a1", region="westus3", zone="westus3-1", instance_type="Standard_NC32ads_A10_v4"))

    assert adapter(regions=["eastus"]).list_order_resources() == []
    [resource] = adapter().list_order_resources()
    assert (resource.kind, resource.region, resource.order_ref) == ("network_security_group", "westus3", "ord-carol")
    assert resource.resource_id == (
        f"/subscriptions/{SUB}/resourceGroups/broker/providers/Microsoft.Network/networkSecurityGroups"
        "/nsg-ord-carol-westus3"
    )


# -------------------------------------------------------------------------------------------------- images


def test_a_missing_default_image_fails_before_anything_is_created(adapter, sandbox):
    sandbox.faults.inject("image_missing", region="eastus")

    with pytest.raises(ImageUnavailable) as missing:
        adapter().launch(_spec())

    assert "eastus" in str(missing.value)
    assert (sandbox.instances(), sandbox.network.all()) == ([], [])
    assert sandbox.calls(LAUNCH) == [] and sandbox.calls(NSG_PUT) == []


@pytest.mark.parametrize(
    "image",
    [
        "microsoft-dsvm:ubuntu-hpc:1804:latest",  # a SKU the region does not offer
        "microsoft-dsvm:ubuntu-hpc:2204:22.04.2019010101",  # a version it does not have
        f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/images/missing",
    ],
)
def test_a_missing_buyer_image_fails_before_anything_is_created(adapter, sandbox, image):
    with pytest.raises(ImageUnavailable, match="not available in eastus"):
        adapter().launch(_spec(boot=_boot(image=image)))

    assert (sandbox.instances(), sandbox.network.all()) == ([], [])


def test_a_managed_image_in_another_region_is_unavailable_here(adapter, sandbox):
    image_id = f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/images/vllm"
    sandbox.images.add_managed_image(image_id, "westus")

    with pytest.raises(ImageUnavailable, match="eastus"):
        adapter().launch(_spec(boot=_boot(image=image_id)))

    assert sandbox.instances() == []


# ----------------------------------------------------------------------------------------- no boot, as before


def test_a_launch_without_a_boot_is_unchanged(adapter, sandbox):
    handle = adapter().launch(replace(_spec(), boot=None))
    properties = _properties(sandbox, handle.instance_id)

    assert properties["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    assert "customData" not in properties["osProfile"]
    assert "diskSizeGB" not in properties["storageProfile"]["osDisk"]
    assert properties["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": sandbox.account_options()["ssh_public_key"]}
    ]
    nic = properties["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert "networkSecurityGroup" not in nic
    assert {c.action for c in sandbox.calls()} == {"OAuth2_Token", LAUNCH, "Operations_Get", "VirtualMachines_Get"}
    assert sandbox.network.all() == []
    assert [r.outcome for r in sandbox.booter.records] == ["no_user_data"]


def test_limits_cite_microsofts_reference():
    limits = launching.LAUNCH_LIMITS

    assert (limits.user_data_max_bytes, limits.user_data_measure.value, limits.user_data_field) == (
        65535,
        "raw",
        "osProfile.customData",
    )
    assert "learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update" in limits.source
