"""The Azure sandbox on the wire for what a launch carries: network security groups (Microsoft.Network), VM images,
the boot fields of a VM create, and booting a VM from its custom data.

Sources (Microsoft's own pages unless named): Virtual Machines - Create Or Update
(https://learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update); Network security groups overview
(https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview); Azure subscription and service
limits, Networking limits (https://learn.microsoft.com/azure/azure-resource-manager/management/azure-subscription-service-limits);
Detailed steps: Create and manage SSH keys for authentication to a Linux VM in Azure
(https://learn.microsoft.com/azure/virtual-machines/linux/create-ssh-keys-detailed). ARM's answers that Microsoft does
not document are as ARM's users quote them in public issue reports, named beside each assertion.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from providers.boot import render_boot_script
from providers.launch import BootSpec, IngressRule
from sandboxes.azure.app import AzureSandbox
from sandboxes.boot import BootMode
from tests.sshkeys import ecdsa_public, ed25519_public, parsed

SUB = "00000000-0000-0000-0000-0000000005b0"
RG = f"/subscriptions/{SUB}/resourceGroups/broker"
NSGS = f"{RG}/providers/Microsoft.Network/networkSecurityGroups"
VMS = f"{RG}/providers/Microsoft.Compute/virtualMachines"
IMAGES = f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/publishers"
API = {"api-version": "2024-07-01"}
NET_API = {"api-version": "2024-05-01"}
KEYS_PATH = "/home/azureuser/.ssh/authorized_keys"


@pytest.fixture
def sandbox(azure_server) -> AzureSandbox:
    azure_server.reset()
    azure_server.create_seconds = 0
    azure_server.booter.mode = BootMode.HOLD
    yield azure_server
    azure_server.reset()


def _rule(name: str, priority: int, prefix: str = "203.0.113.0/24", port: str = "22") -> dict:
    return {
        "name": name,
        "properties": {
            "protocol": "Tcp",
            "sourceAddressPrefix": prefix,
            "sourcePortRange": "*",
            "destinationAddressPrefix": "*",
            "destinationPortRange": port,
            "access": "Allow",
            "priority": priority,
            "direction": "Inbound",
        },
    }


def _nsg(rules: list[dict] | None = None, location: str = "eastus") -> dict:
    return {
        "location": location,
        "tags": {"broker:order": "ord-1"},
        "properties": {"securityRules": [_rule("ssh", 100)] if rules is None else rules},
    }


def _vm(*, custom_data: str | None = None, key: str | None = None, nsg: str | None = None, **storage) -> dict:
    os_profile = {
        "computerName": "vm1",
        "adminUsername": "azureuser",
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            "ssh": {"publicKeys": [{"path": storage.pop("path", KEYS_PATH), "keyData": key or ed25519_public()}]},
        },
    }
    if custom_data is not None:
        os_profile["customData"] = custom_data
    nic: dict = {"ipConfigurations": [{"name": "ip", "properties": {"subnet": {"id": "/s"}}}]}
    if nsg is not None:
        nic["networkSecurityGroup"] = {"id": nsg}
    image = storage.pop(
        "image", {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
    )
    os_disk = {"createOption": "FromImage", **storage}
    return {
        "location": "eastus",
        "zones": ["1"],
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
            "storageProfile": {"imageReference": image, "osDisk": os_disk},
            "osProfile": os_profile,
            "networkProfile": {
                "networkApiVersion": "2024-05-01",
                "networkInterfaceConfigurations": [{"name": "vm1-nic", "properties": nic}],
            },
        },
    }


def _error(response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error.get("target")


# ------------------------------------------------------------------------------------- security groups


def test_a_security_group_put_is_a_long_running_operation_polled_back_here(arm, sandbox):
    created = arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(), timeout=5)
    status = arm.get(created.headers["Azure-AsyncOperation"], timeout=5).json()
    group = arm.get(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5).json()
    replaced = arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(), timeout=5)

    assert (created.status_code, created.json()["properties"]["provisioningState"]) == (201, "Updating")
    assert created.headers["Azure-AsyncOperation"].startswith(
        f"{sandbox.url}/subscriptions/{SUB}/providers/Microsoft.Network/locations/eastus/operations/"
    )
    assert status["status"] == "Succeeded"
    assert group["id"] == f"{NSGS}/nsg-1"
    assert (group["properties"]["provisioningState"], group["tags"]) == ("Succeeded", {"broker:order": "ord-1"})
    assert [r["name"] for r in group["properties"]["securityRules"]] == ["ssh"]
    # [NSG overview] "Default security rules": three inbound, three outbound, priorities 65000-65500.
    assert len(group["properties"]["defaultSecurityRules"]) == 6
    assert replaced.status_code == 200


def test_groups_are_listed_with_their_tags(arm, sandbox):
    arm.put(f"{sandbox.url}{NSGS}/nsg-a", params=NET_API, json=_nsg(), timeout=5)
    arm.put(f"{sandbox.url}{NSGS}/nsg-b", params=NET_API, json={**_nsg(), "tags": {}}, timeout=5)

    listed = arm.get(f"{sandbox.url}{NSGS}", params=NET_API, timeout=5).json()

    assert [(g["name"], g["tags"]) for g in listed["value"]] == [("nsg-a", {"broker:order": "ord-1"}), ("nsg-b", {})]
    assert "nextLink" not in listed


def test_a_delete_is_202_with_an_operation_and_204_when_the_group_is_gone(arm, sandbox):
    arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(), timeout=5)

    deleted = arm.delete(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5)
    status = arm.get(deleted.headers["Azure-AsyncOperation"], timeout=5).json()
    again = arm.delete(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5)

    assert (deleted.status_code, status["status"], again.status_code) == (202, "Succeeded", 204)
    assert arm.get(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5).status_code == 404


def test_a_group_on_a_vms_nic_cannot_be_deleted(arm, sandbox):
    arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(), timeout=5)
    arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(nsg=f"{NSGS}/nsg-1"), timeout=5)

    refused = arm.delete(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5)
    arm.delete(f"{sandbox.url}{VMS}/vm1", params=API, timeout=5)
    deleted = arm.delete(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, timeout=5)

    # ARM: 400 InUseNetworkSecurityGroupCannotBeDeleted, naming the NIC (Azure/RDS-Templates#695).
    assert _error(refused)[:2] == (400, "InUseNetworkSecurityGroupCannotBeDeleted")
    assert f"{RG}/providers/Microsoft.Network/networkInterfaces/vm1-nic" in refused.json()["error"]["message"]
    assert deleted.status_code == 202


@pytest.mark.parametrize(
    ("rules", "code"),
    [
        ([_rule("r", 99)], "SecurityRuleInvalidPriority"),  # [NSG overview] "a number between 100 and 4096"
        ([_rule("r", 4097)], "SecurityRuleInvalidPriority"),
        ([_rule("a", 100), _rule("b", 100)], "SecurityRuleConflict"),
        ([_rule("r", 100, prefix="203.0.113.0/33")], "SecurityRuleInvalidAddressPrefix"),
        ([_rule("r", 100, port="70000")], "SecurityRuleInvalidPortRange"),
        # [Networking limits] "NSG rules per NSG: 1,000"; the answer as quoted in Azure/azure-rest-api-specs#3003.
        ([_rule(f"r{i}", 100 + i) for i in range(1001)], "SecurityRuleCountLimitReached"),
    ],
)
def test_rules_arm_refuses(arm, sandbox, rules, code):
    refused = arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(rules), timeout=5)

    assert _error(refused)[:2] == (400, code)
    assert sandbox.network.all() == []


def test_a_thousand_rules_are_accepted(arm, sandbox):
    rules = [_rule(f"r{i}", 100 + i, prefix=f"198.51.{i // 256}.{i % 256}/32") for i in range(1000)]

    created = arm.put(f"{sandbox.url}{NSGS}/nsg-1", params=NET_API, json=_nsg(rules), timeout=5)

    assert created.status_code == 201


def test_a_vm_naming_a_missing_group_or_one_in_another_region_is_refused(arm, sandbox):
    arm.put(f"{sandbox.url}{NSGS}/nsg-west", params=NET_API, json=_nsg(location="westus"), timeout=5)

    missing = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(nsg=f"{NSGS}/nope"), timeout=5)
    elsewhere = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(nsg=f"{NSGS}/nsg-west"), timeout=5)

    assert _error(missing)[:2] == _error(elsewhere)[:2] == (400, "InvalidResourceReference")
    assert sandbox.instances() == []


# ------------------------------------------------------------------------------------------- boot fields


def test_custom_data_of_65535_bytes_is_accepted_and_one_more_is_refused(arm, sandbox):
    fits = base64.b64encode(b"x" * 65535).decode()
    over = base64.b64encode(b"x" * 65536).decode()

    accepted = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(custom_data=fits), timeout=5)
    refused = arm.put(f"{sandbox.url}{VMS}/vm2", params=API, json=_vm(custom_data=over), timeout=5)
    garbled = arm.put(f"{sandbox.url}{VMS}/vm3", params=API, json=_vm(custom_data="#!/bin/bash"), timeout=5)

    # [VM REST] "The maximum length of the binary array is 65535 bytes" (decoded); len(base64(65535 bytes)) = 87380.
    assert (accepted.status_code, len(fits)) == (201, 87380)
    # ARM's refusal as quoted in Azure/aks-engine#1663.
    assert _error(refused) == _error(garbled) == (400, "InvalidParameter", "customData")
    assert refused.json()["error"]["message"] == (
        "Custom data in OSProfile must be in Base64 encoding and with a maximum length of 87380 characters."
    )
    assert [v.instance_id for v in sandbox.instances()] == ["vm1"]


def test_a_vms_custom_data_is_never_returned(arm, sandbox):
    arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(custom_data="IyEvYmluL2Jhc2gK"), timeout=5)

    read = arm.get(f"{sandbox.url}{VMS}/vm1", params=API, timeout=5).json()
    listed = arm.get(f"{sandbox.url}{VMS}", params=API, timeout=5).json()["value"][0]

    assert "customData" not in read["properties"]["osProfile"]
    assert "customData" not in listed["properties"]["osProfile"]
    assert sandbox.vm_request("vm1")["properties"]["osProfile"]["customData"] == "IyEvYmluL2Jhc2gK"


def _rsa_1024() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()  # noqa: S505 - the weak key ARM refuses
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


@pytest.mark.parametrize(
    ("key", "path", "target"),
    [
        # [SSH keys] RSA of 2048 bits or more and Ed25519 only; ARM's answer as quoted in Azure/azure-cli#22725.
        (ecdsa_public(), KEYS_PATH, "linuxConfiguration.ssh.publicKeys.keyData"),
        (_rsa_1024(), KEYS_PATH, "linuxConfiguration.ssh.publicKeys.keyData"),
        ("ssh-ed25519 AAAA", KEYS_PATH, "linuxConfiguration.ssh.publicKeys.keyData"),
        (ed25519_public(), "/root/.ssh/authorized_keys", "linuxConfiguration.ssh.publicKeys.path"),
    ],
)
def test_keys_arm_refuses(arm, sandbox, key, path, target):
    refused = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(key=key, path=path), timeout=5)

    assert _error(refused) == (400, "InvalidParameter", target)


@pytest.mark.parametrize(
    ("disk", "status", "code"),
    [
        (4096, 400, "InvalidParameter"),  # [Disks] "a maximum capacity of 4,095 GiB"
        (32, 409, "OperationNotAllowed"),  # below the image's disk (Azure/azure-sdk-for-python#23051)
    ],
)
def test_os_disk_sizes_arm_refuses(arm, sandbox, disk, status, code):
    refused = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(diskSizeGB=disk), timeout=5)
    accepted = arm.put(f"{sandbox.url}{VMS}/vm2", params=API, json=_vm(diskSizeGB=4095), timeout=5)

    assert _error(refused) == (status, code, "osDisk.diskSizeGB")
    assert accepted.status_code == 201


def test_a_vm_from_a_platform_image_the_region_lacks_is_refused(arm, sandbox):
    image = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "1804", "version": "latest"}

    refused = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(image=image), timeout=5)

    # ARM's answer as quoted in Azure/azure-quickstart-templates#3622.
    assert _error(refused) == (404, "ImageNotFound", "imageReference")
    assert "microsoft-dsvm:ubuntu-hpc:1804:latest" in refused.json()["error"]["message"]


# ------------------------------------------------------------------------------------------------ images


def test_image_versions_are_a_bare_array_newest_first(arm, sandbox):
    listed = arm.get(
        f"{sandbox.url}{IMAGES}/microsoft-dsvm/artifacttypes/vmimage/offers/ubuntu-hpc/skus/2204/versions",
        params={**API, "$top": "1", "$orderby": "name desc"},
        timeout=5,
    ).json()
    version = arm.get(
        f"{sandbox.url}{IMAGES}/microsoft-dsvm/artifacttypes/vmimage/offers/ubuntu-hpc/skus/2204/versions/"
        f"{listed[0]['name']}",
        params=API,
        timeout=5,
    ).json()

    assert [(v["name"], v["location"]) for v in listed] == [("22.04.2025050601", "eastus")]
    assert version["properties"]["osDiskImage"] == {"operatingSystem": "Linux"}


def test_a_missing_image_is_artifact_not_found_and_so_is_an_image_missing_fault(arm, sandbox):
    versions = f"{IMAGES}/microsoft-dsvm/artifacttypes/vmimage/offers/ubuntu-hpc/skus/2204/versions"
    nope = f"{IMAGES}/microsoft-dsvm/artifacttypes/vmimage/offers/nope/skus/x/versions"
    missing = arm.get(f"{sandbox.url}{nope}", params=API, timeout=5)
    sandbox.faults.inject("image_missing", region="eastus")
    faulted = arm.get(f"{sandbox.url}{versions}", params=API, timeout=5)
    westus = arm.get(f"{sandbox.url}{versions.replace('/eastus/', '/westus/')}", params=API, timeout=5)

    # ARM's answer for an image a location lacks, as quoted in danielsollondon/azvmimagebuilder#80.
    assert _error(missing)[:2] == _error(faulted)[:2] == (404, "NotFound")
    assert missing.json()["error"]["message"] == "Artifact: VMImage was not found."
    assert westus.status_code == 200


# --------------------------------------------------------------------------------------------------- boot


def _script() -> str:
    boot = BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_sandbox-boot-token-0123456789abcdefghijklmnopqrstu",
        agent_sha256="ef" * 32,
        ssh_keys=parsed(ed25519_public()),
        ingress=(IngressRule(port=22, cidrs=("203.0.113.0/24",)),),
    )
    return base64.b64encode(render_boot_script(boot, login_user="azureuser")).decode()


def test_a_vm_boots_its_lease_agent_once_it_runs_and_halts_when_deleted(arm, sandbox):
    sandbox.create_seconds = 3600
    arm.put(f"{sandbox.url}{VMS}/slow", params=API, json=_vm(custom_data=_script()), timeout=5)
    sandbox.create_seconds = 0
    arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm(custom_data=_script()), timeout=5)
    arm.put(f"{sandbox.url}{VMS}/vm2", params=API, json=_vm(), timeout=5)

    running = arm.get(f"{sandbox.url}{VMS}/vm1", params={**API, "$expand": "instanceView"}, timeout=5).json()
    machine = sandbox.booter.machine("vm1")
    arm.delete(f"{sandbox.url}{VMS}/vm1", params=API, timeout=5)

    assert "PowerState/running" in [s["code"] for s in running["properties"]["instanceView"]["statuses"]]
    assert machine.lease["boot_token"] == "bt_sandbox-boot-token-0123456789abcdefghijklmnopqrstu"
    assert [g.name for g in machine.executor.gpus()] == ["Tesla T4"]
    # The VM still creating has not booted; the one without custom data had nothing to start.
    assert sorted((r.instance_id, r.outcome) for r in sandbox.booter.records) == [
        ("vm1", "booted"),
        ("vm2", "no_user_data"),
    ]
    with pytest.raises(KeyError):
        sandbox.booter.machine("vm1")
