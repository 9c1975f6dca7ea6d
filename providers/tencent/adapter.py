"""``TencentAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Tencent Cloud CVM."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from providers import ratelimit
from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ImageUnavailable, ProviderRequestRejected
from providers.launch import BootSpec, IngressRule, LaunchLimits, OrderResource, UserDataMeasure
from providers.options import option_number
from providers.sshkeys import SshPublicKey
from providers.tencent import catalog, errors, launching, mapping
from providers.tencent.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRY_BACKOFF,
    VPC,
    ClientSettings,
    TencentClient,
)
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

CHARGE_FILTER = {"Name": "instance-charge-type", "Values": [mapping.ON_DEMAND_CHARGE, mapping.SPOT_CHARGE]}
UBUNTU_FILTERS = [
    {"Name": "image-type", "Values": ["PUBLIC_IMAGE"]},
    {"Name": "platform", "Values": [launching.UBUNTU_PLATFORM]},
]
# DescribeInstances InstanceIds: "You can query up to 100 instances in each request", and not together with
# Filters; Limit at most 100 (CVM API reference, DescribeInstances, https://www.tencentcloud.com/document/api/213/33258).
DESCRIBE_IDS_MAX = 100
KEY_PAIR = "key_pair"
SECURITY_GROUP = "security_group"

# CVM's public Ubuntu images carry no NVIDIA driver. Ubuntu's documented way to install the server (GPGPU) driver
# is ``ubuntu-drivers install --gpgpu``, with nvidia-smi in the matching nvidia-utils-<version>-server package
# (Ubuntu Server documentation, "NVIDIA drivers installation",
# https://ubuntu.com/server/docs/nvidia-drivers-installation); RunInstances has no field that installs it. The
# lease agent waits for nvidia-smi while the module loads.
GPU_DRIVER_PRELUDE = r"""if ! command -v nvidia-smi >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q ubuntu-drivers-common && ubuntu-drivers install --gpgpu
  driver=$(dpkg-query -W -f='${Package}\n' 'nvidia-driver-*-server' 2>/dev/null \
    | sed -n 's/^nvidia-driver-\([0-9]*\)-server$/\1/p' | head -n 1)
  if [ -n "$driver" ]; then apt-get install -y -q "nvidia-utils-${driver}-server"; fi
  modprobe nvidia || true
