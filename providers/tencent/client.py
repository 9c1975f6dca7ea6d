"""The only module that imports the Tencent Cloud SDK.

``TencentClient`` builds one ``CvmClient`` (and, for security groups, one ``VpcClient``: they live in the VPC API)
per region, with explicit timeouts and SDK retries off, and runs every call through the SDK's typed
request/response models, so callers pass and receive plain dicts and see only ``ProviderError`` subclasses, never
a ``TencentCloudSDKException``. An ``endpoint_url`` override sends both services to that one host, as a private
endpoint or the sandbox serves them. Each request first draws on the account's shared rate-limit bucket
(``providers.ratelimit``, in ``_once``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tencentcloud.common import credential
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from tencentcloud.cvm.v20170312 import cvm_client
from tencentcloud.cvm.v20170312 import models as cvm_models
from tencentcloud.vpc.v20170312 import models as vpc_models
from tencentcloud.vpc.v20170312 import vpc_client

from providers import ratelimit
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import ProviderError, ProviderRequestRejected, TransientProviderError
from providers.tencent import errors

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_RETRY_BACKOFF = 0.25  # seconds before the first retry; doubled for each further one
MAX_RETRY_SLEEP = 5.0
PAGE_LIMIT = 100  # the largest Limit CVM's paginated Describe* calls accept
CVM = "cvm"
VPC = "vpc"
_SERVICES: dict[str, tuple[Any, Any]] = {
    CVM: (cvm_client.CvmClient, cvm_models),
    VPC: (vpc_client.VpcClient, vpc_models),
}


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach CVM. Secrets are excluded from ``repr`` so they never reach a log line."""

    secret_id: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_backoff: float = DEFAULT_RETRY_BACKOFF
    call_deadline: float = CALL_DEADLINE_S  # one call in all, retries included
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this account's own figures by bucket group


