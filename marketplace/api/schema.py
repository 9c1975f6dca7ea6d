"""What the OpenAPI schema says beyond what each view declares: the one error body, and every error status an
operation can answer with, so a generated client knows them all and schemathesis holds the API to them.

``BrokerAutoSchema`` (settings ``DEFAULT_SCHEMA_CLASS``) adds to each operation, unless the view declared it:

- 400 when the operation reads a body, query parameters or headers (the serializers' and parsers' refusals);
- 401 and 403 when it needs a caller (no or a refused token; a scope or role short of it, CSRF);
- 404 when its path names an object (a stranger gets 404, never someone else's);
- 406 when the caller's Accept names nothing the API writes;
- 413 and 415 when it reads a body (over ``DATA_UPLOAD_MAX_MEMORY_SIZE``; not JSON or a form);
- 429 when it is rate limited (every operation: ``DEFAULT_THROTTLE_CLASSES``), with ``Retry-After``.

Each is ``Error`` (``marketplace.api.errors``): ``{"error": {"code", "message", "fields"?}}``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny

from marketplace.api.launch_schema import COMPONENTS
from marketplace.api.serializers import MAX_PROCUREMENT_DEMANDS


class ErrorDetailOutput(serializers.Serializer):
    code = serializers.CharField(help_text="what went wrong, for programs: invalid, not_found, token_unknown, ...")
    message = serializers.CharField(help_text="what went wrong, for people")
    fields = serializers.DictField(
        required=False, child=serializers.JSONField(), help_text="each invalid field, and what is wrong with it"
    )
    # A 402 says what the organisation must add to its prepaid credit (marketplace.api.errors).
    currency = serializers.CharField(required=False)
    needed = serializers.CharField(required=False)
    available = serializers.CharField(required=False)
    add = serializers.CharField(required=False)
    top_up = serializers.CharField(required=False)


class ErrorOutput(serializers.Serializer):
    """The API's one error shape, whatever the status."""

    error = ErrorDetailOutput()


ERROR = OpenApiResponse(ErrorOutput, description="the request was refused: error.code says why")
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class BrokerAutoSchema(AutoSchema):  # type: ignore[misc]
    """drf-spectacular's schema, with every error status an operation can answer declared (module docstring)."""

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._error_codes():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(ERROR, str(code), direction=direction)
        if "429" in responses:
            responses["429"].setdefault("headers", {})["Retry-After"] = {
                "schema": {"type": "integer"},
                "description": "seconds until the rate limit's window opens again",
            }
        return responses

    def _error_codes(self) -> list[int]:
        view = self.view
        has_body = self.method in _BODY_METHODS and self.get_request_serializer() is not None
        has_query = any(p.get("in") in ("query", "header") for p in self._get_parameters())
        codes = [406]
        if has_body or has_query:
            codes.append(400)
        if not any(isinstance(p, AllowAny) for p in view.get_permissions()):
            codes += [401, 403]
        if "{" in self.path:
            codes.append(404)
        if has_body:
            codes += [413, 415]
        if view.get_throttles():
            codes.append(429)
        return sorted(codes)


def add_components(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the components written as JSON Schema rather than serializers
    (the launch configuration, ``marketplace.api.launch_schema``)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(COMPONENTS)
    # A nested serializer's many=True bounds are not carried over by drf-spectacular: stated here.
    demands = schemas.get("ProcurementInputRequest", {}).get("properties", {}).get("demands")
    if demands is not None:
        demands.update(minItems=1, maxItems=MAX_PROCUREMENT_DEMANDS)
    return result


# --------------------------------------------------------------------------------------------- decimals


def _same_length_range(lo: str, hi: str) -> list[str]:
    """Regex alternatives matching the whole numbers from ``lo`` to ``hi``, written with as many digits."""
    if lo == hi:
        return [lo]
    common = next(i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if a != b)
    prefix, lo, hi = lo[:common], lo[common:], hi[common:]
    rest = len(lo) - 1
    if rest == 0:
        return [f"{prefix}[{lo}-{hi}]"]
    out: list[str] = []
    first = int(lo[0])
    if lo[1:] != "0" * rest:
        out += [prefix + lo[0] + tail for tail in _same_length_range(lo[1:], "9" * rest)]
        first += 1
    last = int(hi[0])
    high_tail = [] if hi[1:] == "9" * rest else [prefix + hi[0] + t for t in _same_length_range("0" * rest, hi[1:])]
    if high_tail:
        last -= 1
    if first <= last:
        out.append(f"{prefix}[{first}-{last}][0-9]{{{rest}}}")
    return out + high_tail


def whole_range_pattern(low: int, high: int) -> str:
    """A regex group matching the whole numbers from ``low`` to ``high`` (both >= 0) without leading zeros."""
    parts: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        lo, hi = max(low, 10 ** (digits - 1) if digits > 1 else 0), min(high, 10**digits - 1)
        if lo <= hi:
            parts += _same_length_range(str(lo), str(hi))
    return "(" + "|".join(parts) + ")"


def decimal_text_pattern(low: Decimal, high: Decimal, places: int) -> str:
    """A regex for the plain decimal texts from ``low`` to ``high`` with at most ``places`` decimals: how a
    request's money and hours are typed, so a schema states the bounds a DecimalField enforces. ``high`` is a
    whole number; ``low`` is 0, the smallest amount ``places`` can write, or a whole number."""
    top = int(high)
    fraction = rf"(\.[0-9]{{1,{places}}})?"
    at_top = rf"{top}(\.0{{1,{places}}})?"
    smallest = Decimal(1).scaleb(-places)
    if low in (0, smallest):
        below_one = "" if low == 0 else rf"0\.([0-9]{{0,{places - 1}}}[1-9]|[1-9][0-9]{{0,{places - 1}}})|"
        start = 0 if low == 0 else 1
        return rf"^({below_one}{whole_range_pattern(start, top - 1)}{fraction}|{at_top})$"
    if low != int(low):
        raise ValueError(f"no pattern for a lower bound of {low}")
    return rf"^({whole_range_pattern(int(low), top - 1)}{fraction}|{at_top})$"


class BoundedDecimalScheme(OpenApiSerializerFieldExtension):  # type: ignore[misc]
    """A request's bounded decimal (``marketplace.numbers.DecimalSerializerField``) as decimal text whose pattern
    holds its bounds and places; answers keep drf-spectacular's description."""

    target_class = "marketplace.numbers.DecimalSerializerField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        field = self.target
        schema: dict[str, Any] = auto_schema._map_serializer_field(field, direction, bypass_extensions=True)
        if direction == "request":
            schema["pattern"] = decimal_text_pattern(field.min_value, field.max_value, field.decimal_places)
            if getattr(field.parent, "blank_is_absent", False):
                schema["pattern"] = "^$|" + schema["pattern"]
            schema.pop("maxLength", None)
            schema.setdefault("description", f"from {field.min_value} to {field.max_value}, as text")
        return schema
