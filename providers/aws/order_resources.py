"""What an EC2 launch makes beside its instance, and how it is found and released: the image a launch boots
(the default Ubuntu or Deep Learning AMI, or the buyer's, checked first), the key pair, security group and subnet
of a booted launch, and the cluster placement group. ``AwsAdapter`` inherits these as ``AwsOrderResources``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from providers.aws import errors, launching
from providers.aws.client import AwsClient
from providers.base import ProviderAdapter
from providers.errors import ImageUnavailable, ProviderRequestRejected, TransientProviderError
from providers.launch import IngressRule, LaunchProblem, OrderResource
from providers.sshkeys import SshPublicKey
from providers.types import LaunchSpec

# "Inbound or outbound rules per security group: 60 ... enforced separately for IPv4 rules and IPv6 rules"
# (Amazon VPC quotas, https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html).
RULES_PER_GROUP_PER_FAMILY = 60
RULES_SOURCE = (
    "Amazon VPC quotas, inbound rules per security group, "
    "https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html"
)


# The region's current Deep Learning AMI, as one account resolved it (SSM GetParameter, then DescribeImages): AWS
# publishes a new one every few weeks, so reading it for every order spends two calls on the same answer. One
# process reads it at most every DEFAULT_IMAGE_TTL_S per account and region; a launch the image is refused to
# (InvalidAMIID.*) forgets it at once, so the next attempt reads it again.
DEFAULT_IMAGE_TTL_S = 300.0
_DEFAULT_IMAGES_MAX = 256
# (endpoint URL or "", access key id, region) -> (monotonic expiry, the image's facts)
_default_images: dict[tuple[str, str, str], tuple[float, launching.ImageFacts]] = {}
_default_images_lock = threading.Lock()


# Runs an order's key-pair import beside its security group's calls (``_boot_params``).
_beside = ThreadPoolExecutor(max_workers=4, thread_name_prefix="aws-order-resources")


def default_images_forget() -> None:
    """Forget every account's remembered default image (a test's fresh start)."""
    with _default_images_lock:
        _default_images.clear()


class AwsOrderResources(ProviderAdapter):
    """The order-resource half of ``AwsAdapter`` (see its docstring for the options it reads). Every resource is
    named ``broker-<order>`` and tagged ``broker:order``, so a repeat finds it instead of making another, and
    ``release_order_resources`` finds what an order left.

    Each resource is created first and looked up only when EC2 answers that it exists already (a repeated or
    racing launch), so a first launch makes no reads for it. What one adapter made or read it remembers
    (``_made``, ``_image_facts``): the next attempt of the same order in the same region, from the same task,
    asks EC2 nothing again. Adapters are built per task, so nothing remembered outlives one.
    """

    _client: AwsClient
    _images: dict[str, str]
    # (region, image id or "" for the region's current DLAMI) -> what EC2 said of that image
    _image_facts: dict[tuple[str, str], launching.ImageFacts]
    # ("key_pair" | "security_group", region, VPC id or "" for the default VPC, name) -> the resource's id and, for
    # a group, the (protocol, port, range) permissions it holds
    _made: dict[tuple[str, str, str, str], tuple[str, frozenset[launching.Permission]]]

    def _placement_group(self, region: str, name: str) -> None:
        """The cluster placement group ``name`` in ``region``, created unless it exists: a repeated or racing
        launch is answered ``InvalidPlacementGroup.Duplicate``, which means the group is there."""
        try:
            self._client.call(
                region,
                "create_placement_group",
                GroupName=name,
                Strategy=launching.CLUSTER_STRATEGY,
                TagSpecifications=launching.placement_group_tags(name),
            )
        except ProviderRequestRejected as exc:
            if exc.code != launching.PLACEMENT_GROUP_DUPLICATE:
                raise

    def delete_placement_group(self, region: str, name: str) -> None:
        """``delete_placement_group``; a group AWS does not know (``InvalidPlacementGroup.Unknown``) is already
        deleted. One that still holds instances (``InvalidPlacementGroup.InUse``: they are not all terminated
        yet) raises ``TransientProviderError``, for the caller to try again once they are."""
        try:
            self._client.call(region, "delete_placement_group", GroupName=name)
        except ProviderRequestRejected as exc:
            if exc.code == launching.PLACEMENT_GROUP_UNKNOWN:
                return
            if exc.code == launching.PLACEMENT_GROUP_IN_USE:
                raise TransientProviderError(
                    f"placement group {name} in {region} still holds instances; delete it once they are terminated",
                    code=exc.code,
                    provider=errors.PROVIDER,
                    http_status=exc.http_status,
                ) from exc
            raise

    def _default_image(self, region: str) -> str:
        cached = self._images.get(region)
        if cached:
            return cached
        images = self._client.pages(
            region,
            "describe_images",
            "Images",
            Owners=[launching.UBUNTU_OWNER],
            Filters=[
                {"Name": "name", "Values": [launching.UBUNTU_NAME_PATTERN]},
                {"Name": "architecture", "Values": ["x86_64"]},
                {"Name": "state", "Values": ["available"]},
            ],
        )
        image_id = launching.newest_ubuntu_image(images)
        if image_id is None:
            raise ProviderRequestRejected(
                f"no Canonical Ubuntu x86_64 image in {region}; set options.image_id", provider=errors.PROVIDER
            )
        self._images[region] = image_id
        return image_id

    # -------------------------------------------------------------------------------------- the boot

    def launch_problems(self, spec: LaunchSpec) -> list[LaunchProblem]:
        """The base checks (user data, disk), with the firewall counted as EC2 counts it: inbound rules per
        security group, IPv4 and IPv6 separately (``RULES_SOURCE``)."""
        problems = [p for p in super().launch_problems(spec) if p.field != "launch.allowed_cidrs"]
        if spec.boot is None:
            return problems
        wanted = launching.wanted_permissions(spec.boot.ingress)
        for family, version in (("IPv4", 4), ("IPv6", 6)):
            count = sum(1 for _, _, cidr in wanted if (":" in cidr) == (version == 6))
            if count > RULES_PER_GROUP_PER_FAMILY:
                problems.append(
                    LaunchProblem(
                        "launch.allowed_cidrs",
                        f"{count} (port, {family} range) pairs; an AWS security group takes at most "
                        f"{RULES_PER_GROUP_PER_FAMILY} inbound {family} rules ({RULES_SOURCE})",
                    )
                )
        return problems

    def native_keys(self, spec: LaunchSpec) -> tuple[SshPublicKey, ...]:
        """The keys EC2's own mechanism installs for this launch: one key pair per instance, so the first key
        ``ImportKeyPair`` takes, or none. The boot script installs every key either way."""
        key = launching.native_key(spec.boot.ssh_keys) if spec.boot is not None else None
        return (key,) if key is not None else ()

    def _boot_params(self, spec: LaunchSpec) -> dict[str, Any]:
        """The ``run_instances`` parameters that carry ``spec.boot``, after making what they name."""
        boot = spec.boot
        if boot is None:
            return {}
        facts = self._image(spec.region, boot.image or spec.image or self.options.get("image_id") or None)
        if boot.disk_gb is not None and facts.root_snapshot_gb is not None and boot.disk_gb < facts.root_snapshot_gb:
            # EC2 would refuse it at launch (InvalidBlockDeviceMapping); saying so first creates nothing.
            raise ProviderRequestRejected(
                f"launch.disk_gb: {boot.disk_gb} GB is smaller than image {facts.image_id}'s root snapshot "
                f"({facts.root_snapshot_gb} GB) in {spec.region}",
                code="InvalidBlockDeviceMapping",
                provider=errors.PROVIDER,
            )
        key = launching.native_key(boot.ssh_keys)
        # The key pair and the security group do not depend on each other: the pair is imported on a thread
        # beside the group's two calls (create, then its rules).
        importing = _beside.submit(self._key_pair, spec.region, spec.order_ref, key) if key is not None else None
        try:
            subnet = self._subnet(spec.region, spec.zone)
            vpc_id = subnet[1] if subnet else None  # None: the region's default VPC, which EC2 picks itself
            group_id = self._security_group(spec, vpc_id, boot.ingress)
        finally:
            key_name = importing.result() if importing is not None else None
        params: dict[str, Any] = {
            "ImageId": facts.image_id,
            "SecurityGroupIds": [group_id],
            "UserData": self.user_data(spec),  # botocore base64-encodes it for the wire
        }
        if key_name is not None:
            params["KeyName"] = key_name
        if boot.disk_gb is not None:
            params["BlockDeviceMappings"] = launching.root_volume(facts, boot.disk_gb)
        if subnet is not None:
            params["SubnetId"] = subnet[0]
        return params

    def _image(self, region: str, image_id: str | None) -> launching.ImageFacts:
        """The image to boot (the buyer's, the account's ``image_id`` or the region's current DLAMI) as EC2
        describes it; ``ImageUnavailable`` naming the region when it does not exist there. Read once per adapter
        and region: a failover within the region boots the image the first attempt checked. The region's DLAMI
        is shared by the process's adapters of the same account for ``DEFAULT_IMAGE_TTL_S``."""
        key = (region, image_id or "")
        known = self._image_facts.get(key)
        if known is None:
            known = self._default_image_facts(region) if image_id is None else self._image_read(region, image_id)
            self._image_facts[key] = known
        return known

    def _default_image_key(self, region: str) -> tuple[str, str, str]:
        settings = self._client.settings
        return (settings.endpoint_url or "", settings.access_key_id, region)

    def _default_image_facts(self, region: str) -> launching.ImageFacts:
        key = self._default_image_key(region)
        with _default_images_lock:
            remembered = _default_images.get(key)
        if remembered is not None and remembered[0] > time.monotonic():
            return remembered[1]
        facts = self._image_read(region, None)
        with _default_images_lock:
            _default_images[key] = (time.monotonic() + DEFAULT_IMAGE_TTL_S, facts)
            if len(_default_images) > _DEFAULT_IMAGES_MAX:
                del _default_images[min(_default_images, key=lambda k: _default_images[k][0])]
        return facts

    def _image_refused(self, region: str, image_id: str) -> None:
        """A launch was refused ``image_id``: whatever this process remembered of it is stale."""
        self._image_facts = {k: v for k, v in self._image_facts.items() if v.image_id != image_id}
        key = self._default_image_key(region)
        with _default_images_lock:
            remembered = _default_images.get(key)
            if remembered is not None and remembered[1].image_id == image_id:
                del _default_images[key]

    def _image_read(self, region: str, image_id: str | None) -> launching.ImageFacts:
        if image_id is None:
            try:
                image_id = self._client.parameter(region, launching.DLAMI_PARAMETER)
            except ImageUnavailable as exc:
                raise ImageUnavailable(
                    f"no GPU-ready default image in {region}: {launching.DLAMI_PARAMETER} is not published there",
                    code=exc.code,
                    provider=errors.PROVIDER,
                    http_status=exc.http_status,
                ) from exc
        try:
            images = self._client.call(region, "describe_images", ImageIds=[image_id]).get("Images") or []
        except ImageUnavailable as exc:
            raise ImageUnavailable(
                f"image {image_id} does not exist in {region}",
                code=exc.code,
                provider=errors.PROVIDER,
                http_status=exc.http_status,
            ) from exc
        available = [i for i in images if i.get("ImageId") == image_id and i.get("State", "available") == "available"]
        if not available:
            raise ImageUnavailable(
                f"image {image_id} is not available in {region}",
                code="InvalidAMIID.Unavailable",
                provider=errors.PROVIDER,
            )
        return launching.image_facts(available[0])

    def _subnet(self, region: str, zone: str) -> tuple[str, str] | None:
        """(subnet id, VPC id) of the account's ``subnet_id`` option in the launch's zone; None without the
        option. A subnet is zonal, so an account lists one per zone it sells in."""
        named = [s.strip() for s in self.options.get("subnet_id", "").split(",") if s.strip()]
        if not named:
            return None
        subnets = self._client.pages(
            region,
            "describe_subnets",
            "Subnets",
            Filters=[{"Name": "subnet-id", "Values": named}, {"Name": "availability-zone", "Values": [zone]}],
        )
        if not subnets:
            raise ProviderRequestRejected(
                f"none of options.subnet_id ({', '.join(named)}) is in {zone}", provider=errors.PROVIDER
            )
        try:
            return str(subnets[0]["SubnetId"]), str(subnets[0]["VpcId"])
        except (KeyError, TypeError) as exc:
            raise errors.malformed(f"unreadable subnet entry ({exc!r})") from None

    def _default_vpc(self, region: str) -> str:
        vpcs = self._client.pages(region, "describe_vpcs", "Vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])
        if not vpcs:
            raise ProviderRequestRejected(
                f"{region} has no default VPC; set options.subnet_id", provider=errors.PROVIDER
            )
        return str(vpcs[0]["VpcId"])

    def _key_pair(self, region: str, order_ref: str, key: SshPublicKey) -> str:
        """The order's key pair in ``region``, imported unless it exists: a repeated or racing launch is answered
        ``InvalidKeyPair.Duplicate``, which means the order's pair is there, so nothing is imported twice."""
        name = launching.resource_name(order_ref)
        made = ("key_pair", region, "", name)
        if made in self._made:
            return name
        try:
            self._client.call(
                region,
                "import_key_pair",
                KeyName=name,
                PublicKeyMaterial=key.public_key.encode(),
                TagSpecifications=launching.order_tags("key-pair", order_ref),
            )
        except ProviderRequestRejected as exc:
            if exc.code not in launching.ALREADY_THERE:
                raise
        self._made[made] = (name, frozenset())
        return name

    def _security_group(self, spec: LaunchSpec, vpc_id: str | None, ingress: Sequence[IngressRule]) -> str:
        """The order's security group in the launch's VPC (None: the region's default VPC), with every (port,
        CIDR) of the boot let in: created unless it exists, and only the missing rules added, so repeating the
        launch changes nothing. A group just created has no inbound rule yet (a new group starts with the
        outbound allow-all rule only: Amazon VPC user guide, security groups), so only a group that was there
        already is read."""
        region, name = spec.region, launching.resource_name(spec.order_ref)
        made = ("security_group", region, vpc_id or "", name)
        known = self._made.get(made)
        if known is not None:
            group_id, present = known
        else:
            group_id, present = self._group_create(spec, vpc_id, name)
        missing = [p for p in launching.wanted_permissions(ingress) if p not in present]
        if missing:
            try:
                self._client.call(
                    region,
                    "authorize_security_group_ingress",
                    GroupId=group_id,
                    IpPermissions=launching.ip_permissions(missing),
                    TagSpecifications=launching.order_tags("security-group-rule", spec.order_ref),
                )
            except ProviderRequestRejected as exc:
                if exc.code not in launching.ALREADY_THERE:  # a racing launch added them first
                    raise
        self._made[made] = (group_id, present | frozenset(missing))
        return group_id

    def _group_create(
        self, spec: LaunchSpec, vpc_id: str | None, name: str
    ) -> tuple[str, frozenset[launching.Permission]]:
        """Create the order's group: its id and the permissions it holds (none). When it exists already, the
        existing one's id and permissions."""
        region = spec.region
        try:
            created = self._client.call(
                region,
                "create_security_group",
                GroupName=name,
                Description=f"gpu-broker order {spec.order_ref}",
                TagSpecifications=launching.order_tags("security-group", spec.order_ref),
                **({"VpcId": vpc_id} if vpc_id else {}),
            )
        except ProviderRequestRejected as exc:
            if exc.code == launching.NO_DEFAULT_VPC:
                raise ProviderRequestRejected(
                    f"{region} has no default VPC; set options.subnet_id", code=exc.code, provider=errors.PROVIDER
                ) from exc
            if exc.code not in launching.ALREADY_THERE:
                raise
        else:
            group_id = created.get("GroupId")
            if not group_id:
                raise errors.malformed(f"create_security_group answered without GroupId for {name}")
            return str(group_id), frozenset()
        group = self._find_group(region, vpc_id or self._default_vpc(region), name)
        if group is None:
            raise errors.malformed(f"security group {name} exists in {region} but is not found")
        return str(group["GroupId"]), frozenset(launching.existing_permissions(group.get("IpPermissions") or []))

    def _find_group(self, region: str, vpc_id: str, name: str) -> dict[str, Any] | None:
        groups = self._client.pages(
            region,
            "describe_security_groups",
            "SecurityGroups",
            Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}],
        )
        return dict(groups[0]) if groups else None

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete the order's security groups and key pairs in every region. A group an instance still uses
        (``DependencyViolation``, e.g. while it shuts down) is returned for a later sweep; what is gone is
        skipped, so a repeat is harmless."""
        name = launching.resource_name(order_ref)
        self._made = {made: known for made, known in self._made.items() if made[3] != name}
        remaining: list[OrderResource] = []
        for region in self.regions:
            groups = self._client.pages(
                region, "describe_security_groups", "SecurityGroups", Filters=launching.order_filter(order_ref)
            )
            for group in groups:
                try:
                    self._client.call(region, "delete_security_group", GroupId=str(group["GroupId"]))
                except ProviderRequestRejected as exc:
                    if exc.code == launching.IN_USE:
                        remaining.append(launching.order_resource("security_group", group, region))
                    elif exc.code not in launching.GROUP_GONE:
                        raise
            keys = self._client.call(region, "describe_key_pairs", Filters=launching.order_filter(order_ref))
            for key in keys.get("KeyPairs") or []:
                # DeleteKeyPair succeeds for a name that is already gone.
                self._client.call(region, "delete_key_pair", KeyName=str(key["KeyName"]))
        return remaining

    def list_order_resources(self) -> list[OrderResource]:
        """Security groups and key pairs tagged ``broker:order`` in every region of the account."""
        found: list[OrderResource] = []
        for region in self.regions:
            groups = self._client.pages(
                region, "describe_security_groups", "SecurityGroups", Filters=launching.order_filter()
            )
            found.extend(launching.order_resource("security_group", g, region) for g in groups)
            keys = self._client.call(region, "describe_key_pairs", Filters=launching.order_filter())
            found.extend(launching.order_resource("key_pair", k, region) for k in keys.get("KeyPairs") or [])
        return sorted(found, key=lambda r: (r.region, r.kind, r.resource_id))
