"""``AwsAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over EC2 and the Price List API."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from providers.aws import mapping
from providers.aws.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    AwsClient,
    ClientSettings,
)
from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ProviderRequestRejected
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

# Every AWS GPU family starts with g or p. An unfiltered catalogue is ~1,400 types of which ~65 have GPUs;
# the filter cuts the largest read of a sync by 20x. Entries are still kept only if they carry GpuInfo.
GPU_INSTANCE_TYPE_PATTERNS = ["g*", "p*"]
PRICE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
SPOT_PRODUCT = "Linux/UNIX"
# AWS reports, per zone, the price in effect at StartTime plus later changes: a short window is enough.
SPOT_LOOKBACK = timedelta(hours=1)
FILTER_VALUES_PER_CALL = 100  # EC2 caps the values of one filter; stay well below the cap
PRICE_TYPES_PER_CALL = 50


def _chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


class AwsAdapter(ProviderAdapter):
    """One AWS account over ``self.regions``.

    Credentials: ``values`` holds ``access_key_id``, ``secret_access_key`` and optionally ``session_token``;
    ``endpoint_url``, when set, is used for both EC2 and the Price List API. Options (all strings):
    ``connect_timeout``/``read_timeout`` seconds (defaults 5/20), ``max_attempts`` for reads (default 3),
    ``image_id`` to launch instead of the newest Canonical Ubuntu x86_64 image.
    """

    kind = "aws"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an AWS account needs at least one region")
        access_key_id = credentials.values.get("access_key_id", "")
        secret = credentials.values.get("secret_access_key", "")
        if not access_key_id or not secret:
            raise CredentialsRejected("access_key_id and secret_access_key are required", provider=mapping.PROVIDER)
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
            )
        )
        self._images: dict[str, str] = {}

    def _now(self) -> datetime:
        return datetime.now(UTC)

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``describe_availability_zones`` in the first region: cheap, needs only ``ec2:Describe*``.

        Raises ``CredentialsRejected`` (AuthFailure, UnauthorizedOperation, ...) or ``TransientProviderError``.
        """
        result = self._client.call(self.regions[0], "describe_availability_zones")
        if "AvailabilityZones" not in result:
            raise mapping.malformed("describe_availability_zones answered without AvailabilityZones")

    def list_offers(self) -> list[OfferQuote]:
        """One on-demand quote per (zone, GPU type) with an on-demand price, and one spot quote per (zone, type)
        where the zone has a spot price. Types without an on-demand price in a region are left out.

        Read-only; raises ``TransientProviderError``, ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        offers: list[OfferQuote] = []
        for region in self.regions:
            offers.extend(self._region_offers(region))
        return offers

    def _region_offers(self, region: str) -> list[OfferQuote]:
        catalogue: dict[str, mapping.InstanceTypeSpec] = {}
        for item in self._client.pages(
            region,
            "describe_instance_types",
            "InstanceTypes",
            Filters=[{"Name": "instance-type", "Values": GPU_INSTANCE_TYPE_PATTERNS}],
        ):
            spec = mapping.instance_type_spec(item)
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
        zones = {name: z for name, z in mapping.zones_by_type(offerings).items() if name in catalogue}

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
        spec: mapping.InstanceTypeSpec,
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
        for names in _chunks(instance_types, PRICE_TYPES_PER_CALL):
            items = self._client.price_list(
                ServiceCode="AmazonEC2",
                FormatVersion="aws_v1",
                Filters=[
                    {"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(names)},
                    *({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()),
                ],
            )
            prices.update(mapping.on_demand_usd_by_type(items))
        return prices

    def _spot_prices(self, region: str, instance_types: list[str]) -> dict[tuple[str, str], mapping.SpotPoint]:
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
        return mapping.newest_spot_prices(history)

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` (InvalidInstanceID.NotFound) if unknown."""
        reservations = self._client.pages(region, "describe_instances", "Reservations", InstanceIds=[instance_id])
        handles = [h for h in mapping.handles_from_reservations(reservations, region) if h.instance_id == instance_id]
        if not handles:
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}",
                code="InvalidInstanceID.NotFound",
                provider=mapping.PROVIDER,
            )
        return handles[0]

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

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``run_instances`` for one instance, tagged ``broker:order`` (+ ``spec.tags``), idempotent on
        ``spec.client_token`` in ``spec.region``. Exactly one attempt: see ``ProviderAdapter.launch``.
        """
        mapping.validate_client_token(spec.client_token)
        if spec.pricing_model is PricingModel.RESERVED:
            raise ProviderRequestRejected("reserved capacity cannot be launched on demand", provider=mapping.PROVIDER)
        params: dict[str, Any] = {
            "ImageId": spec.image or self.options.get("image_id") or self._default_image(spec.region),
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
        # The no-retry client: a retried 500 could hide a capacity error behind a second, different answer.
        reservation = self._client.launch(spec.region, **params)
        handles = mapping.handles_from_reservations([reservation], spec.region)
        if len(handles) != 1:
            raise mapping.malformed(f"run_instances returned {len(handles)} instances for MaxCount=1")
        return handles[0]

    def _default_image(self, region: str) -> str:
        cached = self._images.get(region)
        if cached:
            return cached
        images = self._client.pages(
            region,
            "describe_images",
            "Images",
            Owners=[mapping.UBUNTU_OWNER],
            Filters=[
                {"Name": "name", "Values": [mapping.UBUNTU_NAME_PATTERN]},
                {"Name": "architecture", "Values": ["x86_64"]},
                {"Name": "state", "Values": ["available"]},
            ],
        )
        image_id = mapping.newest_ubuntu_image(images)
        if image_id is None:
            raise ProviderRequestRejected(
                f"no Canonical Ubuntu x86_64 image in {region}; set options.image_id", provider=mapping.PROVIDER
            )
        self._images[region] = image_id
        return image_id

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Terminate the instance; a no-op (no API write) when it is already terminated.

        Raises ``ProviderRequestRejected`` (InvalidInstanceID.NotFound) for an id AWS does not know.
        """
        # Describe first: terminate_instances answers without zone or type, and a terminated instance needs no write.
        current = self.describe(region, instance_id)
        if current.state is InstanceState.TERMINATED or current.state is InstanceState.FAILED:
            return current
        result = self._client.call(region, "terminate_instances", InstanceIds=[instance_id])
        try:
            entry = next(t for t in result["TerminatingInstances"] if t["InstanceId"] == instance_id)
            state_name = str(entry["CurrentState"]["Name"])
        except (KeyError, TypeError, StopIteration) as exc:
            raise mapping.malformed(f"terminate_instances answer without {instance_id} ({exc!r})") from None
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
