"""The only module that imports azure-core / azure-mgmt-compute / azure-mgmt-network.

``AzureClient`` builds two ``ComputeManagementClient``s (reads with retries, writes with none), a
``NetworkManagementClient`` for the orders' network security groups (idempotent PUTs and DELETEs, so retried), a small
client-credentials ``TokenCredential`` for Microsoft Entra ID, and a plain azure-core pipeline for the
unauthenticated Retail Prices API. Every call runs through ``_sdk_errors`` so callers receive plain dicts
(the models' wire shape) or ``ProviderError`` subclasses, never an SDK exception. Every HTTP request any of their
pipelines sends first draws on a shared rate-limit bucket (``providers.ratelimit``, ``_RateLimitPolicy``).
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

from azure.core import MatchConditions, PipelineClient
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
from azure.core.polling.base_polling import OperationFailed
from azure.core.rest import HttpRequest, HttpResponse
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import VirtualMachine
from azure.mgmt.core.polling.arm_polling import ARMPolling
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network.models import NetworkSecurityGroup

from providers import ratelimit
from providers.azure import mapping
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
PRICES_API_VERSION = "2023-01-01-preview"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_POLLING_INTERVAL = 3.0
TOKEN_REFRESH_MARGIN_S = 300  # refresh a cached token this long before it expires
MAX_PRICE_PAGES = 200  # a per-size price query is one page; stop a runaway NextPageLink chain
# Far beyond any subscription's VMs at ARM's page sizes; stops a nextLink chain that never ends.
MAX_VM_PAGES = 1000


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
        key = ratelimit.BucketKey(mapping.PROVIDER, self._account, "arm", group)
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
        return mapping.error_from_code(code, message, status)
    name = type(exc).__name__
    if isinstance(exc, ServiceRequestError | ServiceResponseError) or name in mapping.TRANSPORT_ERRORS:
        return mapping.transport_error(name, str(exc))
    if isinstance(exc, DecodeError | DeserializationError | ValueError):
        return mapping.malformed(f"{name}: {exc}")
    return mapping.rejected(str(exc), code=name)


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
            raise mapping.malformed("token endpoint answered with a non-object body")
        status = response.status_code
        if status == 200:
            try:
                return AccessToken(str(body["access_token"]), int(time.time()) + int(body["expires_in"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise mapping.malformed(f"token response without access_token/expires_in ({exc!r})") from None
        # Entra ID errors: {"error": "invalid_client", "error_description": "AADSTS7000215: ...", "error_codes": [...]}
        description = str(body.get("error_description", "")).split("\r\n", 1)[0].split("\n", 1)[0]
        codes = body.get("error_codes") or []
        code = f"AADSTS{codes[0]}" if codes else str(body.get("error") or f"HTTP{status}")
        message = description.removeprefix(f"{code}: ") or str(body.get("error") or f"token request failed ({status})")
        if status == 429 or status >= 500 or body.get("error") == "temporarily_unavailable":
            raise TransientProviderError(message, code=code, provider=mapping.PROVIDER, http_status=status)
        raise CredentialsRejected(message, code=code, provider=mapping.PROVIDER, http_status=status)


# --------------------------------------------------------------------------------------------- polling


class _BudgetSpent(Exception):
    """The bounded poller ran out of time; the operation is still running at Azure."""


class _BoundedPolling(ARMPolling):
    """The SDK's ARM poller (Azure-AsyncOperation / Location headers), giving up after ``budget_s``.

    A launch or delete waits briefly for a quick answer (an allocation failure, a finished delete) and
    otherwise returns while Azure carries on; no polling thread outlives the call.
    """

    def __init__(self, interval: float, budget_s: float):
        super().__init__(timeout=interval)
        self._budget_s = budget_s
        self._deadline = 0.0

    def initialize(self, client: Any, initial_response: Any, deserialization_callback: Any) -> None:
        self._deadline = time.monotonic() + self._budget_s
        super().initialize(client, initial_response, deserialization_callback)

    def run(self) -> None:
        # The polls' waits for rate-limit tokens come out of the same budget as the polls themselves.
        token = _requests_deadline.set(CallDeadline(0.0, max(0.0, self._deadline - time.monotonic())))
        try:
            super().run()
        finally:
            _requests_deadline.reset(token)

    def _delay(self) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _BudgetSpent
        self._sleep(min(self._extract_delay(), remaining))


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What ``create_vm`` learned: the create was new or hit an existing VM, and whether it finished.

    ``error`` is set when the operation failed within the wait (an allocation failure, HTTP 200).
    """

    existed: bool
    finished: bool
    error: ProviderError | None = None


