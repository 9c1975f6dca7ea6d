"""The azure-core plumbing under ``AzureClient``: its settings, the rate-limit policy every request passes
(``providers.ratelimit``), transport and retries bounded by the call's deadline, the client-credentials
``TokenCredential`` for Microsoft Entra ID, and SDK exceptions -> broker errors (``_translate``,
``_sdk_errors``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from azure.core import PipelineClient
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    AzureError,
    DecodeError,
    DeserializationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline import PipelineRequest, PipelineResponse, policies
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest, HttpResponse

from providers import ratelimit
from providers.azure import errors
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import CredentialsRejected, ProviderError, TransientProviderError
from untrusted.jsonbody import bounded_json

# Bounds on an answer's JSON this module parses itself (the SDK parses the rest), far above a token answer or
# a Retail Prices page: beyond them an answer is malformed (a ValueError), not a reason to parse without end or
# to recurse through the stack.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
MAX_ANSWER_DEPTH = 32


def _json(response: HttpResponse) -> Any:
    return bounded_json(response.content, max_bytes=MAX_ANSWER_BYTES, max_depth=MAX_ANSWER_DEPTH)


ARM_URL = "https://management.azure.com"
AUTHORITY_URL = "https://login.microsoftonline.com"
PRICES_URL = "https://prices.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_POLLING_INTERVAL = 3.0
TOKEN_REFRESH_MARGIN_S = 300  # refresh a cached token this long before it expires


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach Azure. Secrets are excluded from ``repr`` so they never reach a log line."""

    tenant_id: str
    client_id: str
    client_secret: str = field(repr=False)
    subscription_id: str = ""
    arm_url: str = ARM_URL
    authority_url: str = AUTHORITY_URL
    prices_url: str = PRICES_URL
    ca_bundle: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    polling_interval: float = DEFAULT_POLLING_INTERVAL
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this account's own figures by bucket group


# A deadline that bounds the rate limiter's waits for every request made under it (a bounded poller's budget);
# without one, each request (with its retries) is bounded by its own CALL_DEADLINE_S.
_requests_deadline: contextvars.ContextVar[CallDeadline | None] = contextvars.ContextVar(
    "azure_requests_deadline", default=None
)
_DEADLINE_KEY = "gpu_broker_rate_deadline"


class _RateLimitPolicy(policies.HTTPPolicy[Any, Any]):
    """Draws each HTTP request a pipeline sends on the account's shared bucket (``providers.ratelimit``) before it
    goes. It sits after the ``RetryPolicy`` (a per-retry policy), so each retry and each poll of a long-running
    operation is counted; the wait is bounded by the request's deadline, kept in the pipeline context across its
    retries. ``group`` names the bucket from the HTTP method (ARM counts reads, writes and deletes apart)."""

    def __init__(self, settings: ClientSettings, account: str, group: Callable[[str], str]):
        super().__init__()
        self._settings = settings
        self._account = account
        self._group = group

    def send(self, request: PipelineRequest[Any]) -> PipelineResponse[Any, Any]:
        settings = self._settings
        deadline = _requests_deadline.get() or request.context.get(_DEADLINE_KEY)
        if deadline is None:
            deadline = CallDeadline(settings.connect_timeout + settings.read_timeout)
            request.context[_DEADLINE_KEY] = deadline
        group = self._group(request.http_request.method)
        default = ratelimit.AZURE_LIMITS[group]
        key = ratelimit.BucketKey(errors.PROVIDER, self._account, "arm", group)
        ratelimit.acquire([(key, ratelimit.resolve(group, default, settings.rate_limits), 1)], deadline)
        return self.next.send(request)


def _transport(settings: ClientSettings) -> RequestsTransport:
    # connection_verify=True means the system CA store; a path trusts exactly that bundle (the sandbox's CA).
    return RequestsTransport(
        connection_verify=settings.ca_bundle or True,
        connection_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
    )


