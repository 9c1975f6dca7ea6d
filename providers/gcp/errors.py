"""GCP error codes -> broker error classes: which codes are transient, out of capacity, over quota or a
rejected request, and how a failed long-running operation is read. Pure tables, testable offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)

PROVIDER = "gcp"

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider (Operation.error.errors[].code, HTTP 503 on the operation)
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityUnavailable,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityUnavailable,
    # quota: skip the region or account (403; GPUS_ALL_REGIONS is account-wide). The camelCase form is the
    # errors[].reason of a synchronous 403, the upper-case one the ErrorInfo reason or operation code.
    "QUOTA_EXCEEDED": QuotaExceeded,
    "quotaExceeded": QuotaExceeded,
    # transient: retry with backoff
    "RESOURCE_OPERATION_RATE_EXCEEDED": TransientProviderError,
    "RATE_LIMIT_EXCEEDED": TransientProviderError,
    "rateLimitExceeded": TransientProviderError,
    "userRateLimitExceeded": TransientProviderError,
    "RESOURCE_EXHAUSTED": TransientProviderError,  # the status name of a 429
    "resourceNotReady": TransientProviderError,  # another operation on the same resource is still running
    "UNAVAILABLE": TransientProviderError,
    "INTERNAL": TransientProviderError,
    "DEADLINE_EXCEEDED": TransientProviderError,
    "backendError": TransientProviderError,
    "internalError": TransientProviderError,
    # credentials: block the account
    "PERMISSION_DENIED": CredentialsRejected,
    "UNAUTHENTICATED": CredentialsRejected,
    "IAM_PERMISSION_DENIED": CredentialsRejected,
    "ACCESS_TOKEN_EXPIRED": CredentialsRejected,
    "SERVICE_DISABLED": CredentialsRejected,  # the API is not enabled for the project: an account setup problem
    "accessNotConfigured": CredentialsRejected,
    "authError": CredentialsRejected,
    "forbidden": CredentialsRejected,
    "invalid_grant": CredentialsRejected,  # OAuth token endpoint: unknown, disabled or deleted key
    "unauthorized_client": CredentialsRejected,
    # final: retrying the same request cannot help
    "notFound": ProviderRequestRejected,
    "NOT_FOUND": ProviderRequestRejected,
    "alreadyExists": ProviderRequestRejected,
    "ALREADY_EXISTS": ProviderRequestRejected,
    "invalid": ProviderRequestRejected,
    "INVALID_ARGUMENT": ProviderRequestRejected,
    "badRequest": ProviderRequestRejected,
    "FAILED_PRECONDITION": ProviderRequestRejected,
    "conditionNotMet": ProviderRequestRejected,
}

# Exceptions raised below HTTP (class names from requests/urllib3/google-auth): the request may not have arrived.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ReadTimeout",
        "ConnectTimeout",
        "Timeout",
        "ConnectionError",
        "ChunkedEncodingError",
        "SSLError",
        "ProxyError",
        "TransportError",
    }
)


def error_class_for(codes: Sequence[str], http_status: int | None = None) -> tuple[type[ProviderError], str]:
    """The broker error class and the deciding code for GCP error codes, most specific first.

    Codes are tried in order (ErrorInfo reason, errors[].reason or operation error code, status name); the first
    known one decides. Without a known code the HTTP status decides: 401/403 credentials, 429 and 5xx transient,
    anything else final.
    """
    for code in codes:
        known = ERROR_CLASSES.get(code)
        if known is not None:
            return known, code
    fallback = next((c for c in codes if c), str(http_status or ""))
    if http_status in (401, 403):
        return CredentialsRejected, fallback
    if http_status == 429 or (http_status is not None and http_status >= 500):
        return TransientProviderError, fallback
    return ProviderRequestRejected, fallback


def error_from_codes(codes: Sequence[str], message: str, http_status: int | None = None) -> ProviderError:
    cls, code = error_class_for([c for c in codes if c], http_status)
    return cls(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


@dataclass(frozen=True, slots=True)
class OperationError:
    """The first error of a failed zone operation, classified."""

    error_class: str
    code: str
    message: str
    http_status: int | None


def operation_error(operation: Mapping[str, Any]) -> OperationError | None:
    """None while the operation has no error; otherwise its classified first error."""
    errors = list((operation.get("error") or {}).get("errors") or [])
    if not errors:
        return None
    codes = [str(e.get("code", "")) for e in errors]
    message = "; ".join(str(e.get("message", "")) for e in errors if e.get("message"))
    status = operation.get("http_error_status_code") or None
    exc = error_from_codes(codes, message, int(status) if status else None)
    return OperationError(exc.error_class, exc.code, exc.message, exc.http_status)


def raise_operation_error(operation: Mapping[str, Any]) -> None:
    failure = operation_error(operation)
    if failure is None:
        return
    codes = [str(e.get("code", "")) for e in (operation.get("error") or {}).get("errors") or []]
    raise error_from_codes(codes, failure.message, failure.http_status)
