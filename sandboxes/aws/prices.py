"""The AWS sandbox's prices: EC2's ``DescribeSpotPriceHistory`` and the Price List API's ``GetProducts``, with its
filters, pages and the units and currencies a test restated.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from xml.sax.saxutils import escape

from werkzeug.wrappers import Response

from sandboxes.aws.catalogue import SeedPrice, vary
from sandboxes.aws.state import (
    _FILTER_NAME,
    _INDEXED,
    EC2_XMLNS,
    PRICING_FAULTS,
    PRICING_MAX_RESULTS,
    SPOT_HISTORY_AGES_H,
    SPOT_MAX_RESULTS,
    SPOT_PRODUCT,
    _decode_token,
    _ec2_error,
    _encode_token,
    _filters_refusal,
    _json_error,
    _parse_time,
    _Request,
    _request_id,
)
from sandboxes.faults import Fault, FaultKind


class PriceHandlers:
    """Spot price history and the Price List, mixed into ``AwsSandbox``."""

    _fault_response: Callable[[Fault, _Request, dict[FaultKind, tuple[str, int, str]]], Response]
    _lock: threading.Lock
    _products: list[dict[str, Any]]
    _restated: dict[tuple[str, str], tuple[str, str]]
    _seed_by_key: dict[tuple[str, str], SeedPrice]
    _spot: dict[tuple[str, str, str], Decimal]
    _transport_fault: Callable[[_Request], Fault | None]
    key_accepted: Callable[[str], bool]

    def _spot_history(self, request: _Request) -> Response:
        params = request.params
        try:
            start = _parse_time(params.get("StartTime"))
            now = datetime.now(UTC)
            end = _parse_time(params.get("EndTime")) or now
            max_results = int(params.get("MaxResults") or SPOT_MAX_RESULTS)
        except ValueError as exc:
            return _ec2_error("InvalidParameterValue", str(exc), 400)
        if not 1 <= max_results <= SPOT_MAX_RESULTS:
            return _ec2_error("InvalidParameterValue", f"MaxResults must be between 1 and {SPOT_MAX_RESULTS}", 400)
        # Each constraint is (field, allowed values); a point must pass all of them.
        constraints: list[tuple[str, set[str]]] = []
        if types := {v for k, v in params.items() if _INDEXED.match(k)}:
            constraints.append(("instance-type", types))
        if products := {v for k, v in params.items() if k.startswith("ProductDescription.")}:
            constraints.append(("product-description", products))
        if params.get("AvailabilityZone"):
            constraints.append(("availability-zone", {params["AvailabilityZone"]}))
        for key, name in params.items():
            match = _FILTER_NAME.match(key)
            if not match:
                continue
            if name not in ("instance-type", "product-description", "availability-zone"):
                return _ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid", 400)
            prefix = f"Filter.{match.group(1)}.Value."
            constraints.append((name, {v for k, v in params.items() if k.startswith(prefix)}))

        anchor = now.replace(minute=0, second=0, microsecond=0)
        points: list[tuple[datetime, str, str, Decimal]] = []
        for (region, instance_type, zone), current in self._spot.items():
            fields = {"instance-type": instance_type, "product-description": SPOT_PRODUCT, "availability-zone": zone}
            if region != request.region or not all(fields[name] in allowed for name, allowed in constraints):
                continue
            ceiling = self._seed_by_key[(region, instance_type)].on_demand
            history = [
                (
                    anchor - timedelta(hours=age),
                    current if age == 0 else vary(current, f"{instance_type}/{zone}/{age}", ceiling, 4),
                )
                for age in SPOT_HISTORY_AGES_H
            ]
            in_window = [(ts, p) for ts, p in history if ts <= end and (start is None or ts >= start)]
            # Like AWS, a window that starts after the last change still reports the price in effect at its start.
            before = [(ts, p) for ts, p in history if start is not None and ts < start]
            if before:
                in_window.append(max(before))
            points.extend((ts, instance_type, zone, price) for ts, price in in_window)
        points.sort(key=lambda p: (-p[0].timestamp(), p[1], p[2]))
        return self._spot_page(points, params, max_results)

    def _spot_page(
        self,
        points: list[tuple[datetime, str, str, Decimal]],
        params: dict[str, str],
        max_results: int,
    ) -> Response:
        query = json.dumps(sorted((k, v) for k, v in params.items() if k not in ("NextToken", "MaxResults")))
        try:
            offset = _decode_token(params["NextToken"], query) if params.get("NextToken") else 0
        except ValueError as exc:
            return _ec2_error("InvalidNextToken", str(exc), 400)
        page = points[offset : offset + max_results]
        next_token = _encode_token(offset + max_results, query) if offset + max_results < len(points) else ""
        items = "".join(
            "<item>"
            f"<instanceType>{escape(instance_type)}</instanceType>"
            f"<productDescription>{SPOT_PRODUCT}</productDescription>"
            f"<spotPrice>{price:.6f}</spotPrice>"
            f"<timestamp>{ts.strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{escape(zone)}</availabilityZone>"
            "</item>"
            for ts, instance_type, zone, price in page
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<DescribeSpotPriceHistoryResponse xmlns="{EC2_XMLNS}">'
            f"<requestId>{_request_id()}</requestId>"
            f"<spotPriceHistorySet>{items}</spotPriceHistorySet>"
            f"<nextToken>{escape(next_token)}</nextToken>"
            "</DescribeSpotPriceHistoryResponse>"
        )
        return Response(body, status=200, mimetype="text/xml")

    def _pricing(self, request: _Request) -> Response:
        if not self.key_accepted(request.access_key):
            code, status, message = PRICING_FAULTS[FaultKind.CREDENTIALS]
            return _json_error(code, message, status)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, PRICING_FAULTS)
        if request.action == "GetProducts":
            return self._get_products(request.payload)
        if request.action == "DescribeServices":
            body = {"Services": [{"ServiceCode": "AmazonEC2", "AttributeNames": ["instanceType", "regionCode"]}]}
            return Response(json.dumps({**body, "FormatVersion": "aws_v1"}), content_type="application/x-amz-json-1.1")
        return _json_error("UnknownOperationException", f"unknown operation {request.action}", 400)

    def _get_products(self, payload: dict[str, Any]) -> Response:
        if payload.get("ServiceCode") != "AmazonEC2":
            return _json_error("NotFoundException", f"Service {payload.get('ServiceCode')!r} not found", 400)
        max_results = payload.get("MaxResults", PRICING_MAX_RESULTS)
        if not isinstance(max_results, int) or not 1 <= max_results <= PRICING_MAX_RESULTS:
            return _json_error("InvalidParameterException", "MaxResults must be between 1 and 100", 400)
        matchers: list[tuple[str, str, str]] = []
        filters = payload.get("Filters") or []
        refusal = _filters_refusal(filters)
        if refusal is not None:
            return _json_error("ValidationException", refusal, 400)
        for item in filters:
            kind = str(item.get("Type", ""))
            if kind not in ("TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF"):
                return _json_error("InvalidParameterException", f"unsupported filter type {kind!r}", 400)
            matchers.append((kind, str(item.get("Field", "")).lower(), str(item.get("Value", ""))))
        matches = [p for p in self._products if self._product_matches(p, matchers)]
        query = json.dumps([payload.get("ServiceCode"), sorted(matchers)])
        try:
            offset = _decode_token(payload["NextToken"], query) if payload.get("NextToken") else 0
        except ValueError as exc:
            return _json_error("InvalidNextTokenException", str(exc), 400)
        page = [self._as_stated(p) for p in matches[offset : offset + max_results]]
        body: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
        if offset + max_results < len(matches):
            body["NextToken"] = _encode_token(offset + max_results, query)
        return Response(json.dumps(body), content_type="application/x-amz-json-1.1")

    def _as_stated(self, product: dict[str, Any]) -> dict[str, Any]:
        attributes = product["product"]["attributes"]
        with self._lock:
            restated = self._restated.get((attributes["regionCode"], attributes["instanceType"]))
        if restated is None or attributes["capacitystatus"] != "Used":
            return product
        unit, currency = restated
        product = copy.deepcopy(product)
        for term in product["terms"]["OnDemand"].values():
            for dimension in term["priceDimensions"].values():
                dimension["unit"] = unit
                dimension["pricePerUnit"] = {currency: next(iter(dimension["pricePerUnit"].values()))}
        return product

    @staticmethod
    def _product_matches(product: dict[str, Any], matchers: list[tuple[str, str, str]]) -> bool:
        # Field names compare case-insensitively, values exactly, as the Price List API does for TERM_MATCH.
        attributes = {k.lower(): v for k, v in product["product"]["attributes"].items()}
        for kind, name, value in matchers:
            actual = attributes.get(name)
            if kind in ("TERM_MATCH", "EQUALS") and actual != value:
                return False
            if kind == "CONTAINS" and (actual is None or value not in actual):
                return False
            if kind == "ANY_OF" and actual not in {v.strip() for v in value.split(",")}:
                return False
            if kind == "NONE_OF" and actual in {v.strip() for v in value.split(",")}:
                return False
        return True
