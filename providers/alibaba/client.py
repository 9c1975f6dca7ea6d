"""The only module that imports the Alibaba Cloud SDK (alibabacloud-ecs20140526 + tea-openapi / darabonba).

``AlibabaClient`` builds one SDK client per region (explicit timeouts, the SDK's own retries off) and runs every
call through ``_translate``: callers pass and receive plain dicts keyed by the API's own field names
(``InstanceType``, ``Tag``, ...) and see ``ProviderError`` subclasses, never an SDK exception. Reads are
retried here on transient errors, a bounded number of times; ``launch`` sends exactly one request. Each request
first draws on the account's shared rate-limit buckets (``providers.ratelimit``, in ``_once``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import darabonba.exceptions as dara_errors
import Tea.exceptions as tea_errors
from alibabacloud_ecs20140526 import models as ecs_models
from alibabacloud_ecs20140526.client import Client as EcsClient
from alibabacloud_tea_openapi import utils_models as openapi_models
from darabonba.runtime import RuntimeOptions

from providers import ratelimit
from providers.alibaba import errors
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import ProviderError, ProviderRequestRejected

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_MAX_ATTEMPTS = 3
BACKOFF_BASE = 0.1
BACKOFF_CAP = 2.0
MAX_PAGES = 1000
USER_AGENT = "gpu-broker"

# API action -> (request model, client method). Explicit rather than derived: the SDK's snake_case of names
# such as DescribeInstanceTypes is not a rule to guess.
ACTIONS: dict[str, tuple[str, str]] = {
    "DescribeRegions": ("DescribeRegionsRequest", "describe_regions_with_options"),
    "DescribeInstanceTypes": ("DescribeInstanceTypesRequest", "describe_instance_types_with_options"),
    "DescribeAvailableResource": ("DescribeAvailableResourceRequest", "describe_available_resource_with_options"),
    "DescribePrice": ("DescribePriceRequest", "describe_price_with_options"),
    "DescribeSpotPriceHistory": ("DescribeSpotPriceHistoryRequest", "describe_spot_price_history_with_options"),
    "RunInstances": ("RunInstancesRequest", "run_instances_with_options"),
    "DescribeInstances": ("DescribeInstancesRequest", "describe_instances_with_options"),
    "DescribeInstanceStatus": ("DescribeInstanceStatusRequest", "describe_instance_status_with_options"),
    "DeleteInstances": ("DeleteInstancesRequest", "delete_instances_with_options"),
    "StopInstance": ("StopInstanceRequest", "stop_instance_with_options"),
    "StartInstance": ("StartInstanceRequest", "start_instance_with_options"),
    "RebootInstance": ("RebootInstanceRequest", "reboot_instance_with_options"),
    # What a booted launch creates and releases, and the reads that show what it carried.
    "DescribeImages": ("DescribeImagesRequest", "describe_images_with_options"),
    "DescribeVSwitches": ("DescribeVSwitchesRequest", "describe_vswitches_with_options"),
    "ImportKeyPair": ("ImportKeyPairRequest", "import_key_pair_with_options"),
    "DescribeKeyPairs": ("DescribeKeyPairsRequest", "describe_key_pairs_with_options"),
    "DeleteKeyPairs": ("DeleteKeyPairsRequest", "delete_key_pairs_with_options"),
    "CreateSecurityGroup": ("CreateSecurityGroupRequest", "create_security_group_with_options"),
    "AuthorizeSecurityGroup": ("AuthorizeSecurityGroupRequest", "authorize_security_group_with_options"),
    "DescribeSecurityGroups": ("DescribeSecurityGroupsRequest", "describe_security_groups_with_options"),
    "DescribeSecurityGroupAttribute": (
        "DescribeSecurityGroupAttributeRequest",
        "describe_security_group_attribute_with_options",
    ),
    "DeleteSecurityGroup": ("DeleteSecurityGroupRequest", "delete_security_group_with_options"),
    "DescribeUserData": ("DescribeUserDataRequest", "describe_user_data_with_options"),
    "DescribeInstanceAttribute": ("DescribeInstanceAttributeRequest", "describe_instance_attribute_with_options"),
    "DescribeDisks": ("DescribeDisksRequest", "describe_disks_with_options"),
}

_RETRY_ERRORS = (dara_errors.RetryError, tea_errors.RetryError)
_VALIDATE_ERRORS = (dara_errors.ValidateException, tea_errors.ValidateException)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach ECS. Secrets are excluded from ``repr`` so they never reach a log line."""

    access_key_id: str
    access_key_secret: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    call_deadline: float = CALL_DEADLINE_S  # one call in all, retries included
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this account's own figures by bucket group


