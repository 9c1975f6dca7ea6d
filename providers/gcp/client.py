"""The only module that imports the Google Cloud SDKs (google-cloud-compute, google-cloud-billing, google-auth).

``GcpClient`` builds REST-transport clients (explicit ``(connect, read)`` timeouts, SDK retries off), runs reads in
a small bounded retry loop, and turns every SDK message into a plain dict (``Message.to_dict``, snake_case proto
field names) and every SDK exception into a ``ProviderError``. Operations are polled with our own
``ZoneOperationsClient`` (firewall rules: ``GlobalOperationsClient``): ``ExtendedOperation.result()`` would poll the
public endpoint whatever ``api_endpoint`` says. Every HTTP request a client's session sends first draws on the
project's shared rate-limit bucket (``providers.ratelimit``, ``_RateLimitedAdapter``).
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
import requests.adapters
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.cloud import billing_v1, compute_v1
from google.oauth2 import service_account
from google.protobuf import json_format
from google.protobuf import message as protobuf_message

from providers import ratelimit
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import CredentialsRejected, ProviderError, ProviderRequestRejected, TransientProviderError
from providers.gcp import errors, mapping

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_PAGE_SIZE = 500  # Compute Engine's maximum maxResults
SKU_PAGE_SIZE = 5000  # the Billing Catalog's maximum pageSize
BACKOFF_SECONDS = 0.25
BACKOFF_CAP_SECONDS = 2.0
GLOBAL_OPERATION_POLLS = 12  # about 20 s at the capped backoff: a firewall rule is usually done in a few seconds

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach GCP. The key material is excluded from ``repr`` so it never reaches a log line."""

    project_id: str
    service_account_info: dict[str, Any] = field(repr=False)
    endpoint_url: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    page_size: int = DEFAULT_PAGE_SIZE
    retry_backoff: float = BACKOFF_SECONDS
    call_deadline: float = CALL_DEADLINE_S  # one call in all, retries included
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this project's own figures by bucket group


# The deadline of the call under way in this thread (``GcpClient._read`` or ``insert``): it bounds the rate
# limiter's waits for every request the call sends, each page of a list included.
_call_deadline: contextvars.ContextVar[CallDeadline | None] = contextvars.ContextVar("gcp_call_deadline", default=None)


@contextmanager
def _deadline_of_call(deadline: CallDeadline) -> Iterator[None]:
    token = _call_deadline.set(deadline)
    try:
        yield
    finally:
        _call_deadline.reset(token)


class _RateLimitedAdapter(requests.adapters.BaseAdapter):
    """The transport adapter of a GAPIC client's ``requests`` session, drawing each request it sends (every page,
    every retry) on the project's shared bucket (``providers.ratelimit``) before handing it to the adapter it
    wraps. The bucket follows the URL: Compute Engine reads or writes, global or in a region; Cloud Billing."""

    def __init__(self, inner: requests.adapters.BaseAdapter, settings: ClientSettings):
        super().__init__()
        self._inner = inner
        self._settings = settings

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        s = self._settings
        region, group = ratelimit.gcp_group(request.method or "GET", urlsplit(request.url or "").path)
        key = ratelimit.BucketKey(errors.PROVIDER, s.project_id, region, group)
        limit = ratelimit.resolve(group, ratelimit.GCP_LIMITS[group], s.rate_limits)
        deadline = _call_deadline.get() or CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)
        ratelimit.acquire([(key, limit, 1)], deadline)
        return self._inner.send(request, *args, **kwargs)

    def close(self) -> None:
        self._inner.close()


def _count_requests(client: Any, settings: ClientSettings) -> None:
    """Mount the rate-limited adapter on the client's REST session (``transport._session``, the
    ``AuthorizedSession`` every generated REST transport sends through), over whatever adapter it had."""
    session = client.transport._session
    for prefix in ("https://", "http://"):
        session.mount(prefix, _RateLimitedAdapter(session.get_adapter(f"{prefix}x"), settings))


class _HttpTimeout:
    """An api_core timeout decorator that hands ``requests`` a ``(connect, read)`` pair.

    The SDK's own float timeouts set both to one value; a slow connect and a slow answer deserve different limits.
    """

    def __init__(self, connect: float, read: float):
        self._value = (connect, read)

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        return functools.partial(func, timeout=self._value)


def _status_name(exc: api_exceptions.GoogleAPICallError) -> str:
    status = getattr(exc, "grpc_status_code", None)
    return str(getattr(status, "name", "") or "")