def _retries(settings: ClientSettings, wanted: int) -> int:
    """Retries within one call, no more than fit in ``CALL_DEADLINE_S`` at the per-attempt timeouts. azure-core's
    own total (the RetryPolicy's ``timeout``, set to the same deadline) is checked only between attempts."""
    fit = int(CALL_DEADLINE_S // (settings.connect_timeout + settings.read_timeout))
    return max(0, min(wanted, fit - 1))


def _plain_pipeline(
    base_url: str, settings: ClientSettings, retries: int, rate_limit: _RateLimitPolicy
) -> PipelineClient[HttpRequest, HttpResponse]:
    return PipelineClient(
        base_url=base_url,
        policies=[
            policies.HeadersPolicy(),
            policies.UserAgentPolicy(user_agent="gpu-broker"),
            policies.RetryPolicy(
                retry_total=_retries(settings, retries),
                retry_backoff_factor=0.5,
                retry_backoff_max=10,
                timeout=CALL_DEADLINE_S,
            ),
            rate_limit,
            policies.NetworkTraceLoggingPolicy(),
        ],
        transport=_transport(settings),
    )


def _translate(exc: BaseException) -> ProviderError:
    """SDK exception -> broker error. Azure errors are classified by their ``error.code`` string."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, HttpResponseError):
        status = exc.status_code
        error = exc.error
        code = str(getattr(error, "code", "") or "")
        message = str(getattr(error, "message", "") or exc.message or exc)
        if not code:
            code = type(exc).__name__ if status in (401, 403) else f"HTTP{status}" if status else type(exc).__name__
        return errors.error_from_code(code, message, status)
    name = type(exc).__name__
    if isinstance(exc, ServiceRequestError | ServiceResponseError) or name in errors.TRANSPORT_ERRORS:
        return errors.transport_error(name, str(exc))
    if isinstance(exc, DecodeError | DeserializationError | ValueError):
        return errors.malformed(f"{name}: {exc}")
    return errors.rejected(str(exc), code=name)


@contextmanager
def _sdk_errors() -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except (AzureError, ValueError) as exc:
        raise _translate(exc) from exc


# ------------------------------------------------------------------------------------------ credential


class ClientSecretTokenCredential:
    """A ``TokenCredential`` for a service principal: the OAuth 2.0 client-credentials grant against
    ``<authority>/<tenant>/oauth2/v2.0/token``, cached until shortly before expiry. Thread-safe.

    Raises ``CredentialsRejected`` when Entra ID refuses the principal (``AADSTS...`` codes) and
    ``TransientProviderError`` when it cannot be reached or is throttled; the ARM pipeline lets these through.
    """

    def __init__(self, settings: ClientSettings):
        self._settings = settings
        # Entra ID's token endpoint, per tenant and application.
        limit = _RateLimitPolicy(settings, f"{settings.tenant_id}/{settings.client_id}", lambda _: "entra/token")
        self._pipeline = _plain_pipeline(settings.authority_url, settings, settings.max_attempts - 1, limit)
        self._tokens: dict[tuple[str, ...], AccessToken] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pipeline.close()

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        key = tuple(sorted(scopes)) or (ARM_SCOPE,)
        with self._lock:
            cached = self._tokens.get(key)
            if cached is not None and cached.expires_on - TOKEN_REFRESH_MARGIN_S > time.time() and not claims:
                return cached
            token = self._request(key)
            self._tokens[key] = token
            return token

    def _request(self, scopes: tuple[str, ...]) -> AccessToken:
        settings = self._settings
        url = f"{settings.authority_url.rstrip('/')}/{quote(settings.tenant_id, safe='')}/oauth2/v2.0/token"
        request = HttpRequest(
            "POST",
            url,
            data={
                "grant_type": "client_credentials",
                "client_id": settings.client_id,
                "client_secret": settings.client_secret,
                "scope": " ".join(scopes),
            },
        )
        try:
            response = self._pipeline.send_request(request)
            body = _json(response) if response.content else {}
        except (AzureError, ValueError) as exc:
            raise _translate(exc) from exc
        if not isinstance(body, dict):
            raise errors.malformed("token endpoint answered with a non-object body")
        status = response.status_code
        if status == 200:
            try:
                return AccessToken(str(body["access_token"]), int(time.time()) + int(body["expires_in"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise errors.malformed(f"token response without access_token/expires_in ({exc!r})") from None
        # Entra ID errors: {"error": "invalid_client", "error_description": "AADSTS7000215: ...", "error_codes": [...]}
        description = str(body.get("error_description", "")).split("\r\n", 1)[0].split("\n", 1)[0]
        codes = body.get("error_codes") or []
        code = f"AADSTS{codes[0]}" if codes else str(body.get("error") or f"HTTP{status}")
        message = description.removeprefix(f"{code}: ") or str(body.get("error") or f"token request failed ({status})")
        if status == 429 or status >= 500 or body.get("error") == "temporarily_unavailable":
            raise TransientProviderError(message, code=code, provider=errors.PROVIDER, http_status=status)
        raise CredentialsRejected(message, code=code, provider=errors.PROVIDER, http_status=status)
