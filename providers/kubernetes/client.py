"""The only module that imports the ``kubernetes`` client (and the urllib3 it runs on).

``KubernetesClient`` builds one ``ApiClient`` from an explicit ``Configuration`` (never ``~/.kube`` or in-cluster
config): the seller's API server URL as host, the account's CA bundle as PEM data (no file on disk), the service
account token as a bearer key, the client's own retries off (``retries=False`` also stops redirects being followed,
so the API server cannot send the broker elsewhere) and no proxy from the environment. Every call passes
``_request_timeout=(connect, read)`` and ``_preload_content=False``: the answer's bytes are read here, bounded in
size and depth (``untrusted.jsonbody``), and handed on as plain dicts. Reads retry transient errors a few times
within the call's deadline (``providers.deadline``); writes run exactly once, so the broker decides.

Errors: an ``ApiException`` is the API server's ``Status`` (``mapping.status_error``); a TLS failure to verify
the server is the account's CA bundle being wrong (credentials); timeouts and connection errors are transient.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from providers import ratelimit
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import (
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    TransientProviderError,
)
from providers.kubernetes import mapping
from untrusted.jsonbody import bounded_json

PROVIDER = mapping.PROVIDER
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 3
BACKOFF_SECONDS = 0.25
BACKOFF_CAP_SECONDS = 2.0
PAGE_SIZE = 500  # items per list page (``limit``); the API server pages with ``continue``
MAX_PAGES = 200  # 100,000 objects: beyond any cluster the broker sells
MAX_BODY_BYTES = 32 * 1024 * 1024  # one page of 500 pods with their managedFields stays well below
MAX_DEPTH = 64  # managedFields nest deeply (fieldsV1 mirrors the object)
MAX_METRICS_BYTES = 4 * 1024 * 1024

RETRY_AFTER_CAP_S = 5.0  # the longest Retry-After a read waits for before trying again (the deadline still holds)

T = TypeVar("T")


class Throttled(TransientProviderError):
    """A 429: the API server's flow control turned the request away, saying how long to wait (``Retry-After``,
    also ``details.retryAfterSeconds`` of its Status: https://kubernetes.io/docs/concepts/cluster-administration/
    flow-control/)."""

    def __init__(self, message: str, *, retry_after_s: float, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


def _retry_after(exc: ApiException) -> float:
    """The answer's ``Retry-After`` in seconds (a number; 0 when absent or a date), capped."""
    value = str((exc.headers or {}).get("Retry-After") or "").strip()
    if not value.isdigit() or len(value) > 6:
        return 0.0
    return min(float(value), RETRY_AFTER_CAP_S)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach the API server. The token is excluded from ``repr`` so it never reaches a log line."""

    endpoint_url: str
    token: str = field(repr=False)
    ca_bundle: str = ""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_backoff: float = BACKOFF_SECONDS
    call_deadline: float = CALL_DEADLINE_S
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this account's own figures by bucket group


def _error(exc: BaseException) -> ProviderError:
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        if status == 0:
            reason = str(exc.reason or "")
            if "CERTIFICATE_VERIFY_FAILED" in reason or "certificate verify failed" in reason:
                return CredentialsRejected(
                    f"the API server's certificate is not signed by the account's CA bundle: {reason[:300]}",
                    code="TLSVerifyFailed",
                    provider=PROVIDER,
                )
            return TransientProviderError(reason[:500] or "the request failed", code="SSLError", provider=PROVIDER)
        body: Any = None
        text = exc.body if isinstance(exc.body, str | bytes) else None
        if text and len(text) <= mapping.MAX_STATUS_CHARS:
            try:
                body = bounded_json(text, max_bytes=mapping.MAX_STATUS_CHARS, max_depth=8)
            except ValueError:
                body = None
        error = mapping.status_error(status, body if isinstance(body, dict) else None, str(exc.reason or ""))
        if status == 429:
            return Throttled(
                error.message,
                retry_after_s=_retry_after(exc),
                code=error.code,
                provider=PROVIDER,
                http_status=status,
            )
        return error
    if isinstance(exc, urllib3.exceptions.HTTPError):
        return TransientProviderError(str(exc)[:500] or type(exc).__name__, code=type(exc).__name__, provider=PROVIDER)
    if isinstance(exc, pydantic.ValidationError):  # the client refused to build the request
        return ProviderRequestRejected(str(exc)[:500], code="Invalid", provider=PROVIDER)
    return TransientProviderError(str(exc)[:500], code=type(exc).__name__, provider=PROVIDER)


@contextmanager
def _sdk_errors() -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except (ApiException, urllib3.exceptions.HTTPError, pydantic.ValidationError, OSError) as exc:
        raise _error(exc) from exc


def _json(response: Any, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The bytes of a raw (unpreloaded) urllib3 response, bounded, as a JSON object."""
    try:
        data = response.read(max_bytes + 1)
    finally:
        response.release_conn()
    if len(data) > max_bytes:
        raise MalformedProviderResponse(f"the API server's answer is larger than {max_bytes} bytes", provider=PROVIDER)
    try:
        body = bounded_json(data, max_bytes=max_bytes, max_depth=MAX_DEPTH)
    except ValueError as exc:
        raise MalformedProviderResponse(f"the API server's answer is not JSON: {exc}", provider=PROVIDER) from None
    if not isinstance(body, dict):
        raise MalformedProviderResponse("the API server's answer is not a JSON object", provider=PROVIDER)
    return body


