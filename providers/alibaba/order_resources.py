"""What an ECS launch with a boot makes beside its instance, and how it is found and released: the GPU driver
prelude, the image (the buyer's, or the family's newest, checked first), the vSwitch of the launch's zone, and
the order's key pair and security group. ``AlibabaAdapter`` inherits these as ``AlibabaOrderResources``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from providers.alibaba import errors, launching, mapping
from providers.alibaba.client import AlibabaClient
from providers.base import ProviderAdapter
from providers.errors import ImageUnavailable, ProviderRequestRejected
from providers.launch import BootSpec, OrderResource
from providers.types import LaunchSpec

IMAGES_PAGE = 100
KEY_PAIRS_PAGE = 50  # DescribeKeyPairs PageSize: at most 50
MAX_KEY_PAIR_PAGES = 1000
SECURITY_GROUPS_PAGE = 100
VSWITCHES_PAGE = 50


class AlibabaOrderResources(ProviderAdapter):
    """The order-resource half of ``AlibabaAdapter`` (see its docstring for the options it reads). Key pair and
    security group are named and tagged for the order, so a repeat finds them instead of making more, and
    ``release_order_resources`` finds what an order left.
    """

    _client: AlibabaClient

    def boot_prelude(self, spec: LaunchSpec) -> str:
        """The NVIDIA driver installation Alibaba documents for GPU instances (``launching.gpu_driver_prelude``):
        its public images carry no driver."""
        return launching.gpu_driver_prelude()

    def _boot_params(self, spec: LaunchSpec, boot: BootSpec) -> dict[str, Any]:
        """RunInstances fields that deliver ``boot``. Order matters: the image is checked before anything is
        created, so a missing image leaves no key pair or group behind."""
        image = self._image(spec, boot)
        image_id = str(image["ImageId"])
        if boot.disk_gb is not None and boot.disk_gb < launching.image_size_gb(image):
            raise ProviderRequestRejected(
                f"a {boot.disk_gb} GB system disk is smaller than image {image_id} "
                f"({launching.image_size_gb(image)} GB)",
                code="InvalidSystemDiskSize.LessThanImageSize",
                provider=errors.PROVIDER,
            )
        vswitch = self._vswitch(spec.region, spec.zone)
        # Rendered deterministically: a resumed attempt sends the same UserData, as its ClientToken requires.
        script = self.user_data(spec)
        params: dict[str, Any] = {
            "ImageId": image_id,
            "VSwitchId": str(vswitch["VSwitchId"]),
            "SecurityGroupId": self._security_group(spec.region, str(vswitch["VpcId"]), spec.order_ref, boot),
            "UserData": launching.encode_user_data(script or b""),
        }
        key_pair = self._key_pair(spec.region, spec.order_ref, boot)
        if key_pair is not None:
            params["KeyPairName"] = key_pair
        if boot.disk_gb is not None:
            params["SystemDisk"] = {"Size": str(boot.disk_gb)}
        return params

    def _image(self, spec: LaunchSpec, boot: BootSpec) -> Mapping[str, Any]:
        """The buyer's image (``boot.image``), else the account's ``image_id``, else the newest Available build of
        the public family; ``ImageUnavailable`` naming the region when DescribeImages finds none."""
        explicit = boot.image or spec.image or self.options.get("image_id")
        if not explicit:
            return self._family_image(spec.region, spec.instance_type)
        found = self._newest_image(spec.region, spec.instance_type, {"ImageId": explicit})
        if found is None:
            raise ImageUnavailable(
                f"image {explicit} does not exist in {spec.region}", code="precheck", provider=errors.PROVIDER
            )
        return found

    def _family_image(self, region: str, instance_type: str) -> Mapping[str, Any]:
        """The newest Available public build of the account's ``image_family`` that ``instance_type`` can run
        (DescribeImages with ImageFamily); ``ImageUnavailable`` naming the family and region when there is none."""
        family = self.options.get("image_family") or launching.DEFAULT_IMAGE_FAMILY
        found = self._newest_image(
            region, instance_type, {"ImageFamily": family, "ImageOwnerAlias": "system", "OSType": "linux"}
        )
        if found is None:
            raise ImageUnavailable(
                f"no Available image of family {family} in {region}", code="precheck", provider=errors.PROVIDER
            )
        return found

    def _newest_image(self, region: str, instance_type: str, selector: dict[str, Any]) -> Mapping[str, Any] | None:
        params = {"RegionId": region, "Status": "Available", "InstanceType": instance_type, "PageSize": IMAGES_PAGE}
        body = self._client.call(region, "DescribeImages", {**params, **selector})
        return launching.newest_image((body.get("Images") or {}).get("Image") or [])

    def _vswitch(self, region: str, zone: str) -> Mapping[str, Any]:
        """The ``vswitch_id`` option's vSwitch when it is in the zone, else the zone's default vSwitch: a VPC
        instance needs one, and its VPC is where the security group must be."""
        wanted = self.options.get("vswitch_id")
        # The option names one vSwitch for the whole account, but a vSwitch lives in one zone: a launch that failed
        # over to another zone or region must not carry it there.
        queries: list[dict[str, Any]] = []
        if wanted:
            queries.append({"RegionId": region, "VSwitchId": wanted})
        queries += [
            {"RegionId": region, "ZoneId": zone, "IsDefault": True},
            {"RegionId": region, "ZoneId": zone},
        ]
        for query in queries:
            body = self._client.call(region, "DescribeVSwitches", {**query, "PageSize": VSWITCHES_PAGE})
            for item in (body.get("VSwitches") or {}).get("VSwitch") or []:
                if item.get("ZoneId") == zone and str(item.get("Status") or "Available") == "Available":
                    return dict(item)
        raise ProviderRequestRejected(
            f"no available vSwitch in {zone} ({region}) to launch in", code="precheck", provider=errors.PROVIDER
        )

    def _key_pair(self, region: str, order_ref: str, boot: BootSpec) -> str | None:
        """The order's key pair in the region, imported once (found by name first; a concurrent import that won
        answers ``KeyPair.AlreadyExist``, which means the same). None when no key is of a type ECS imports."""
        key = launching.native_key(boot.ssh_keys)
        if key is None:
            return None
        name = launching.order_resource_name(order_ref)
        # Found by name rather than tag: names are unique per region, so the name is what an import collides on.
        body = self._client.call(region, "DescribeKeyPairs", {"RegionId": region, "KeyPairName": name})
        if any(item.get("KeyPairName") == name for item in (body.get("KeyPairs") or {}).get("KeyPair") or []):
            return name
        try:
            self._client.call(
                region,
                "ImportKeyPair",
                {
                    "RegionId": region,
                    "KeyPairName": name,
                    "PublicKeyBody": key.public_key,
                    "Tag": launching.order_tags(order_ref),
                },
            )
        except ProviderRequestRejected as exc:
            if exc.code != "KeyPair.AlreadyExist":
                raise
        return name

    def _security_group(self, region: str, vpc_id: str, order_ref: str, boot: BootSpec) -> str:
        """The order's security group in the VPC, created once (found by its order tag first; the ClientToken
        makes two racing creations one), then authorized for every (port, range) pair. AuthorizeSecurityGroup of
        a rule the group already has succeeds without adding it, so a repeat changes nothing."""
        groups = self._client.pages(
            region,
            "DescribeSecurityGroups",
            {
                "RegionId": region,
                "VpcId": vpc_id,
                "Tag": launching.order_tags(order_ref),
                "MaxResults": SECURITY_GROUPS_PAGE,
            },
            "SecurityGroups",
            "SecurityGroup",
        )
        if groups:
            # The lowest id, so every attempt picks the same group should two ever exist.
            group_id = str(sorted(groups, key=lambda g: str(g["SecurityGroupId"]))[0]["SecurityGroupId"])
        else:
            body = self._client.call(
                region,
                "CreateSecurityGroup",
                {
                    "RegionId": region,
                    "VpcId": vpc_id,
                    "SecurityGroupName": launching.order_resource_name(order_ref),
                    "Description": f"gpu-broker order {order_ref}: the buyer's addresses only",
                    "SecurityGroupType": "normal",
                    "Tag": launching.order_tags(order_ref),
                    "ClientToken": launching.security_group_token(order_ref, region, vpc_id),
                },
            )
            group_id = str(body.get("SecurityGroupId") or "")
            if not group_id:
                raise errors.malformed("CreateSecurityGroup answered without a SecurityGroupId")
        permissions = launching.ingress_permissions(boot.ingress, f"gpu-broker order {order_ref}")
        for start in range(0, len(permissions), launching.PERMISSIONS_PER_CALL):
            self._client.call(
                region,
                "AuthorizeSecurityGroup",
                {
                    "RegionId": region,
                    "SecurityGroupId": group_id,
                    "Permissions": permissions[start : start + launching.PERMISSIONS_PER_CALL],
                },
            )
        return group_id

    def list_order_resources(self) -> list[OrderResource]:
        """Key pairs and security groups carrying the ``broker:order`` tag in every region of the account."""
        found: list[OrderResource] = []
        for region in self.regions:
            found.extend(launching.key_pair_resources(self._tagged_key_pairs(region, None), region))
            found.extend(launching.security_group_resources(self._tagged_groups(region, None), region))
        return sorted(found, key=lambda r: (r.region, r.kind, r.resource_id))

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete the order's security groups and key pairs in every region. What is already gone is skipped;
        a group an instance still uses (``DependencyViolation``) or a key pair still bound to one
        (``InvalidParameter.KeypairAlreadyAttachedInstance``) is returned for the next sweep."""
        remaining: list[OrderResource] = []
        for region in self.regions:
            for group in launching.security_group_resources(self._tagged_groups(region, order_ref), region):
                # One group per call: a group still in use must not keep the others from going.
                try:
                    self._client.call(
                        region, "DeleteSecurityGroup", {"RegionId": region, "SecurityGroupId": group.resource_id}
                    )
                except ProviderRequestRejected as exc:
                    if exc.code.startswith("DependencyViolation"):
                        remaining.append(group)
                    elif exc.code != "InvalidSecurityGroupId.NotFound":
                        raise
            for key_pair in launching.key_pair_resources(self._tagged_key_pairs(region, order_ref), region):
                try:
                    # One name per call: ECS refuses the whole call when any name is still bound.
                    self._client.call(
                        region,
                        "DeleteKeyPairs",
                        {"RegionId": region, "KeyPairNames": json.dumps([key_pair.resource_id])},
                    )
                except ProviderRequestRejected as exc:
                    if exc.code != "InvalidParameter.KeypairAlreadyAttachedInstance":
                        raise
                    remaining.append(key_pair)
        return remaining

    def _tag_filter(self, order_ref: str | None) -> list[dict[str, str]]:
        # The key alone matches every order's resources: what the reconciler compares with the orders it knows.
        return launching.order_tags(order_ref) if order_ref else [{"Key": mapping.ORDER_TAG}]

    def _tagged_key_pairs(self, region: str, order_ref: str | None) -> list[Any]:
        """DescribeKeyPairs pages (PageNumber/PageSize) filtered by the order tag (any order when None)."""
        items: list[Any] = []
        for number in range(1, MAX_KEY_PAIR_PAGES + 1):
            body = self._client.call(
                region,
                "DescribeKeyPairs",
                {
                    "RegionId": region,
                    "Tag": self._tag_filter(order_ref),
                    "PageNumber": number,
                    "PageSize": KEY_PAIRS_PAGE,
                },
            )
            page = (body.get("KeyPairs") or {}).get("KeyPair") or []
            items.extend(page)
            if len(page) < KEY_PAIRS_PAGE or len(items) >= int(body.get("TotalCount") or 0):
                return items
        raise errors.malformed(f"DescribeKeyPairs did not finish within {MAX_KEY_PAIR_PAGES} pages")

    def _tagged_groups(self, region: str, order_ref: str | None) -> list[Any]:
        return self._client.pages(
            region,
            "DescribeSecurityGroups",
            {"RegionId": region, "Tag": self._tag_filter(order_ref), "MaxResults": SECURITY_GROUPS_PAGE},
            "SecurityGroups",
            "SecurityGroup",
        )
