"""What an Azure launch sends: the VM's name, image reference, tags and body (inline NIC, spot settings, OS
disk), its boot's custom data and SSH key, and the network security group that lets the order's ingress rules
in. Pure functions over plain dicts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.azure.catalog import azure_zones
from providers.azure.errors import rejected
from providers.azure.mapping import ORDER_TAG, TOKEN_TAG
from providers.launch import IngressRule, LaunchLimits, OrderResource, UserDataMeasure
from providers.types import LaunchSpec, PricingModel

VM_NAME_MAX_LENGTH = 64
VM_NAME_PREFIX = "vm-"
NETWORK_API_VERSION = "2024-05-01"  # Microsoft.Network version the inline NIC is created with
DEFAULT_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"  # a bare launch (no boot): the account's plain image
# A launch with a boot runs Microsoft's Ubuntu-HPC image, which "come[s] preconfigured with the NVIDIA GPU drivers
# and GPU compute software stack (CUDA, NCCL)" for the NC and ND sizes ("Configure and optimize VMs",
# https://learn.microsoft.com/azure/virtual-machines/configure); the URN is the one github.com/Azure/azhpc-images
# lists. "latest" lets Azure pick the newest version at create time, so no dated version is named here.
DEFAULT_GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
DEFAULT_ADMIN_USERNAME = "azureuser"
DEFAULT_OS_DISK_TYPE = "StandardSSD_LRS"  # every GPU size takes it; Premium_LRS needs an "s" size
SPOT_ANY_PRICE = -1  # Azure's "pay up to the on-demand price, never evict for price"

_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}[a-z0-9]$")


def validate_client_token(token: str) -> None:
    if not token:
        raise rejected("client_token is required for an idempotent launch")
    if not all(" " < ch <= "~" for ch in token):
        raise rejected("client_token must be printable ASCII without spaces")


def vm_name(client_token: str) -> str:
    """The VM name for a client token: the same token always names the same VM (Azure's idempotency).

    A token that is already a valid lowercase name (letters, digits, hyphens, at most 64) is used as is;
    any other is hashed. Resource names are case-insensitive in Azure, so names are kept lowercase.
    """
    validate_client_token(client_token)
    if _NAME_OK.match(client_token) and not client_token.startswith(VM_NAME_PREFIX):
        return client_token
    return VM_NAME_PREFIX + hashlib.sha256(client_token.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image as a launch names it: a marketplace URN (``publisher:offer:sku:version``, version ``latest``
    meaning the newest at create time) or the resource id of an image the account holds."""

    publisher: str = ""
    offer: str = ""
    sku: str = ""
    version: str = ""
    resource_id: str = ""

    @property
    def marketplace(self) -> bool:
        return not self.resource_id

    def reference(self) -> dict[str, str]:
        """The VM body's ``storageProfile.imageReference``."""
        if self.resource_id:
            return {"id": self.resource_id}
        return {"publisher": self.publisher, "offer": self.offer, "sku": self.sku, "version": self.version}

    def __str__(self) -> str:
        return self.resource_id or f"{self.publisher}:{self.offer}:{self.sku}:{self.version}"


def parse_image(image: str) -> ImageRef:
    """``publisher:offer:sku:version`` or a full image resource id; raises ``ProviderRequestRejected`` otherwise."""
    if image.startswith("/subscriptions/"):
        return ImageRef(resource_id=image)
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise rejected(f"image {image!r} is neither publisher:offer:sku:version nor an image resource id")
    publisher, offer, sku, version = parts
    return ImageRef(publisher=publisher, offer=offer, sku=sku, version=version)


def image_reference(image: str) -> dict[str, str]:
    """``publisher:offer:sku:version`` (a marketplace URN) or a full image resource id -> ``imageReference``."""
    return parse_image(image).reference()


_MANAGED_IMAGE = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/images/(?P<name>[^/]+)$",
    re.IGNORECASE,
)


def managed_image_parts(resource_id: str) -> tuple[str, str, str] | None:
    """(subscription, resource group, name) of a managed image id; None for any other resource id."""
    match = _MANAGED_IMAGE.match(resource_id)
    return (match["sub"], match["rg"], match["name"]) if match else None


def vm_tags(spec: LaunchSpec) -> dict[str, str]:
    """The caller's tags plus the broker's; the broker's order and token tags win over a caller tag."""
    return {**spec.tags, ORDER_TAG: spec.order_ref, TOKEN_TAG: spec.client_token}


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """Account options a VM body needs beyond the spec. ``gpu_image`` is what a launch with a boot runs when the
    buyer names no image of their own; ``image`` is what a bare launch (no boot) runs."""

    subnet_id: str
    ssh_public_key: str
    admin_username: str = DEFAULT_ADMIN_USERNAME
    image: str = DEFAULT_IMAGE
    os_disk_type: str = DEFAULT_OS_DISK_TYPE
    public_ip: bool = True
    gpu_image: str = DEFAULT_GPU_IMAGE


