"""``AwsAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over EC2 and the Price List API."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

from providers import ratelimit
from providers.aws import catalog, errors, launching, mapping
from providers.aws.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    AwsClient,
    ClientSettings,
)
from providers.aws.order_resources import RULES_PER_GROUP_PER_FAMILY, AwsOrderResources
from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ImageUnavailable, ProviderRequestRejected
from providers.launch import LaunchLimits, UserDataMeasure
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

log = logging.getLogger("providers.aws.adapter")

# Every AWS GPU family starts with g or p. An unfiltered catalogue is ~1,400 types of which ~65 have GPUs;
# the filter cuts the largest read of a sync by 20x. Entries are still kept only if they carry GpuInfo.
GPU_INSTANCE_TYPE_PATTERNS = ["g*", "p*"]
PRICE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
SPOT_PRODUCT = "Linux/UNIX"
# AWS reports, per zone, the price in effect at StartTime plus later changes: a short window is enough.
SPOT_LOOKBACK = timedelta(hours=1)
FILTER_VALUES_PER_CALL = 100  # EC2 caps the values of one filter; stay well below the cap
# EC2 refuses a call with too many filter values (FilterLimitExceeded, "The request uses too many filters or too
# many filter values": Error codes for the Amazon EC2 API,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html). The number is in EC2's own
# answer: "The maximum number of filter values specified on a single call is 200".
DESCRIBE_FILTER_VALUES_MAX = 200
# DescribeInstances' MaxResults: "You can specify a value between 5 and 1000", and not together with InstanceIds
# (EC2 API reference, DescribeInstances, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html).
DESCRIBE_PAGE_MAX = 1000
PRICE_TYPES_PER_CALL = 50
# A Price List Filter's Value is a string of 1 to 1024 characters (AWS Price List API reference, Filter,
# https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_Filter.html; botocore's
# pricing model: Value max 1024). botocore checks only the minimum, so an ANY_OF list longer than that
# reaches AWS and is refused there: the list is cut so each comma-joined Value stays within it.
PRICE_FILTER_VALUE_MAX = 1024


def _chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def any_of_values(items: Sequence[str], max_items: int, max_length: int) -> list[str]:
    """``items`` as comma-joined ANY_OF filter values of at most ``max_items`` names and ``max_length``
    characters each. A single name longer than ``max_length`` cannot be filtered for: ValueError."""
    values: list[str] = []
    current: list[str] = []
    for item in items:
        if len(item) > max_length:
            raise ValueError(f"{item[:40]!r}... is longer than a Price List filter value ({max_length})")
        if current and (len(current) == max_items or len(",".join([*current, item])) > max_length):
            values.append(",".join(current))
            current = []
        current.append(item)
    if current:
        values.append(",".join(current))
    return values


class AwsAdapter(AwsOrderResources, ProviderAdapter):
    """One AWS account over ``self.regions``.

    Credentials: ``values`` holds ``access_key_id``, ``secret_access_key`` and optionally ``session_token``;
    ``endpoint_url``, when set, is used for EC2, Systems Manager and the Price List API. Options (all strings):
    ``connect_timeout``/``read_timeout`` seconds (defaults 5/20), ``max_attempts`` for reads (default 3),
    ``image_id`` to launch instead of the default image (a bare launch's: the newest Canonical Ubuntu x86_64; a
    booted launch's: the region's current Deep Learning Base OSS Nvidia Driver GPU AMI), ``subnet_id`` (one or
    more, comma-separated) to launch booted machines into the named subnet of the launch's zone instead of the
    region's default VPC.

    A booted launch (``spec.boot``) imports the buyer's first importable key as the order's key pair, opens the
    boot's (port, CIDR) pairs in the order's security group, sizes the image's root volume and carries the boot
    script as user data; key pair and group are named ``broker-<order>``, tagged ``broker:order`` and made once
    per order and region. A launch naming ``spec.placement_group`` goes into that cluster placement group, made
    (tagged ``broker:placement-group``) by the first launch that names it.
    """

    kind = "aws"
    launch_limits: ClassVar[LaunchLimits] = LaunchLimits(
        # "User data is limited to 16 KB, in raw form, before it is base64-encoded."
        user_data_max_bytes=16 * 1024,
        user_data_measure=UserDataMeasure.RAW,
        user_data_field="EC2's RunInstances UserData",
        source=(
            "EC2 User Guide, Work with instance user data, "
            "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html"
        ),
        # gp3 VolumeSize "1 - 16,384 GiB" (EC2 API reference, EbsBlockDevice,
        # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html).
        disk_gb_min=1,
        disk_gb_max=16384,
        ingress_rules_max=RULES_PER_GROUP_PER_FAMILY,
        native_key_types=launching.NATIVE_KEY_TYPES,
    )
    login_user: ClassVar[str] = launching.DLAMI_LOGIN_USER
    placement_groups: ClassVar[bool] = True
    prepares_launch: ClassVar[bool] = True

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an AWS account needs at least one region")
        access_key_id = credentials.values.get("access_key_id", "")
        secret = credentials.values.get("secret_access_key", "")
        if not access_key_id or not secret:
            raise CredentialsRejected("access_key_id and secret_access_key are required", provider=errors.PROVIDER)
        max_attempts = int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS))
        self._client = AwsClient(
            ClientSettings(
                access_key_id=access_key_id,
                secret_access_key=secret,
                session_token=credentials.values.get("session_token") or None,
                endpoint_url=credentials.endpoint_url or None,
                connect_timeout=option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=max_attempts,
                rate_limits=ratelimit.limits_from_options(self.options, self.kind),
            )
        )
        self._images: dict[str, str] = {}
        self._image_facts: dict[tuple[str, str], launching.ImageFacts] = {}
        self._made: dict[tuple[str, str, str, str], tuple[str, frozenset[launching.Permission]]] = {}
        self.price_refusals: list[catalog.PriceRefusal] = []

    def _now(self) -> datetime:
        return datetime.now(UTC)

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``describe_availability_zones`` in the first region: cheap, needs only ``ec2:Describe*``.

        Raises ``CredentialsRejected`` (AuthFailure, UnauthorizedOperation, ...) or ``TransientProviderError``.
        """
        result = self._client.call(self.regions[0], "describe_availability_zones")
        if "AvailabilityZones" not in result:
            raise errors.malformed("describe_availability_zones answered without AvailabilityZones")

    def list_offers(self) -> list[OfferQuote]:
        """One on-demand quote per (zone, GPU type) with an on-demand price, and one spot quote per (zone, type)
        where the zone has a spot price. Types without an on-demand price in a region are left out.

        A Price List product priced in anything but USD per hour is not quoted: it is logged and kept, with
        its reason, in ``self.price_refusals`` (the last call's). Read-only; raises ``TransientProviderError``,
        ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        self.price_refusals = []
        offers: list[OfferQuote] = []
        for region in self.regions:
            offers.extend(self._region_offers(region))
        return offers

    def _region_offers(self, region: str) -> list[OfferQuote]:
        catalogue: dict[str, catalog.InstanceTypeSpec] = {}
        for item in self._client.pages(
            region,
            "describe_instance_types",
            "InstanceTypes",
            Filters=[{"Name": "instance-type", "Values": GPU_INSTANCE_TYPE_PATTERNS}],
        ):
            spec = catalog.instance_type_spec(item)
            if spec is not None:
                catalogue[spec.instance_type] = spec
        if not catalogue:
            return []

        offerings: list[Any] = []
        for names in _chunks(sorted(catalogue), FILTER_VALUES_PER_CALL):
            offerings.extend(
                self._client.pages(
                    region,
                    "describe_instance_type_offerings",
                    "InstanceTypeOfferings",
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": names}],
                )
            )
        zones = {name: z for name, z in catalog.zones_by_type(offerings).items() if name in catalogue}

        on_demand = self._on_demand_prices(region, sorted(zones))

        spot = self._spot_prices(region, sorted(on_demand))

        offers: list[OfferQuote] = []
        for name in sorted(on_demand):
            spec = catalogue[name]
            od_price, sku = on_demand[name]
            for zone in zones[name]:
                offers.append(self._quote(region, zone, spec, PricingModel.ON_DEMAND, od_price, {"price_sku": sku}))
                point = spot.get((name, zone))
                if point is not None:
                    extra = {"spot_price_timestamp": point.timestamp.isoformat()}
                    offers.append(self._quote(region, zone, spec, PricingModel.SPOT, point.price, extra))
        return offers

    def _quote(
        self,
        region: str,
        zone: str,
        spec: catalog.InstanceTypeSpec,
        pricing_model: PricingModel,
        price: Decimal,
        extra: dict[str, Any],
    ) -> OfferQuote:
        return OfferQuote(
            region=region,
            zone=zone,
            instance_type=spec.instance_type,
            pricing_model=pricing_model,
            gpu_model=spec.gpu.model,
            gpu_count=spec.gpu.count,
            gpu_memory_gb=spec.gpu.memory_gb,
            vcpus=spec.vcpus,
            memory_gib=spec.memory_gib,
            price=price,
            currency="USD",
            capacity=None,
            interconnect=spec.gpu.interconnect,
            extra={**spec.extra, **extra},
        )

    def _on_demand_prices(self, region: str, instance_types: list[str]) -> dict[str, tuple[Decimal, str]]:
        # One ANY_OF query per chunk of types instead of one query per type: a region's prices in a few
        # calls (the Price List API is slow and rate-limited per account).
        prices: dict[str, tuple[Decimal, str]] = {}
        terms = {"regionCode": region, **PRICE_FILTERS}
        try:
            values = any_of_values(instance_types, PRICE_TYPES_PER_CALL, PRICE_FILTER_VALUE_MAX)
        except ValueError as exc:
            raise errors.malformed(f"describe_instance_types named an unpriceable type: {exc}") from None
        for value in values:
            items = self._client.price_list(
                ServiceCode="AmazonEC2",
                FormatVersion="aws_v1",
                Filters=[
                    {"Type": "ANY_OF", "Field": "instanceType", "Value": value},
                    *({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()),
                ],
            )
            read = catalog.on_demand_usd_by_type(items)
            prices.update(read.prices)
            for refusal in read.refused:
                log.warning(
                    "aws %s: no quote for %s: Price List product %s refused: %s",
                    region,
                    refusal.instance_type,
                    refusal.sku,
                    refusal.reason,
                )
            self.price_refusals.extend(read.refused)
        return prices

    def _spot_prices(self, region: str, instance_types: list[str]) -> dict[tuple[str, str], catalog.SpotPoint]:
        if not instance_types:
            return {}
        history: list[Any] = []
        start = self._now() - SPOT_LOOKBACK
        for names in _chunks(instance_types, FILTER_VALUES_PER_CALL):
            history.extend(
                self._client.pages(
                    region,
                    "describe_spot_price_history",
                    "SpotPriceHistory",
                    InstanceTypes=names,
                    ProductDescriptions=[SPOT_PRODUCT],
                    StartTime=start,
                )
            )
        return catalog.newest_spot_prices(history)

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` (InvalidInstanceID.NotFound) if unknown."""
        # One call, not the paginator: a request naming instance ids is answered whole ("You cannot specify this
        # parameter [MaxResults] and the instance IDs parameter in the same request", DescribeInstances, EC2 API
        # reference, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html).
        answer = self._client.call(region, "describe_instances", InstanceIds=[instance_id])
        reservations = answer.get("Reservations") or []
        handles = [h for h in mapping.handles_from_reservations(reservations, region) if h.instance_id == instance_id]
        if not handles:
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}",
                code="InvalidInstanceID.NotFound",
                provider=errors.PROVIDER,
            )
        return handles[0]

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """``DescribeInstances`` with an ``instance-id`` filter of at most ``DESCRIBE_FILTER_VALUES_MAX`` ids per
        call (``ceil(n / 200)`` calls; each asks for ``DESCRIBE_PAGE_MAX`` items, so one page holds them all).

        A filter, not ``InstanceIds``: "If you specify an instance ID that is not valid, an error is returned"
        (EC2 API reference, DescribeInstances), so one forgotten instance would fail the call for every other;
        a filter value that matches nothing is simply not in the answer, which is this contract's "not found".
        Terminated instances stay listed for a while ("usually less than one hour") before they are absent."""
        wanted = list(dict.fromkeys(instance_ids))
        found: dict[str, InstanceHandle] = {}
        for ids in _chunks(wanted, DESCRIBE_FILTER_VALUES_MAX):
            reservations = self._client.pages(
                region,
                "describe_instances",
                "Reservations",
                Filters=[{"Name": "instance-id", "Values": ids}],
                MaxResults=DESCRIBE_PAGE_MAX,
            )
            asked = set(ids)
            for handle in mapping.handles_from_reservations(reservations, region):
                if handle.instance_id in asked:  # a filter the server ignored must not answer for strangers
                    found[handle.instance_id] = handle
        return found

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Every instance tagged ``broker:order=<order_ref>`` in every region of the account, in any state."""
        handles: list[InstanceHandle] = []
        for region in self.regions:
            reservations = self._client.pages(
                region,
                "describe_instances",
                "Reservations",
                Filters=[{"Name": f"tag:{mapping.ORDER_TAG}", "Values": [order_ref]}],
            )
            handles.extend(mapping.handles_from_reservations(reservations, region))
        return sorted(handles, key=lambda h: (h.region, h.instance_id))

    # ------------------------------------------------------------------------------------------ writes

    def launch_prepare(self, spec: LaunchSpec) -> None:
        """The boot's image read, key pair and security group (``_boot_params``), for ``launch(spec)`` to find;
        nothing for a launch whose boot this cloud would refuse (``launch_problems``)."""
        if spec.boot is not None and not self.launch_problems(spec):
            self._boot_params(spec)

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``run_instances`` for one instance, tagged ``broker:order`` (+ ``spec.tags``), idempotent on
        ``spec.client_token`` in ``spec.region``. Exactly one attempt: see ``ProviderAdapter.launch``.

        With ``spec.boot``: raises ``ImageUnavailable`` (naming the region) before any write when the image is
        missing, then finds or creates the order's key pair and security group (a repeat creates neither again)
        and launches with them, the boot script as ``UserData`` and the root volume sized. Without it the request
        is the bare launch it always was.

        With ``spec.placement_group``: makes the cluster placement group unless it exists, then launches into it
        in ``spec.zone``. A group holding instances in another zone refuses the launch
        (``ProviderRequestRejected``, ``InvalidPlacementGroup.InUse``); no room for the group in the zone is
        ``CapacityUnavailable`` (``InsufficientInstanceCapacity``), as for any launch.
        """
        mapping.validate_client_token(spec.client_token)
        if spec.pricing_model is PricingModel.RESERVED:
            raise ProviderRequestRejected("reserved capacity cannot be launched on demand", provider=errors.PROVIDER)
        # The boot's resources first: a missing image fails here, before anything exists at AWS.
        boot_params = self._boot_params(spec) if spec.boot is not None else {}
        params: dict[str, Any] = {
            "ImageId": boot_params.get("ImageId")
            or spec.image
            or self.options.get("image_id")
            or self._default_image(spec.region),
            "InstanceType": spec.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": spec.client_token,
            "Placement": {"AvailabilityZone": spec.zone},
            "TagSpecifications": mapping.tag_specifications(spec.order_ref, spec.tags),
        }
        if spec.pricing_model is PricingModel.SPOT:
            spot_options: dict[str, str] = {"SpotInstanceType": "one-time"}
            if spec.max_price is not None:
                spot_options["MaxPrice"] = str(spec.max_price)
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot_options}
        params.update(boot_params)
        if spec.placement_group is not None:
            self._placement_group(spec.region, spec.placement_group)
            params["Placement"]["GroupName"] = spec.placement_group
        # The no-retry client: a retried 500 could hide a capacity error behind a second, different answer.
        try:
            reservation = self._client.launch(spec.region, **params)
        except ImageUnavailable:
            self._image_refused(spec.region, params["ImageId"])
            raise
        handles = mapping.handles_from_reservations([reservation], spec.region)
        if len(handles) != 1:
            raise errors.malformed(f"run_instances returned {len(handles)} instances for MaxCount=1")
        return handles[0]

    # ---------------------------------------------------------------------------- stop, start, reboot

    stoppable: ClassVar[bool] = True
    # "We don't charge usage for a stopped instance, or data transfer fees; however, your root partition Amazon
    # EBS volume remains and continues to persist your data, and you are charged for Amazon EBS volume usage"
    # (EC2 API reference, StopInstances, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html).
    stopped_billing: ClassVar[str] = (
        "its EBS volumes (disk storage); the instance itself is not billed while stopped (EC2 API reference, "
        "StopInstances, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html)"
    )

    def can_stop(self, pricing_model: str) -> bool:
        # The broker buys spot as one-time requests, and EC2 stops only persistent spot requests' instances
        # ("If your Spot Instance was launched by a one-time request, you can't stop it", EC2 user guide,
        # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/stop-start-spot-instances.html).
        return pricing_model != PricingModel.SPOT

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """``StopInstances``; a no-op (no API write) when the instance is stopped or stopping already. EC2 refuses
        a terminated instance (``IncorrectInstanceState``) and a one-time spot instance (``UnsupportedOperation``):
        ``ProviderRequestRejected``."""
        current = self.describe(region, instance_id)
        if current.state is InstanceState.STOPPED or current.extra.get("state_name") == "stopping":
            return current
        result = self._client.call(region, "stop_instances", InstanceIds=[instance_id])
        return self._changed(current, result, "StoppingInstances")

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """``StartInstances``; a no-op (no API write) when the instance is pending or running already. No room
        to start it in its zone is ``CapacityUnavailable`` (``InsufficientInstanceCapacity``); the instance stays
        stopped with its volumes. A stop still under way or a terminated instance is refused by EC2
        (``IncorrectInstanceState``): ``ProviderRequestRejected``."""
        current = self.describe(region, instance_id)
        if current.state in (InstanceState.PENDING, InstanceState.RUNNING):
            return current
        # The no-retry client, as for a launch: botocore would retry the 500 of InsufficientInstanceCapacity.
        result = self._client.once(region, "start_instances", InstanceIds=[instance_id])
        return self._changed(current, result, "StartingInstances")

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """``RebootInstances``: the instance keeps its volumes, addresses and state ``running`` throughout. EC2
        refuses a stopped or terminated instance (``IncorrectInstanceState``): ``ProviderRequestRejected``."""
        current = self.describe(region, instance_id)
        if current.state is not InstanceState.RUNNING:
            raise ProviderRequestRejected(
                f"instance {instance_id} is {current.extra.get('state_name', current.state.value)}, not running",
                code="IncorrectInstanceState",
                provider=errors.PROVIDER,
            )
        self._client.call(region, "reboot_instances", InstanceIds=[instance_id])
        return current

    def _changed(self, current: InstanceHandle, result: dict[str, Any], key: str) -> InstanceHandle:
        """``current`` in the state a Stop/Start/TerminateInstances answer reports for it."""
        try:
            entry = next(t for t in result[key] if t["InstanceId"] == current.instance_id)
            state_name = str(entry["CurrentState"]["Name"])
        except (KeyError, TypeError, StopIteration) as exc:
            raise errors.malformed(f"answer without {current.instance_id} in {key} ({exc!r})") from None
        return InstanceHandle(
            instance_id=current.instance_id,
            region=current.region,
            zone=current.zone,
            instance_type=current.instance_type,
            state=mapping.instance_state(state_name),
            public_ip=current.public_ip,
            private_ip=current.private_ip,
            launched_at=current.launched_at,
            tags=current.tags,
            extra={**current.extra, "state_name": state_name},
        )

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Terminate the instance; a no-op (no API write) when it is already terminated.

        Raises ``ProviderRequestRejected`` (InvalidInstanceID.NotFound) for an id AWS does not know.
        """
        # Describe first: terminate_instances answers without zone or type, and a terminated instance needs no write.
        current = self.describe(region, instance_id)
        if current.state is InstanceState.TERMINATED or current.state is InstanceState.FAILED:
            return current
        result = self._client.call(region, "terminate_instances", InstanceIds=[instance_id])
        return self._changed(current, result, "TerminatingInstances")