def split_endpoint(endpoint_url: str | None) -> tuple[str, str | None]:
    """``(protocol, host[:port])`` for ``HttpProfile``; ``(https, None)`` means the SDK's public endpoint.

    Raises ``ProviderRequestRejected`` for anything that is not a bare http(s) origin: CVM answers on ``/`` only.
    """
    if not endpoint_url:
        return "https", None
    if "://" not in endpoint_url:
        endpoint_url = f"https://{endpoint_url}"
    parts = urlsplit(endpoint_url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise ProviderRequestRejected(
            f"endpoint_url {endpoint_url!r} is not an http(s) origin such as https://cvm.tencentcloudapi.com",
            provider=errors.PROVIDER,
        )
    return parts.scheme, parts.netloc


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def translate(exc: TencentCloudSDKException) -> ProviderError:
    """SDK exception -> broker error, classified by ``get_code()`` only."""
    return errors.error_from_code(_text(exc.get_code()), _text(exc.get_message()), _text(exc.get_request_id()))


class TencentClient:
    """Lazily built, cached SDK clients per (service, region) for one account.

    ``call``/``pages`` retry transient errors up to ``max_attempts`` in total with exponential backoff;
    ``launch`` makes exactly one attempt. The SDK's own retryer stays off (its default is none) for both.
    """

    def __init__(self, settings: ClientSettings, *, sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self.protocol, self.endpoint = split_endpoint(settings.endpoint_url)
        self._sleep = sleep
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def profile(self) -> Any:
        """The ``ClientProfile`` every regional client uses."""
        # requests (under the SDK) takes a (connect, read) tuple as its timeout; reqTimeout is handed to it
        # unchanged, so fractions and separate connect/read limits both work.
        http = HttpProfile(
            protocol=self.protocol,
            endpoint=self.endpoint,
            reqTimeout=(self.settings.connect_timeout, self.settings.read_timeout),
        )
        return ClientProfile(httpProfile=http, language="en-US")

    def _client(self, service: str, region: str) -> Any:
        with self._lock:
            client = self._clients.get((service, region))
            if client is None:
                try:
                    cred = credential.Credential(self.settings.secret_id, self.settings.secret_key, self.settings.token)
                except TencentCloudSDKException as exc:
                    raise translate(exc) from exc
                client = _SERVICES[service][0](cred, region, self.profile())
                self._clients[(service, region)] = client
            return client

    def _deadline(self) -> CallDeadline:
        s = self.settings
        return CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)

    def _once(
        self, region: str, action: str, params: dict[str, Any], service: str = CVM, deadline: CallDeadline | None = None
    ) -> dict[str, Any]:
        request = getattr(_SERVICES[service][1], f"{action}Request")()
        request.from_json_string(json.dumps(params))
        # This is the one path to the wire (the SDK's retryer is off): each request is counted here. Tencent counts
        # per API, per access region (the API server reached, the nearest one for the default endpoint, whatever
        # region the request names) and per sub-account (the SecretId's).
        group = f"{service}/{action}"
        limit = ratelimit.resolve(group, ratelimit.tencent_limit(group), self.settings.rate_limits)
        key = ratelimit.BucketKey(errors.PROVIDER, self.settings.secret_id, self.endpoint or "nearest", group)
        ratelimit.acquire([(key, limit, 1)], deadline or self._deadline())
        try:
            response = getattr(self._client(service, region), action)(request)
        except TencentCloudSDKException as exc:
            raise translate(exc) from exc
        result: dict[str, Any] = json.loads(response.to_json_string())
        return result

    def call(
        self, region: str, action: str, params: dict[str, Any] | None = None, *, service: str = CVM
    ) -> dict[str, Any]:
        """One read (or a safely repeatable write such as TerminateInstances), retried when transient and while a
        retry still ends within the call's deadline (``providers.deadline``)."""
        deadline = self._deadline()
        attempt = 1
        while True:
            try:
                return self._once(region, action, dict(params or {}), service, deadline)
            except TransientProviderError as error:
                if error.code == ratelimit.RATE_LIMITED:  # it already waited all the deadline allows
                    raise
                delay = min(MAX_RETRY_SLEEP, self.settings.retry_backoff * 2 ** (attempt - 1))
                if attempt >= self.settings.max_attempts or not deadline.allows_retry(delay):
                    raise
            self._sleep(delay)
            attempt += 1

    def pages(
        self,
        region: str,
        action: str,
        result_key: str,
        params: dict[str, Any] | None = None,
        *,
        service: str = CVM,
    ) -> list[Any]:
        """Every item under ``result_key`` of an Offset/Limit-paginated read (``TotalCount`` ends the walk)."""
        items: list[Any] = []
        offset = 0
        while True:
            # VPC's Describe* calls type Offset and Limit as strings; CVM's as integers.
            paging: dict[str, Any] = {"Offset": offset, "Limit": PAGE_LIMIT}
            if service == VPC:
                paging = {key: str(value) for key, value in paging.items()}
            page = self.call(region, action, {**(params or {}), **paging}, service=service)
            batch = page.get(result_key) or []
            if not isinstance(batch, list):
                raise errors.malformed(f"{action}: {result_key} is not a list")
            items.extend(batch)
            offset += len(batch)
            total = page.get("TotalCount")
            # A short page also ends the walk, so a TotalCount that is missing or too high cannot loop forever.
            if not batch or len(batch) < PAGE_LIMIT or (isinstance(total, int) and offset >= total):
                return items

    def launch(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        """``RunInstances`` exactly once: the broker decides on retry (same ClientToken) or failover."""
        return self._once(region, "RunInstances", params)

    def write(self, region: str, action: str, params: dict[str, Any], *, service: str = CVM) -> dict[str, Any]:
        """A write that is not safe to repeat blindly (ImportKeyPair, CreateSecurityGroup): exactly once; the
        caller finds what a lost answer created by its tag or name before trying again."""
        return self._once(region, action, dict(params), service)
