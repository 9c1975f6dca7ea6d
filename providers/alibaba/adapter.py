"""``AlibabaAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Alibaba Cloud ECS."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from providers.alibaba import mapping
from providers.alibaba.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    AlibabaClient,
    ClientSettings,
)
from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ProviderRequestRejected
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

# A public Alibaba Ubuntu 22.04 image id (the sandbox knows it too); override with options.image_id.
DEFAULT_IMAGE_ID = "ubuntu_22_04_x64_20G_alibase_20230815.vhd"
PRICE_UNIT = "Hour"
CHARGE_TYPE = "PostPaid"  # pay-as-you-go: the only charge type the broker resells
NETWORK_TYPE = "vpc"
SPOT_LOOKBACK = timedelta(hours=1)
INSTANCE_TYPES_PAGE = 100
INSTANCES_PAGE = 100
SPOT_HISTORY_PAGES = 100


class AlibabaAdapter(ProviderAdapter):
    """One Alibaba Cloud account over ``self.regions``.

    Credentials: ``values`` holds ``access_key_id`` and ``access_key_secret`` (and optionally an STS
    ``security_token``); ``endpoint_url``, when set (``http://127.0.0.1:P`` for the sandbox), replaces the
    regional ECS endpoint. Options (all strings): ``connect_timeout``/``read_timeout`` seconds (defaults 5/20),
    ``max_attempts`` for reads (default 3), ``image_id`` (default a public Ubuntu 22.04 image),
    ``vswitch_id`` and ``security_group_id`` passed to RunInstances when set.

    Prices stay in the currency ECS states (CNY in mainland regions).
    """

    kind = "alibaba"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an Alibaba Cloud account needs at least one region")
        access_key_id = credentials.values.get("access_key_id", "")
        secret = credentials.values.get("access_key_secret", "")
        if not access_key_id or not secret:
            # Without a key pair the SDK would fall back to its credential chain (env, files, instance role).
            raise CredentialsRejected("access_key_id and access_key_secret are required", provider=mapping.PROVIDER)
        self._client = AlibabaClient(
            ClientSettings(
                access_key_id=access_key_id,
                access_key_secret=secret,
                security_token=credentials.values.get("security_token") or None,
                endpoint_url=credentials.endpoint_url or None,
                connect_timeout=option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
            )
        )

    def _now(self) -> datetime:
        return datetime.now(UTC)

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``DescribeRegions`` in the first region: cheap and allowed by any ECS read policy.

        Raises ``CredentialsRejected`` (InvalidAccessKeyId.NotFound, SignatureDoesNotMatch, ...) or
        ``TransientProviderError``.
        """
        body = self._client.call(self.regions[0], "DescribeRegions", {})
        if "Regions" not in body:
            raise mapping.malformed("DescribeRegions answered without Regions")

    def list_offers(self) -> list[OfferQuote]:
        """One on-demand quote per (zone, GPU type) that ECS reports in stock (WithStock or ClosedWithStock)
        and prices, plus one spot quote per (zone, type) with a spot price in the recent history.

        WithoutStock zones produce no quote (rather than a quote with capacity 0), so a sold-out zone simply
        drops out of the broker's catalogue until stock returns. Read-only; raises ``TransientProviderError``,
        ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        catalogue = self._catalogue()
        offers: list[OfferQuote] = []
        if catalogue:
            for region in self.regions:
                offers.extend(self._region_offers(region, catalogue))
        return offers

    def _catalogue(self) -> dict[str, mapping.InstanceTypeSpec]:
        # DescribeInstanceTypes is not regional (it has no RegionId); one read serves every region.
        items = self._client.pages(
            self.regions[0],
            "DescribeInstanceTypes",
            {"MinimumGPUAmount": 1, "MaxResults": INSTANCE_TYPES_PAGE},
            "InstanceTypes",
            "InstanceType",
        )
        catalogue: dict[str, mapping.InstanceTypeSpec] = {}
        for item in items:
            spec = mapping.instance_type_spec(item)
            if spec is not None:
                catalogue[spec.instance_type] = spec
        return catalogue

    def _region_offers(self, region: str, catalogue: dict[str, mapping.InstanceTypeSpec]) -> list[OfferQuote]:
        # Without ZoneId/InstanceType one answer covers every zone and type of the region.
        body = self._client.call(
            region,
            "DescribeAvailableResource",
            {
                "RegionId": region,
                "DestinationResource": "InstanceType",
                "InstanceChargeType": CHARGE_TYPE,
                "SpotStrategy": "NoSpot",
            },
        )
        stock = mapping.zone_stock(body)
        offers: list[OfferQuote] = []
        for name in sorted(set(stock) & set(catalogue)):
            spec = catalogue[name]
            zones = sorted(z for z, category in stock[name].items() if category in mapping.STOCK_BUYABLE)
            priced: list[str] = []
            # DescribePrice takes a zone and ECS may price zones apart, so each zone is asked, not the first one.
            for zone in zones:
                price = self._price(region, name, zone)
                if price is None:
                    continue
                priced.append(zone)
                extra = {
                    "stock_status": stock[name][zone],
                    "original_price": str(price.original),
                    "discount_price": str(price.discount),
                    "price_unit": PRICE_UNIT,
                }
                offers.append(
                    self._quote(region, zone, spec, PricingModel.ON_DEMAND, price.trade, price.currency, extra)
                )
            if not priced:
                continue
            # Spot quotes only where the on-demand read shows the zone on sale: it is the only stock signal read.
            for zone, point in sorted(self._spot_prices(region, name).items()):
                if zone not in priced:
                    continue
                extra = {
                    "stock_status": stock[name][zone],
                    "spot_price_timestamp": point.timestamp.isoformat(),
                    "spot_origin_price": str(point.origin_price) if point.origin_price is not None else "",
                }
                offers.append(
                    self._quote(region, zone, spec, PricingModel.SPOT, point.price, mapping.DEFAULT_CURRENCY, extra)
                )
        return offers

    def _quote(
        self,
        region: str,
        zone: str,
        spec: mapping.InstanceTypeSpec,
        pricing_model: PricingModel,
        price: Any,
        currency: str,
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
            currency=currency,
            capacity=None,
            interconnect=spec.gpu.interconnect,
            extra={**spec.extra, **extra},
        )

    def _price(self, region: str, instance_type: str, zone: str) -> mapping.Price | None:
        """The hourly pay-as-you-go price, or None when ECS will not price the type in the zone (left out)."""
        try:
            body = self._client.call(
                region,
                "DescribePrice",
                {
                    "RegionId": region,
                    "ResourceType": "instance",
                    "InstanceType": instance_type,
                    "ZoneId": zone,
                    "PriceUnit": PRICE_UNIT,
                    "SpotStrategy": "NoSpot",
                },
            )
        except ProviderRequestRejected:
            return None
        return mapping.price_from_body(body)

    def _spot_prices(self, region: str, instance_type: str) -> dict[str, mapping.SpotPoint]:
        """Newest spot price per zone from ``DescribeSpotPriceHistory`` (Offset/NextOffset pagination)."""
        now = self._now()
        params: dict[str, Any] = {
            "RegionId": region,
            "InstanceType": instance_type,
            "NetworkType": NETWORK_TYPE,
            "OSType": "linux",
            "StartTime": mapping.format_time(now - SPOT_LOOKBACK),
            "EndTime": mapping.format_time(now),
        }
        rows: list[Any] = []
        offset = 0
        for _ in range(SPOT_HISTORY_PAGES):
            body = self._client.call(
                region, "DescribeSpotPriceHistory", {**params, "Offset": offset} if offset else params
            )
            page = (body.get("SpotPrices") or {}).get("SpotPriceType") or []
            rows.extend(page)
            next_offset = int(body.get("NextOffset") or 0)
            if not page or next_offset <= offset:
                break
            offset = next_offset
        return mapping.newest_spot_prices(rows)

    def _lookup(self, region: str, instance_id: str) -> InstanceHandle | None:
        # This API takes InstanceIds as a JSON array string, not as InstanceId.N.
        body = self._client.call(
            region,
            "DescribeInstances",
            {"RegionId": region, "InstanceIds": json.dumps([instance_id]), "MaxResults": INSTANCES_PAGE},
        )
        found = [h for h in mapping.handles_from_body(body, region) if h.instance_id == instance_id]
        return found[0] if found else None

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` (InvalidInstanceId.NotFound) if ECS
        does not list it, which is also what a released instance looks like."""
        handle = self._lookup(region, instance_id)
        if handle is None:
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}",
                code="InvalidInstanceId.NotFound",
                provider=mapping.PROVIDER,
            )
        return handle

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Every instance tagged ``broker:order=<order_ref>`` in every region of the account.

        Released instances are not listed: ECS forgets them.
        """
        handles: list[InstanceHandle] = []
        for region in self.regions:
            items = self._client.pages(
                region,
                "DescribeInstances",
                {
                    "RegionId": region,
                    "Tag": [{"Key": mapping.ORDER_TAG, "Value": order_ref}],
                    "MaxResults": INSTANCES_PAGE,
                },
                "Instances",
                "Instance",
            )
            handles.extend(mapping.instance_handle(item, region) for item in items)
        return sorted(handles, key=lambda h: (h.region, h.instance_id))

    # ------------------------------------------------------------------------------------------ writes

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``RunInstances`` for one pay-as-you-go instance (Amount=MinAmount=1), tagged ``broker:order``
        (+ ``spec.tags``), idempotent on ``spec.client_token`` (ECS ``ClientToken``) in ``spec.region``.

        Exactly one attempt: see ``ProviderAdapter.launch``. ECS answers with the instance id only, so the
        handle is PENDING with the requested zone and type; ``describe`` reports what ECS then says.
        """
        mapping.validate_client_token(spec.client_token)
        if spec.pricing_model is PricingModel.RESERVED:
            raise ProviderRequestRejected("reserved capacity cannot be launched on demand", provider=mapping.PROVIDER)
        strategy, limit = mapping.spot_strategy(spec.pricing_model, spec.max_price)
        tags = mapping.run_tags(spec.order_ref, spec.tags)
        image_id = spec.image or self.options.get("image_id") or DEFAULT_IMAGE_ID
        params: dict[str, Any] = {
            "RegionId": spec.region,
            "ZoneId": spec.zone,
            "InstanceType": spec.instance_type,
            "ImageId": image_id,
            "ClientToken": spec.client_token,
            "Amount": 1,
            "MinAmount": 1,
            "InstanceChargeType": CHARGE_TYPE,
            "SpotStrategy": strategy,
            "Tag": tags,
        }
        if limit is not None:
            params["SpotPriceLimit"] = float(limit)
        for option, name in (("vswitch_id", "VSwitchId"), ("security_group_id", "SecurityGroupId")):
            if self.options.get(option):
                params[name] = self.options[option]
        body = self._client.launch(spec.region, params)
        ids = (body.get("InstanceIdSets") or {}).get("InstanceIdSet") or []
        if len(ids) != 1:
            raise mapping.malformed(f"RunInstances returned {len(ids)} instance ids for Amount=1")
        return InstanceHandle(
            instance_id=str(ids[0]),
            region=spec.region,
            zone=spec.zone,
            instance_type=spec.instance_type,
            state=InstanceState.PENDING,
            tags={t["Key"]: t["Value"] for t in tags},
            extra={
                "status": "Pending",
                "client_token": spec.client_token,
                "spot_strategy": strategy,
                "image_id": image_id,
                "order_id": str(body.get("OrderId") or ""),
                "request_id": str(body.get("RequestId") or ""),
            },
        )

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Release the instance with ``DeleteInstances(Force=True)``; TERMINATED once ECS accepted the release.

        Idempotent: an instance ECS no longer lists (already released) is reported TERMINATED without a write.
        ECS cannot tell "released" from "never existed", so an unknown id is reported the same way.
        """
        current = self._lookup(region, instance_id)
        if current is None:
            return InstanceHandle(
                instance_id=instance_id,
                region=region,
                zone="",
                instance_type="",
                state=InstanceState.TERMINATED,
                extra={"status": "Released"},
            )
        try:
            # Force releases a Running instance without a stop first: the rental is over, nothing to shut down
            # gracefully. The token makes a retried release (after a timeout) the same request, not a second one.
            self._client.call(
                region,
                "DeleteInstances",
                {
                    "RegionId": region,
                    "InstanceId": [instance_id],
                    "Force": True,
                    "ClientToken": f"release-{instance_id}",
                },
            )
        except ProviderRequestRejected as exc:
            if exc.code != "InvalidInstanceId.NotFound":  # released between the lookup and the delete
                raise
        return replace(current, state=InstanceState.TERMINATED, extra={**current.extra, "status": "Released"})
