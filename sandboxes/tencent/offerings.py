"""The Tencent sandbox's catalogue reads: ``DescribeZones``, ``DescribeZoneInstanceConfigInfos`` (stock and
prices per account site), ``DescribeInstanceTypeConfigs`` and ``DescribeImages``.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

from sandboxes.faults import IMAGE_ACTION, FaultKind, FaultRegistry
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.catalogue import (
    DEFAULT_SITE,
    PUBLIC_IMAGES,
    REGIONS,
    SEED_CURRENCY,
    SITE_CURRENCIES,
    SeedPrice,
    quota_rows,
)
from sandboxes.tencent.state import _filters, _int, _matches, _Request, _string_list


class OfferingHandlers:
    """CVM's catalogue actions, mixed into ``TencentSandbox``."""

    _lock: threading.Lock
    _set_prices: dict[str, dict[tuple[str, str, str], Decimal]]
    _sites: dict[str, str]
    _sold_out: set[tuple[str, str, str]]
    _type_configs: list[tuple[str, dict[str, Any]]]
    faults: FaultRegistry
    seed: list[SeedPrice]

    def _describe_zones(self, request: _Request) -> dict[str, Any]:
        zones = [
            {"Zone": z.name, "ZoneName": z.label, "ZoneId": z.zone_id, "ZoneState": "AVAILABLE"}
            for z in REGIONS[request.region]
        ]
        return {"TotalCount": len(zones), "ZoneSet": zones}

    def _describe_zone_instance_config_infos(self, request: _Request) -> dict[str, Any]:
        filters = _filters(
            request.params,
            ("zone", "instance-family", "instance-type", "instance-charge-type", "sort-keys"),
            max_filters=10,
            max_values=100,
        )
        filters = [(name, values) for name, values in filters if name != "sort-keys"]
        with self._lock:
            sold_out = set(self._sold_out)
            currency = SITE_CURRENCIES[self._sites.get(request.secret_id, DEFAULT_SITE)]
            prices = None if currency == SEED_CURRENCY else dict(self._set_prices.get(currency, {}))
        rows = [
            row
            for region, row in quota_rows(self.seed, sold_out, prices)
            if region == request.region
            and _matches(
                {
                    "zone": [row["Zone"]],
                    "instance-family": [row["InstanceFamily"]],
                    "instance-type": [row["InstanceType"]],
                    "instance-charge-type": [row["InstanceChargeType"]],
                },
                filters,
            )
        ]
        return {"InstanceTypeQuotaSet": rows}

    def _describe_instance_type_configs(self, request: _Request) -> dict[str, Any]:
        # CVM takes a single value per filter here (its documentation: "Filter.Values的上限为1").
        filters = _filters(request.params, ("zone", "instance-family", "instance-type"), max_filters=10, max_values=1)
        rows = [
            row
            for region, row in self._type_configs
            if region == request.region
            and _matches(
                {
                    "zone": [row["Zone"]],
                    "instance-family": [row["InstanceFamily"]],
                    "instance-type": [row["InstanceType"]],
                },
                filters,
            )
        ]
        return {"InstanceTypeConfigSet": rows}

    def _describe_images(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "ImageIds", 100)
        filters = _filters(
            params, ("image-id", "image-type", "image-name", "platform"), max_filters=10, max_values=5, tags=True
        )
        if ids and filters:
            raise ApiError(
                "InvalidParameter.InvalidParameterCoexistImageIdsFilters", "ImageIds and Filters are exclusive."
            )
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        instance_type = params.get("InstanceType")
        types = [instance_type] if isinstance(instance_type, str) else []
        missing = self.faults.take(IMAGE_ACTION, types, None, kinds={FaultKind.IMAGE_MISSING}, region=request.region)
        if missing is not None:
            # CVM answers a lookup of an image the region lacks with an empty set, not an error.
            return {"TotalCount": 0, "ImageSet": []}
        found = []
        for image in PUBLIC_IMAGES:
            if ids and image["ImageId"] not in ids:
                continue
            fields = {"image-id": [image["ImageId"]], "image-type": [image["ImageType"]]}
            ok = _matches(fields, [(n, v) for n, v in filters if n in fields])
            # image-name and platform match fuzzily (a substring, any case), as CVM documents them.
            for name, key in (("image-name", "ImageName"), ("platform", "Platform")):
                for fname, wanted in filters:
                    if fname == name and not any(w.lower() in str(image[key]).lower() for w in wanted):
                        ok = False
            if any(n.startswith("tag:") for n, _ in filters):
                ok = False  # public images carry no tags
            if ok:
                found.append(image)
        return {"TotalCount": len(found), "ImageSet": found[offset : offset + limit]}
