"""``TencentAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Tencent Cloud CVM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ProviderRequestRejected
from providers.options import option_number
from providers.tencent import mapping
from providers.tencent.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRY_BACKOFF,
    ClientSettings,
    TencentClient,
)
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

CHARGE_FILTER = {"Name": "instance-charge-type", "Values": [mapping.ON_DEMAND_CHARGE, mapping.SPOT_CHARGE]}
UBUNTU_FILTERS = [
    {"Name": "image-type", "Values": ["PUBLIC_IMAGE"]},
    {"Name": "platform", "Values": [mapping.UBUNTU_PLATFORM]},
]


class TencentAdapter(ProviderAdapter):
    """One Tencent Cloud account over ``self.regions`` (e.g. ``ap-guangzhou``).

    Credentials: ``values`` holds ``secret_id``, ``secret_key`` and optionally ``token`` (an STS session token);
    ``endpoint_url``, when set, replaces ``https://cvm.tencentcloudapi.com``. Options (all strings):
    ``connect_timeout``/``read_timeout`` seconds (defaults 5/20), ``max_attempts`` for reads (default 3),
    ``retry_backoff`` seconds before the first read retry (default 0.25), ``image_id`` to launch instead of the
    newest public Ubuntu x86_64 image. Prices are CNY per hour for the whole instance.
    """

    kind = "tencent"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: a Tencent Cloud account needs at least one region")
        secret_id = credentials.values.get("secret_id", "")
        secret_key = credentials.values.get("secret_key", "")
        if not secret_id or not secret_key:
            raise CredentialsRejected("secret_id and secret_key are required", provider=mapping.PROVIDER)
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
            )
        )
        self._images: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``DescribeZones`` in the first region: cheap and needs only read permission.

        Raises ``CredentialsRejected`` (AuthFailure.*, UnauthorizedOperation) or ``TransientProviderError``.
        """
        result = self._client.call(self.regions[0], "DescribeZones")
        if not isinstance(result.get("ZoneSet"), list):
            raise mapping.malformed("DescribeZones answered without ZoneSet")

    def list_offers(self) -> list[OfferQuote]:
        """One quote per (zone, GPU type, charge type) that CVM sells now, priced in CNY per hour.

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
            raise mapping.malformed("DescribeZoneInstanceConfigInfos answered without InstanceTypeQuotaSet")
        configs: list[Any] = []
        # GpuType lives only in DescribeInstanceTypeConfigs, whose filters take one value each: one call per
        # GPU family keeps the read to the GPU part of a catalogue of thousands of (zone, type) rows.
        for family in mapping.gpu_families(items):
            answer = self._client.call(
                region,
                "DescribeInstanceTypeConfigs",
                {"Filters": [{"Name": "instance-family", "Values": [family]}]},
            )
            configs.extend(answer.get("InstanceTypeConfigSet") or [])
        identities = mapping.gpu_identities(configs)
        offers = [offer for item in items if (offer := mapping.offer_from_quota_item(item, region, identities))]
        return sorted(offers, key=lambda q: (q.zone, q.instance_type, q.pricing_model.value))

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` (InvalidInstanceId.NotFound) when CVM
        does not know it, which includes an instance destroyed long enough ago to have left the recycle bin."""
        result = self._client.call(region, "DescribeInstances", {"InstanceIds": [instance_id]})
        found = [h for h in mapping.handles(result.get("InstanceSet") or [], region) if h.instance_id == instance_id]
        if not found:
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}", code=mapping.NOT_FOUND_CODE, provider=mapping.PROVIDER
            )
        return found[0]

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
        """
        mapping.validate_client_token(spec.client_token)
        charge = mapping.CHARGE_FOR_MODEL.get(spec.pricing_model)
        if charge is None:
            raise ProviderRequestRejected(
                f"{spec.pricing_model.value} capacity cannot be launched on demand", provider=mapping.PROVIDER
            )
        if spec.pricing_model is PricingModel.SPOT and spec.max_price is None:
            raise ProviderRequestRejected("a CVM spot launch needs max_price (the bid)", provider=mapping.PROVIDER)
        image_id = spec.image or self.options.get("image_id") or self._default_image(spec.region, spec.instance_type)
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
        result = self._client.launch(spec.region, params)
        ids = result.get("InstanceIdSet")
        if not isinstance(ids, list) or len(ids) != 1:
            raise mapping.malformed(f"RunInstances returned InstanceIdSet {ids!r} for InstanceCount=1")
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
        cached = self._images.get((region, instance_type))
        if cached:
            return cached
        images = self._client.pages(
            region, "DescribeImages", "ImageSet", {"Filters": UBUNTU_FILTERS, "InstanceType": instance_type}
        )
        image_id = mapping.newest_ubuntu_image(images)
        if image_id is None:
            raise ProviderRequestRejected(
                f"no public Ubuntu x86_64 image for {instance_type} in {region}; set options.image_id",
                provider=mapping.PROVIDER,
            )
        self._images[(region, instance_type)] = image_id
        return image_id

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
            if exc.code not in mapping.ALREADY_TERMINATING_CODES:
                raise
        try:
            return self.describe(region, instance_id)
        except ProviderRequestRejected as exc:
            if exc.code != mapping.NOT_FOUND_CODE:
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