def _operation_error(exc: HttpResponseError) -> ProviderError:
    error = exc.error
    code = str(getattr(error, "code", "") or "OperationFailed")
    message = str(getattr(error, "message", "") or exc.message or "the operation failed")
    return mapping.error_from_code(code, message, exc.status_code)


# ------------------------------------------------------------------------------------------- paged reads


class _PagedRead:
    """One paged ARM list, all its pages one call: every request it sends (each page, each retry) starts only if a
    whole attempt still ends by the call's deadline, and every page Azure answers with 200 is checked before the SDK
    reads it: a bounded JSON object with a ``value`` list, and a ``nextLink`` (if any) on the ARM endpoint itself,
    seen once. The SDK takes a page with no ``value`` for an empty one, which here would read as "no VMs"; and its
    bearer token goes wherever a ``nextLink`` points."""

    def __init__(self, what: str, settings: ClientSettings, deadline: CallDeadline):
        self._what = what
        self._arm = settings.arm_url.rstrip("/") + "/"
        self._deadline = deadline
        self._links: set[str] = set()
        self.pages = 0

    def on_request(self, request: PipelineRequest[Any]) -> None:
        if not self._deadline.allows_retry(0.0):
            raise TransientProviderError(
                f"{self._what}: {self.pages} page(s) read and the next would end past the call's deadline "
                f"({CALL_DEADLINE_S:.0f} s)",
                code="CallDeadlineExceeded",
                provider=mapping.PROVIDER,
            )

    def on_response(self, response: PipelineResponse[Any, Any]) -> None:
        answer = response.http_response
        if answer.status_code != 200:
            return  # an error answer is the SDK's to raise (throttling, refusals)
        try:
            body = bounded_json(answer.content, max_bytes=MAX_ANSWER_BYTES, max_depth=MAX_ANSWER_DEPTH)
        except ValueError as exc:
            raise mapping.malformed(f"{self._what}: a page is not bounded JSON ({exc})") from None
        if not isinstance(body, dict) or not isinstance(body.get("value"), list):
            raise mapping.malformed(f"{self._what}: a page without a 'value' list")
        self.pages += 1
        if self.pages > MAX_VM_PAGES:
            raise mapping.malformed(f"{self._what}: more than {MAX_VM_PAGES} pages")
        link = body.get("nextLink")
        if link is None or link == "":
            return
        if not isinstance(link, str) or not link.startswith(self._arm):
            raise mapping.malformed(f"{self._what}: nextLink {str(link)[:200]!r} is not on {self._arm}")
        if link in self._links:
            raise mapping.malformed(f"{self._what}: nextLink {link[:200]!r} came twice")
        self._links.add(link)


# --------------------------------------------------------------------------------------------- client


