"""What every resource of the Kubernetes sandbox answers alike: the resource table, ``Status`` error bodies, list
objects, object names and quantities.

Errors follow the API server's ``Status`` kind (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/
and the API concepts page, https://kubernetes.io/docs/reference/using-api/api-concepts/): ``status: Failure``, a
``reason`` (``NotFound``, ``AlreadyExists``, ``Invalid``, ``Forbidden``, ...), ``details`` naming the object and the
HTTP ``code``. The messages are worded as apimachinery's ``k8s.io/apimachinery/pkg/api/errors`` words them
(``pods "x" not found``, ``namespaces "x" already exists``, ``Pod "X" is invalid: metadata.name: Invalid value: ...``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from werkzeug.wrappers import Response


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource type: its REST name (``plural``), ``kind``, API group (``""`` for core) and scope."""

    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods``, ``networkpolicies.networking.k8s.io``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = Resource("nodes", "Node", "", "v1", False)
NAMESPACES = Resource("namespaces", "Namespace", "", "v1", False)
PODS = Resource("pods", "Pod", "", "v1", True)
SERVICES = Resource("services", "Service", "", "v1", True)
SECRETS = Resource("secrets", "Secret", "", "v1", True)
EVENTS = Resource("events", "Event", "", "v1", True)
RESOURCE_QUOTAS = Resource("resourcequotas", "ResourceQuota", "", "v1", True)
NETWORK_POLICIES = Resource("networkpolicies", "NetworkPolicy", "networking.k8s.io", "v1", True)
JOBS = Resource("jobs", "Job", "batch", "v1", True)
SSRR = Resource("selfsubjectrulesreviews", "SelfSubjectRulesReview", "authorization.k8s.io", "v1", False)

RESOURCES: dict[tuple[str, str], Resource] = {
    (r.group, r.plural): r
    for r in (NODES, NAMESPACES, PODS, SERVICES, SECRETS, EVENTS, RESOURCE_QUOTAS, NETWORK_POLICIES, JOBS, SSRR)
}


def now_rfc3339() -> str:
    """A ``metav1.Time`` as the API server writes it: RFC 3339, whole seconds, UTC ``Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """A refusal the sandbox answers as a ``Status`` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def response(self) -> Response:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        response = object_response(body, self.code)
        for key, value in self.headers.items():
            response.headers[key] = value
        return response


def object_response(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def _details(resource: Resource, name: str | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.plural
    return details


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name))


def already_exists(resource: Resource, name: str, *, being_deleted: bool = False) -> ApiError:
    prefix = "object is being deleted: " if being_deleted else ""
    return ApiError(
        409, "AlreadyExists", f'{prefix}{resource.qualified} "{name}" already exists', _details(resource, name)
    )


def forbidden(resource: Resource, name: str | None, why: str, causes: list[dict[str, str]] | None = None) -> ApiError:
    """apimachinery's ``NewForbidden``: ``<resource> "<name>" is forbidden: <why>`` (no name for a collection)."""
    subject = f'{resource.qualified} "{name}"' if name else resource.qualified
    details = _details(resource, name)
    if causes:
        details["causes"] = causes
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def too_many_requests(retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": retry_after_s},
        {"Retry-After": str(retry_after_s)},
    )


def service_unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")


@dataclass(frozen=True, slots=True)
class Cause:
    """One field error of an ``Invalid`` answer (``field.Error`` in apimachinery)."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotFound, FieldValueDuplicate, ...
    message: str

    def to_json(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def text(self) -> str:
        return f"{self.field}: {self.message}"


def invalid_value(field: str, value: Any, detail: str) -> Cause:
    shown = json.dumps(value) if isinstance(value, str) else str(value)
    return Cause(field, "FieldValueInvalid", f"Invalid value: {shown}: {detail}")


def required(field: str, detail: str = "") -> Cause:
    return Cause(field, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def not_found_value(field: str, value: str) -> Cause:
    return Cause(field, "FieldValueNotFound", f"Not found: {json.dumps(value)}")


def duplicate(field: str, value: Any) -> Cause:
    shown = json.dumps(value) if isinstance(value, str) else str(value)
    return Cause(field, "FieldValueDuplicate", f"Duplicate value: {shown}")


def invalid(resource: Resource, name: str, causes: list[Cause]) -> ApiError:
    """422 ``Invalid`` as ``NewInvalid`` words it: one cause plain, several in brackets."""
    texts = [c.text() for c in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.kind
    details["causes"] = [c.to_json() for c in causes]
    # The group kind as GroupKind.String() writes it: "Pod", "Job.batch", "NetworkPolicy.networking.k8s.io".
    group_kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    return ApiError(422, "Invalid", f'{group_kind} "{name}" is invalid: {summary}', details)


# ---------------------------------------------------------------------------------------------------- names

# Object names, from apimachinery's validation (IsDNS1123Label, IsDNS1123Subdomain, IsDNS1035Label) and the object
# names page, https://kubernetes.io/docs/concepts/overview/working-with-objects/names/.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation "
    "is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def name_causes(name: str, rule: str, field: str = "metadata.name") -> list[Cause]:
    """What is wrong with an object name under ``rule`` (``label``, ``subdomain`` or ``dns1035``); [] if nothing."""
    pattern, message, limit = {
        "label": (DNS1123_LABEL, LABEL_MESSAGE, 63),
        "subdomain": (DNS1123_SUBDOMAIN, SUBDOMAIN_MESSAGE, 253),
        "dns1035": (DNS1035_LABEL, DNS1035_MESSAGE, 63),
    }[rule]
    causes = []
    if len(name) > limit:
        causes.append(invalid_value(field, name, f"must be no more than {limit} characters"))
    if not pattern.fullmatch(name):
        causes.append(invalid_value(field, name, message))
    return causes


# ----------------------------------------------------------------------------------------------- quantities

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[kMGTPE]|m|u|n|)$")
_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: Any) -> Decimal:
    """A ``resource.Quantity`` (``"500m"``, ``"8Gi"``, ``"2"``, ``4``) as a Decimal; ValueError naming it if
    malformed (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/)."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match or len(text) > 64:
        raise ValueError("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    number, suffix = match.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as exc:
        raise ValueError(f"quantity {text!r} is not a number") from exc
    if suffix[:1] in ("e", "E"):
        return base * (Decimal(10) ** int(suffix[1:]))
    return base * _SUFFIXES[suffix]


def format_quantity(value: Decimal) -> str:
    """A whole quantity as a plain integer string, else milli-units (``"1500m"``)."""
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"
