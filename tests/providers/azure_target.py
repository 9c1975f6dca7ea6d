"""The Azure adapter under the contract suite."""

from __future__ import annotations

import base64
from typing import Any

from providers.azure.adapter import AzureAdapter
from providers.types import Credentials, InstanceHandle
from sandboxes.azure.app import AzureSandbox, start_azure_sandbox
from sandboxes.azure.launch import nsg_ids
from sandboxes.azure.network import ingress_pairs
from tests.providers.contract import ContractTarget, LaunchedView

KIND = "azure"
REGIONS = ["eastus", "southcentralus", "westus", "westus3"]
ORDER_TAG = "broker:order"


def start_sandbox() -> AzureSandbox:
    return start_azure_sandbox()


def launched_view(sandbox: AzureSandbox, handle: InstanceHandle) -> LaunchedView:
    """What the sandbox keeps of the VM's create request in ARM's own shape: the image reference, the OS disk
    size, ``osProfile.customData`` decoded, the keys of ``linuxConfiguration.ssh.publicKeys``, and the rules and
    tags of the network security groups its NICs name."""
    properties = sandbox.vm_request(handle.instance_id)["properties"]
    storage = properties["storageProfile"]
    reference = storage["imageReference"]
    image = reference.get("id") or ":".join(reference[k] for k in ("publisher", "offer", "sku", "version"))
    os_profile = properties["osProfile"]
    keys = os_profile["linuxConfiguration"]["ssh"]["publicKeys"]
    ingress: set[tuple[int, str]] = set()
    tags: list[str] = []
    for nsg_id in nsg_ids(properties):
        nsg = sandbox.network_security_group(nsg_id)
        assert nsg is not None, f"{handle.instance_id} names {nsg_id}, which the sandbox does not hold"
        ingress |= ingress_pairs(nsg)
        tags.append(nsg.tags.get(ORDER_TAG, ""))
    return LaunchedView(
        image=image,
        disk_gb=storage["osDisk"].get("diskSizeGB"),
        user_data=base64.b64decode(os_profile.get("customData", "")),
        public_keys=[key["keyData"] for key in keys],
        ingress=ingress,
        resource_tags=tags,
    )


def target(sandbox: AzureSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> AzureAdapter:
        values = dict(sandbox.demo_credentials)
        values["client_id"] = "contract-app" if valid else "bad-app-0001"
        credentials = Credentials(kind=KIND, values=values, endpoint_url=sandbox.url)
        return AzureAdapter(credentials, REGIONS, {**sandbox.account_options(), "polling_interval": "0.02", **options})

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=REGIONS,
        launch_action="VirtualMachines_CreateOrUpdate",
        read_action="ResourceSkus_List",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
        launched=lambda handle: launched_view(sandbox, handle),
        extra={"start_action": "VirtualMachines_Start"},
    )
