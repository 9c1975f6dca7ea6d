"""``AlibabaAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Alibaba Cloud ECS."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from providers import ratelimit
from providers.alibaba import catalog, errors, launching, mapping
from providers.alibaba.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    AlibabaClient,
    ClientSettings,
)
from providers.alibaba.order_resources import AlibabaOrderResources
from providers.base import ProviderAdapter
from providers.errors import CredentialsRejected, ImageUnavailable, ProviderRequestRejected
from providers.launch import LaunchLimits, UserDataMeasure
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

PRICE_UNIT = "Hour"
CHARGE_TYPE = "PostPaid"  # pay-as-you-go: the only charge type the broker resells
NETWORK_TYPE = "vpc"
SPOT_LOOKBACK = timedelta(hours=1)
INSTANCE_TYPES_PAGE = 100
INSTANCES_PAGE = 100
# DescribeInstances InstanceIds: "a JSON array that consists of up to 100 instance IDs", and MaxResults at most
# 100 (ECS API reference, DescribeInstances,
# https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-describeinstances).
DESCRIBE_IDS_MAX = 100
SPOT_HISTORY_PAGES = 100
RUN_INSTANCES_REFERENCE = "https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-runinstances"


class AlibabaAdapter(AlibabaOrderResources, ProviderAdapter):
    """One Alibaba Cloud account over ``self.regions``.

    Credentials: ``values`` holds ``access_key_id`` and ``access_key_secret`` (and optionally an STS
    ``security_token``); ``endpoint_url``, when set (``http://127.0.0.1:P`` for the sandbox), replaces the
    regional ECS endpoint. Options (all strings): ``connect_timeout``/``read_timeout`` seconds (defaults 5/20),
    ``max_attempts`` for reads (default 3), ``image_id`` (an image every launch uses instead of the default),
    ``image_family`` (the public family every launch without an image takes its newest Available build from,
    default ``acs:ubuntu_22_04_x64``: no dated build is pinned, so a retired one never breaks launches),
    ``vswitch_id`` (the vSwitch to launch in; a booted launch in a zone the vSwitch is not in uses the zone's
    default vSwitch) and ``security_group_id`` (the group of a launch without boot: a booted
    launch gets a group of its own).

    A launch with ``spec.boot`` delivers it in ECS's own mechanisms: the first RSA or ECDSA key as an imported key
    pair (``KeyPairName``), a security group of the order's (port, range) pairs in the vSwitch's VPC
    (``SecurityGroupId``), ``SystemDisk.Size``, the newest image of the family (or the buyer's own) checked to exist
    first, and the boot script as Base64 ``UserData``, led by the GPU driver installation Alibaba documents. The
    key pair and the group are named and tagged after the order, one of each per region, and reused by every
    attempt there.

    Prices stay in the currency each ECS answer states (CNY on the China site, USD on the International site); an
    answer that states none, or another, fails the read rather than being labelled by guess.
    """

    kind = "alibaba"
    launch_limits: ClassVar[LaunchLimits] = LaunchLimits(
        user_data_max_bytes=launching.USER_DATA_MAX_BYTES,
        user_data_measure=UserDataMeasure.RAW,
        user_data_field="RunInstances UserData",
        source=f"ECS RunInstances reference: at most 32 KB before Base64 encoding, {RUN_INSTANCES_REFERENCE}",
        disk_gb_min=launching.SYSTEM_DISK_MIN_GB,
        disk_gb_max=launching.SYSTEM_DISK_MAX_GB,
        ingress_rules_max=launching.INGRESS_RULES_MAX,
        native_key_types=launching.NATIVE_KEY_TYPES,
    )
    # Alibaba's public Linux images log in as root; an imported key pair is bound to root.
    login_user: ClassVar[str] = "root"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an Alibaba Cloud account needs at least one region")
        access_key_id = credentials.values.get("access_key_id", "")
        secret = credentials.values.get("access_key_secret", "")
        if not access_key_id or not secret:
            # Without a key pair the SDK would fall back to its credential chain (env, files, instance role).
            raise CredentialsRejected("access_key_id and access_key_secret are required", provider=errors.PROVIDER)
        self._client = AlibabaClient(
            ClientSettings(
                access_key_id=access_key_id,
                access_key_secret=secret,
                security_token=credentials.values.get("security_token") or None,
                endpoint_url=credentials.endpoint_url or None,
                connect_timeout=option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
                rate_limits=ratelimit.limits_from_options(self.options, self.kind),
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
            raise errors.malformed("DescribeRegions answered without Regions")

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

    def _catalogue(self) -> dict[str, catalog.InstanceTypeSpec]:
        # DescribeInstanceTypes is not regional (it has no RegionId); one read serves every region.
        items = self._client.pages(
            self.regions[0],
            "DescribeInstanceTypes",
            {"MinimumGPUAmount": 1, "MaxResults": INSTANCE_TYPES_PAGE},
            "InstanceTypes",
            "InstanceType",
        )
        catalogue: dict[str, catalog.InstanceTypeSpec] = {}
        for item in items:
            spec = catalog.instance_type_spec(item)
            if spec is not None:
                catalogue[spec.instance_type] = spec
        return catalogue

    def _region_offers(self, region: str, catalogue: dict[str, catalog.InstanceTypeSpec]) -> list[OfferQuote]:
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
        stock = catalog.zone_stock(body)
        offers: list[OfferQuote] = []
        for name in sorted(set(stock) & set(catalogue)):
            spec = catalogue[name]
            zones = sorted(z for z, category in stock[name].items() if category in catalog.STOCK_BUYABLE)
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
            spot_currency, points = self._spot_prices(region, name)
            for zone, point in sorted(points.items()):
                if zone not in priced:
                    continue
                extra = {
                    "stock_status": stock[name][zone],
                    "spot_price_timestamp": point.timestamp.isoformat(),
                    "spot_origin_price": str(point.origin_price) if point.origin_price is not None else "",
                }
                offers.append(self._quote(region, zone, spec, PricingModel.SPOT, point.price, spot_currency, extra))
        return offers

    def _quote(
        self,
        region: str,
        zone: str,
        spec: catalog.InstanceTypeSpec,
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

    def _price(self, region: str, instance_type: str, zone: str) -> catalog.Price | None:
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
        return catalog.price_from_body(body)

    def _spot_prices(self, region: str, instance_type: str) -> tuple[str, dict[str, catalog.SpotPoint]]:
        """(currency, newest spot price per zone) from ``DescribeSpotPriceHistory`` (Offset/NextOffset pagination).

        The currency is the answer's own ``Currency``, required on every page with rows and the same on all of them
        (``MalformedProviderResponse`` otherwise); "" when the history is empty.
        """
        now = self._now()
        params: dict[str, Any] = {
            "RegionId": region,
            "InstanceType": instance_type,
            "NetworkType": NETWORK_TYPE,
            "OSType": "linux",
            "StartTime": catalog.format_time(now - SPOT_LOOKBACK),
            "EndTime": catalog.format_time(now),
        }
        rows: list[Any] = []
        currency = ""
        offset = 0
        for _ in range(SPOT_HISTORY_PAGES):
            body = self._client.call(
                region, "DescribeSpotPriceHistory", {**params, "Offset": offset} if offset else params
            )
            page = (body.get("SpotPrices") or {}).get("SpotPriceType") or []
            if page:
                stated = catalog.answer_currency(body.get("Currency"), "DescribeSpotPriceHistory Currency")
                if currency and stated != currency:
                    raise errors.malformed(f"DescribeSpotPriceHistory pages in {currency} and {stated}")
                currency = stated
            rows.extend(page)
            next_offset = int(body.get("NextOffset") or 0)
            if not page or next_offset <= offset:
                break
            offset = next_offset
        return currency, catalog.newest_spot_prices(rows)

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
                provider=errors.PROVIDER,
            )
        return handle

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """``DescribeInstances`` with ``InstanceIds`` of at most ``DESCRIBE_IDS_MAX`` ids per call (``ceil(n /
        100)`` calls, one page each). ECS filters by the ids it has: one it does not list (released, or never
        there) is simply not in the answer, which is this contract's "not found"."""
        wanted = list(dict.fromkeys(instance_ids))
        found: dict[str, InstanceHandle] = {}
        for start in range(0, len(wanted), DESCRIBE_IDS_MAX):
            ids = wanted[start : start + DESCRIBE_IDS_MAX]
            items = self._client.pages(
                region,
                "DescribeInstances",
                {"RegionId": region, "InstanceIds": json.dumps(ids), "MaxResults": INSTANCES_PAGE},
                "Instances",
                "Instance",
            )
            asked = set(ids)
            for handle in (mapping.instance_handle(item, region) for item in items):
                if handle.instance_id in asked:
                    found[handle.instance_id] = handle
        return found

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

        With ``spec.boot`` the image, vSwitch, key pair and security group are settled first (see the class
        docstring); each is found before it is created, so a repeated launch creates nothing twice and sends the
        same request. A missing image raises ``ImageUnavailable`` before anything is created. Exactly one
        ``RunInstances`` attempt: see ``ProviderAdapter.launch``. ECS answers with the instance id only, so the
        handle is PENDING with the requested zone and type; ``describe`` reports what ECS then says.
        """
        mapping.validate_client_token(spec.client_token)
        if spec.pricing_model is PricingModel.RESERVED:
            raise ProviderRequestRejected("reserved capacity cannot be launched on demand", provider=errors.PROVIDER)
        strategy, limit = catalog.spot_strategy(spec.pricing_model, spec.max_price)
        tags = mapping.run_tags(spec.order_ref, spec.tags)
        params: dict[str, Any] = {
            "RegionId": spec.region,
            "ZoneId": spec.zone,
            "InstanceType": spec.instance_type,
            "ClientToken": spec.client_token,
            "Amount": 1,
            "MinAmount": 1,
            "InstanceChargeType": CHARGE_TYPE,
            "SpotStrategy": strategy,
            "Tag": tags,
        }
        if limit is not None:
            params["SpotPriceLimit"] = float(limit)
        looked_up = False
        if spec.boot is None:
            explicit = spec.image or self.options.get("image_id")
            looked_up = not explicit
            params["ImageId"] = explicit or str(self._family_image(spec.region, spec.instance_type)["ImageId"])
            for option, name in (("vswitch_id", "VSwitchId"), ("security_group_id", "SecurityGroupId")):
                if self.options.get(option):
                    params[name] = self.options[option]
        else:
            params.update(self._boot_params(spec, spec.boot))
        try:
            body = self._client.launch(spec.region, params)
        except ProviderRequestRejected as exc:
            # Withdrawn since it was looked up: the same failure a lookup finding nothing gives.
            if (spec.boot is not None or looked_up) and exc.code == "InvalidImageId.NotFound":
                raise ImageUnavailable(
                    f"image {params['ImageId']} is not available in {spec.region}",
                    code=exc.code,
                    provider=errors.PROVIDER,
                    http_status=exc.http_status,
                ) from exc
            raise
        ids = (body.get("InstanceIdSets") or {}).get("InstanceIdSet") or []
        if len(ids) != 1:
            raise errors.malformed(f"RunInstances returned {len(ids)} instance ids for Amount=1")
        extra = {
            "status": "Pending",
            "client_token": spec.client_token,
            "spot_strategy": strategy,
            "image_id": str(params["ImageId"]),
            "order_id": str(body.get("OrderId") or ""),
            "request_id": str(body.get("RequestId") or ""),
        }
        for name, key in (
            ("VSwitchId", "vswitch_id"),
            ("SecurityGroupId", "security_group_id"),
            ("KeyPairName", "key_pair_name"),
        ):
            if spec.boot is not None and params.get(name):
                extra[key] = str(params[name])
        return InstanceHandle(
            instance_id=str(ids[0]),
            region=spec.region,
            zone=spec.zone,
            instance_type=spec.instance_type,
            state=InstanceState.PENDING,
            tags={t["Key"]: t["Value"] for t in tags},
            extra=extra,
        )

    # ------------------------------------------------------------------------------------------------- boot

    # ---------------------------------------------------------------------------- stop, start, reboot

    stoppable: ClassVar[bool] = True
    # Economical mode (StoppedMode=StopCharging, pay-as-you-go and spot instances in a VPC): "computing resources,
    # such as vCPUs, memory, GPUs" are no longer billed; "system disks, data disks, EIPs and snapshots" continue
    # to be billed (ECS User Guide, Economical mode, https://www.alibabacloud.com/help/en/ecs/user-guide/economical-mode).
    stopped_billing: ClassVar[str] = (
        "its cloud disks (system and data disks, and any EIP or snapshots); a pay-as-you-go instance stopped in "
        "economical mode is not billed for vCPUs, memory or GPUs (ECS, Economical mode, "
        "https://www.alibabacloud.com/help/en/ecs/user-guide/economical-mode)"
    )

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """``StopInstance`` with ``StoppedMode=StopCharging`` (economical mode: compute released and no longer
        billed, disks kept); a no-op (no write) when ECS reports the instance Stopped or Stopping. ECS refuses any
        other status (``IncorrectInstanceStatus``) and an id it does not list (``InvalidInstanceId.NotFound``):
        ``ProviderRequestRejected``."""
        current = self.describe(region, instance_id)
        if current.extra.get("status") in ("Stopped", "Stopping"):
            return current
        self._client.call(region, "StopInstance", {"InstanceId": instance_id, "StoppedMode": "StopCharging"})
        return self.describe(region, instance_id)

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """``StartInstance``; a no-op (no write) when the instance is pending, starting or running. An instance
        stopped in economical mode must find its compute again: none in its zone is ``CapacityUnavailable``
        (``OperationDenied.NoStock``) and it stays Stopped with its disks."""
        current = self.describe(region, instance_id)
        if current.state in (InstanceState.PENDING, InstanceState.RUNNING):
            return current
        self._client.call(region, "StartInstance", {"InstanceId": instance_id})
        return self.describe(region, instance_id)

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """``RebootInstance``: a restart in place (same disks, same addresses). ECS refuses an instance that is not
        Running (``IncorrectInstanceStatus``): ``ProviderRequestRejected``."""
        self.describe(region, instance_id)  # an id ECS does not list: InvalidInstanceId.NotFound, named
        self._client.call(region, "RebootInstance", {"InstanceId": instance_id})
        return self.describe(region, instance_id)

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
