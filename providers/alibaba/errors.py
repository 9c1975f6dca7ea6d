"""ECS error codes -> broker error classes: which codes are throttling or otherwise transient, out of stock,
over quota, a rejected request or rejected credentials. Pure tables, testable offline.
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

PROVIDER = "alibaba"

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "OperationDenied.NoStock": CapacityUnavailable,
    "Zone.NotOnSale": CapacityUnavailable,
    "InvalidResourceType.NotSupported": CapacityUnavailable,
    "InstanceType.Offline": CapacityUnavailable,
    "InvalidInstanceType.PhasedOut": CapacityUnavailable,
    "InvalidInstanceType.ZoneNotSupported": CapacityUnavailable,
    # A spot ceiling below the market price is a miss for this offer, like AWS's SpotMaxPriceTooLow.
    "InvalidSpotPriceLimit.LowerThanPublicPrice": CapacityUnavailable,
    # quota: skip the region or account
    "QuotaExceed.ElasticQuota": QuotaExceeded,
    # transient: retry with backoff (every "Throttling*" code is caught by THROTTLING_PREFIX below)
    "Throttling": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "InternalError": TransientProviderError,
    "UnknownError": TransientProviderError,
    "LastTokenProcessing": TransientProviderError,
    "Idempotence.Processing": TransientProviderError,
    "LastOrderProcessing": TransientProviderError,
    "OperationDenied.ResourceControl": TransientProviderError,
    "IncorrectInstanceStatus.Initializing": TransientProviderError,
    # A replayed nonce only means this exact request was sent twice; a new request gets a new nonce.
    "SignatureNonceUsed": TransientProviderError,
    # credentials: block the account
    "InvalidAccessKeyId.NotFound": CredentialsRejected,
    "InvalidAccessKeyId.Inactive": CredentialsRejected,
    "SignatureDoesNotMatch": CredentialsRejected,
    "IncompleteSignature": CredentialsRejected,
    "InvalidSecurityToken.Expired": CredentialsRejected,
    "InvalidSecurityToken.Malformed": CredentialsRejected,
    "Forbidden.RAM": CredentialsRejected,
    "Forbidden.AccessKeyDisabled": CredentialsRejected,
    # final: named here so the table documents them; any other 4xx code is final too
    "InvalidInstanceId.NotFound": ProviderRequestRejected,
    "IdempotenceParamNotMatch": ProviderRequestRejected,
    "InvalidClientToken.ValueNotSupported": ProviderRequestRejected,
    "IncorrectInstanceStatus": ProviderRequestRejected,
    "InvalidImageId.NotFound": ProviderRequestRejected,
    "InvalidZoneId.NotFound": ProviderRequestRejected,
    "InvalidInstanceType.ValueNotSupported": ProviderRequestRejected,
    "InvalidParameter": ProviderRequestRejected,
    "MissingParameter": ProviderRequestRejected,
    "Account.Arrearage": ProviderRequestRejected,
    "InvalidAccountStatus.NotEnoughBalance": ProviderRequestRejected,
    # What a booted launch can meet (RunInstances, ImportKeyPair, AuthorizeSecurityGroup, DeleteSecurityGroup and
    # DeleteKeyPairs error tables); the adapter reads the last two as "still in use", not as failures.
    "InvalidUserData.SizeExceeded": ProviderRequestRejected,
    "InvalidUserData.Base64FormatInvalid": ProviderRequestRejected,
    "InvalidSystemDiskSize.LessThanImageSize": ProviderRequestRejected,
    "InvalidSystemDiskSize.LessThanMinSize": ProviderRequestRejected,
    "InvalidSystemDiskSize.MoreThanMaxSize": ProviderRequestRejected,
    "InvalidKeyPairName.NotFound": ProviderRequestRejected,
    "InvalidSecurityGroupId.NotFound": ProviderRequestRejected,
    "InvalidPublicKeyBody.Malformed": ProviderRequestRejected,
    "KeyPair.AlreadyExist": ProviderRequestRejected,
    "AuthorizationLimitExceed": ProviderRequestRejected,
    "DependencyViolation": ProviderRequestRejected,
    "InvalidParameter.KeypairAlreadyAttachedInstance": ProviderRequestRejected,
}
THROTTLING_PREFIX = "Throttling."

# Failures below the HTTP layer, named by the adapter (the SDK reports them without a code).
TRANSPORT_ERROR_CODE = "TransportError"


def error_class_for(code: str, http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an ECS error code. Unknown codes are final unless the status is 5xx.

    The code decides, never the status: ECS answers ``Throttling.User`` with HTTP 400 and ``NoStock`` with 403.
    """
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if code.startswith(THROTTLING_PREFIX):
        return TransientProviderError
    if http_status is not None and http_status >= 500:
        return TransientProviderError
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an ECS ``Code``; the code and message are kept on the exception."""
    return error_class_for(code, http_status)(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(message: str) -> ProviderError:
    """A connection failure or timeout; always retryable."""
    return TransientProviderError(message or TRANSPORT_ERROR_CODE, code=TRANSPORT_ERROR_CODE, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)