def split_endpoint(endpoint_url: str) -> tuple[str, str]:
    """``http://127.0.0.1:8702`` -> (``http``, ``127.0.0.1:8702``): the SDK wants host:port and the scheme apart.

    A bare ``host[:port]`` means https, as the SDK's own default.
    """
    raw = endpoint_url.strip()
    parts = urlsplit(raw if "://" in raw else f"https://{raw}")
    try:
        port = parts.port
    except ValueError:
        port = None
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in raw or parts.path not in ("", "/"):
        raise ProviderRequestRejected(f"endpoint_url {endpoint_url!r} is not an http(s) host", provider=errors.PROVIDER)
    host = parts.hostname if port is None else f"{parts.hostname}:{port}"
    return parts.scheme, host


def _status(exc: Any) -> int | None:
    for attr in ("status_code", "statusCode"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    data = getattr(exc, "data", None)
    value = data.get("statusCode") if isinstance(data, dict) else None
    return value if isinstance(value, int) else None


def _translate(exc: BaseException) -> ProviderError:
    """SDK exception -> broker error. ECS errors are classified by their ``Code`` string only."""
    if isinstance(exc, tea_errors.UnretryableException):
        # The SDK wraps what went wrong below the HTTP answer: a transport failure or an unparseable body.
        inner = exc.inner_exception
        if isinstance(inner, _RETRY_ERRORS):
            return errors.transport_error(str(getattr(inner, "message", "") or inner))
        if isinstance(inner, tea_errors.TeaException):
            return _translate(inner)
        if isinstance(inner, ValueError):
            return errors.malformed(f"unparseable ECS answer: {inner}")
        return ProviderRequestRejected(repr(inner), code=type(inner).__name__, provider=errors.PROVIDER)
    if isinstance(exc, tea_errors.TeaException):
        data = exc.data if isinstance(exc.data, dict) else {}
        status = _status(exc)
        code = str(exc.code or "")
        if code in ("", "None"):  # the SDK formats a missing Code as the string "None"
            if status is not None and status >= 500:
                return errors.transport_error(f"HTTP {status} without an error code")
            return errors.malformed(f"ECS error answer without a Code (HTTP {status}): {data}")
        message = str(data.get("Message") or exc.message or code)
        return errors.error_from_code(code, message, status)
    if isinstance(exc, _VALIDATE_ERRORS):
        return ProviderRequestRejected(str(exc), code=type(exc).__name__, provider=errors.PROVIDER)
    if isinstance(exc, AttributeError | TypeError | KeyError | ValueError):
        # Raised while the SDK maps an answer onto its response model: the answer had the wrong shape.
        return errors.malformed(f"{type(exc).__name__}: {exc}")
    return ProviderRequestRejected(str(exc), code=type(exc).__name__, provider=errors.PROVIDER)


def backoff_seconds(attempt: int, retry_after_ms: int | None = None) -> float:
    """Delay before retry number ``attempt`` (1-based); the provider's ``x-acs-retry-after`` wins when sent."""
    if retry_after_ms:
        return min(retry_after_ms / 1000, BACKOFF_CAP)
    return min(BACKOFF_BASE * 2 ** (attempt - 1), BACKOFF_CAP)


class AlibabaClient:
    """Lazily built, cached SDK clients for one account, one per region (ECS endpoints are regional)."""

    def __init__(self, settings: ClientSettings, sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self._sleep = sleep
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, region: str) -> Any:
        with self._lock:
            client = self._clients.get(region)
            if client is not None:
                return client
            protocol, endpoint = (None, None)
            # An explicit endpoint replaces the SDK's regional endpoint map; RegionId still travels in each request.
            if self.settings.endpoint_url:
                protocol, endpoint = split_endpoint(self.settings.endpoint_url)
            config = openapi_models.Config(
                access_key_id=self.settings.access_key_id,
                access_key_secret=self.settings.access_key_secret,
                security_token=self.settings.security_token or None,
                region_id=region,
                endpoint=endpoint,
                protocol=protocol or "https",
                connect_timeout=self._millis(self.settings.connect_timeout),
                read_timeout=self._millis(self.settings.read_timeout),
                user_agent=USER_AGENT,
            )
            try:
                client = EcsClient(config)
            except tea_errors.TeaException as exc:
                raise _translate(exc) from exc
            self._clients[region] = client
            return client

    @staticmethod
    def _millis(seconds: float) -> int:
        # The SDK takes milliseconds; 0 would mean "use the SDK default", never what an option asked for.
        return max(1, round(seconds * 1000))

    def _runtime(self) -> Any:
        # autoretry=False everywhere: retries are decided here by error class, not by the SDK.
        return RuntimeOptions(
            autoretry=False,
            max_attempts=1,
            connect_timeout=self._millis(self.settings.connect_timeout),
            read_timeout=self._millis(self.settings.read_timeout),
        )

    def _deadline(self) -> CallDeadline:
        s = self.settings
        return CallDeadline(s.connect_timeout + s.read_timeout, s.call_deadline)

    def _draws(self, region: str, action: str, params: dict[str, Any]) -> list[ratelimit.Draw]:
        """The buckets one request draws on: its operation's in its region (ECS counts each operation apart) and,
        for RunInstances, the account's instances created per minute, one token per instance."""

        def draw(group: str, cost: float) -> ratelimit.Draw:
            limit = ratelimit.resolve(group, ratelimit.alibaba_limit(group), self.settings.rate_limits)
            return ratelimit.BucketKey(errors.PROVIDER, self.settings.access_key_id, region, group), limit, cost

        draws = [draw(action, 1)]
        if action == "RunInstances":
            amount = params.get("Amount") or 1
            draws.append(draw("RunInstances/instances", float(amount) if isinstance(amount, int | float) else 1.0))
        return draws

    def _once(self, region: str, action: str, params: dict[str, Any], deadline: CallDeadline) -> dict[str, Any]:
        try:
            request_model, method_name = ACTIONS[action]
        except KeyError:
            raise ProviderRequestRejected(f"action {action} is not wired in", provider=errors.PROVIDER) from None
        client = self._client(region)
        # This is the one path to the wire (the SDK's own retries are off): each request is counted here.
        ratelimit.acquire(self._draws(region, action, params), deadline)
        try:
            request = getattr(ecs_models, request_model)().from_map(params)
            response = getattr(client, method_name)(request, self._runtime())
            body = response.body.to_map() if response.body is not None else {}
        except Exception as exc:  # every SDK failure is translated; none escapes
            raise _translate(exc) from exc
        if not isinstance(body, dict):
            raise errors.malformed(f"{action} answered {type(body).__name__}, not an object")
        return body

    def call(self, region: str, action: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One read, or a write that is safe to repeat (DeleteInstances with its token, ImportKeyPair by name,
        CreateSecurityGroup with its token, AuthorizeSecurityGroup of an existing rule, the deletes), with up to
        ``max_attempts`` tries, each retry only if it still ends within the call's deadline (``providers.deadline``)."""
        attempts = max(1, self.settings.max_attempts)
        deadline = self._deadline()
        for attempt in range(1, attempts + 1):
            try:
                return self._once(region, action, dict(params or {}), deadline)
            except ProviderError as error:
                if not error.retryable or attempt == attempts or error.code == ratelimit.RATE_LIMITED:
                    raise
                retry_after = getattr(error.__cause__, "retry_after", None)
                delay = backoff_seconds(attempt, retry_after if isinstance(retry_after, int) else None)
                if not deadline.allows_retry(delay):
                    raise
                self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def launch(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        """``RunInstances`` exactly once: the broker decides on retry (same ClientToken) or failover."""
        return self._once(region, "RunInstances", dict(params), self._deadline())

    def pages(self, region: str, action: str, params: dict[str, Any], container: str, item: str) -> list[Any]:
        """Every ``body[container][item]`` entry across the NextToken pages of a read."""
        items: list[Any] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            page_params = {**params, "NextToken": token} if token else dict(params)
            body = self.call(region, action, page_params)
            items.extend((body.get(container) or {}).get(item) or [])
            token = str(body.get("NextToken") or "") or None
            if token is None:
                return items
            if token in seen:  # a misbehaving endpoint must not keep a sync paging forever
                raise errors.malformed(f"{action} repeated NextToken {token!r}")
            seen.add(token)
        raise errors.malformed(f"{action} did not finish within {MAX_PAGES} pages")