def _translate(exc: BaseException) -> ProviderError:
    """SDK exception -> broker error; classification by GCP's code strings (see ``errors.error_class_for``)."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        codes = [str(exc.reason or "")]
        codes += [str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)]
        codes.append(_status_name(exc))
        return errors.error_from_codes(codes, exc.message or str(exc), exc.code)
    if isinstance(exc, auth_exceptions.RefreshError):
        # A token endpoint answering invalid_grant is final; an unreachable one is not.
        if getattr(exc, "retryable", False):
            return TransientProviderError(str(exc), code="RefreshError", provider=errors.PROVIDER)
        return CredentialsRejected(str(exc), code="invalid_grant", provider=errors.PROVIDER)
    if isinstance(exc, requests.exceptions.RequestException | auth_exceptions.TransportError):
        return errors.transport_error(type(exc).__name__, str(exc))
    if isinstance(exc, api_exceptions.RetryError):
        return TransientProviderError(str(exc), code="RetryError", provider=errors.PROVIDER)
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return CredentialsRejected(str(exc), code=type(exc).__name__, provider=errors.PROVIDER)
    if isinstance(exc, json_format.ParseError | protobuf_message.Error):
        return errors.malformed(f"{type(exc).__name__}: {exc}")
    # Anything else (a request the SDK refused to build) would fail the same way again.
    return ProviderRequestRejected(str(exc), code=type(exc).__name__, provider=errors.PROVIDER)


@contextmanager
def _sdk_errors() -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except (
        api_exceptions.GoogleAPIError,
        auth_exceptions.GoogleAuthError,
        requests.exceptions.RequestException,
        protobuf_message.Error,
        ValueError,
        TypeError,
    ) as exc:
        raise _translate(exc) from exc


def _as_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = type(message).to_dict(message, use_integers_for_enums=False)
    return result


def credentials_from_info(info: dict[str, Any]) -> Any:
    """Service-account credentials from a key file's JSON. Raises ``CredentialsRejected`` for an unusable key.

    The GAPIC clients sign their own JWTs with this key (self-signed JWT access), so no token endpoint is called.
    """
    try:
        return service_account.Credentials.from_service_account_info(info, scopes=list(SCOPES))
    except (ValueError, KeyError, TypeError, auth_exceptions.GoogleAuthError) as exc:
        raise CredentialsRejected(
            f"unusable service account key: {exc}", code="invalid_key", provider=errors.PROVIDER
        ) from None


class GcpClient:
    """Lazily built SDK clients for one project.

    Reads (``regions_get``, ``aggregated``, ``skus``, ``instance_get``, ``operations``) retry transient errors up
    to ``max_attempts`` in total; ``insert`` runs exactly once so the broker decides on retry or failover.
    """

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self.project = settings.project_id
        self._credentials = credentials_from_info(settings.service_account_info)
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._timeout = _HttpTimeout(settings.connect_timeout, settings.read_timeout)

    # ---------------------------------------------------------------------------------------- plumbing

    def _client(self, name: str) -> Any:
        factories: dict[str, Callable[..., Any]] = {
            "instances": compute_v1.InstancesClient,
            "machine_types": compute_v1.MachineTypesClient,
            "accelerator_types": compute_v1.AcceleratorTypesClient,
            "zone_operations": compute_v1.ZoneOperationsClient,
            "regions": compute_v1.RegionsClient,
            "images": compute_v1.ImagesClient,
            "image_family_views": compute_v1.ImageFamilyViewsClient,
            "firewalls": compute_v1.FirewallsClient,
            "global_operations": compute_v1.GlobalOperationsClient,
            "catalog": billing_v1.CloudCatalogClient,
        }
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                options = ClientOptions(api_endpoint=self.settings.endpoint_url) if self.settings.endpoint_url else None
                with _sdk_errors():
                    # REST only: the billing client defaults to gRPC, which a plain-HTTP endpoint cannot serve.
                    client = factories[name](credentials=self._credentials, transport="rest", client_options=options)
                _count_requests(client, self.settings)
                self._clients[name] = client
            return client

    def _read(self, call: Callable[[], T]) -> T:
        """``call`` with SDK errors translated, retried on transient errors with capped exponential backoff while
        a retry still ends within the call's deadline (``providers.deadline``)."""
        s = self.settings
        deadline = CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)
        attempt = 0
        while True:
            attempt += 1
            try:
                with _sdk_errors(), _deadline_of_call(deadline):
                    return call()
            except TransientProviderError as error:
                if error.code == ratelimit.RATE_LIMITED:  # it already waited all the deadline allows
                    raise
                delay = min(BACKOFF_CAP_SECONDS, self.settings.retry_backoff * 2 ** (attempt - 1))
                if attempt >= self.settings.max_attempts or not deadline.allows_retry(delay):
                    raise
                time.sleep(delay)

    def _call_options(self) -> dict[str, Any]:
        # retry=None: the SDK's default retry (up to 600 s for aggregated lists) would hide outages from the broker.
        return {"retry": None, "timeout": self._timeout}

    # ------------------------------------------------------------------------------------------- reads

    def regions_get(self, region: str) -> dict[str, Any]:
        client = self._client("regions")
        return self._read(lambda: _as_dict(client.get(project=self.project, region=region, **self._call_options())))

    def aggregated(self, resource: str, filter_: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """Every (scope, item) of ``<resource>.aggregated_list`` across all pages; ``resource`` is
        ``machine_types``, ``accelerator_types`` or ``instances``."""
        client = self._client(resource)
        request_classes: dict[str, Any] = {
            "machine_types": compute_v1.AggregatedListMachineTypesRequest,
            "accelerator_types": compute_v1.AggregatedListAcceleratorTypesRequest,
            "instances": compute_v1.AggregatedListInstancesRequest,
        }
        field_names = {"machine_types": "machine_types", "accelerator_types": "accelerator_types"}
        items_field = field_names.get(resource, "instances")
        params: dict[str, Any] = {"project": self.project, "max_results": self.settings.page_size}
        if filter_:
            params["filter"] = filter_
        request = request_classes[resource](**params)

        def fetch() -> list[tuple[str, dict[str, Any]]]:
            found: list[tuple[str, dict[str, Any]]] = []
            for scope, scoped in client.aggregated_list(request=request, **self._call_options()):
                found.extend((scope, _as_dict(item)) for item in getattr(scoped, items_field))
            return found

        return self._read(fetch)

    def skus(self, service: str = mapping.COMPUTE_SERVICE) -> list[dict[str, Any]]:
        """Every SKU of a Cloud Billing service, priced in USD."""
        client = self._client("catalog")
        request = billing_v1.ListSkusRequest(
            parent=service, currency_code="USD", page_size=min(SKU_PAGE_SIZE, max(self.settings.page_size, 1))
        )
        return self._read(lambda: [_as_dict(s) for s in client.list_skus(request=request, **self._call_options())])

    def instance_get(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance, or None when GCP answers 404."""
        client = self._client("instances")

        def fetch() -> dict[str, Any] | None:
            try:
                return _as_dict(client.get(project=self.project, zone=zone, instance=name, **self._call_options()))
            except api_exceptions.NotFound:
                return None

        return self._read(fetch)

    def operations(self, zone: str, filter_: str) -> list[dict[str, Any]]:
        """Zone operations matching a list filter (e.g. on ``targetLink``), every page."""
        client = self._client("zone_operations")
        request = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter=filter_, max_results=self.settings.page_size
        )
        return self._read(lambda: [_as_dict(op) for op in client.list(request=request, **self._call_options())])

    def operation_get(self, zone: str, operation: str) -> dict[str, Any]:
        client = self._client("zone_operations")
        return self._read(
            lambda: _as_dict(client.get(project=self.project, zone=zone, operation=operation, **self._call_options()))
        )

    def image_family_view(self, project: str, zone: str, family: str) -> dict[str, Any] | None:
        """The newest image of ``project``'s ``family`` rolled out in ``zone`` (``imageFamilyViews.get``); None when
        GCP answers 404 (no such family, or none of its images is available in the zone)."""
        client = self._client("image_family_views")

        def fetch() -> dict[str, Any] | None:
            try:
                view = _as_dict(client.get(project=project, zone=zone, family=family, **self._call_options()))
            except api_exceptions.NotFound:
                return None
            image: dict[str, Any] | None = view.get("image") or None
            return image

        return self._read(fetch)

    def image_get(self, project: str, name: str) -> dict[str, Any] | None:
        """One image by name (``images.get``, global); None when GCP answers 404."""
        client = self._client("images")

        def fetch() -> dict[str, Any] | None:
            try:
                return _as_dict(client.get(project=project, image=name, **self._call_options()))
            except api_exceptions.NotFound:
                return None

        return self._read(fetch)

    def firewall_get(self, name: str) -> dict[str, Any] | None:
        """One VPC firewall rule of the project; None when GCP answers 404."""
        client = self._client("firewalls")

        def fetch() -> dict[str, Any] | None:
            try:
                return _as_dict(client.get(project=self.project, firewall=name, **self._call_options()))
            except api_exceptions.NotFound:
                return None

        return self._read(fetch)

    def firewalls(self, filter_: str) -> list[dict[str, Any]]:
        """The project's firewall rules matching a list filter, every page."""
        client = self._client("firewalls")
        request = compute_v1.ListFirewallsRequest(
            project=self.project, filter=filter_, max_results=self.settings.page_size
        )
        return self._read(lambda: [_as_dict(f) for f in client.list(request=request, **self._call_options())])

    def global_operation(self, name: str) -> dict[str, Any]:
        client = self._client("global_operations")
        return self._read(lambda: _as_dict(client.get(project=self.project, operation=name, **self._call_options())))

    def settle_global(self, operation: dict[str, Any], polls: int = GLOBAL_OPERATION_POLLS) -> dict[str, Any]:
        """The global operation once DONE, polled with capped backoff; as last seen if it is still running after
        ``polls`` reads (the caller decides whether that is good enough)."""
        for attempt in range(polls):
            if operation.get("status") == "DONE" or not operation.get("name"):
                return operation
            if attempt:
                time.sleep(min(BACKOFF_CAP_SECONDS, self.settings.retry_backoff * 2 ** (attempt - 1)))
            operation = self.global_operation(str(operation["name"]))
        return operation

    # ------------------------------------------------------------------------------------------ writes

    def firewall_insert(self, resource: dict[str, Any], request_id: str) -> dict[str, Any]:
        """``firewalls.insert`` (the Operation as GCP returned it). Retried like a read: the rule's name is
        unique in the project and the request id makes a repeat return the first operation."""
        client = self._client("firewalls")
        request = compute_v1.InsertFirewallRequest(
            project=self.project, firewall_resource=compute_v1.Firewall(resource), request_id=request_id
        )
        return self._read(lambda: _as_dict(client.insert_unary(request=request, **self._call_options())))

    def firewall_delete(self, name: str, request_id: str) -> dict[str, Any] | None:
        """``firewalls.delete``; None when the rule is already gone (404)."""
        client = self._client("firewalls")
        request = compute_v1.DeleteFirewallRequest(project=self.project, firewall=name, request_id=request_id)

        def call() -> dict[str, Any] | None:
            try:
                return _as_dict(client.delete_unary(request=request, **self._call_options()))
            except api_exceptions.NotFound:
                return None

        return self._read(call)

    def insert(self, zone: str, resource: dict[str, Any], request_id: str) -> dict[str, Any]:
        """``instances.insert`` exactly once (``insert_unary``: the Operation as GCP returned it, not polled)."""
        client = self._client("instances")
        s = self.settings
        with _sdk_errors(), _deadline_of_call(CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)):
            request = compute_v1.InsertInstanceRequest(
                project=self.project,
                zone=zone,
                instance_resource=compute_v1.Instance(resource),
                request_id=request_id,
            )
            return _as_dict(client.insert_unary(request=request, **self._call_options()))

    def instance_action(self, zone: str, name: str, action: str, request_id: str) -> dict[str, Any]:
        """``instances.stop``, ``instances.start`` or ``instances.reset`` (``action``): the Operation as GCP returned
        it, not polled. Retried like a read: the request id makes a repeat return the first operation. A start
        GCP has no capacity for is accepted and fails on its operation (``ZONE_RESOURCE_POOL_EXHAUSTED``)."""
        client = self._client("instances")
        kinds: dict[str, tuple[Any, str]] = {
            "stop": (compute_v1.StopInstanceRequest, "stop_unary"),
            "start": (compute_v1.StartInstanceRequest, "start_unary"),
            "reset": (compute_v1.ResetInstanceRequest, "reset_unary"),
        }
        request_type, method = kinds[action]
        request = request_type(project=self.project, zone=zone, instance=name, request_id=request_id)
        send = getattr(client, method)
        return self._read(lambda: _as_dict(send(request=request, **self._call_options())))

    def settle_zone(self, zone: str, operation: dict[str, Any], polls: int = GLOBAL_OPERATION_POLLS) -> dict[str, Any]:
        """The zone operation once DONE, polled with capped backoff; as last seen if it still runs after ``polls``
        reads."""
        for attempt in range(polls):
            if operation.get("status") == "DONE" or not operation.get("name"):
                return operation
            if attempt:
                time.sleep(min(BACKOFF_CAP_SECONDS, self.settings.retry_backoff * 2 ** (attempt - 1)))
            operation = self.operation_get(zone, str(operation["name"]))
        return operation

    def delete(self, zone: str, name: str, request_id: str) -> dict[str, Any] | None:
        """``instances.delete``; None when the instance is already gone (404). Retried like a read: the request
        id makes a repeat return the first operation instead of a second delete."""
        client = self._client("instances")
        request = compute_v1.DeleteInstanceRequest(
            project=self.project, zone=zone, instance=name, request_id=request_id
        )

        def call() -> dict[str, Any] | None:
            try:
                return _as_dict(client.delete_unary(request=request, **self._call_options()))
            except api_exceptions.NotFound:
                return None

        return self._read(call)
