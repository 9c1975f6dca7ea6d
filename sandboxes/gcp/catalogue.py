"""The GCP sandbox's catalogue: machine and accelerator types, regions (with their quotas) and zones, and the
Cloud Billing Catalog's SKUs, as Compute Engine and the billing API list them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Response

from sandboxes.gcp import filters as gcp_filter
from sandboxes.gcp.quotas import GPU_QUOTA_METRICS
from sandboxes.gcp.seed import BILLING_SERVICE, REGION_ZONES
from sandboxes.gcp.state import _Instance, _Request
from sandboxes.gcp.wire import (
    API_BASE,
    CREATED,
    MAX_RESULTS,
    SKU_PAGE_MAX,
    ApiError,
    encode_token,
    last_segment,
    numeric_id,
    page_bounds,
    with_project,
)
from sandboxes.server import json_response

# Non-GPU machine types every zone lists, so a client has something to skip.
PLAIN_MACHINE_TYPES = (("e2-standard-4", 4, 16), ("n2-standard-8", 8, 32), ("n1-standard-1", 1, 3.75))


class CatalogueHandlers:
    """Machine types, accelerator types, regions, zones and billing SKUs, mixed into ``GcpSandbox``."""

    _lock: threading.Lock
    _instances: dict[tuple[str, str, str], _Instance]
    _machine_types: dict[str, dict[str, dict[str, Any]]]
    _accelerators: dict[str, dict[str, dict[str, Any]]]
    _sku_items: list[dict[str, Any]]
    _gpu_usage: Callable[[str, str], dict[str, float]]
    _quota_limit: Callable[[str], float]

    if TYPE_CHECKING:  # the app's property, read here

        @property
        def zones(self) -> list[str]: ...

    def _billing(self, request: _Request) -> Response:
        if request.action == "cloudbilling.services.list":
            service = {
                "name": BILLING_SERVICE,
                "serviceId": BILLING_SERVICE.split("/", 1)[1],
                "displayName": "Compute Engine",
                "businessEntityName": "businessEntities/GCP",
            }
            return json_response({"services": [service], "nextPageToken": ""})
        if request.route["service"] != BILLING_SERVICE:
            raise ApiError(404, f"Service {request.route['service']} not found.", "notFound")
        currency = request.query.get("currencyCode") or "USD"
        if currency != "USD":
            raise ApiError(400, f"The sandbox prices in USD only, not {currency}.", "invalid")
        query = json.dumps([request.route["service"], currency])
        offset, size = page_bounds(request.query, query, SKU_PAGE_MAX, key="pageSize")
        page = self._sku_items[offset : offset + size]
        more = offset + size < len(self._sku_items)
        return json_response({"skus": page, "nextPageToken": encode_token(offset + size, query) if more else ""})

    def _aggregated(
        self, request: _Request, kind: str, items_key: str, by_zone: dict[str, list[dict[str, Any]]]
    ) -> Response:
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        flat = [(zone, item) for zone in sorted(by_zone) for item in by_zone[zone] if matches(item)]
        query = json.dumps([kind, request.project, request.query.get("filter", "")])
        offset, size = page_bounds(request.query, query, MAX_RESULTS)
        page = flat[offset : offset + size]
        items: dict[str, Any] = {}
        for zone in sorted(by_zone):
            on_page = [item for z, item in page if z == zone]
            if on_page:
                items[f"zones/{zone}"] = {items_key: on_page}
            else:
                items[f"zones/{zone}"] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{zone}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
        body: dict[str, Any] = {
            "kind": f"compute#{kind}AggregatedList",
            "id": f"projects/{request.project}/aggregated/{items_key}",
            "items": items,
            "selfLink": f"{API_BASE}projects/{request.project}/aggregated/{items_key}",
        }
        if offset + size < len(flat):
            body["nextPageToken"] = encode_token(offset + size, query)
        return json_response(body)

    def _machine_types_list(self, request: _Request) -> Response:
        by_zone = {
            z: [with_project(t, request.project) for _, t in sorted(types.items())]
            for z, types in self._machine_types.items()
        }
        return self._aggregated(request, "machineType", "machineTypes", by_zone)

    def _accelerator_types_list(self, request: _Request) -> Response:
        by_zone = {
            z: [with_project(t, request.project) for _, t in sorted(types.items())]
            for z, types in self._accelerators.items()
        }
        return self._aggregated(request, "acceleratorType", "acceleratorTypes", by_zone)

    def _regions_get(self, request: _Request) -> Response:
        region = request.route["region"]
        if region not in REGION_ZONES:
            raise ApiError(404, f"The resource 'projects/{request.project}/regions/{region}' was not found", "notFound")
        with self._lock:
            live = [i for i in self._instances.values() if i.project == request.project and i.zone.startswith(region)]
            cpus = sum(self._vcpus(i) for i in live)
            quotas = [
                {"metric": "CPUS", "limit": 2400.0, "usage": float(cpus)},
                {"metric": "INSTANCES", "limit": 6000.0, "usage": float(len(live))},
            ]
            gpus = self._gpu_usage(request.project, region)
            metrics = sorted(GPU_QUOTA_METRICS.values())
            for metric in [*metrics, *(f"PREEMPTIBLE_{m}" for m in metrics)]:
                quotas.append({"metric": metric, "limit": self._quota_limit(metric), "usage": gpus.get(metric, 0.0)})
        return json_response(
            {
                "kind": "compute#region",
                "id": numeric_id("region", region),
                "creationTimestamp": CREATED,
                "name": region,
                "description": region,
                "status": "UP",
                "zones": [f"{API_BASE}projects/{request.project}/zones/{z}" for z in REGION_ZONES[region]],
                "quotas": quotas,
                "selfLink": f"{API_BASE}projects/{request.project}/regions/{region}",
                "supportsPzs": False,
            }
        )

    def _vcpus(self, inst: _Instance) -> int:
        machine = self._machine_types.get(inst.zone, {}).get(last_segment(inst.body.get("machineType", "")))
        return int(machine["guestCpus"]) if machine else 0

    def _zones_list(self, request: _Request) -> Response:
        items = [
            {
                "kind": "compute#zone",
                "id": numeric_id("zone", zone),
                "creationTimestamp": CREATED,
                "name": zone,
                "description": zone,
                "status": "UP",
                "region": f"{API_BASE}projects/{request.project}/regions/{zone.rsplit('-', 1)[0]}",
                "selfLink": f"{API_BASE}projects/{request.project}/zones/{zone}",
            }
            for zone in self.zones
        ]
        return json_response(
            {
                "kind": "compute#zoneList",
                "id": f"projects/{request.project}/zones",
                "items": items,
                "selfLink": f"{API_BASE}projects/{request.project}/zones",
            }
        )
