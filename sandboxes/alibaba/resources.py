"""What the ECS sandbox keeps besides instances: public and custom images, the VPC and vSwitches of each region,
SSH key pairs and security groups with their rules and tags, all in the ECS API's own field names and formats.

Each operation answers as the ECS 2014-05-26 API reference describes it (the page is named at each handler).
Every figure the sandbox refuses on is the documented one:

- ImportKeyPair: rsa, dsa, ssh-rsa, ssh-dss and ecdsa keys only (``InvalidPublicKeyBody.Malformed``), names of
  2-128 characters starting with a letter, unique per region (``KeyPair.AlreadyExist``), 500 per region;
- DeleteKeyPairs: a key pair bound to an instance is not deleted
  (``InvalidParameter.KeypairAlreadyAttachedInstance``);
- AuthorizeSecurityGroup: at most 200 inbound rules per group (``AuthorizationLimitExceed``, 403); a rule the group
  already has is accepted and not added again; ``Permissions.N`` from 1 to 100 per call;
- DeleteSecurityGroup: a group an instance is still in answers ``DependencyViolation`` (403);
- DescribeImages: the newest build of a family is the one with the latest ``CreationTime``; an ``image_missing``
  fault makes the lookup answer what ECS answers for an image it does not have: no images.

Security groups and vSwitches the sandbox did not create are taken on trust by RunInstances (a seller's own
``security_group_id`` or ``vswitch_id`` option needs no set-up), as before key pairs and groups existed here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.records import (
    IMAGE_STATUSES,
    PUBLIC_IMAGES,
    Binding,
    KeyPair,
    SandboxImage,
    SecurityGroup,
    VSwitch,
    _now,
)
from sandboxes.alibaba.security import SecurityHandlers
from sandboxes.alibaba.wire import WireError
from sandboxes.faults import IMAGE_ACTION, FaultKind, FaultRegistry


class EcsResources(SecurityHandlers):
    """Images, vSwitches, key pairs and security groups of the ECS sandbox's regions.

    ``regions`` maps region -> (local name, zones, instance id prefix), as the sandbox's ``REGIONS``;
    ``bindings(region)`` answers what the region's live instances hold, for the "in use" refusals. Thread-safe:
    one lock guards this state; ``bindings`` takes the sandbox's lock, so it is only called without this one
    (the sandbox takes its lock first and this one second, never the other way round).
    """

    def __init__(
        self,
        regions: Mapping[str, tuple[str, tuple[str, ...], str]],
        faults: FaultRegistry,
        bindings: Callable[[str], list[Binding]],
    ):
        self._regions = regions
        self._faults = faults
        self._bindings = bindings
        self._lock = threading.Lock()
        self._vswitches = {
            region: tuple(
                VSwitch(f"vsw-sandbox{prefix}{zone[-1]}", f"vpc-sandbox{prefix}", zone, f"172.16.{16 * n}.0/20")
                for n, zone in enumerate(zones)
            )
            for region, (_, zones, prefix) in regions.items()
        }
        self._key_pairs: dict[tuple[str, str], KeyPair] = {}
        self._groups: dict[str, SecurityGroup] = {}
        self._deleted_groups: set[str] = set()
        self._group_tokens: dict[tuple[str, str], tuple[str, str]] = {}
        self._custom_images: dict[tuple[str, str], SandboxImage] = {}
        self._retired_images: set[str] = set()

    def reset(self) -> None:
        with self._lock:
            self._key_pairs.clear()
            self._groups.clear()
            self._deleted_groups.clear()
            self._group_tokens.clear()
            self._custom_images.clear()
            self._retired_images.clear()

    # ------------------------------------------------------------------------------ for RunInstances and tests

    def add_image(self, region: str, image_id: str, *, size_gb: int = 20, name: str = "") -> None:
        """A custom image (ImageOwnerAlias ``self``) in one region, as a buyer's own image would be."""
        image = SandboxImage(image_id, name or image_id, "", "Ubuntu  22.04 64位", size_gb, _now(), owner="self")
        with self._lock:
            self._custom_images[(region, image_id)] = image

    def retire_image(self, image_id: str) -> None:
        """Withdraw a public build, as Alibaba retires dated builds: DescribeImages no longer lists it and
        RunInstances answers ``InvalidImageId.NotFound``. Restored by ``reset()``."""
        if not any(i.image_id == image_id for i in PUBLIC_IMAGES):
            raise ValueError(f"unknown public image {image_id!r}")
        with self._lock:
            self._retired_images.add(image_id)

    def image(self, region: str, image_id: str) -> SandboxImage | None:
        return next((i for i in self.images(region) if i.image_id == image_id), None)

    def images(self, region: str) -> list[SandboxImage]:
        with self._lock:
            custom = [i for (r, _), i in self._custom_images.items() if r == region]
            retired = set(self._retired_images)
        return [*(i for i in PUBLIC_IMAGES if i.image_id not in retired), *custom]

    def vswitch(self, region: str, vswitch_id: str) -> VSwitch | None:
        return next((v for v in self._vswitches.get(region, ()) if v.vswitch_id == vswitch_id), None)

    def vswitches(self, region: str) -> list[VSwitch]:
        """The region's default vSwitch in each zone, all in the region's one VPC."""
        return list(self._vswitches.get(region, ()))

    def key_pair(self, region: str, name: str) -> KeyPair | None:
        with self._lock:
            return self._key_pairs.get((region, name))

    def group(self, group_id: str) -> SecurityGroup | None:
        with self._lock:
            return self._groups.get(group_id)

    def group_deleted(self, group_id: str) -> bool:
        with self._lock:
            return group_id in self._deleted_groups

    def groups(self, region: str | None = None) -> list[SecurityGroup]:
        with self._lock:
            return [g for g in self._groups.values() if region is None or g.region == region]

    def key_pairs(self, region: str | None = None) -> list[KeyPair]:
        with self._lock:
            return [k for (r, _), k in self._key_pairs.items() if region is None or r == region]

    # ------------------------------------------------------------------------------------------------- images

    def describe_images(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeImages: ImageId (comma-separated), ImageFamily, ImageName (fuzzy), ImageOwnerAlias, OSType,
        Status (default Available) and InstanceType filters; PageNumber/PageSize pages (at most 100)."""
        instance_type = params.get("InstanceType") or ""
        fault = self._faults.take(
            IMAGE_ACTION, [instance_type] if instance_type else [], None, kinds={FaultKind.IMAGE_MISSING}, region=region
        )
        ids = {i for i in (params.get("ImageId") or "").split(",") if i}
        owner = params.get("ImageOwnerAlias") or ""
        if owner and owner not in ("system", "self", "others", "marketplace"):
            raise WireError("InvalidImageOwnerAlias.ValueNotSupported", "The ImageOwnerAlias is not valid.", 400)
        statuses = {s for s in (params.get("Status") or "Available").split(",") if s}
        if "ALL" in statuses:
            statuses = set(IMAGE_STATUSES)
        name = params.get("ImageName") or ""
        os_type = (params.get("OSType") or "").lower()
        matches = [
            image
            for image in self.images(region)
            if (not ids or image.image_id in ids)
            and (not params.get("ImageFamily") or image.family == params["ImageFamily"])
            and (not owner or image.owner == owner)
            and (not name or name.lower() in image.name.lower())
            and (not os_type or os_type == "linux")
            and image.status in statuses
        ]
        if fault is not None:  # ECS answers a lookup of an image it does not have with an empty list
            matches = []
        matches.sort(key=lambda i: i.created, reverse=True)
        page, number, size = wire.number_page(matches, params, 10, 100)
        return {
            "RegionId": region,
            "TotalCount": len(matches),
            "PageNumber": number,
            "PageSize": size,
            "Images": {"Image": [self._image_item(i) for i in page]},
        }

    @staticmethod
    def _image_item(image: SandboxImage) -> dict[str, Any]:
        return {
            "ImageId": image.image_id,
            "ImageName": image.name,
            "ImageFamily": image.family,
            "ImageOwnerAlias": image.owner,
            "ImageVersion": "",
            "Description": "",
            "OSType": "linux",
            "OSName": image.os_name,
            "OSNameEn": image.os_name.replace("位", " bit"),
            "Platform": "Ubuntu",
            "Architecture": "x86_64",
            "Size": image.size_gb,
            "Status": image.status,
            "CreationTime": image.created,
            "Progress": "100%",
            "Usage": "instance",
            "IsPublic": image.owner == "system",
            "IsSupportCloudinit": True,
            "IsSupportIoOptimized": True,
            "BootMode": "BIOS",
            "DiskDeviceMappings": {"DiskDeviceMapping": []},
            "Tags": {"Tag": []},
        }

    # ---------------------------------------------------------------------------------------------- vSwitches

    def describe_vswitches(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """DescribeVSwitches (ECS 2014-05-26): VSwitchId, VpcId, ZoneId and IsDefault filters, PageSize at most 50."""
        default = params.get("IsDefault")
        matches = [
            v
            for v in self.vswitches(region)
            if (not params.get("VSwitchId") or v.vswitch_id == params["VSwitchId"])
            and (not params.get("VpcId") or v.vpc_id == params["VpcId"])
            and (not params.get("ZoneId") or v.zone == params["ZoneId"])
            and (not default or wire.boolean(params, "IsDefault"))
        ]
        page, number, size = wire.number_page(matches, params, 10, 50)
        items = [
            {
                "VSwitchId": v.vswitch_id,
                "VpcId": v.vpc_id,
                "ZoneId": v.zone,
                "CidrBlock": v.cidr,
                "VSwitchName": "",
                "Description": "",
                "IsDefault": True,
                "Status": "Available",
                "AvailableIpAddressCount": 4091,
                "CreationTime": "2023-01-01T00:00:00Z",
                "ResourceGroupId": "",
            }
            for v in page
        ]
        return {"TotalCount": len(matches), "PageNumber": number, "PageSize": size, "VSwitches": {"VSwitch": items}}


def bindings_of(instances: Iterable[Any], region: str) -> list[Binding]:
    """The key pairs and groups held by the live instances of a region (objects with ``region``, ``status``,
    ``key_pair_name`` and ``security_group_id``)."""
    return [
        Binding(i.instance_id, i.key_pair_name, (i.security_group_id,))
        for i in instances
        if i.region == region and i.status != "Deleted"
    ]
