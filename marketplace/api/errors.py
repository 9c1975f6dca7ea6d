"""One error shape for the whole API: {"error": {"code", "message", "fields"?}}."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ledger.checkpoints import ProofUnavailable
from marketplace.api.tokens import MADE_WHERE, PREFIX
from marketplace.billing.credit import PaymentRequired
from marketplace.fleets.services import FleetEnded
from marketplace.fleets.specs import FleetInvalid
from marketplace.fleets.telemetry import MetricRefused
from marketplace.launch.config import LaunchConfigInvalid
from marketplace.orders.budgets import BudgetExceeded
from marketplace.orders.errors import (
    ActionUnsupported,
    IdempotencyConflict,
    OfferNotFound,
    OfferNotOrderable,
    OrderError,
    QuoteExpired,
    QuoteNotFound,
    QuoteUsed,
    TransitionRefused,
)

_STATUS = {
    OfferNotFound: status.HTTP_404_NOT_FOUND,
    OfferNotOrderable: status.HTTP_409_CONFLICT,
    IdempotencyConflict: status.HTTP_409_CONFLICT,
    TransitionRefused: status.HTTP_409_CONFLICT,
    ActionUnsupported: status.HTTP_409_CONFLICT,
    QuoteNotFound: status.HTTP_404_NOT_FOUND,
    QuoteExpired: status.HTTP_410_GONE,
    QuoteUsed: status.HTTP_409_CONFLICT,
    BudgetExceeded: status.HTTP_402_PAYMENT_REQUIRED,
    FleetEnded: status.HTTP_409_CONFLICT,
}


def error_response(code: str, message: str, http_status: int, fields: dict[str, Any] | None = None) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return Response({"error": body}, status=http_status)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # DRF reads request.body before a JSON parser, so Django checks first
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return error_response("too_large", f"the body is over {limit} bytes, the most the API reads", 413)
    if isinstance(exc, LaunchConfigInvalid):
        fields = {k: [v] for k, v in exc.fields.items()}
        return error_response(exc.code, "the launch configuration has invalid fields", 400, fields)
    if isinstance(exc, FleetInvalid):
        fields = {k: [v] for k, v in exc.fields.items()}
        return error_response(exc.code, "the fleet has invalid fields", 400, fields)
    if isinstance(exc, MetricRefused):
        return error_response(exc.code, str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
    if isinstance(exc, ProofUnavailable):
        return error_response("proof_unavailable", str(exc), status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, PaymentRequired):
        response = error_response(exc.code, str(exc), status.HTTP_402_PAYMENT_REQUIRED)
        response.data["error"].update(
            currency="USD",
            needed=f"{exc.needed_minor / 100:.2f}",
            available=f"{exc.available_minor / 100:.2f}",
            add=f"{exc.shortfall_minor / 100:.2f}",
            top_up="/api/v1/billing/topups",
        )
        return response
    if isinstance(exc, OrderError):
        return error_response(exc.code, str(exc), _STATUS.get(type(exc), status.HTTP_400_BAD_REQUEST))
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.NotAuthenticated):  # neither a token nor a signed-in session came with it
        exc = exceptions.NotAuthenticated(f"no API token: send the header 'Authorization: Bearer {PREFIX}…' "
                                          f"{MADE_WHERE}", "token_missing")  # fmt: skip
    shaped = _shape(exc, response)
    for header in ("Retry-After", "WWW-Authenticate"):
        if header in response:
            shaped[header] = response[header]
    return shaped


def _shape(exc: Exception, response: Response) -> Response:
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return error_response("invalid", "the request has invalid fields", response.status_code, detail)
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.APIException) and isinstance(exc.detail, str):
        message = str(exc.detail)
        code = getattr(exc.detail, "code", code) or code
    else:
        message = str(getattr(exc, "detail", exc))
    return error_response(str(code), message, response.status_code)