@dataclass(frozen=True, slots=True)
class BootParts:
    """What a launch with a boot adds to the VM body, in Azure's own fields: the image it was checked to run,
    ``osProfile.customData`` (the boot script, base64), the login user and the keys ARM installs for it, the
    order's network security group on the NIC, and the OS disk size."""

    image: ImageRef
    custom_data: str
    admin_username: str
    public_keys: tuple[str, ...]
    nsg_id: str
    disk_gb: int | None = None


def vm_body(spec: LaunchSpec, name: str, settings: LaunchSettings, boot: BootParts | None = None) -> dict[str, Any]:
    """The ``begin_create_or_update`` body: one VM with an inline NIC (deleted with it). Without ``boot`` the
    account's image and login key; with it the boot's image, custom data, keys, disk and firewall."""
    check_launchable(spec, settings, with_boot=boot is not None)
    ip_configuration: dict[str, Any] = {"subnet": {"id": settings.subnet_id}, "primary": True}
    if settings.public_ip:
        ip_configuration["publicIPAddressConfiguration"] = {
            "name": f"{name}-ip",
            "sku": {"name": "Standard"},
            "properties": {"deleteOption": "Delete"},
        }
    admin = boot.admin_username if boot is not None else settings.admin_username
    keys = boot.public_keys if boot is not None else (settings.ssh_public_key,)
    os_disk: dict[str, Any] = {
        "createOption": "FromImage",
        "deleteOption": "Delete",
        "managedDisk": {"storageAccountType": settings.os_disk_type},
    }
    os_profile: dict[str, Any] = {
        "computerName": name,
        "adminUsername": admin,
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            # ARM places each key at this path, the only one it accepts (the admin's authorized_keys).
            "ssh": {"publicKeys": [{"path": authorized_keys_path(admin), "keyData": key} for key in keys]},
        },
    }
    nic: dict[str, Any] = {
        "primary": True,
        "deleteOption": "Delete",
        "ipConfigurations": [{"name": "ipconfig1", "properties": ip_configuration}],
    }
    image = parse_image(spec.image or settings.image) if boot is None else boot.image
    if boot is not None:
        os_profile["customData"] = boot.custom_data
        nic["networkSecurityGroup"] = {"id": boot.nsg_id}
        if boot.disk_gb is not None:
            os_disk["diskSizeGB"] = boot.disk_gb
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": spec.instance_type},
        "storageProfile": {"imageReference": image.reference(), "osDisk": os_disk},
        "osProfile": os_profile,
        "networkProfile": {
            "networkApiVersion": NETWORK_API_VERSION,
            "networkInterfaceConfigurations": [{"name": f"{name}-nic", "properties": nic}],
        },
    }
    if spec.pricing_model is PricingModel.SPOT:
        properties["priority"] = "Spot"
        # Delete, not Deallocate: a deallocated spot VM keeps its quota and disk bills for a machine nobody runs.
        properties["evictionPolicy"] = "Delete"
        max_price = float(spec.max_price) if spec.max_price is not None else SPOT_ANY_PRICE
        properties["billingProfile"] = {"maxPrice": max_price}
    body: dict[str, Any] = {"location": spec.region, "tags": vm_tags(spec), "properties": properties}
    zones = azure_zones(spec.region, spec.zone)
    if zones:
        body["zones"] = zones
    return body


def check_launchable(spec: LaunchSpec, settings: LaunchSettings, *, with_boot: bool) -> None:
    """Raise ``ProviderRequestRejected`` for a launch the account's options cannot make, before any call."""
    if spec.pricing_model is PricingModel.RESERVED:
        raise rejected("reserved capacity cannot be launched on demand")
    if not settings.subnet_id:
        raise rejected("options.subnet_id is required to launch (the subnet the VM's NIC joins)")
    if not with_boot and not settings.ssh_public_key:
        raise rejected("options.ssh_public_key is required to launch (Linux VMs need a login key)")


def authorized_keys_path(admin_username: str) -> str:
    return f"/home/{admin_username}/.ssh/authorized_keys"


# ------------------------------------------------------------------------------------------------ boot
#
# Every figure below is from Microsoft's own reference; the tests repeat each source beside its assertion.

# "Specifies a base-64 encoded string of custom data. The base-64 encoded string is decoded to a binary array
# ... The maximum length of the binary array is 65535 bytes." (Virtual Machines - Create Or Update, OSProfile)
CUSTOM_DATA_MAX_BYTES = 65535
CUSTOM_DATA_SOURCE = (
    "Azure Compute REST API, Virtual Machines - Create Or Update, OSProfile.customData: at most 65535 bytes once "
    "decoded, https://learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update"
)
# "This disk has a maximum capacity of 4,095 GiB." (Introduction to Azure managed disks, "OS disk"). The REST
# reference's older "cannot be larger than 1023" is reported stale (Azure/azure-rest-api-specs#35664).
OS_DISK_MAX_GB = 4095
# "NSG rules per NSG: 1,000" (Azure subscription and service limits, Networking limits - Azure Resource
# Manager); the broker writes one rule per (port, address range), so that is also the most one launch may open.
NSG_RULES_MAX = 1000
# "Priority: a number between 100 and 4096" (Network security groups overview, Security rules).
NSG_PRIORITY_MIN = 100
NSG_PRIORITY_MAX = 4096
# "Azure currently supports following key types: SSH-2 RSA with a minimum length of 2048 bits; ED25519 keys
# with a fixed length of 256 bits" (Detailed steps: Create and manage SSH keys for authentication to a Linux VM
# in Azure). Other keys (ECDSA, security keys) reach the machine through the boot script alone.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519"})
RSA_MIN_BITS = 2048

