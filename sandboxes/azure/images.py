"""VM images in the Azure sandbox: the marketplace images ARM lists per location, and the managed images a
subscription holds, answered as ``azure-mgmt-compute``'s ``virtual_machine_images`` and ``images`` read them.

- ``GET .../locations/{loc}/publishers/{p}/artifacttypes/vmimage/offers/{o}/skus/{s}/versions`` answers a bare
  JSON array of ``{name, location, id}`` (``$top``, ``$orderby=name desc``); a publisher, offer or SKU the
  location does not have is 404 ``NotFound`` "Artifact: VMImage was not found.", which is also what ``GET
  .../versions/{version}`` answers for a missing version.
- ``GET .../resourceGroups/{rg}/providers/Microsoft.Compute/images/{name}`` answers a managed image a test added
  with ``add_managed_image``; 404 ``ResourceNotFound`` otherwise.

The catalogue's version names and OS disk sizes are the sandbox's own data, shaped like Azure's (Canonical's
Ubuntu server images have a 30 GB OS disk: "The default virtual hard disk size for the operating system (OS) is
typically 30 GB on a Linux virtual machine (VM) in Azure", Expand virtual hard disks on a Linux VM). The
Ubuntu-HPC image's 64 GB is an assumption of the sandbox: Microsoft does not publish it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from werkzeug.wrappers import Request, Response

from sandboxes.azure.wire import arm_error
from sandboxes.server import json_response

COMPUTE = "Microsoft.Compute"


@dataclass(frozen=True, slots=True)
class MarketplaceImage:
    """One marketplace SKU with its versions (oldest first) and the size of the OS disk it makes."""

    publisher: str
    offer: str
    sku: str
    versions: tuple[str, ...]
    os_disk_gb: int
    hyperv_generation: str = "V2"

    def matches(self, publisher: str, offer: str, sku: str) -> bool:
        wanted = (publisher.lower(), offer.lower(), sku.lower())
        return (self.publisher.lower(), self.offer.lower(), self.sku.lower()) == wanted


CATALOGUE: tuple[MarketplaceImage, ...] = (
    MarketplaceImage("Canonical", "ubuntu-24_04-lts", "server", ("24.04.202409120", "24.04.202502210"), 30),
    MarketplaceImage("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2", ("22.04.202502180",), 30),
    MarketplaceImage("microsoft-dsvm", "ubuntu-hpc", "2204", ("22.04.2025030701", "22.04.2025050601"), 64),
    MarketplaceImage("microsoft-dsvm", "ubuntu-hpc", "2404", ("24.04.2025050601",), 64),
)


@dataclass(frozen=True, slots=True)
class ManagedImage:
    resource_id: str
    location: str
    os_disk_gb: int


_MANAGED_ID = re.compile(
    r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/images/([^/]+)$", re.I
)


class ImageCatalogue:
    """The images every sandbox location offers, plus the managed images tests add."""

    def __init__(self, regions: list[str]):
        self.regions = regions
        self.marketplace = list(CATALOGUE)
        self._managed: dict[str, ManagedImage] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._managed.clear()
            self.marketplace = list(CATALOGUE)

    def add_managed_image(self, resource_id: str, location: str, os_disk_gb: int = 30) -> None:
        """A managed image the subscription holds in ``location`` (e.g. the buyer's own, for a launch to use)."""
        if _MANAGED_ID.match(resource_id) is None:
            raise ValueError(f"{resource_id!r} is not a Microsoft.Compute/images resource id")
        with self._lock:
            self._managed[resource_id.lower()] = ManagedImage(resource_id, location.lower(), os_disk_gb)

    def find(self, publisher: str, offer: str, sku: str) -> MarketplaceImage | None:
        return next((i for i in self.marketplace if i.matches(publisher, offer, sku)), None)

    def managed(self, resource_id: str) -> ManagedImage | None:
        with self._lock:
            return self._managed.get(resource_id.lower())

    def os_disk_gb(self, reference: dict[str, Any], location: str) -> int | None:
        """The OS disk size the image makes; None for an image the sandbox does not know (a gallery image)."""
        if reference.get("id"):
            image = self.managed(str(reference["id"]))
            return image.os_disk_gb if image is not None and image.location == location else None
        found = self.find(*(str(reference.get(k, "")) for k in ("publisher", "offer", "sku")))
        return found.os_disk_gb if found is not None else None

    def platform_image_missing(self, reference: dict[str, Any], location: str) -> bool:
        """A marketplace reference whose image or version the location does not have (a VM create refuses it)."""
        if reference.get("id") or location not in self.regions:
            return False
        found = self.find(*(str(reference.get(k, "")) for k in ("publisher", "offer", "sku")))
        version = str(reference.get("version", ""))
        return found is None or (version.lower() != "latest" and version not in found.versions)

    # -- ARM routes

    def versions(self, request: Request, args: dict[str, str]) -> Response:
        location = args["loc"].lower()
        image = self.find(args["publisher"], args["offer"], args["sku"])
        if image is None or location not in self.regions:
            return self.not_found()
        names = list(image.versions)
        if request.args.get("$orderby", "").strip().lower() == "name desc":
            names.reverse()
        top = request.args.get("$top")
        if top is not None:
            try:
                names = names[: max(0, int(top))]
            except ValueError:
                return arm_error("InvalidParameter", f"The value '{top}' of parameter '$top' is invalid.", 400)
        return json_response([self._resource(args, image, location, name) for name in names])

    def version(self, args: dict[str, str]) -> Response:
        location = args["loc"].lower()
        image = self.find(args["publisher"], args["offer"], args["sku"])
        if image is None or location not in self.regions or args["version"] not in image.versions:
            return self.not_found()
        result = self._resource(args, image, location, args["version"])
        result["properties"] = {
            "osDiskImage": {"operatingSystem": "Linux"},
            "dataDiskImages": [],
            "hyperVGeneration": image.hyperv_generation,
            "architecture": "x64",
            "automaticOSUpgradeProperties": {"automaticOSUpgradeSupported": False},
            "imageDeprecationStatus": {"imageState": "Active"},
        }
        return json_response(result)

    def managed_image(self, args: dict[str, str]) -> Response:
        resource_id = (
            f"/subscriptions/{args['sub']}/resourceGroups/{args['rg']}/providers/{COMPUTE}/images/{args['image']}"
        )
        image = self.managed(resource_id)
        if image is None:
            return arm_error(
                "ResourceNotFound",
                f"The Resource '{COMPUTE}/images/{args['image']}' under resource group '{args['rg']}' was not found.",
                404,
            )
        return json_response(
            {
                "name": args["image"],
                "id": image.resource_id,
                "type": f"{COMPUTE}/images",
                "location": image.location,
                "properties": {
                    "provisioningState": "Succeeded",
                    "hyperVGeneration": "V2",
                    "storageProfile": {
                        "osDisk": {"osType": "Linux", "osState": "Generalized", "diskSizeGB": image.os_disk_gb},
                        "dataDisks": [],
                    },
                },
            }
        )

    @staticmethod
    def not_found() -> Response:
        return arm_error("NotFound", "Artifact: VMImage was not found.", 404)

    @staticmethod
    def _resource(args: dict[str, str], image: MarketplaceImage, location: str, version: str) -> dict[str, Any]:
        return {
            "name": version,
            "location": location,
            "id": (
                f"/Subscriptions/{args['sub']}/Providers/{COMPUTE}/Locations/{location}/Publishers/{image.publisher}"
                f"/ArtifactTypes/VMImage/Offers/{image.offer}/Skus/{image.sku}/Versions/{version}"
            ),
        }
