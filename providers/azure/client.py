"""The Azure SDK calls (azure-mgmt-compute, azure-mgmt-network): with ``pipeline`` beside it, the only
modules that import an Azure package.

``AzureClient`` builds two ``ComputeManagementClient``s (reads with retries, writes with none), a
``NetworkManagementClient`` for the orders' network security groups (idempotent PUTs and DELETEs, so retried), and
a plain azure-core pipeline for the unauthenticated Retail Prices API, all on ``pipeline``'s transport and
credential. Every call runs through ``_sdk_errors`` so callers receive plain dicts (the models' wire shape) or
``ProviderError`` subclasses, never an SDK exception. Long-running operations are polled within a budget
(``_BoundedPolling``) and paged lists are checked page by page (``_PagedRead``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
)
from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.polling.base_polling import OperationFailed
from azure.core.rest import HttpRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import VirtualMachine
from azure.mgmt.core.polling.arm_polling import ARMPolling
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network.models import NetworkSecurityGroup

from providers import ratelimit
from providers.azure import errors
from providers.azure.pipeline import (
    MAX_ANSWER_BYTES,
    MAX_ANSWER_DEPTH,
    ClientSecretTokenCredential,
    ClientSettings,
    _json,
    _plain_pipeline,
    _RateLimitPolicy,
    _requests_deadline,
    _retries,
    _sdk_errors,
    _transport,
)
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import ProviderError, TransientProviderError
from untrusted.jsonbody import bounded_json

PRICES_API_VERSION = "2023-01-01-preview"
MAX_PRICE_PAGES = 200  # a per-size price query is one page; stop a runaway NextPageLink chain
# Far beyond any subscription's VMs at ARM's page sizes; stops a nextLink chain that never ends.
MAX_VM_PAGES = 1000
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
    return errors.error_from_code(code, message, exc.status_code)


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
                provider=errors.PROVIDER,
            )

    def on_response(self, response: PipelineResponse[Any, Any]) -> None:
        answer = response.http_response
        if answer.status_code != 200:
            return  # an error answer is the SDK's to raise (throttling, refusals)
        try:
            body = bounded_json(answer.content, max_bytes=MAX_ANSWER_BYTES, max_depth=MAX_ANSWER_DEPTH)
        except ValueError as exc:
            raise errors.malformed(f"{self._what}: a page is not bounded JSON ({exc})") from None
        if not isinstance(body, dict) or not isinstance(body.get("value"), list):
            raise errors.malformed(f"{self._what}: a page without a 'value' list")
        self.pages += 1
        if self.pages > MAX_VM_PAGES:
            raise errors.malformed(f"{self._what}: more than {MAX_VM_PAGES} pages")
        link = body.get("nextLink")
        if link is None or link == "":
            return
        if not isinstance(link, str) or not link.startswith(self._arm):
            raise errors.malformed(f"{self._what}: nextLink {str(link)[:200]!r} is not on {self._arm}")
        if link in self._links:
            raise errors.malformed(f"{self._what}: nextLink {link[:200]!r} came twice")
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
                        raise errors.malformed(f"{what}: an item is {type(vm).__name__}, not a virtual machine")
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
                raise errors.malformed(f"Retail Prices answered more than {MAX_PRICE_PAGES} pages")
            with _sdk_errors():
                response = self._prices.send_request(HttpRequest("GET", url))
                body = _json(response) if response.content else None
            if response.status_code != 200:
                detail = body.get("Error") or body.get("error") if isinstance(body, dict) else None
                detail = detail if isinstance(detail, dict) else {}
                code = str(detail.get("Code") or detail.get("code") or f"HTTP{response.status_code}")
                message = str(detail.get("Message") or detail.get("message") or response.text()[:300])
                raise errors.error_from_code(code, message, response.status_code)
            if not isinstance(body, dict) or not isinstance(body.get("Items"), list):
                raise errors.malformed("Retail Prices answered without an Items list")
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

    def power_vm(self, resource_group: str, name: str, action: str, *, wait_s: float) -> bool:
        """``begin_deallocate``, ``begin_start`` or ``begin_restart`` (``action``), waiting up to ``wait_s``; True
        when the operation finished within it. A start is sent once (no retry): its allocation failure is the
        broker's answer, raised as the operation's error (``AllocationFailed`` -> ``CapacityUnavailable``), as is a
        synchronous refusal (409 ``OperationNotAllowed``)."""
        polling: Any = _BoundedPolling(self.settings.polling_interval, wait_s) if wait_s > 0 else False
        client = self._write if action == "start" else self._read
        begin = {
            "deallocate": client.virtual_machines.begin_deallocate,
            "start": client.virtual_machines.begin_start,
            "restart": client.virtual_machines.begin_restart,
        }[action]
        with _sdk_errors():
            poller = begin(resource_group, name, polling=polling)
        outcome = self._settle(poller)
        if outcome["error"] is not None:
            raise outcome["error"]
        return bool(outcome["finished"]) and wait_s > 0

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