fi"""


class TencentAdapter(ProviderAdapter):
    """One Tencent Cloud account over ``self.regions`` (e.g. ``ap-guangzhou``).

    Credentials: ``values`` holds ``secret_id``, ``secret_key`` and optionally ``token`` (an STS session token);
    ``endpoint_url``, when set, replaces ``https://cvm.tencentcloudapi.com``. Options (all strings):
    ``connect_timeout``/``read_timeout`` seconds (defaults 5/20), ``max_attempts`` for reads (default 3),
    ``retry_backoff`` seconds before the first read retry (default 0.25), ``image_id`` to launch instead of the
    newest public Ubuntu x86_64 image, ``site`` (``china``, the default, or ``international``): the site the account
    signed up on, whose currency its prices are in (CNY or USD per hour for the whole instance), because CVM's price
    answers state none.

    A launch with a boot (``spec.boot``) carries it in CVM's own fields: the buyer's RSA keys as imported key
    pairs (``LoginSettings.KeyIds``), a security group of the VPC API letting only the buyer's addresses in
    (``SecurityGroupIds``), ``SystemDisk.DiskSize``, and the boot script as base64 ``UserData``. Key pairs and
    security groups are per region and tagged ``broker:order``; ``release_order_resources`` deletes them.
    """

    kind = "tencent"
    launch_limits: ClassVar[LaunchLimits] = LaunchLimits(
        user_data_max_bytes=launching.USER_DATA_MAX_BYTES,
        user_data_measure=UserDataMeasure.BASE64,
        user_data_field="CVM RunInstances UserData",
        source="CVM RunInstances: UserData is base64-encoded, at most 16 KB, "
        "https://cloud.tencent.com/document/api/213/15730",
        # Not found in CVM's references (RunInstances documents only the 50 GB default of SystemDisk.DiskSize):
        # 20 GB is the size of CVM's public Linux images, below which no system disk can hold one; the upper
        # bound is the broker's default.
        disk_gb_min=20,
        disk_gb_max=16384,
        # DescribeSecurityGroupLimits: 100 rules per security group, less the egress rules every group gets.
        ingress_rules_max=launching.SECURITY_GROUP_POLICY_LIMIT - len(launching.EGRESS_POLICIES),
        native_key_types=launching.NATIVE_KEY_TYPES,
    )
    login_user: ClassVar[str] = "ubuntu"  # CVM's Ubuntu public images log in as ubuntu (DefaultLoginUser)

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: a Tencent Cloud account needs at least one region")
        secret_id = credentials.values.get("secret_id", "")
        secret_key = credentials.values.get("secret_key", "")
        if not secret_id or not secret_key:
            raise CredentialsRejected("secret_id and secret_key are required", provider=errors.PROVIDER)
        self._client = TencentClient(
            ClientSettings(
                secret_id=secret_id,
                secret_key=secret_key,
                token=credentials.values.get("token") or None,
                endpoint_url=credentials.endpoint_url or None,
                connect_timeout=option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
                retry_backoff=option_number(self.options, "retry_backoff", DEFAULT_RETRY_BACKOFF),
                rate_limits=ratelimit.limits_from_options(self.options, self.kind),
            )
        )
        self._images: dict[tuple[str, str], str] = {}
        self.currency = catalog.site_currency(self.options.get("site") or catalog.DEFAULT_SITE)

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``DescribeZones`` in the first region: cheap and needs only read permission.

        Raises ``CredentialsRejected`` (AuthFailure.*, UnauthorizedOperation) or ``TransientProviderError``.
        """
        result = self._client.call(self.regions[0], "DescribeZones")
        if not isinstance(result.get("ZoneSet"), list):
            raise errors.malformed("DescribeZones answered without ZoneSet")

    def list_offers(self) -> list[OfferQuote]:
        """One quote per (zone, GPU type, charge type) that CVM sells now, per hour in the site's currency.

        On-demand quotes are the POSTPAID_BY_HOUR rows, spot quotes the SPOTPAID rows (none are invented when CVM
        lists none). Sold-out rows are left out. Read-only; raises ``TransientProviderError``,
        ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        offers: list[OfferQuote] = []
        for region in self.regions:
            offers.extend(self._region_offers(region))
        return offers

    def _region_offers(self, region: str) -> list[OfferQuote]:
        result = self._client.call(region, "DescribeZoneInstanceConfigInfos", {"Filters": [CHARGE_FILTER]})
        items = result.get("InstanceTypeQuotaSet")
        if not isinstance(items, list):
            raise errors.malformed("DescribeZoneInstanceConfigInfos answered without InstanceTypeQuotaSet")
        configs: list[Any] = []
        # GpuType lives only in DescribeInstanceTypeConfigs, whose filters take one value each: one call per
        # GPU family keeps the read to the GPU part of a catalogue of thousands of (zone, type) rows.
        for family in catalog.gpu_families(items):
            answer = self._client.call(
                region,
                "DescribeInstanceTypeConfigs",
                {"Filters": [{"Name": "instance-family", "Values": [family]}]},
            )
            configs.extend(answer.get("InstanceTypeConfigSet") or [])
        identities = catalog.gpu_identities(configs)
        offers = [
            offer
            for item in items
            if (offer := catalog.offer_from_quota_item(item, region, identities, currency=self.currency))
        ]
        return sorted(offers, key=lambda q: (q.zone, q.instance_type, q.pricing_model.value))

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` (InvalidInstanceId.NotFound) when CVM
        does not know it, which includes an instance destroyed long enough ago to have left the recycle bin."""
        result = self._client.call(region, "DescribeInstances", {"InstanceIds": [instance_id]})
        found = [h for h in mapping.handles(result.get("InstanceSet") or [], region) if h.instance_id == instance_id]
        if not found:
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}", code=errors.NOT_FOUND_CODE, provider=errors.PROVIDER
            )
        return found[0]

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """``DescribeInstances`` with ``InstanceIds`` of at most ``DESCRIBE_IDS_MAX`` ids per call (``ceil(n /
        100)`` calls: the client's pages ask for ``Limit`` 100, so one page holds them). CVM answers the ids it
        knows: one it does not (destroyed long enough ago to have left the recycle bin) is not in the answer,
        which is this contract's "not found"."""
        wanted = list(dict.fromkeys(instance_ids))
        found: dict[str, InstanceHandle] = {}
        for start in range(0, len(wanted), DESCRIBE_IDS_MAX):
            ids = wanted[start : start + DESCRIBE_IDS_MAX]
            items = self._client.pages(region, "DescribeInstances", "InstanceSet", {"InstanceIds": ids})
            asked = set(ids)
            for handle in mapping.handles(items, region):
                if handle.instance_id in asked:
                    found[handle.instance_id] = handle
        return found

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Every instance tagged ``broker:order=<order_ref>`` in every region of the account, in any state."""
        found: list[InstanceHandle] = []
        for region in self.regions:
            items = self._client.pages(
                region,
                "DescribeInstances",
                "InstanceSet",
                {"Filters": [{"Name": f"tag:{mapping.ORDER_TAG}", "Values": [order_ref]}]},
            )
            found.extend(mapping.handles(items, region))
        return sorted(found, key=lambda h: (h.region, h.instance_id))

    # ------------------------------------------------------------------------------------------ writes

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``RunInstances`` for one instance, tagged ``broker:order`` (+ ``spec.tags``), idempotent on
        ``spec.client_token`` in ``spec.region``. Exactly one attempt: see ``ProviderAdapter.launch``.

        CVM creates instances asynchronously: the handle is PENDING and a later ``describe`` shows RUNNING or
        FAILED (LAUNCH_FAILED, with the error in ``extra``). A spot launch needs ``spec.max_price`` (CVM's bid).

        With ``spec.boot``, the image is checked first (``ImageUnavailable`` naming the region, before anything
        is created), then the order's key pairs and security group in the region are found by their tag or
        created, and RunInstances carries them with the user data and the system disk size. A repeat finds them
        again, so it creates no second key pair or security group; with ``boot=None`` nothing of this happens.
        """
        mapping.validate_client_token(spec.client_token)
        charge = mapping.CHARGE_FOR_MODEL.get(spec.pricing_model)
        if charge is None:
            raise ProviderRequestRejected(
                f"{spec.pricing_model.value} capacity cannot be launched on demand", provider=errors.PROVIDER
            )
        if spec.pricing_model is PricingModel.SPOT and spec.max_price is None:
            raise ProviderRequestRejected("a CVM spot launch needs max_price (the bid)", provider=errors.PROVIDER)
        if spec.boot is None:
            image_id = (
                spec.image or self.options.get("image_id") or self._default_image(spec.region, spec.instance_type)
            )
        else:
            image_id = self._boot_image(spec, spec.boot)
        tag_spec = mapping.tag_specification(spec.order_ref, spec.tags)
        params: dict[str, Any] = {
            "InstanceChargeType": charge,
            "Placement": {"Zone": spec.zone},
            "InstanceType": spec.instance_type,
            "ImageId": image_id,
            "InstanceCount": 1,
            "ClientToken": spec.client_token,
            "InstanceName": spec.order_ref[: mapping.INSTANCE_NAME_MAX_LENGTH],
            "TagSpecification": tag_spec,
        }
        if spec.pricing_model is PricingModel.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"MaxPrice": str(spec.max_price), "SpotInstanceType": "one-time"},
            }
        if spec.boot is not None:
            params.update(self._boot_params(spec, spec.boot))
        result = self._client.launch(spec.region, params)
        ids = result.get("InstanceIdSet")
        if not isinstance(ids, list) or len(ids) != 1:
            raise errors.malformed(f"RunInstances returned InstanceIdSet {ids!r} for InstanceCount=1")
        # RunInstances answers with ids only; the handle is built from the request rather than a describe that
        # the API's eventual consistency could answer with "not found" this early.
        return InstanceHandle(
            instance_id=str(ids[0]),
            region=spec.region,
            zone=spec.zone,
            instance_type=spec.instance_type,
            state=InstanceState.PENDING,
            tags=mapping.tags_dict(tag_spec[0]["Tags"]),
            extra={
                "state_name": "PENDING",
                "charge_type": charge,
                "client_token": spec.client_token,
                "image_id": image_id,
                "request_id": str(result.get("RequestId") or ""),
            },
        )

    def _default_image(self, region: str, instance_type: str) -> str:
        image_id = self._newest_ubuntu(region, instance_type)
        if image_id is None:
            raise ProviderRequestRejected(
                f"no public Ubuntu x86_64 image for {instance_type} in {region}; set options.image_id",
                provider=errors.PROVIDER,
            )
        return image_id

    def _newest_ubuntu(self, region: str, instance_type: str) -> str | None:
        cached = self._images.get((region, instance_type))
        if cached:
            return cached
        images = self._client.pages(
            region, "DescribeImages", "ImageSet", {"Filters": UBUNTU_FILTERS, "InstanceType": instance_type}
        )
        image_id = launching.newest_ubuntu_image(images)
        if image_id is not None:
            self._images[(region, instance_type)] = image_id
        return image_id

    # ------------------------------------------------------------------------------------------------ boot

    def boot_prelude(self, spec: LaunchSpec) -> str:
        """The NVIDIA driver install CVM's Ubuntu public images need; nothing for the buyer's own image, which
        is theirs to prepare."""
        if spec.boot is None or spec.image or spec.boot.image:
            return ""
        return GPU_DRIVER_PRELUDE

    def _boot_image(self, spec: LaunchSpec, boot: BootSpec) -> str:
        """The image a booted launch uses, checked to exist in the region before anything is created there.

        Raises ``ImageUnavailable`` naming the region when DescribeImages does not know the chosen image (the
        buyer's, or the account's ``image_id`` option) or no public Ubuntu image fits the instance type."""
        chosen = spec.image or boot.image or self.options.get("image_id")
        if not chosen:
            newest = self._newest_ubuntu(spec.region, spec.instance_type)
            if newest is None:
                raise ImageUnavailable(
                    f"no public Ubuntu x86_64 image for {spec.instance_type} in {spec.region}",
                    provider=errors.PROVIDER,
                )
            return newest
        found = self._client.call(
            spec.region, "DescribeImages", {"ImageIds": [chosen], "InstanceType": spec.instance_type}
        )
        if not any(str(image.get("ImageId")) == chosen for image in found.get("ImageSet") or []):
            raise ImageUnavailable(f"image {chosen} does not exist in {spec.region}", provider=errors.PROVIDER)
        return chosen

    def _boot_params(self, spec: LaunchSpec, boot: BootSpec) -> dict[str, Any]:
        """RunInstances fields for the boot, after making sure its key pairs and security group exist."""
        script = self.user_data(spec)
        assert script is not None  # a spec with a boot always renders one
        native = [key for key in boot.ssh_keys if key.key_type in launching.NATIVE_KEY_TYPES]
        key_ids = self._ensure_key_pairs(spec.region, spec.order_ref, native)
        group_id = self._ensure_security_group(spec.region, spec.order_ref, boot.ingress)
        params: dict[str, Any] = {"UserData": launching.encode_user_data(script), "SecurityGroupIds": [group_id]}
        if key_ids:
            params["LoginSettings"] = {"KeyIds": key_ids}
        if boot.disk_gb is not None:
            params["SystemDisk"] = {"DiskSize": boot.disk_gb}
        return params

    def _ensure_key_pairs(self, region: str, order_ref: str, keys: Sequence[SshPublicKey]) -> list[str]:
        """One imported key pair per key, found by the order's tag before any import, so a resumed launch
        imports nothing twice."""
        if not keys:
            return []
        mine = {
            launching.canonical_public_key(str(kp.get("PublicKey") or "")): str(kp["KeyId"])
            for kp in self._order_key_pairs(region, order_ref)
        }
        return [mine.get(key.public_key) or self._import_key_pair(region, order_ref, key.public_key) for key in keys]

    def _import_key_pair(self, region: str, order_ref: str, public_key: str) -> str:
        name = launching.key_pair_name(order_ref, public_key)
        params = {
            "KeyName": name,
            "ProjectId": 0,
            "PublicKey": public_key,
            "TagSpecification": [{"ResourceType": "keypair", "Tags": launching.order_tags(order_ref)}],
        }
        try:
            return str(self._client.write(region, "ImportKeyPair", params)["KeyId"])
        except ProviderRequestRejected as exc:
            if exc.code == launching.KEY_NAME_TAKEN_CODE:
                # An earlier import whose answer was lost: the name is derived from (order, key), so it is ours.
                found = self._key_pairs(region, [{"Name": "key-name", "Values": [name]}])
            elif exc.code == launching.PUBLIC_KEY_TAKEN_CODE:
                # CVM takes one copy of a public key per account: the buyer's key is already here (another of
                # their orders, or the seller's own). Use it; it is not this order's to delete.
                found = self._key_pairs(region, [])
            else:
                raise
            for key_pair in found:
                if launching.canonical_public_key(str(key_pair.get("PublicKey") or "")) == public_key:
                    return str(key_pair["KeyId"])
            raise

    def _ensure_security_group(self, region: str, order_ref: str, ingress: Iterable[IngressRule]) -> str:
        """The order's security group in the region holding every wanted rule: found by tag, created when
        missing; rules a lost answer left out are added, none twice."""
        groups = self._order_security_groups(region, order_ref)
        if groups:
            # Two groups can only come from two launches racing; the oldest wins and release deletes both.
            group_id = str(
                min(groups, key=lambda g: (str(g.get("CreatedTime") or ""), str(g["SecurityGroupId"])))[
                    "SecurityGroupId"
                ]
            )
        else:
            created = self._client.write(
                region,
                "CreateSecurityGroup",
                {
                    "GroupName": launching.security_group_name(order_ref),
                    "GroupDescription": launching.SECURITY_GROUP_DESCRIPTION,
                    "ProjectId": "0",
                    "Tags": launching.order_tags(order_ref),
                },
                service=VPC,
            )
            group_id = str((created.get("SecurityGroup") or {}).get("SecurityGroupId") or "")
            if not group_id:
                raise errors.malformed("CreateSecurityGroup answered without SecurityGroup.SecurityGroupId")
        present = self._client.call(region, "DescribeSecurityGroupPolicies", {"SecurityGroupId": group_id}, service=VPC)
        policy_set = present.get("SecurityGroupPolicySet") or {}
        # CreateSecurityGroupPolicies takes one direction per request (https://cloud.tencent.com/document/api/215/15807).
        for direction, wanted in (
            ("Ingress", launching.ingress_policies(ingress)),
            ("Egress", list(launching.EGRESS_POLICIES)),
        ):
            missing = launching.missing_policies(wanted, policy_set.get(direction) or [])
            if missing:
                self._client.write(
                    region,
                    "CreateSecurityGroupPolicies",
                    {"SecurityGroupId": group_id, "SecurityGroupPolicySet": {direction: missing}},
                    service=VPC,
                )
        return group_id

    def _key_pairs(self, region: str, filters: list[dict[str, Any]]) -> list[Any]:
        params: dict[str, Any] = {"Filters": filters} if filters else {}
        return self._client.pages(region, "DescribeKeyPairs", "KeyPairSet", params)

    def _order_key_pairs(self, region: str, order_ref: str) -> list[Any]:
        return self._key_pairs(region, [{"Name": f"tag:{mapping.ORDER_TAG}", "Values": [order_ref]}])

    def _security_groups(self, region: str, filters: list[dict[str, Any]]) -> list[Any]:
        return self._client.pages(
            region, "DescribeSecurityGroups", "SecurityGroupSet", {"Filters": filters}, service=VPC
        )

    def _order_security_groups(self, region: str, order_ref: str) -> list[Any]:
        return self._security_groups(region, [{"Name": f"tag:{mapping.ORDER_TAG}", "Values": [order_ref]}])

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete the order's key pairs (DeleteKeyPairs) and security groups (DeleteSecurityGroup) in every
        region. Idempotent: what is gone is skipped. Returns those CVM refuses to delete while an instance still
        uses them (a key pair bound to it, a security group it is in, until the instance is shut down)."""
        remaining: list[OrderResource] = []
        for region in self.regions:
            for key_pair in self._order_key_pairs(region, order_ref):
                resource = self._resource(
                    KEY_PAIR, str(key_pair["KeyId"]), region, key_pair.get("Tags"), key_pair.get("KeyName")
                )
                if not self._delete(
                    region,
                    "DeleteKeyPairs",
                    {"KeyIds": [resource.resource_id]},
                    launching.KEY_PAIR_IN_USE_CODES,
                    launching.KEY_PAIR_GONE_CODES,
                ):
                    remaining.append(resource)
            for group in self._order_security_groups(region, order_ref):
                resource = self._resource(
                    SECURITY_GROUP,
                    str(group["SecurityGroupId"]),
                    region,
                    group.get("TagSet"),
                    group.get("SecurityGroupName"),
                )
                if not self._delete(
                    region,
                    "DeleteSecurityGroup",
                    {"SecurityGroupId": resource.resource_id},
                    launching.SECURITY_GROUP_IN_USE_CODES,
                    launching.SECURITY_GROUP_GONE_CODES,
                    service=VPC,
                ):
                    remaining.append(resource)
        return remaining

    def _delete(
        self,
        region: str,
        action: str,
        params: dict[str, Any],
        in_use: frozenset[str],
        gone: frozenset[str],
        service: str = "cvm",
    ) -> bool:
        """False when the provider refuses because the resource is still in use; True when it is gone."""
        try:
            self._client.call(region, action, params, service=service)
        except ProviderRequestRejected as exc:
            if exc.code in in_use:
                return False
            if exc.code not in gone:
                raise
        return True

    def list_order_resources(self) -> list[OrderResource]:
        """Every key pair and security group carrying a ``broker:order`` tag in the account's regions."""
        found: list[OrderResource] = []
        any_order = [{"Name": "tag-key", "Values": [mapping.ORDER_TAG]}]
        for region in self.regions:
            for key_pair in self._key_pairs(region, any_order):
                found.append(
                    self._resource(
                        KEY_PAIR, str(key_pair["KeyId"]), region, key_pair.get("Tags"), key_pair.get("KeyName")
                    )
                )
            for group in self._security_groups(region, any_order):
                found.append(
                    self._resource(
                        SECURITY_GROUP,
                        str(group["SecurityGroupId"]),
                        region,
                        group.get("TagSet"),
                        group.get("SecurityGroupName"),
                    )
                )
        return [r for r in found if r.order_ref]

    @staticmethod
    def _resource(kind: str, resource_id: str, region: str, tags: Any, name: Any) -> OrderResource:
        return OrderResource(
            kind=kind,
            resource_id=resource_id,
            region=region,
            order_ref=launching.order_of(tags) or "",
            extra={"name": str(name or "")},
        )

    # ---------------------------------------------------------------------------- stop, start, reboot

    stoppable: ClassVar[bool] = True
    # StoppedMode=STOP_CHARGING ("No Charge when Shut Down", pay-as-you-go instances): "the billing of CPU and
    # memory resources of this instance stops. However the Cloud disks (system disk and data disk), public network
    # bandwidth, images, and other key components of the CVM instance are still billed" (CVM, Shutting Down
    # Pay-as-You-Go Instances to Avoid Charges, https://www.tencentcloud.com/document/product/213/19922).
    stopped_billing: ClassVar[str] = (
        "its cloud disks (system and data disks) and any public bandwidth; a pay-as-you-go instance stopped with "
        "no charges is not billed for CPU and memory (CVM, Shutting Down Pay-as-You-Go Instances to Avoid "
        "Charges, https://www.tencentcloud.com/document/product/213/19922)"
    )

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """``StopInstances`` with ``StoppedMode=STOP_CHARGING`` (CPU and memory released and no longer billed,
        disks kept); a no-op (no write) when CVM reports the instance STOPPED or STOPPING. CVM refuses any other
        state (``UnsupportedOperation.InstanceState<State>``) and an id it does not know
        (``InvalidInstanceId.NotFound``): ``ProviderRequestRejected``."""
        current = self.describe(region, instance_id)
        if current.extra.get("state_name") in ("STOPPED", "STOPPING"):
            return current
        self._client.call(
            region, "StopInstances", {"InstanceIds": [instance_id], "StoppedMode": "STOP_CHARGING", "StopType": "SOFT"}
        )
        return self.describe(region, instance_id)

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """``StartInstances``; a no-op (no write) when the instance is pending, starting or running. An instance
        stopped with no charges must find CPU and memory again: none in its zone (``ResourceInsufficient...``) is
        ``CapacityUnavailable`` and it stays STOPPED with its disks."""
        current = self.describe(region, instance_id)
        if current.state in (InstanceState.PENDING, InstanceState.RUNNING):
            return current
        self._client.call(region, "StartInstances", {"InstanceIds": [instance_id]})
        return self.describe(region, instance_id)

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """``RebootInstances`` (a soft restart in place: same disks, same addresses). CVM refuses an instance that
        is not RUNNING (``UnsupportedOperation.InstanceState<State>``): ``ProviderRequestRejected``."""
        self.describe(region, instance_id)  # an id CVM does not know: InvalidInstanceId.NotFound, named
        self._client.call(region, "RebootInstances", {"InstanceIds": [instance_id], "StopType": "SOFT"})
        return self.describe(region, instance_id)

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Terminate the instance; a no-op (no API write) when it is already terminated, terminating or failed.

        Raises ``ProviderRequestRejected`` (InvalidInstanceId.NotFound) for an id CVM does not know.
        """
        # Describe first: a second TerminateInstances on a terminating instance is an error, not a no-op, on CVM.
        current = self.describe(region, instance_id)
        if current.state in (InstanceState.TERMINATED, InstanceState.FAILED):
            return current
        if current.extra.get("state_name") == "TERMINATING":
            return current
        try:
            self._client.call(region, "TerminateInstances", {"InstanceIds": [instance_id]})
        except ProviderRequestRejected as exc:
            if exc.code not in errors.ALREADY_TERMINATING_CODES:
                raise
        try:
            return self.describe(region, instance_id)
        except ProviderRequestRejected as exc:
            if exc.code != errors.NOT_FOUND_CODE:
                raise
            # Released at once: nothing is left to describe, so report the last known handle as terminated.
            return InstanceHandle(
                instance_id=current.instance_id,
                region=current.region,
                zone=current.zone,
                instance_type=current.instance_type,
                state=InstanceState.TERMINATED,
                public_ip=current.public_ip,
                private_ip=current.private_ip,
                launched_at=current.launched_at,
                tags=current.tags,
                extra={**current.extra, "state_name": "RELEASED"},
            )
