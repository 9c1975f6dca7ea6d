"""Tencent error codes -> broker error classes: which codes (and code prefixes) are transient, sold out,
over quota, a rejected request or rejected credentials. Pure tables, reusable by any code that sees a Tencent
error code.
"""

from __future__ import annotations

from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)

PROVIDER = "tencent"
NOT_FOUND_CODE = "InvalidInstanceId.NotFound"
# The code reported for a LAUNCH_FAILED instance whose error message names no known code.
LAUNCH_FAILED_CODE = "LAUNCH_FAILED"

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "ResourceInsufficient": CapacityUnavailable,
    "ResourceInsufficient.SpecifiedInstanceType": CapacityUnavailable,
    "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance": CapacityUnavailable,
    "ResourceInsufficient.AvailabilityZoneSoldOut": CapacityUnavailable,
    "ResourceInsufficient.InsufficientOfferingMinimum": CapacityUnavailable,
    "ResourceInsufficient.CloudDiskSoldOut": CapacityUnavailable,
    # "this zone does not sell this type": the offer is stale, another zone or type may work
    "ResourceUnavailable.InstanceType": CapacityUnavailable,
    "ResourceNotFound.InvalidZoneInstanceType": CapacityUnavailable,
    # a spot bid below the market price, the counterpart of AWS SpotMaxPriceTooLow
    "InvalidParameterValue.InsufficientPrice": CapacityUnavailable,
    LAUNCH_FAILED_CODE: CapacityUnavailable,
    # quota: skip the region or account
    "LimitExceeded": QuotaExceeded,
    "LimitExceeded.InstanceQuota": QuotaExceeded,
    "LimitExceeded.CvmInstanceQuota": QuotaExceeded,
    "LimitExceeded.SpotQuota": QuotaExceeded,
    "LimitExceeded.UserSpotQuota": QuotaExceeded,
    "LimitExceeded.PrepayQuota": QuotaExceeded,
    "InstancesQuotaLimitExceeded": QuotaExceeded,
    "ResourceInsufficient.InsufficientGroupQuota": QuotaExceeded,
    "ResourceInsufficient.DisasterRecoverGroupCvmQuota": QuotaExceeded,
    # The region's key pairs are used up (ImportKeyPair): another region or account has room.
    "InvalidKeyPair.LimitExceeded": QuotaExceeded,
    # An account without balance can buy nothing in any region until topped up: skipping it is the quota action.
    "InvalidAccount.InsufficientBalance": QuotaExceeded,
    "InvalidAccount.UnpaidOrder": QuotaExceeded,
    # transient: retry with backoff
    "RequestLimitExceeded": TransientProviderError,
    "InternalError": TransientProviderError,
    "InternalServerError": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "MutexOperation.TaskRunning": TransientProviderError,
    "OperationDenied.InstanceOperationInProgress": TransientProviderError,
    "UnsupportedOperation.InstanceStatePending": TransientProviderError,
    # raised by the SDK itself: connection failures and timeouts, and non-200 HTTP answers (proxies, gateways)
    "ClientNetworkError": TransientProviderError,
    "ServerNetworkError": TransientProviderError,
    # credentials: block the account
    "AuthFailure": CredentialsRejected,
    "UnauthorizedOperation": CredentialsRejected,
    "UnauthorizedOperation.PermissionDenied": CredentialsRejected,
    "UnauthorizedOperation.InvalidToken": CredentialsRejected,
    "UnauthorizedOperation.MFAExpired": CredentialsRejected,
    "UnauthorizedOperation.MFANotFound": CredentialsRejected,
    "InvalidCredential": CredentialsRejected,  # the SDK's answer to an empty secret id or key
}

# Families of codes classified by prefix; an exact entry above wins over a prefix.
ERROR_PREFIXES: tuple[tuple[str, type[ProviderError]], ...] = (
    ("ResourcesSoldOut.", CapacityUnavailable),
    ("AuthFailure.", CredentialsRejected),
    ("RequestLimitExceeded", TransientProviderError),  # .IPLimitExceeded, .UinLimitExceeded, ...
    ("InternalError.", TransientProviderError),
)

# The SDK wraps any non-SDK exception of a call (an unparsable body, a missing key) as
# TencentCloudSDKException(type(e).__name__, str(e)): these names mean the answer could not be read.
MALFORMED_CODES: frozenset[str] = frozenset(
    {"JSONDecodeError", "KeyError", "TypeError", "ValueError", "AttributeError", "IndexError", "UnicodeDecodeError"}
)

# Codes a TerminateInstances call answers when the instance is already on its way out.
ALREADY_TERMINATING_CODES: frozenset[str] = frozenset(
    {
        "UnsupportedOperation.InstanceStateTerminating",
        "UnsupportedOperation.InstanceStateShutdown",
        "UnsupportedOperation.InstanceStateTerminated",
    }
)


def error_class_for(code: str) -> type[ProviderError]:
    """The broker error class for a Tencent error code (exact, then prefix). Unknown codes are final."""
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if code in MALFORMED_CODES:
        return MalformedProviderResponse
    for prefix, cls in ERROR_PREFIXES:
        if code.startswith(prefix):
            return cls
    return ProviderRequestRejected


def is_known_code(code: str) -> bool:
    """True when ``code`` is in the tables (exactly or by prefix), i.e. it does not fall through to final."""
    return code in ERROR_CLASSES or any(code.startswith(prefix) for prefix, _ in ERROR_PREFIXES)


def error_from_code(code: str, message: str, request_id: str = "") -> ProviderError:
    """Build the broker error for a Tencent ``Error.Code``; the code, message and RequestId are kept."""
    text = message or code
    if request_id:
        text = f"{text} (RequestId {request_id})"
    return error_class_for(code)(text, code=code, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)
