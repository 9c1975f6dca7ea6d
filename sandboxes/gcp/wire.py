"""The wire shapes of the GCP sandbox: Google's JSON error bodies, Compute Engine catalogue entries, Cloud Billing
SKUs and ``nextPageToken`` pagination. Pure helpers used by ``sandboxes.gcp.app``."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.gcp.seed import ACCELERATORS, BILLING_SERVICE, ON_DEMAND, REGION_LOCATIONS, SeedSku
from sandboxes.server import json_response

API_BASE = "https://www.googleapis.com/compute/v1/"  # self links use the public base, whatever the endpoint
MAX_RESULTS = 500  # Compute Engine's maximum (and default) maxResults
SKU_PAGE_MAX = 5000
CREATED = "2019-06-01T00:00:00.000-07:00"  # creationTimestamp of catalogue entries

# Synchronous error wire shapes: code -> (HTTP status, errors[].reason, ErrorInfo reason or "", message template).
SYNC_ERRORS: dict[str, tuple[int, str, str, str]] = {
    "QUOTA_EXCEEDED": (
        403,
        "quotaExceeded",
        "QUOTA_EXCEEDED",
        "Quota '{metric}' exceeded.  Limit: 0.0 in region {region}.",
    ),
    "RATE_LIMIT_EXCEEDED": (
        429,
        "rateLimitExceeded",
        "RATE_LIMIT_EXCEEDED",
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
        "'compute.googleapis.com' for consumer 'project_number:{project}'.",
    ),
    "PERMISSION_DENIED": (403, "forbidden", "", "Required '{action}' permission for 'projects/{project}'"),
    "UNAUTHENTICATED": (
        401,
        "authError",
        "",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
        "valid authentication credential.",
    ),
    "INTERNAL": (500, "backendError", "", "Internal error. Please try again or contact Google Support."),
    "UNAVAILABLE": (503, "backendError", "", "The service is currently unavailable."),
}
SYNC_ALIASES = {
    "quotaExceeded": "QUOTA_EXCEEDED",
    "rateLimitExceeded": "RATE_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED": "RATE_LIMIT_EXCEEDED",
    "forbidden": "PERMISSION_DENIED",
    "authError": "UNAUTHENTICATED",
    "backendError": "INTERNAL",
}
# Operation error shapes: code -> (httpErrorStatusCode, httpErrorMessage, message template).
OPERATION_ERRORS: dict[str, tuple[int, str, str]] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        503,
        "SERVICE UNAVAILABLE",
        "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the "
        "request.  Try a different zone, or try again later.",
    ),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (
        503,
        "SERVICE UNAVAILABLE",
        "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the "
        "request. '(resource type:compute)'.",
    ),
    "RESOURCE_OPERATION_RATE_EXCEEDED": (
        403,
        "FORBIDDEN",
        "Operation rate exceeded for resource 'projects/{project}/zones/{zone}/instances/{name}'. Too frequent "
        "operations from the source resource.",
    ),
    "QUOTA_EXCEEDED": (403, "FORBIDDEN", "Quota '{metric}' exceeded.  Limit: 0.0 in region {region}."),
}
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class ApiError(Exception):
    """An error answer in Google's JSON error shape."""

    def __init__(self, status: int, message: str, reason: str, info_reason: str = "", metadata: Any = None):
        super().__init__(message)
        self.status, self.message, self.reason, self.info_reason = status, message, reason, info_reason
        self.metadata = metadata or {}

    def response(self, *, billing: bool = False) -> Response:
        error: dict[str, Any] = {"code": self.status, "message": self.message}
        if not billing:
            error["errors"] = [{"message": self.message, "domain": "global", "reason": self.reason}]
        if billing or self.status == 401:
            # One-platform answers (Billing, and the auth layer in front of every API) carry the status name.
            error["status"] = STATUS_NAMES.get(self.status, "UNKNOWN")
        if self.info_reason:
            error["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.info_reason,
                    "domain": "cloudbilling.googleapis.com" if billing else "compute.googleapis.com",
                    "metadata": self.metadata,
                }
            ]
        return json_response({"error": error}, status=self.status)


