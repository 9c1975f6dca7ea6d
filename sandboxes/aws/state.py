"""What the AWS sandbox holds besides moto (its instances, calls, idempotent answers and requests) and the small
helpers of EC2's, SSM's and the Price List's wires its handlers share: error bodies, filters, times and page tokens.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

from werkzeug.wrappers import Response

from sandboxes.faults import FaultKind

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
PRICING_TARGET = "AWSPriceListService."
SSM_TARGET = "AmazonSSM."
SPOT_PRODUCT = "Linux/UNIX"
SPOT_HISTORY_AGES_H = (0, 5, 13, 29)
PRICING_MAX_RESULTS = 100
# Filter.Field and Filter.Value: strings of 1 to 1024 characters; at most 50 filters (Price List API
# reference, Filter, https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_Filter.html,
# and botocore's pricing service model). botocore checks only the minimum; AWS refuses the rest.
PRICING_FILTER_TEXT_MAX = 1024
PRICING_FILTERS_MAX = 50
SPOT_MAX_RESULTS = 1000
_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_INDEXED = re.compile(r"^InstanceType\.\d+$")
_FILTER_NAME = re.compile(r"^Filter\.(\d+)\.Name$")
_FILTER_VALUE = re.compile(r"^Filter\.\d+\.Value\.\d+$")
# EC2 refuses a call with more filter values than this, across its filters: FilterLimitExceeded ("The request
# uses too many filters or too many filter values", Error codes for the Amazon EC2 API,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), in the words of EC2's answer
# "The maximum number of filter values specified on a single call is 200". moto accepts any number.
FILTER_VALUES_MAX = 200


# What each fault kind looks like on the EC2 wire: (code, HTTP status, message template).
EC2_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.CAPACITY: (
        "InsufficientInstanceCapacity",
        500,
        "We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested "
        "({zone}). Our system will be working on provisioning additional capacity.",
    ),
    FaultKind.QUOTA: (
        "VcpuLimitExceeded",
        400,
        "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance "
        "bucket that the specified instance type belongs to.",
    ),
    FaultKind.THROTTLE: ("RequestLimitExceeded", 503, "Request limit exceeded."),
    # An access key EC2 has no record of ("Error codes for the Amazon EC2 API", AuthFailure,
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
    FaultKind.CREDENTIALS: ("AuthFailure", 401, "AWS was not able to validate the provided access credentials"),
}
PRICING_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.THROTTLE: ("ThrottlingException", 400, "Rate exceeded"),
    # The JSON-protocol services' answer to an unknown key ("The most likely cause is an AWS access key ID or
    # secret key that's not valid", botocore reference, UnrecognizedClientException,
    # https://docs.aws.amazon.com/botocore/latest/reference/services/logs/client/exceptions/UnrecognizedClientException.html).
    FaultKind.CREDENTIALS: (
        "UnrecognizedClientException",
        400,
        "The security token included in the request is invalid.",
    ),
}
# Systems Manager speaks the same JSON protocol as the Price List API and refuses a bad key the same way.
SSM_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.THROTTLE: ("ThrottlingException", 400, "Rate exceeded"),
    FaultKind.CREDENTIALS: PRICING_FAULTS[FaultKind.CREDENTIALS],
}
CODE_STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InternalError": 500,
    "Unavailable": 503,
    "RequestLimitExceeded": 503,
    "AuthFailure": 401,
    "UnauthorizedOperation": 403,
}

# Catalogue reads whose answers never change for a given request: served from a cache after the first call.
STATIC_ACTIONS = frozenset({"DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeRegions"})


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as moto holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    lifecycle: str
    client_token: str
    tags: dict[str, str]


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    service: str
    action: str
    region: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None
    # The instances the request names, as InstanceId.N or as values of an ``instance-id`` filter.
    instance_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Stored:
    fingerprint: tuple[tuple[str, str], ...]
    status: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(slots=True)
class _Request:
    service: str
    action: str
    region: str
    access_key: str
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


def _request_id() -> str:
    return str(uuid.uuid4())


def _ec2_error(code: str, message: str, status: int) -> Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{_request_id()}</RequestID></Response>"
    )
    return Response(body, status=status, mimetype="text/xml")


def _json_error(code: str, message: str, status: int) -> Response:
    body = json.dumps({"__type": code, "message": message})
    return Response(body, status=status, content_type="application/x-amz-json-1.1")


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _filters_refusal(filters: Any) -> str | None:
    """The refusal, worded as AWS words its request validation errors, of GetProducts ``Filters`` outside the
    documented lengths; None when they are within them."""
    if not isinstance(filters, list):
        return "1 validation error detected: Value at 'filters' failed to satisfy constraint: Member must be a list"
    if len(filters) > PRICING_FILTERS_MAX:
        return (
            f"1 validation error detected: Value at 'filters' failed to satisfy constraint: Member must have "
            f"length less than or equal to {PRICING_FILTERS_MAX}"
        )
    for position, item in enumerate(filters, start=1):
        for name in ("Field", "Value"):
            text = str(item.get(name, "")) if isinstance(item, dict) else ""
            if len(text) > PRICING_FILTER_TEXT_MAX:
                return (
                    f"1 validation error detected: Value '{text[:40]}...' at 'filters.{position}.member."
                    f"{name.lower()}' failed to satisfy constraint: Member must have length less than or equal "
                    f"to {PRICING_FILTER_TEXT_MAX}"
                )
    return None


def _named_instances(params: dict[str, str]) -> tuple[str, ...]:
    """The instance ids an EC2 query names: ``InstanceId.N`` and the values of an ``instance-id`` filter."""
    named = [v for k, v in params.items() if k.startswith("InstanceId.")]
    for key, name in params.items():
        match = _FILTER_NAME.match(key)
        if match and name == "instance-id":
            prefix = f"Filter.{match.group(1)}.Value."
            named.extend(v for k, v in params.items() if k.startswith(prefix))
    return tuple(named)


def _encode_token(offset: int, query: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "q": query}).encode()).decode()


def _decode_token(token: str, query: str) -> int:
    """The offset in ``token``; ValueError if it is not one this sandbox issued for the same query."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset = int(data["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("invalid NextToken") from exc
    if data.get("q") != query or offset < 0:
        raise ValueError("NextToken does not belong to this query")
    return offset