class AzureClient:
    """SDK clients for one subscription, built once per adapter.

    Reads (``skus``, ``get_vm``, ``list_vms``, ``vm_statuses``, ``usages``, ``retail_prices``) retry throttling,
    5xx and timeouts up to ``max_attempts`` in total; ``create_vm`` runs with no retry so a refusal reaches the
    broker on the first answer.
    """

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self.credential = ClientSecretTokenCredential(settings)
        # ARM's buckets are per subscription and per service principal.
        self._arm_limit = _RateLimitPolicy(
            settings, f"{settings.subscription_id}/{settings.client_id}", ratelimit.azure_group
        )
        self._read = self._compute(retries=settings.max_attempts - 1)
        self._write = self._compute(retries=0)
        self._network = NetworkManagementClient(
            self.credential,
            settings.subscription_id,
            base_url=settings.arm_url,
            transport=_transport(settings),
            retry_total=_retries(settings, settings.max_attempts - 1),
            timeout=CALL_DEADLINE_S,
            retry_backoff_factor=0.5,
            retry_backoff_max=10,
            polling_interval=settings.polling_interval,
            user_agent="gpu-broker",
            per_retry_policies=[self._arm_limit],
        )
        # The Retail Prices API is unauthenticated: its limit, if any, is the broker's as a caller, not an account's.
        prices_limit = _RateLimitPolicy(settings, "retail-prices", lambda _: "prices")
        self._prices = _plain_pipeline(settings.prices_url, settings, settings.max_attempts - 1, prices_limit)

    def _compute(self, *, retries: int) -> ComputeManagementClient:
        return ComputeManagementClient(
            self.credential,
            self.settings.subscription_id,
            base_url=self.settings.arm_url,
            transport=_transport(self.settings),
            retry_total=_retries(self.settings, retries),
            timeout=CALL_DEADLINE_S,
            retry_backoff_factor=0.5,
            retry_backoff_max=10,
            polling_interval=self.settings.polling_interval,
            user_agent="gpu-broker",
            per_retry_policies=[self._arm_limit],
        )

    def close(self) -> None:
        for closeable in (self._read, self._write, self._network, self._prices, self.credential):
            closeable.close()

    # -- reads

    def skus(self, region: str) -> list[dict[str, Any]]:
        """Every resource SKU offered in ``region`` (all resource types; callers filter)."""
        with _sdk_errors():
            return [sku.as_dict() for sku in self._read.resource_skus.list(filter=f"location eq '{region}'")]

    def usages(self, region: str) -> list[dict[str, Any]]:
        """The subscription's compute quotas and usage in ``region``."""
        with _sdk_errors():
            return [usage.as_dict() for usage in self._read.usage.list(region)]

    def get_vm(self, resource_group: str, name: str) -> dict[str, Any] | None:
        """The VM with its instance view, or None when Azure has no such VM (or resource group)."""
        with _sdk_errors():
            try:
                vm = self._read.virtual_machines.get(resource_group, name, expand="instanceView")
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return None
                raise
            result: dict[str, Any] = vm.as_dict()
            return result

    def list_vms(self, resource_group: str) -> list[dict[str, Any]]:
        """Every VM in the resource group (no instance view); [] when the group does not exist."""
        with _sdk_errors():
            try:
                return [vm.as_dict() for vm in self._read.virtual_machines.list(resource_group)]
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return []
                raise

    def vm_statuses(self) -> list[dict[str, Any]]:
        """Every VM of the subscription, in every resource group and location, with its run-time status: ARM's
        "Virtual Machines - List All" with ``statusOnly=true``, every page (``nextLink``). Each item is the SDK's
        ``VirtualMachine`` as a dict; what Azure puts in it is ``mapping``'s to read (its identity and
        ``properties.instanceView``, not the VM's model). A page Azure throttled or failed is retried as any read;
        all the pages together end within ``CALL_DEADLINE_S``. Raises ``TransientProviderError``,
        ``CredentialsRejected``, ``MalformedProviderResponse`` (a page or an item the reference does not allow)."""
        settings = self.settings
        what = "Virtual Machines - List All (statusOnly)"
        deadline = CallDeadline(settings.connect_timeout + settings.read_timeout)
        paged = _PagedRead(what, settings, deadline)
        # The rate limiter's waits for every page come out of the same deadline as the pages themselves.
        token = _requests_deadline.set(deadline)
        try:
            with _sdk_errors():
                listed = self._read.virtual_machines.list_all(
                    status_only="true", raw_request_hook=paged.on_request, raw_response_hook=paged.on_response
                )
                found: list[dict[str, Any]] = []
                for vm in listed:
                    if not isinstance(vm, VirtualMachine):  # the SDK hands on whatever a page's list held
                        raise mapping.malformed(f"{what}: an item is {type(vm).__name__}, not a virtual machine")
                    found.append(vm.as_dict())
                return found
        finally:
            _requests_deadline.reset(token)

    def retail_prices(self, odata_filter: str) -> list[dict[str, Any]]:
        """Every ``Items[]`` row of the Retail Prices API for ``odata_filter``, following ``NextPageLink``."""
        url: str | None = (
            f"{self.settings.prices_url.rstrip('/')}/api/retail/prices"
            f"?api-version={PRICES_API_VERSION}&$filter={quote(odata_filter)}"
        )
        items: list[dict[str, Any]] = []
        pages = 0
        while url:
            pages += 1
            if pages > MAX_PRICE_PAGES:
                raise mapping.malformed(f"Retail Prices answered more than {MAX_PRICE_PAGES} pages")
            with _sdk_errors():
                response = self._prices.send_request(HttpRequest("GET", url))
                body = _json(response) if response.content else None
            if response.status_code != 200:
                detail = body.get("Error") or body.get("error") if isinstance(body, dict) else None
                detail = detail if isinstance(detail, dict) else {}
                code = str(detail.get("Code") or detail.get("code") or f"HTTP{response.status_code}")
                message = str(detail.get("Message") or detail.get("message") or response.text()[:300])
                raise mapping.error_from_code(code, message, response.status_code)
            if not isinstance(body, dict) or not isinstance(body.get("Items"), list):
                raise mapping.malformed("Retail Prices answered without an Items list")
            items.extend(item for item in body["Items"] if isinstance(item, dict))
            url = body.get("NextPageLink") or None
        return items

    # -- images

    def image_versions(self, location: str, publisher: str, offer: str, sku: str) -> list[str]:
        """The versions of a marketplace image offered in ``location``, newest first (at most one is asked for);
        [] when Azure has none there: it answers 404 ``NotFound`` ("Artifact: VMImage was not found.")."""
        with _sdk_errors():
            try:
                found = self._read.virtual_machine_images.list(
                    location, publisher, offer, sku, top=1, orderby="name desc"
                )
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return []
                raise
            return [str(item.name) for item in found or ()]

    @staticmethod
    def _found(read: Callable[[], Any]) -> dict[str, Any] | None:
        """What a GET answers, as a dict; None for ARM's 404 (no such resource, or no such resource group)."""
        with _sdk_errors():
            try:
                found = read()
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return None
                raise
            result: dict[str, Any] = found.as_dict()
            return result

    def image_version(self, location: str, publisher: str, offer: str, sku: str, version: str) -> dict[str, Any] | None:
        """One version of a marketplace image in ``location``; None when Azure has no such version there."""
        return self._found(lambda: self._read.virtual_machine_images.get(location, publisher, offer, sku, version))

    def managed_image(self, resource_group: str, name: str) -> dict[str, Any] | None:
        """A managed image of this subscription; None when there is no such image (or resource group)."""
        return self._found(lambda: self._read.images.get(resource_group, name))

    # -- network security groups

    def get_nsg(self, resource_group: str, name: str) -> dict[str, Any] | None:
        """The network security group, or None when there is none of that name (or no such resource group)."""
        return self._found(lambda: self._network.network_security_groups.get(resource_group, name))

    def list_nsgs(self, resource_group: str) -> list[dict[str, Any]]:
        """Every network security group in the resource group (ARM's list has no tag filter: callers filter);
        [] when the group does not exist."""
        with _sdk_errors():
            try:
                return [nsg.as_dict() for nsg in self._network.network_security_groups.list(resource_group)]
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return []
                raise

    def put_nsg(self, resource_group: str, name: str, body: dict[str, Any], *, wait_s: float) -> bool:
        """``begin_create_or_update`` (a PUT: repeating it converges on the same group), waiting up to ``wait_s``.
        True when Azure finished within the wait. A failed operation is raised as the broker's error."""
        polling: Any = _BoundedPolling(self.settings.polling_interval, wait_s) if wait_s > 0 else False
        with _sdk_errors():
            poller = self._network.network_security_groups.begin_create_or_update(
                resource_group, name, NetworkSecurityGroup(body), polling=polling
            )
        outcome = self._settle(poller)
        if outcome["error"] is not None:
            raise outcome["error"]
        return bool(outcome["finished"]) and wait_s > 0

    def delete_nsg(self, resource_group: str, name: str, *, wait_s: float) -> bool:
        """``begin_delete``; True when the group is gone within ``wait_s`` (or was not there). Azure refuses a
        group still on a NIC with 400 ``InUseNetworkSecurityGroupCannotBeDeleted``, raised as
        ``ProviderRequestRejected`` with that code."""
        return self._delete(
            lambda polling: self._network.network_security_groups.begin_delete(resource_group, name, polling=polling),
            wait_s,
        )

    # -- writes

    def create_vm(self, resource_group: str, name: str, body: dict[str, Any], *, wait_s: float) -> CreateResult:
        """``begin_create_or_update`` with ``If-None-Match: *`` and no retry, then wait up to ``wait_s``.

        A VM that already exists is left untouched (``existed=True``). An operation that fails within the
        wait is returned as ``error``; a synchronous refusal (409 SkuNotAvailable, OperationNotAllowed, 429)
        is raised as the broker's error.
        """
        polling: Any = _BoundedPolling(self.settings.polling_interval, wait_s) if wait_s > 0 else False
        with _sdk_errors():
            try:
                poller = self._write.virtual_machines.begin_create_or_update(
                    resource_group,
                    name,
                    VirtualMachine(body),
                    match_condition=MatchConditions.IfMissing,
                    polling=polling,
                )
            except HttpResponseError as exc:
                if exc.status_code == 412:  # If-None-Match: * met an existing VM of this name
                    return CreateResult(existed=True, finished=True)
                raise
        return CreateResult(existed=False, **self._settle(poller))

    def delete_vm(self, resource_group: str, name: str, *, wait_s: float) -> bool:
        """``begin_delete``; True when Azure finished deleting within ``wait_s`` (or had no such VM)."""
        return self._delete(
            lambda polling: self._read.virtual_machines.begin_delete(resource_group, name, polling=polling), wait_s
        )

    def _delete(self, begin: Callable[[Any], Any], wait_s: float) -> bool:
        """Start a delete with polling bounded by ``wait_s``; True when it finished within it, or there was
        nothing to delete (404)."""
        polling: Any = _BoundedPolling(self.settings.polling_interval, wait_s) if wait_s > 0 else False
        with _sdk_errors():
            try:
                poller = begin(polling)
            except HttpResponseError as exc:
                if exc.status_code == 404:
                    return True
                raise
        outcome = self._settle(poller)
        if outcome["error"] is not None:
            raise outcome["error"]
        return bool(outcome["finished"]) and wait_s > 0

    @staticmethod
    def _settle(poller: Any) -> dict[str, Any]:
        """Join the bounded poller: finished or not, and the operation's own error if it failed."""
        try:
            poller.result()
        except _BudgetSpent:
            return {"finished": False, "error": None}
        except TransientProviderError:  # a poll the rate limit could not fit in the budget: Azure carries on
            return {"finished": False, "error": None}
        except HttpResponseError as exc:
            if isinstance(exc.__cause__, OperationFailed) or isinstance(exc.inner_exception, OperationFailed):
                return {"finished": True, "error": _operation_error(exc)}
            # A status poll failed (throttled, timed out): the operation itself goes on at Azure.
            return {"finished": False, "error": None}
        except AzureError:
            return {"finished": False, "error": None}
        return {"finished": poller.done(), "error": None}