class KubernetesClient:
    """One seller's API server. Reads retry transient errors up to ``max_attempts`` in total; writes run once."""

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        configuration = k8s.Configuration(
            host=settings.endpoint_url.rstrip("/"),
            api_key={"BearerToken": settings.token},
            api_key_prefix={"BearerToken": "Bearer"},
            ca_cert_data=settings.ca_bundle or None,
            retries=False,
            proxy="",  # not from the environment: the address checks judged this URL, not a proxy's
            no_proxy="*",
        )
        configuration.client_go_retries = False
        self._api = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self._api)
        self.networking = k8s.NetworkingV1Api(self._api)
        self.authorization = k8s.AuthorizationV1Api(self._api)
        self._timeout = (settings.connect_timeout, settings.read_timeout)

    def close(self) -> None:
        self._api.close()

    # ------------------------------------------------------------------------------------------ plumbing

    def _once(
        self, call: Callable[..., Any], *args: Any, deadline: CallDeadline | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """One request: a token from the cluster's shared bucket first (``providers.ratelimit``; raises
        ``TransientProviderError`` ``BrokerRateLimited`` when the wait would pass the call's deadline), then the
        call with the timeouts, its answer read bounded."""
        s = self.settings
        limit = ratelimit.resolve("api", ratelimit.KUBERNETES_LIMITS["api"], s.rate_limits)
        key = ratelimit.BucketKey(PROVIDER, s.endpoint_url, "cluster", "api")
        ratelimit.acquire(
            [(key, limit, 1)], deadline or CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)
        )
        with _sdk_errors():
            response = call(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
            return _json(response)

    def _read(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A read, retried on transient errors with capped exponential backoff (at least the ``Retry-After`` of a
        429) while a retry still ends within the call's deadline."""
        s = self.settings
        deadline = CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._once(call, *args, deadline=deadline, **kwargs)
            except TransientProviderError as error:
                if error.code == ratelimit.RATE_LIMITED:  # it already waited all the deadline allows
                    raise
                delay = min(BACKOFF_CAP_SECONDS, s.retry_backoff * 2 ** (attempt - 1))
                if isinstance(error, Throttled):  # the server said how long; wait at least that
                    delay = max(delay, error.retry_after_s)
                if attempt >= s.max_attempts or not deadline.allows_retry(delay):
                    raise
                time.sleep(delay)

    def _maybe(self, call: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """A read of one object; None when the API server answers 404."""
        try:
            return self._read(call, *args)
        except ProviderRequestRejected as exc:
            if exc.code == "NotFound":
                return None
            raise

    def _list(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a list, page by page (``limit``/``continue``:
        https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = self._read(call, *args, limit=PAGE_SIZE, _continue=token, **kwargs)
            found = page.get("items")
            if not isinstance(found, list):
                raise MalformedProviderResponse("a list without items", provider=PROVIDER)
            items.extend(i for i in found if isinstance(i, dict))
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items
        raise MalformedProviderResponse(f"a list of more than {MAX_PAGES} pages", provider=PROVIDER)

    # --------------------------------------------------------------------------------------------- reads

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._list(self.core.list_node)

    def list_pods(self) -> list[dict[str, Any]]:
        """Pods of every namespace that may hold resources (not Succeeded, not Failed)."""
        return self._list(
            self.core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
        )

    def list_labelled_pods(self, label_selector: str) -> list[dict[str, Any]]:
        """Pods of every namespace carrying the labels."""
        return self._list(self.core.list_pod_for_all_namespaces, label_selector=label_selector)

    def list_labelled_services(self, label_selector: str) -> list[dict[str, Any]]:
        """Services of every namespace carrying the labels."""
        return self._list(self.core.list_service_for_all_namespaces, label_selector=label_selector)

    def list_namespaces(self, label_selector: str) -> list[dict[str, Any]]:
        return self._list(self.core.list_namespace, label_selector=label_selector)

    def read_namespace(self, name: str) -> dict[str, Any] | None:
        return self._maybe(self.core.read_namespace, name)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._maybe(self.core.read_namespaced_pod, name, namespace)

    def read_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._maybe(self.core.read_namespaced_service, name, namespace)

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self._maybe(self.core.read_node, name)

    def rules_review(self, namespace: str) -> dict[str, Any]:
        """A SelfSubjectRulesReview's ``status`` (a create, but one that changes nothing: retried like a read)."""
        body = k8s.V1SelfSubjectRulesReview.from_dict(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": namespace},
            }
        )
        answer = self._read(self.authorization.create_self_subject_rules_review, body)
        status = answer.get("status")
        if not isinstance(status, dict):
            raise MalformedProviderResponse("a SelfSubjectRulesReview without status", provider=PROVIDER)
        return status

    # -------------------------------------------------------------------------------------------- writes

    def create_namespace(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(self.core.create_namespace, k8s.V1Namespace.from_dict(body))

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(self.core.create_namespaced_secret, namespace, k8s.V1Secret.from_dict(body))

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(self.core.create_namespaced_pod, namespace, k8s.V1Pod.from_dict(body))

    def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(self.core.create_namespaced_service, namespace, k8s.V1Service.from_dict(body))

    def create_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(
            self.networking.create_namespaced_network_policy, namespace, k8s.V1NetworkPolicy.from_dict(body)
        )

    def create_resource_quota(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._once(self.core.create_namespaced_resource_quota, namespace, k8s.V1ResourceQuota.from_dict(body))

    def delete_namespace(self, name: str) -> bool:
        """Delete the namespace and everything in it (foreground propagation is the API server's default for a
        namespace). False when it was already gone (404)."""
        try:
            self._once(self.core.delete_namespace, name)
        except ProviderRequestRejected as exc:
            if exc.code == "NotFound":
                return False
            raise
        return True


def fetch_metrics(url: str, connect_timeout: float, read_timeout: float, ca_bundle: str = "") -> bytes:
    """GET a dcgm-exporter's ``/metrics`` text, bounded in size, without following redirects or retrying. Over
    https the exporter's certificate is checked against ``ca_bundle`` (the cluster's CA, which signs what the
    cluster serves) when given, else the system's CAs. Raises ``TransientProviderError`` when it cannot be read
    and ``MalformedProviderResponse`` for an answer over ``MAX_METRICS_BYTES``."""
    pool = urllib3.PoolManager(
        retries=False,
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        cert_reqs="CERT_REQUIRED",
        ca_cert_data=ca_bundle or None,
    )
    try:
        response = pool.request("GET", url, preload_content=False, redirect=False)
        try:
            if response.status != 200:
                raise TransientProviderError(
                    f"the DCGM exporter answered HTTP {response.status}",
                    code=f"HTTP{response.status}",
                    provider=PROVIDER,
                )
            data = response.read(MAX_METRICS_BYTES + 1)
        finally:
            response.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        raise TransientProviderError(
            f"the DCGM exporter cannot be read: {str(exc)[:300]}", code=type(exc).__name__, provider=PROVIDER
        ) from None
    finally:
        pool.clear()
    if len(data) > MAX_METRICS_BYTES:
        raise MalformedProviderResponse(
            f"the DCGM exporter's answer is larger than {MAX_METRICS_BYTES} bytes", provider=PROVIDER
        )
    return bytes(data)
