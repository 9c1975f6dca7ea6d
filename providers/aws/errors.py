"""AWS error codes -> broker error classes: which codes are transient, out of capacity, over quota, a
rejected request or rejected credentials. Pure tables, reusable by any code that sees an AWS error code.
"""

from __future__ import annotations

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

PROVIDER = "aws"

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "InsufficientInstanceCapacity": CapacityUnavailable,
    "InsufficientCapacity": CapacityUnavailable,
    "InsufficientHostCapacity": CapacityUnavailable,
    "InsufficientReservedInstanceCapacity": CapacityUnavailable,
    "Unsupported": CapacityUnavailable,
    "SpotMaxPriceTooLow": CapacityUnavailable,
    # quota: skip the region or account
    "VcpuLimitExceeded": QuotaExceeded,
    "InstanceLimitExceeded": QuotaExceeded,
    "MaxSpotInstanceCountExceeded": QuotaExceeded,
    # transient: retry with backoff
    "RequestLimitExceeded": TransientProviderError,
    "Throttling": TransientProviderError,
    "ThrottlingException": TransientProviderError,
    "InternalError": TransientProviderError,
    "InternalFailure": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "Unavailable": TransientProviderError,
    "RequestTimeout": TransientProviderError,
    "RequestTimeoutException": TransientProviderError,
    # credentials: block the account. The last four are what STS-signed and JSON-protocol services
    # (the Price List API) answer for a bad key or signature.
    "AuthFailure": CredentialsRejected,
    "UnauthorizedOperation": CredentialsRejected,
    "InvalidClientTokenId": CredentialsRejected,
    "SignatureDoesNotMatch": CredentialsRejected,
    "UnrecognizedClientException": CredentialsRejected,
    "InvalidSignatureException": CredentialsRejected,
    "AccessDeniedException": CredentialsRejected,
    "ExpiredToken": CredentialsRejected,
    # the image is not in this region: EC2's codes for an AMI id, SSM's for the public parameter naming one
    "InvalidAMIID.NotFound": ImageUnavailable,
    "InvalidAMIID.Unavailable": ImageUnavailable,
    "ParameterNotFound": ImageUnavailable,
}

# Errors raised below the HTTP layer (botocore exception class names): the request may not have reached AWS.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ProxyConnectionError",
        "SSLError",
        "HTTPClientError",
        "ConnectionError",
    }
)


def error_class_for(code: str, http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an AWS error code. Unknown codes are final unless the status is 5xx."""
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if http_status is not None and http_status >= 500:
        return TransientProviderError
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an AWS ``Error.Code``; the code and message are kept on the exception."""
    return error_class_for(code, http_status)(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the SDK exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)