LAUNCH_LIMITS = LaunchLimits(
    user_data_max_bytes=CUSTOM_DATA_MAX_BYTES,
    user_data_measure=UserDataMeasure.RAW,
    user_data_field="osProfile.customData",
    source=CUSTOM_DATA_SOURCE,
    disk_gb_min=1,
    disk_gb_max=OS_DISK_MAX_GB,
    ingress_rules_max=NSG_RULES_MAX,
    native_key_types=NATIVE_KEY_TYPES,
)

NSG_PREFIX = "nsg-"
NSG_NAME_MAX = 80
_NSG_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
RESOURCE_KIND_NSG = "network_security_group"


def nsg_name(order_ref: str, region: str) -> str:
    """The order's network security group in ``region``: one per (order, region), named so a repeat finds it.

    NSG names take letters, digits, ``_``, ``.`` and ``-`` up to 80 characters; an order reference outside that
    is hashed.
    """
    readable = f"{NSG_PREFIX}{order_ref}-{region}"
    if len(readable) <= NSG_NAME_MAX and _NSG_NAME_OK.match(readable):
        return readable
    return f"{NSG_PREFIX}{hashlib.sha256(order_ref.encode()).hexdigest()[:40]}-{region}"[:NSG_NAME_MAX]


def nsg_id(subscription_id: str, resource_group: str, name: str) -> str:
    return (
        f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}/providers/Microsoft.Network"
        f"/networkSecurityGroups/{name}"
    )


def security_rules(ingress: Iterable[IngressRule]) -> list[dict[str, Any]]:
    """One inbound Allow rule per (port, address range), prioritised in a stable order from 100 up."""
    pairs = sorted({(rule.protocol, rule.port, cidr) for rule in ingress for cidr in rule.cidrs})
    if len(pairs) > NSG_PRIORITY_MAX - NSG_PRIORITY_MIN + 1:
        raise rejected(f"{len(pairs)} inbound rules do not fit the priorities {NSG_PRIORITY_MIN}-{NSG_PRIORITY_MAX}")
    return [
        {
            "name": f"broker-{protocol}-{port}-{index}",
            "properties": {
                "description": f"gpu-broker: {protocol} {port} from {cidr}",
                "protocol": protocol.capitalize(),
                "sourceAddressPrefix": cidr,
                "sourcePortRange": "*",
                "destinationAddressPrefix": "*",
                "destinationPortRange": str(port),
                "access": "Allow",
                "priority": NSG_PRIORITY_MIN + index,
                "direction": "Inbound",
            },
        }
        for index, (protocol, port, cidr) in enumerate(pairs)
    ]


def nsg_body(spec: LaunchSpec) -> dict[str, Any]:
    """The order's network security group for ``spec.region``: the boot's ingress, tagged with the order."""
    ingress = spec.boot.ingress if spec.boot is not None else ()
    return {
        "location": spec.region,
        "tags": {ORDER_TAG: spec.order_ref},
        "properties": {"securityRules": security_rules(ingress)},
    }


_RULE_FIELDS = (
    "protocol",
    "sourceAddressPrefix",
    "sourcePortRange",
    "destinationAddressPrefix",
    "destinationPortRange",
    "access",
    "priority",
    "direction",
)


def nsg_matches(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Does an existing NSG already hold the wanted rules and order tag (so a repeat need not write it)?"""

    def rules(nsg: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        found = (nsg.get("properties") or {}).get("securityRules") or []
        return sorted(tuple(str((r.get("properties") or {}).get(f, "")) for f in _RULE_FIELDS) for r in found)

    tags = current.get("tags") or {}
    return tags.get(ORDER_TAG) == (wanted.get("tags") or {}).get(ORDER_TAG) and rules(current) == rules(wanted)


def order_resource(nsg: Mapping[str, Any]) -> OrderResource | None:
    """A network security group (``network_security_groups.list``) -> ``OrderResource``; None without an order tag."""
    order_ref = (nsg.get("tags") or {}).get(ORDER_TAG)
    if not order_ref:
        return None
    return OrderResource(
        kind=RESOURCE_KIND_NSG,
        resource_id=str(nsg.get("id", "")),
        region=str(nsg.get("location", "")),
        order_ref=str(order_ref),
        extra={
            "name": str(nsg.get("name", "")),
            "provisioning_state": str((nsg.get("properties") or {}).get("provisioningState", "")),
        },
    )