def now_iso() -> str:
    return datetime.now(UTC).astimezone().isoformat(timespec="milliseconds")


def numeric_id(*parts: str) -> str:
    return str(int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:15], 16))


def last_segment(url: str) -> str:
    return str(url).rstrip("/").rsplit("/", 1)[-1]


def encode_token(offset: int, query: str) -> str:
    raw = json.dumps({"o": offset, "q": hashlib.sha256(query.encode()).hexdigest()[:16]})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_token(token: str, query: str) -> int:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset = int(data["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, f"Invalid value for field 'pageToken': '{token}'.", "invalid") from exc
    if data.get("q") != hashlib.sha256(query.encode()).hexdigest()[:16]:
        raise ApiError(400, "The page token belongs to a different query.", "invalid")
    return offset


def page_bounds(query_params: dict[str, str], query: str, maximum: int, key: str = "maxResults") -> tuple[int, int]:
    try:
        size = int(query_params.get(key) or maximum)
    except ValueError:
        raise ApiError(400, f"Invalid value for field '{key}'.", "invalid") from None
    if not 0 < size <= maximum:
        raise ApiError(400, f"Invalid value for field '{key}': {size}. Must be between 1 and {maximum}.", "invalid")
    offset = decode_token(query_params["pageToken"], query) if query_params.get("pageToken") else 0
    return offset, size


def list_page(query_params: dict[str, str], query: str, found: list[Any], *, kind: str, path: str) -> dict[str, Any]:
    """One page of a Compute Engine list answer: ``kind``, ``id`` and ``selfLink`` (``path`` under the API's
    base), the page's ``items``, and ``nextPageToken`` while more remain."""
    offset, size = page_bounds(query_params, query, MAX_RESULTS)
    body: dict[str, Any] = {
        "kind": kind,
        "id": path,
        "items": found[offset : offset + size],
        "selfLink": f"{API_BASE}{path}",
    }
    if offset + size < len(found):
        body["nextPageToken"] = encode_token(offset + size, query)
    return body


# ------------------------------------------------------------------------------------------- catalogue


def machine_json(zone: str, name: str, vcpus: int, memory_gib: Decimal, gpus: tuple[str, int] | None) -> dict[str, Any]:
    memory_mb = int(memory_gib * 1024)
    if gpus is not None:
        description = (
            f"Accelerator Optimized: {gpus[1]} {ACCELERATORS[gpus[0]].description} GPU{'s' if gpus[1] > 1 else ''}, "
            f"{vcpus} vCPUs, {memory_gib.normalize():f}GB RAM"
        )
    else:
        description = f"{vcpus} vCPU{'s' if vcpus > 1 else ''}, {memory_gib.normalize():f} GB RAM"
    item: dict[str, Any] = {
        "kind": "compute#machineType",
        "id": numeric_id("machineType", name),
        "creationTimestamp": CREATED,
        "name": name,
        "description": description,
        "guestCpus": vcpus,
        "memoryMb": memory_mb,
        "imageSpaceGb": 0,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": f"{API_BASE}projects/{{project}}/zones/{zone}/machineTypes/{name}",
        "isSharedCpu": False,
        "architecture": "X86_64",
    }
    if gpus is not None:
        item["accelerators"] = [{"guestAcceleratorType": gpus[0], "guestAcceleratorCount": gpus[1]}]
    return item


def accelerator_json(zone: str, name: str) -> dict[str, Any]:
    spec = ACCELERATORS[name]
    return {
        "kind": "compute#acceleratorType",
        "id": numeric_id("acceleratorType", name),
        "creationTimestamp": CREATED,
        "name": name,
        "description": spec.description,
        "zone": f"{API_BASE}projects/{{project}}/zones/{zone}",
        "selfLink": f"{API_BASE}projects/{{project}}/zones/{zone}/acceleratorTypes/{name}",
        "maximumCardsPerInstance": spec.max_cards,
    }


def money(value: Decimal) -> dict[str, Any]:
    units = int(value)
    nanos = int((value - units) * 1_000_000_000)
    return {"currencyCode": "USD", "units": str(units), "nanos": nanos}


def sku_json(sku: SeedSku, effective: str) -> dict[str, Any]:
    unit, unit_description = ("GiBy.h", "gibibyte hour") if sku.resource == "ram" else ("h", "hour")
    groups = {"gpu": "GPU", "core": "CPU", "ram": "RAM"}
    group = "N1Standard" if sku.family == "N1 Predefined" else groups[sku.resource]
    return {
        "name": f"{BILLING_SERVICE}/skus/{sku.sku_id}",
        "skuId": sku.sku_id,
        "description": sku.description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": group,
            "usageType": sku.usage_type,
        },
        "serviceRegions": [sku.region],
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "tieredRates": [{"startUsageAmount": 0, "unitPrice": money(sku.unit_price)}],
                    "usageUnitDescription": unit_description,
                    "baseUnit": "By.s" if sku.resource == "ram" else "s",
                    "baseUnitDescription": "byte second" if sku.resource == "ram" else "second",
                    "baseUnitConversionFactor": 3865470566400 if sku.resource == "ram" else 3600,
                },
                "currencyConversionRate": 1,
                "effectiveTime": effective,
            }
        ],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "REGIONAL", "regions": [sku.region]},
    }


