"""The ECS sandbox's catalogue reads: ``DescribeRegions``, ``DescribeInstanceTypes``, ``DescribeAvailableResource``
(stock per zone), ``DescribePrice`` and ``DescribeSpotPriceHistory``, priced in the account's site currency.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.state import (
    INSTANCE_TYPES_DEFAULT_RESULTS,
    INSTANCE_TYPES_MAX_RESULTS,
    REGIONS,
    SPOT_STRATEGIES,
    SpotPricePoint,
    _Request,
    _spot_row,
)
from sandboxes.alibaba.wire import WireError


class CatalogueHandlers:
    """ECS's catalogue actions, mixed into ``AlibabaSandbox``."""

    _catalogue: dict[str, dict[str, Any]]
    _lock: threading.Lock
    _region: Callable[[_Request], str]
    _spot_history: dict[tuple[str, str], list[SpotPricePoint]]
    _stock: dict[tuple[str, str, str], str]
    _zone: Callable[[str, str], str]
    currency_of: Callable[[str], str]
    list_price: Callable[[str, str, str], Decimal | None]

    def _describe_regions(self, req: _Request) -> dict[str, Any]:
        regions = [
            {"RegionId": r, "LocalName": name, "RegionEndpoint": f"ecs.{r}.aliyuncs.com", "Status": "available"}
            for r, (name, _, _) in sorted(REGIONS.items())
        ]
        return {"Regions": {"Region": regions}}

    def _describe_instance_types(self, req: _Request) -> dict[str, Any]:
        params = req.params
        wanted = set(wire.indexed_list(params, "InstanceTypes"))
        families = set(wire.indexed_list(params, "InstanceTypeFamilies"))
        if params.get("InstanceTypeFamily"):
            families.add(params["InstanceTypeFamily"])
        min_gpus = wire.integer(params, "MinimumGPUAmount", 0, 0, 1000)
        max_gpus = wire.integer(params, "MaximumGPUAmount", 1000, 0, 1000)
        gpu_spec = params.get("GPUSpec", "")
        max_results = wire.integer(params, "MaxResults", INSTANCE_TYPES_DEFAULT_RESULTS, 1, INSTANCE_TYPES_MAX_RESULTS)
        matches = [
            entry
            for name, entry in sorted(self._catalogue.items())
            if (not wanted or name in wanted)
            and (not families or entry["InstanceTypeFamily"] in families)
            and min_gpus <= entry["GPUAmount"] <= max_gpus
            and (not gpu_spec or entry["GPUSpec"] == gpu_spec)
        ]
        page, token = self._page(matches, params, max_results)
        return {"NextToken": token, "InstanceTypes": {"InstanceType": page}}

    def _page(self, items: list[Any], params: dict[str, str], size: int) -> tuple[list[Any], str]:
        return wire.token_page(items, params, size)

    def _describe_available_resource(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        destination = wire.required(params, "DestinationResource")
        if destination not in ("InstanceType", "Zone"):
            raise WireError(
                "InvalidParameter",
                f'The sandbox answers DestinationResource "InstanceType" or "Zone", not {destination!r}.',
            )
        charge_type = params.get("InstanceChargeType") or "PostPaid"
        if charge_type not in ("PostPaid", "PrePaid"):
            raise WireError(
                "InvalidInstanceChargeType.NotFound", "The InstanceChargeType does not exist in our records", 404
            )
        if (params.get("SpotStrategy") or "NoSpot") not in SPOT_STRATEGIES:
            raise WireError("InvalidSpotStrategy", "The specified SpotStrategy is not valid.", 400)
        zones = [self._zone(region, params["ZoneId"])] if params.get("ZoneId") else list(REGIONS[region][1])
        only_type = params.get("InstanceType") or None
        with self._lock:
            stock = dict(self._stock)
        answer: list[dict[str, Any]] = []
        for zone in zones:
            offered = sorted(
                (name, category)
                for (r, z, name), category in stock.items()
                if r == region and z == zone and (only_type is None or name == only_type)
            )
            if not offered:  # like ECS, a zone that sells none of the asked types is left out
                continue
            categories = {category for _, category in offered}
            zone_category = next(c for c in ("WithStock", "ClosedWithStock", "WithoutStock") if c in categories)
            if destination == "InstanceType":
                resources = [
                    {"Value": name, "Status": self._sale_status(category), "StatusCategory": category}
                    for name, category in offered
                ]
            else:
                resources = [
                    {"Value": zone, "Status": self._sale_status(zone_category), "StatusCategory": zone_category}
                ]
            answer.append(
                {
                    "ZoneId": zone,
                    "RegionId": region,
                    "Status": self._sale_status(zone_category),
                    "StatusCategory": zone_category,
                    "AvailableResources": {
                        "AvailableResource": [
                            {"Type": destination, "SupportedResources": {"SupportedResource": resources}}
                        ]
                    },
                }
            )
        return {"AvailableZones": {"AvailableZone": answer}}

    @staticmethod
    def _sale_status(category: str) -> str:
        return "SoldOut" if category == "WithoutStock" else "Available"

    def _describe_price(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        resource_type = params.get("ResourceType") or "instance"
        if resource_type != "instance":
            raise WireError(
                "InvalidParameter", f"The sandbox prices ResourceType instance only, not {resource_type!r}."
            )
        instance_type = wire.required(params, "InstanceType")
        if instance_type not in self._catalogue:
            raise WireError(
                "InvalidInstanceType.ValueNotSupported",
                "The specified InstanceType does not exist or beyond the permitted range.",
                400,
            )
        if params.get("ZoneId"):
            self._zone(region, params["ZoneId"])
        # Only hourly pay-as-you-go prices were sourced; the real API's default unit (Month) is not served.
        if params.get("PriceUnit") != "Hour":
            raise WireError(
                "InvalidParameter", "The sandbox serves PriceUnit=Hour only (the sourced prices are hourly)."
            )
        if (params.get("SpotStrategy") or "NoSpot") != "NoSpot":
            raise WireError("PriceNotFound", "No spot price was sourced for Alibaba Cloud; none is served.", 400)
        currency = self.currency_of(req.access_key_id)
        amount = self.list_price(currency, region, instance_type)
        if amount is None:
            raise WireError("PriceNotFound", f"No sourced {currency} price for {instance_type} in {region}.", 400)
        price = float(amount)
        detail = {"Resource": "instanceType", "OriginalPrice": price, "DiscountPrice": 0.0, "TradePrice": price}
        return {
            "PriceInfo": {
                "Price": {
                    "OriginalPrice": price,
                    "DiscountPrice": 0.0,
                    "TradePrice": price,
                    "Currency": currency,
                    "DetailInfos": {"DetailInfo": [detail]},
                },
                "Rules": {"Rule": []},
            }
        }

    def _describe_spot_price_history(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        instance_type = wire.required(params, "InstanceType")
        network_type = wire.required(params, "NetworkType")
        if network_type not in ("classic", "vpc"):
            raise WireError("InvalidParameter", 'The specified parameter "NetworkType" is not valid.')
        bounds: dict[str, datetime] = {}
        for name in ("StartTime", "EndTime"):
            if params.get(name):
                try:
                    bounds[name] = datetime.strptime(params[name], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                except ValueError:
                    raise WireError("InvalidParameter", f'The specified parameter "{name}" is not valid.') from None
        currency = self.currency_of(req.access_key_id)
        with self._lock:
            history = list(self._spot_history.get((region, instance_type), ()))
        # No Alibaba spot price was sourced: only points a test added are served, in the account's currency.
        rows = [
            _spot_row(p, instance_type, network_type)
            for p in sorted(history, key=lambda p: (p.timestamp, p.zone))
            if p.currency == currency
            and params.get("ZoneId") in (None, "", p.zone)
            and bounds.get("StartTime", p.timestamp) <= p.timestamp <= bounds.get("EndTime", p.timestamp)
        ]
        return {"Currency": currency, "NextOffset": 0, "SpotPrices": {"SpotPriceType": rows}}
