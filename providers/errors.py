"""The broker's provider error classes. Every SDK exception is translated into one of these at the edge.

The class decides what the broker does next: ``CapacityUnavailable`` -> try another zone/type/provider,
``QuotaExceeded`` -> skip the region or account, ``TransientProviderError`` -> retry with backoff,
``CredentialsRejected`` -> block the account, ``ProviderRequestRejected`` -> final, do not retry.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base class. ``code`` is the provider's own error code string; ``message`` its text."""

    error_class = "provider"
    retryable = False

    def __init__(self, message: str, *, code: str = "", provider: str = "", http_status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.provider = provider
        self.http_status = http_status

    def __str__(self) -> str:
        prefix = f"{self.provider}: " if self.provider else ""
        code = f"{self.code}: " if self.code else ""
        return f"{prefix}{code}{self.message}"


class CapacityUnavailable(ProviderError):
    """The provider has no capacity for this type in this zone right now."""

    error_class = "capacity"


class QuotaExceeded(ProviderError):
    """The account's quota (vCPU, GPU, instance count) for the region or account is used up."""

    error_class = "quota"


class TransientProviderError(ProviderError):
    """Throttling, timeouts, 5xx: the same call may succeed later."""

    error_class = "transient"
    retryable = True


class CredentialsRejected(ProviderError):
    """The provider refused the account's credentials or permissions."""

    error_class = "credentials"


class ProviderRequestRejected(ProviderError):
    """A final refusal (bad parameter, unknown instance): retrying the same request cannot help."""

    error_class = "final"


class ImageUnavailable(ProviderError):
    """The image to launch (the cloud's GPU-ready default or the buyer's own) does not exist in this region.

    Raised before any launch call, so the attempt fails with the reason and the order fails over."""

    error_class = "image"


class MalformedProviderResponse(ProviderError):
    """The provider answered with something the adapter cannot parse."""

    error_class = "malformed"
