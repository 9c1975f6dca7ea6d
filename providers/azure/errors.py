"""Azure error codes -> broker error classes: which codes (and, for the codes Azure shares between causes,
which messages) are transient, out of capacity, over quota, a rejected request or rejected credentials.
Pure tables, testable offline.
"""

from __future__ import annotations

import re

from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ImageUnavailable,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)

PROVIDER = "azure"

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, size or provider. The four allocation codes arrive on a FAILED
    # asynchronous operation (HTTP 200 on the operation); SkuNotAvailable is a synchronous 409.
    "AllocationFailed": CapacityUnavailable,
    "ZonalAllocationFailed": CapacityUnavailable,
    "OverconstrainedAllocationRequest": CapacityUnavailable,
    "OverconstrainedZonalAllocationRequest": CapacityUnavailable,
    "SkuNotAvailable": CapacityUnavailable,
    "AllocationFailedVMSeriesNotAvailable": CapacityUnavailable,
    # the image is not in this region: another region or provider may have it
    "ImageNotFound": ImageUnavailable,
    "GalleryImageNotFound": ImageUnavailable,
    # quota: skip the region or account
    "QuotaExceeded": QuotaExceeded,
    # transient: retry with backoff
    "TooManyRequests": TransientProviderError,
    "RetryableError": TransientProviderError,
    "InternalServerError": TransientProviderError,
    "InternalExecutionError": TransientProviderError,
    "InternalOperationError": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "GatewayTimeout": TransientProviderError,
    "OperationPreempted": TransientProviderError,
    # credentials: block the account
    "AuthenticationFailed": CredentialsRejected,
    "InvalidAuthenticationToken": CredentialsRejected,
    "InvalidAuthenticationTokenTenant": CredentialsRejected,
    "InvalidAuthenticationTokenAudience": CredentialsRejected,
    "ExpiredAuthenticationToken": CredentialsRejected,
    "AuthorizationFailed": CredentialsRejected,
    "LinkedAuthorizationFailed": CredentialsRejected,
    "ClientAuthenticationError": CredentialsRejected,
    "SubscriptionNotFound": CredentialsRejected,
    "InvalidSubscriptionId": CredentialsRejected,
    "ReadOnlyDisabledSubscription": CredentialsRejected,
}

# Azure answers both a cores-quota refusal and a spot max price below the market with 409 OperationNotAllowed
# (and uses the same code for unrelated refusals), so this one code is split by its message.
OPERATION_NOT_ALLOWED = "OperationNotAllowed"
_QUOTA_MESSAGE = re.compile(r"quota", re.IGNORECASE)
_SPOT_PRICE_MESSAGE = re.compile(r"max(imum)? price|spot price", re.IGNORECASE)

# Exceptions raised below the HTTP layer (azure-core class names): the request may not have reached Azure.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        "IncompleteReadError",
        "ConnectionError",
        "SSLError",
    }
)


def error_class_for(code: str, message: str = "", http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an Azure error code. Unknown codes are final unless the status says otherwise.

    A 429 is throttling whatever its code: Compute throttles with ``OperationNotAllowed`` ("too many requests",
    details ``TooManyRequests``), which must not be read as a final refusal by its message."""
    if http_status == 429:
        return TransientProviderError
    if code == OPERATION_NOT_ALLOWED:
        if _QUOTA_MESSAGE.search(message):
            return QuotaExceeded
        if _SPOT_PRICE_MESSAGE.search(message):
            return CapacityUnavailable
        return ProviderRequestRejected
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if http_status == 429 or (http_status is not None and http_status >= 500):
        return TransientProviderError
    if http_status in (401, 403):
        return CredentialsRejected
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an Azure ``error.code``; the code and message are kept on the exception."""
    cls = error_class_for(code, message, http_status)
    return cls(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the SDK exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


def rejected(message: str, code: str = "") -> ProviderRequestRejected:
    return ProviderRequestRejected(message, code=code, provider=PROVIDER)
