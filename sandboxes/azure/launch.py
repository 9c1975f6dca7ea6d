"""What ARM checks in a VM create's boot fields before accepting it, answered as ARM answers each refusal.

Each check cites where Microsoft states the rule; where Microsoft documents the rule but not ARM's answer, the
answer is the one ARM's users quote in public issue reports (named beside it).

- ``osProfile.customData``: base64 that decodes to at most 65,535 bytes ("The maximum length of the binary
  array is 65535 bytes", Virtual Machines - Create Or Update, OSProfile). ARM refuses anything else with 400
  ``InvalidParameter``, target ``customData``: "Custom data in OSProfile must be in Base64 encoding and with a
  maximum length of 87380 characters." (87,380 = the base64 length of 65,535 bytes; Azure/aks-engine#1663).
- ``osProfile.linuxConfiguration.ssh.publicKeys[].keyData``: SSH-2 RSA of at least 2048 bits or Ed25519 ("Azure
  currently supports following key types", Detailed steps: Create and manage SSH keys for authentication to a
  Linux VM in Azure); anything else is 400 ``InvalidParameter`` "The value of parameter
  linuxConfiguration.ssh.publicKeys.keyData is invalid." (Azure/azure-cli#22725). ``path`` must be the admin's
  ``/home/<admin>/.ssh/authorized_keys``.
- ``storageProfile.osDisk.diskSizeGB``: at most 4,095 GiB ("This disk has a maximum capacity of 4,095 GiB",
  Introduction to Azure managed disks); the sandbox refuses more with 400 ``InvalidParameter`` (Microsoft
  publishes no text for it). Smaller than the image's disk is 409 ``OperationNotAllowed``, target
  ``osDisk.diskSizeGB``, "The specified disk size N GB is smaller than the size of the corresponding disk in the VM
  image: M GB. ..." (Azure/azure-sdk-for-python#23051).
- ``storageProfile.imageReference``: a marketplace image the location lacks is 404 ``ImageNotFound`` "The
  platform image 'p:o:s:v' is not available. Verify that all fields in the storage profile are correct."
  (Azure/azure-quickstart-templates#3622).
- ``networkInterfaceConfigurations[].properties.networkSecurityGroup.id``: a group that does not exist, or lives
  in another region, is 400 ``InvalidResourceReference``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from werkzeug.wrappers import Response

from sandboxes.azure.images import ImageCatalogue
from sandboxes.azure.network import NetworkSecurityGroups
from sandboxes.azure.wire import arm_error

CUSTOM_DATA_MAX_BYTES = 65535
CUSTOM_DATA_MAX_CHARS = 87380  # len(base64(65535 bytes))
RSA_MIN_BITS = 2048
OS_DISK_MAX_GB = 4095
KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519"})


def custom_data_refusal(os_profile: dict[str, Any]) -> Response | None:
    encoded = os_profile.get("customData")
    if encoded is None:
        return None
    if isinstance(encoded, str) and len(encoded) <= CUSTOM_DATA_MAX_CHARS:
        try:
            decoded = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            decoded = None
        if decoded is not None and len(decoded) <= CUSTOM_DATA_MAX_BYTES:
            return None
    return arm_error(
        "InvalidParameter",
        f"Custom data in OSProfile must be in Base64 encoding and with a maximum length of {CUSTOM_DATA_MAX_CHARS} "
        "characters.",
        400,
        target="customData",
    )


def custom_data(os_profile: dict[str, Any]) -> bytes:
    """The raw bytes a VM's cloud-init reads (checked by ``custom_data_refusal`` first); b"" without any."""
    encoded = os_profile.get("customData")
    return base64.b64decode(encoded) if isinstance(encoded, str) and encoded else b""


def key_refusal(os_profile: dict[str, Any]) -> Response | None:
    admin = str(os_profile.get("adminUsername") or "")
    keys = ((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get("publicKeys") or []
    for key in keys:
        path = str(key.get("path") or "")
        if path != f"/home/{admin}/.ssh/authorized_keys":
            return arm_error(
                "InvalidParameter",
                "Destination path for SSH public keys is currently limited to its default value "
                f"/home/{admin}/.ssh/authorized_keys due to a known issue in Linux provisioning agent.",
                400,
                target="linuxConfiguration.ssh.publicKeys.path",
            )
        if not key_accepted(str(key.get("keyData") or "")):
            return arm_error(
                "InvalidParameter",
                "The value of parameter linuxConfiguration.ssh.publicKeys.keyData is invalid.",
                400,
                target="linuxConfiguration.ssh.publicKeys.keyData",
            )
    return None


def key_accepted(key_data: str) -> bool:
    """An OpenSSH one-line RSA (2048 bits or more) or Ed25519 public key."""
    parts = key_data.split()
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        return False
    try:
        loaded = serialization.load_ssh_public_key(f"{parts[0]} {parts[1]}".encode())
    except Exception:  # cryptography raises ValueError or its Rust parser's own types for a malformed blob
        return False
    if isinstance(loaded, rsa.RSAPublicKey):
        return loaded.key_size >= RSA_MIN_BITS
    return isinstance(loaded, ed25519.Ed25519PublicKey)


def disk_refusal(storage: dict[str, Any], location: str, images: ImageCatalogue) -> Response | None:
    reference = storage.get("imageReference") or {}
    if images.platform_image_missing(reference, location):
        urn = ":".join(str(reference.get(k, "")) for k in ("publisher", "offer", "sku", "version"))
        return arm_error(
            "ImageNotFound",
            f"The platform image '{urn}' is not available. Verify that all fields in the storage profile are correct.",
            404,
            target="imageReference",
        )
    size = (storage.get("osDisk") or {}).get("diskSizeGB")
    if size is None:
        return None
    if not isinstance(size, int) or not 1 <= size <= OS_DISK_MAX_GB:
        return arm_error(
            "InvalidParameter",
            f"The value {size} of parameter 'osDisk.diskSizeGB' is out of range. The value must be between 1 and "
            f"{OS_DISK_MAX_GB}, inclusive.",
            400,
            target="osDisk.diskSizeGB",
        )
    image_gb = images.os_disk_gb(reference, location)
    if image_gb is not None and size < image_gb:
        return arm_error(
            "OperationNotAllowed",
            f"The specified disk size {size} GB is smaller than the size of the corresponding disk in the VM image: "
            f"{image_gb} GB. This is not allowed. Please choose equal or greater size or do not specify an explicit "
            "size.",
            409,
            target="osDisk.diskSizeGB",
        )
    return None


def nsg_ids(properties: dict[str, Any]) -> list[str]:
    """The network security groups a VM body's inline NICs name."""
    configurations = (properties.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []
    found = [((c.get("properties") or {}).get("networkSecurityGroup") or {}).get("id") for c in configurations]
    return [str(i) for i in found if i]


def nsg_refusal(
    vm_id: str, properties: dict[str, Any], location: str, groups: NetworkSecurityGroups
) -> Response | None:
    for nsg_id in nsg_ids(properties):
        nsg = groups.find(nsg_id)
        if nsg is None or nsg.location != location:
            return arm_error(
                "InvalidResourceReference",
                f"Resource {nsg_id} referenced by resource {vm_id} was not found. Please make sure that the referenced "
                "resource exists, and that both resources are in the same region.",
                400,
            )
    return None
