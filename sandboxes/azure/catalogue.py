"""The Azure sandbox's catalogue: ``Microsoft.Compute`` resource SKUs and the Retail Prices API's rows (with its
``$filter`` and paging), both built from the seed."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from werkzeug.wrappers import Request, Response

from sandboxes.azure.seed import (
    LOCATION_RESTRICTIONS,
    RDMA_SIZES,
    REGION_DISPLAY,
    RESERVATION_DISCOUNT,
    WINDOWS_UPLIFT_PER_VCPU,
    ZONAL_REGIONS,
    ZONE_OVERRIDES,
    ZONE_RESTRICTIONS,
    SeedPrice,
    _family,
    _meter,
    _series,
    _short,
    _uuid,
)
from sandboxes.azure.state import Call
from sandboxes.azure.wire import arm_error
from sandboxes.faults import Fault, FaultKind
from sandboxes.server import json_response

PRICE_PAGE_SIZE = 100
SKU_PAGE_SIZE = 100
_FILTER_CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$", re.I)
_AND = re.compile(r"\s+and\s+", re.I)
PRICE_FIELDS = {
    "servicename": "serviceName",
    "armregionname": "armRegionName",
    "armskuname": "armSkuName",
    "pricetype": "type",
    "skuname": "skuName",
    "productname": "productName",
    "metername": "meterName",
    "location": "location",
    "currencycode": "currencyCode",
    "servicefamily": "serviceFamily",
}


class CatalogueHandlers:
    """Resource SKUs and retail prices, mixed into ``AzureSandbox``."""

    seed: list[SeedPrice]
    regions: list[str]
    _skus: list[dict[str, Any]]
    _prices: list[dict[str, Any]]
    price_page_size: int
    retry_after_s: int
    _log: Callable[[Call], None]
    _transport_fault: Callable[[Call], Fault | None]

    def _zones_of(self, region: str, size: str) -> list[str]:
        if region not in ZONAL_REGIONS:
            return []
        return list(ZONE_OVERRIDES.get((region, size), ["1", "2", "3"]))

    def _build_skus(self) -> list[dict[str, Any]]:
        skus: list[dict[str, Any]] = []
        for row in self.seed:
            skus.append(self._sku(row.region, row.instance_type, row.vcpus, row.memory_gib, row.gpu_count))
        for region in self.regions:  # decoys the adapter must skip: no GPUs, not a VM
            skus.append(self._sku(region, "Standard_D4s_v5", 4, Decimal(16), 0))
            skus.append(
                {
                    "resourceType": "disks",
                    "name": "Premium_LRS",
                    "tier": "Premium",
                    "size": "P1",
                    "family": "PremiumDisks",
                    "locations": [region],
                    "locationInfo": [{"location": region, "zones": self._zones_of(region, ""), "zoneDetails": []}],
                    "capabilities": [{"name": "MaxSizeGiB", "value": "4"}],
                    "restrictions": [],
                }
            )
        return skus

    def _sku(self, region: str, size: str, vcpus: int, memory_gib: Decimal, gpus: int) -> dict[str, Any]:
        capabilities = {
            "MaxResourceVolumeMB": str(vcpus * 30 * 1024),
            "OSVhdSizeMB": "1047552",
            "vCPUs": str(vcpus),
            "MemoryGB": f"{memory_gib.normalize():f}",
            "HyperVGenerations": "V2" if "H100" in size or "A100" in size or "A10_" in size else "V1,V2",
            "LowPriorityCapable": "True",
            "vCPUsAvailable": str(vcpus),
            "PremiumIO": "True" if re.search(r"\d+\w*s_", size) else "False",
            "AcceleratedNetworkingEnabled": "True",
            "RdmaEnabled": "True" if RDMA_SIZES.match(size) else "False",
        }
        if gpus:
            capabilities["GPUs"] = str(gpus)
        restrictions: list[dict[str, Any]] = []
        if (region, size) in LOCATION_RESTRICTIONS:
            restrictions.append(
                {
                    "type": "Location",
                    "values": [region],
                    "restrictionInfo": {"locations": [region]},
                    "reasonCode": "NotAvailableForSubscription",
                }
            )
        closed = ZONE_RESTRICTIONS.get((region, size))
        if closed:
            restrictions.append(
                {
                    "type": "Zone",
                    "values": [region],
                    "restrictionInfo": {"locations": [region], "zones": closed},
                    "reasonCode": "NotAvailableForSubscription",
                }
            )
        return {
            "resourceType": "virtualMachines",
            "name": size,
            "tier": "Standard",
            "size": _short(size),
            "family": _family(size),
            "locations": [region],
            "locationInfo": [{"location": region, "zones": self._zones_of(region, size), "zoneDetails": []}],
            "capabilities": [{"name": k, "value": v} for k, v in capabilities.items()],
            "restrictions": restrictions,
        }

    def _build_prices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for row in self.seed:
            meter, series = _meter(row.instance_type), _series(row.instance_type)
            linux = f"Virtual Machines {series} Series"

            def item(
                sku_name: str,
                product: str,
                price: Decimal,
                kind: str = "Consumption",
                _row: SeedPrice = row,
                **more: Any,
            ) -> dict[str, Any]:
                return {
                    "currencyCode": "USD",
                    "tierMinimumUnits": 0.0,
                    "retailPrice": float(price),
                    "unitPrice": float(price),
                    "armRegionName": _row.region,
                    "location": REGION_DISPLAY.get(_row.region, _row.region),
                    "effectiveStartDate": "2025-06-01T00:00:00Z",
                    "meterId": _uuid(_row.region, _row.instance_type, sku_name, product, kind),
                    "meterName": sku_name,
                    "productId": "DZH318Z0" + hashlib.sha256(product.encode()).hexdigest()[:4].upper(),
                    "skuId": "DZH318Z0/" + hashlib.sha256(sku_name.encode()).hexdigest()[:4].upper(),
                    "productName": product,
                    "skuName": sku_name,
                    "serviceName": "Virtual Machines",
                    "serviceId": "DZH313Z7MMC8",
                    "serviceFamily": "Compute",
                    "unitOfMeasure": "1 Hour",
                    "type": kind,
                    "isPrimaryMeterRegion": True,
                    "armSkuName": _row.instance_type,
                    **more,
                }

            items.append(item(meter, linux, row.on_demand))
            items.append(item(meter, linux, row.on_demand, "DevTestConsumption"))
            items.append(item(meter, f"{linux} Windows", row.on_demand + WINDOWS_UPLIFT_PER_VCPU * row.vcpus))
            reserved = (row.on_demand * RESERVATION_DISCOUNT * 8760).quantize(Decimal("0.01"))
            items.append(item(meter, linux, reserved, "Reservation", reservationTerm="1 Year"))
            if row.spot is not None:
                items.append(item(f"{meter} Spot", linux, row.spot))
                items.append(item(f"{meter} Low Priority", linux, row.spot))
                items.append(item(f"{meter} Spot", f"{linux} Windows", row.spot + WINDOWS_UPLIFT_PER_VCPU * row.vcpus))
        return items

    def _retail_prices(self, request: Request) -> Response:
        self._log(Call("RetailPrices_List"))
        fault = self._transport_fault(Call("RetailPrices_List"))
        if fault is not None:
            if fault.kind is FaultKind.THROTTLE:
                response = json_response({"Error": {"Code": "TooManyRequests", "Message": "Rate limited"}}, 429)
                response.headers["Retry-After"] = str(self.retry_after_s)
                return response
            return json_response({"Error": {"Code": "Forbidden", "Message": "Access denied"}}, 403)
        odata = request.args.get("$filter", "")
        clauses: list[tuple[str, str]] = []
        for clause in _AND.split(odata.strip()) if odata.strip() else []:
            match = _FILTER_CLAUSE.match(clause)
            field_name = PRICE_FIELDS.get(match.group(1).lower()) if match else None
            if match is None or field_name is None:
                return json_response({"Error": {"Code": "InvalidFilter", "Message": f"Invalid filter: {clause}"}}, 400)
            clauses.append((field_name, match.group(2)))
        currency = request.args.get("currencyCode", "USD").strip("'")
        try:
            skip = int(request.args.get("$skip", "0"))
        except ValueError:
            return json_response({"Error": {"Code": "InvalidSkip", "Message": "Invalid $skip"}}, 400)
        rows = [
            item
            for item in self._prices
            if item["currencyCode"] == currency and all(str(item.get(f)) == v for f, v in clauses)
        ]
        page = rows[skip : skip + self.price_page_size]
        next_link = None
        if skip + self.price_page_size < len(rows):
            query = "&".join(
                f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in request.args.items() if k != "$skip"
            )
            next_link = f"{request.host_url}api/retail/prices?{query}&$skip={skip + self.price_page_size}"
        return json_response(
            {
                "BillingCurrency": currency,
                "CustomerEntityId": "Default",
                "CustomerEntityType": "Retail",
                "Items": page,
                "NextPageLink": next_link,
                "Count": len(page),
            }
        )

    def _list_skus(self, request: Request) -> Response:
        odata = request.args.get("$filter", "").strip()
        skus = self._skus
        if odata:
            match = re.match(r"^location\s+eq\s+'([^']+)'$", odata, re.I)
            if match is None:
                return arm_error("InvalidFilter", f"The filter '{odata}' is not supported.", 400)
            wanted = match.group(1).lower()
            skus = [s for s in skus if wanted in {loc.lower() for loc in s["locations"]}]
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        page = skus[offset : offset + SKU_PAGE_SIZE]
        result: dict[str, Any] = {"value": page}
        if offset + SKU_PAGE_SIZE < len(skus):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + SKU_PAGE_SIZE)})
        return json_response(result)

    @staticmethod
    def _link(request: Request, replace: dict[str, str]) -> str:
        args = {k: v for k, v in request.args.items() if k not in replace}
        args.update(replace)
        query = "&".join(f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in args.items())
        return f"{request.host_url.rstrip('/')}{request.path}?{query}"