def decoy_skus(regions: Iterable[str], effective: str) -> list[dict[str, Any]]:
    """SKUs a client must skip: storage, a licence, a commitment and a non-GPU family."""
    decoys: list[dict[str, Any]] = []
    for region in sorted(regions):
        location = REGION_LOCATIONS[region]
        for description, family, group, usage, unit, price in (
            (f"Storage PD Capacity in {location}", "Storage", "PDStandard", ON_DEMAND, "GiBy.mo", "0.04"),
            (
                f"Commitment v1: Nvidia Tesla T4 GPU in {location} for 1 Year",
                "Compute",
                "GPU",
                "Commit1Yr",
                "h",
                "0.22",
            ),
            (f"E2 Instance Core running in {location}", "Compute", "CPU", ON_DEMAND, "h", "0.021811"),
            (
                f"Licensing Fee for Ubuntu Pro running in {location}",
                "License",
                "SoftwareLicense",
                ON_DEMAND,
                "h",
                "0.01",
            ),
        ):
            sku_id = numeric_id(region, description)[:12].rjust(12, "0")
            sku_id = f"{sku_id[0:4]}-{sku_id[4:8]}-{sku_id[8:12]}"
            decoys.append(
                {
                    "name": f"{BILLING_SERVICE}/skus/{sku_id}",
                    "skuId": sku_id,
                    "description": description,
                    "category": {
                        "serviceDisplayName": "Compute Engine",
                        "resourceFamily": family,
                        "resourceGroup": group,
                        "usageType": usage,
                    },
                    "serviceRegions": [region],
                    "pricingInfo": [
                        {
                            "summary": "",
                            "pricingExpression": {
                                "usageUnit": unit,
                                "displayQuantity": 1,
                                "tieredRates": [{"startUsageAmount": 0, "unitPrice": money(Decimal(price))}],
                                "usageUnitDescription": unit,
                                "baseUnit": "s",
                                "baseUnitDescription": "second",
                                "baseUnitConversionFactor": 3600,
                            },
                            "currencyConversionRate": 1,
                            "effectiveTime": effective,
                        }
                    ],
                    "serviceProviderName": "Google",
                    "geoTaxonomy": {"type": "REGIONAL", "regions": [region]},
                }
            )
    return decoys


def with_project(item: dict[str, Any], project: str) -> dict[str, Any]:
    return json.loads(json.dumps(item).replace("{project}", project))
