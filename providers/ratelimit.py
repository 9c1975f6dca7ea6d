"""Provider request rate limits, shared by every worker process (issue 23).

Each cloud throttles an account's API requests (per region, per API or group of APIs) and answers a request over
the limit with a throttling error. Celery's ``rate_limit`` counts one worker's tasks, so forty workers would send
forty times the rate; here every process draws from the same token buckets, kept in Redis
(``settings.PROVIDER_RATE_LIMIT_REDIS_URL``), one per ``BucketKey``: provider, account, region and API group.

Each cloud's client calls ``acquire`` before every HTTP request it sends (each page of a paged read, each retry),
so the count is of requests on the wire, not of calls. One atomic Lua script per acquire reads Redis's own clock
(``TIME``, so hosts with skewed clocks agree), refills the buckets by the elapsed time and either takes the tokens
and answers how long until they are covered, or, when that wait would pass the call's deadline, takes nothing.
Tokens are taken even when a wait is due (the bucket goes into debt): the caller has reserved its place, so
waiting callers are served in the order they asked, and the grants of a bucket never exceed capacity + refill x
elapsed whatever the number of processes. The caller then sleeps the wait and sends.

Without Redis (an empty URL: the embedded default, ``bin/run``), the buckets live in each process: the limits then
hold per process only, which is all a single-process broker needs. When Redis cannot be reached, provisioning must
not stop: the limiter falls back to the in-process buckets, logs a warning at most once a minute, and tries Redis
again after ``REDIS_RETRY_S``.

The figures (the tables at the end of this module) are each cloud's documented defaults, cited beside each; where
a cloud publishes no figure for an API the broker calls, the figure is a conservative choice and says so. An
account whose cloud granted it more (or whose operator wants it gentler) gives its own by bucket group in its
options, ``rate_limit.<group>`` = ``<capacity>/<refill per second>``: ``limits_from_options`` reads and checks
them (the groups each cloud's accounts may name are ``ACCOUNT_GROUPS``) when the account is connected and whenever
its adapter is built, and each adapter hands them to its client (``ClientSettings.rate_limits``).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings

from providers.deadline import CallDeadline
from providers.errors import TransientProviderError

logger = logging.getLogger(__name__)

RATE_LIMITED = "BrokerRateLimited"  # the code of the error raised when a wait would pass the deadline
KEY_PREFIX = "provider-rate"
REDIS_TIMEOUT_S = 0.5  # connect and read; a Redis slower than this costs each request at most this, then is skipped
REDIS_RETRY_S = 5.0  # after a failure, how long the in-process buckets serve before Redis is tried again
WARN_EVERY_S = 60.0
OPTION_PREFIX = "rate_limit."


@dataclass(frozen=True, slots=True)
class Limit:
    """A token bucket: at most ``capacity`` requests at once, refilled at ``refill_per_s`` tokens a second."""

    capacity: float
    refill_per_s: float

    def __post_init__(self) -> None:
        for name in ("capacity", "refill_per_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, not {value!r}")

    @classmethod
    def per_window(cls, requests: float, window_s: float) -> Limit:
        """A bucket that never lets more than ``requests`` through in any ``window_s``, for a cloud that counts
        requests in fixed windows (per second, per minute) rather than with a bucket: a tenth of them at once, the
        rest spread over the window, so capacity + refill x window = ``requests`` whatever the window's alignment."""
        return cls(capacity=requests / 10, refill_per_s=requests * 0.9 / window_s)


@dataclass(frozen=True, slots=True)
class BucketKey:
    """Which bucket a request draws from. ``account`` is a stable identity of the seller account as its client
    knows it (an access key id, a subscription, a project); only its hash reaches Redis."""

    provider: str
    account: str
    region: str
    group: str

    @property
    def redis_key(self) -> str:
        account = hashlib.sha256(self.account.encode()).hexdigest()[:20]
        return f"{KEY_PREFIX}:{self.provider}:{account}:{self.region}:{self.group}"


@dataclass(frozen=True, slots=True)
class Grant:
    """One decision. ``granted``: the tokens were taken and the request may go after ``wait_s``; otherwise nothing
    was taken and ``wait_s`` is how long they would have taken to cover. ``at_us``: when it was decided, in
    microseconds of the deciding clock (Redis's ``TIME`` when ``shared``, this process's monotonic clock if not)."""

    granted: bool
    wait_s: float
    at_us: int
    shared: bool


Draw = tuple[BucketKey, Limit, float]  # a bucket, its figures, the tokens a request takes from it


# KEYS: the buckets; ARGV[1]: the longest wait the caller accepts (microseconds); then, per bucket, its capacity,
# refill per second and cost. A bucket is a hash {tokens, at}; a missing bucket is full.
_ACQUIRE_LUA = """
-- Before Redis 5 a script that read TIME could write only with effects replication asked for; since, a no-op.
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[1])
local levels = {}
local wait = 0
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[3 * i - 1])
  local refill = tonumber(ARGV[3 * i])
  local cost = tonumber(ARGV[3 * i + 1])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  local level = tonumber(state[1])
  local at = tonumber(state[2])
  if level == nil or at == nil then
    level = capacity
    at = now
  end
  if now > at then
    level = math.min(capacity, level + (now - at) * refill / 1000000)
  end
  level = level - cost
  levels[i] = level
  if level < 0 then
    wait = math.max(wait, math.ceil(-level * 1000000 / refill))
  end
end
if wait > max_wait then
  return {0, wait, now}
end
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[3 * i - 1])
  local refill = tonumber(ARGV[3 * i])
  redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', levels[i]), 'at', now)
  -- A bucket left alone refills to full, which is what a missing one is: let it expire then.
  redis.call('PEXPIRE', KEYS[i], math.ceil((capacity - levels[i]) * 1000 / refill) + 1000)
end
return {1, wait, now}
"""


class _LocalBuckets:
    """The same buckets in this process only: without Redis, or while it cannot be reached."""

    MAX_BUCKETS = 10_000

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at in seconds)

    def take(self, draws: Sequence[Draw], max_wait_s: float) -> Grant:
        with self._lock:
            now = self._clock()
            levels: list[float] = []
            wait = 0.0
            for key, limit, cost in draws:
                level, at = self._buckets.get(key.redis_key, (limit.capacity, now))
                level = min(limit.capacity, level + max(0.0, now - at) * limit.refill_per_s) - cost
                levels.append(level)
                if level < 0:
                    wait = max(wait, -level / limit.refill_per_s)
            at_us = int(now * 1_000_000)
            if wait > max(0.0, max_wait_s):
                return Grant(granted=False, wait_s=wait, at_us=at_us, shared=False)
            if len(self._buckets) >= self.MAX_BUCKETS:
                self._forget_full(now, draws)
            for (key, _, _), level in zip(draws, levels, strict=True):
                self._buckets[key.redis_key] = (level, now)
            return Grant(granted=True, wait_s=wait, at_us=at_us, shared=False)

    def _forget_full(self, now: float, keep: Sequence[Draw]) -> None:
        # Buckets untouched for ten minutes are full again at every default figure here; forget them.
        kept = {key.redis_key for key, _, _ in keep}
        for name, (_, at) in list(self._buckets.items()):
            if now - at > 600 and name not in kept:
                del self._buckets[name]


class RateLimiter:
    """Token buckets in Redis at ``redis_url`` (in-process only when it is empty). Thread-safe; one per process."""

    def __init__(
        self,
        redis_url: str = "",
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        redis_retry_s: float = REDIS_RETRY_S,
        redis_timeout_s: float = REDIS_TIMEOUT_S,
    ):
        self.redis_url = redis_url
        self._clock = clock
        self._sleep = sleep
        self._redis_retry_s = redis_retry_s
        self._local = _LocalBuckets(clock)
        self._script: Any = None
        if redis_url:
            client = redis.Redis.from_url(
                redis_url, socket_timeout=redis_timeout_s, socket_connect_timeout=redis_timeout_s
            )
            self._script = client.register_script(_ACQUIRE_LUA)
        self._state_lock = threading.Lock()
        self._redis_skipped_until = float("-inf")
        self._warned_at = float("-inf")

    def take(self, draws: Sequence[Draw], max_wait_s: float) -> Grant:
        """One atomic decision over every bucket in ``draws``: all their tokens are taken, or none. A request that
        needs no wait is granted even when ``max_wait_s`` is negative (an attempt longer than its whole deadline
        still runs once, as ``providers.deadline`` has it)."""
        if not draws:
            raise ValueError("take needs at least one bucket")
        for _, _, cost in draws:
            if not math.isfinite(cost) or cost <= 0:
                raise ValueError(f"cost must be a positive number, not {cost!r}")
        if self._script is not None and self._clock() >= self._redis_skipped_until:
            keys = [key.redis_key for key, _, _ in draws]
            args: list[Any] = [max(0, math.floor(max_wait_s * 1_000_000))]
            for _, limit, cost in draws:
                args += [repr(float(limit.capacity)), repr(float(limit.refill_per_s)), repr(float(cost))]
            try:
                granted, wait_us, at_us = self._script(keys=keys, args=args)
            except Exception as exc:  # any Redis failure (refused, timed out, read-only replica): degrade, never stop
                self._redis_failed(exc)
            else:
                return Grant(granted=bool(granted), wait_s=int(wait_us) / 1_000_000, at_us=int(at_us), shared=True)
        return self._local.take(draws, max_wait_s)

    def acquire(self, draws: Sequence[Draw], deadline: CallDeadline | None = None) -> Grant:
        """Take the tokens for one request and sleep until they are covered.

        The wait may last as long as an attempt started after it still ends by ``deadline`` (a fresh
        ``CALL_DEADLINE_S`` when None). Raises ``TransientProviderError`` (code ``RATE_LIMITED``, retryable) when
        it would not, having taken nothing: the caller's call fails now rather than late, and the broker retries it.
        """
        if deadline is None:
            deadline = CallDeadline(0.0)
        # CallDeadline measures on time.monotonic; allows_retry(w) holds exactly for w <= this budget.
        budget = deadline.ends - time.monotonic() - deadline.attempt_s
        grant = self.take(draws, budget)
        if not grant.granted:
            groups = ", ".join(f"{key.region}/{key.group}" for key, _, _ in draws)
            provider = draws[0][0].provider
            raise TransientProviderError(
                f"request rate limit ({groups}): the next tokens come in {grant.wait_s:.2f} s, past the call's "
                "deadline",
                code=RATE_LIMITED,
                provider=provider,
            )
        if grant.wait_s > 0:
            self._sleep(grant.wait_s)
        return grant

    def _redis_failed(self, exc: Exception) -> None:
        with self._state_lock:
            now = self._clock()
            self._redis_skipped_until = now + self._redis_retry_s
            warn = now - self._warned_at >= WARN_EVERY_S
            if warn:
                self._warned_at = now
        if warn:
            logger.warning(
                "provider rate limits: Redis at %s failed (%s: %s); each process now counts its own requests, "
                "so the limits hold per process until Redis answers again",
                _redis_location(self.redis_url),
                type(exc).__name__,
                exc,
            )


def _redis_location(url: str) -> str:
    """host:port/db of a Redis URL, without its password."""
    parts = urlsplit(url)
    return f"{parts.hostname or ''}:{parts.port or 6379}{parts.path or ''}"


_limiters: dict[str, RateLimiter] = {}
_limiters_lock = threading.Lock()


def limiter() -> RateLimiter:
    """The process's limiter for ``settings.PROVIDER_RATE_LIMIT_REDIS_URL`` (in-process buckets when Django is not
    configured, e.g. a sandbox run alone)."""
    url = ""
    if settings.configured:
        url = str(getattr(settings, "PROVIDER_RATE_LIMIT_REDIS_URL", "") or "")
    with _limiters_lock:
        found = _limiters.get(url)
        if found is None:
            found = _limiters[url] = RateLimiter(url)
        return found


def acquire(draws: Sequence[Draw], deadline: CallDeadline | None = None) -> Grant:
    """``limiter().acquire``: what each cloud's client calls before each request it sends."""
    return limiter().acquire(draws, deadline)


# ------------------------------------------------------------------------------------------------ the figures


def resolve(group: str, default: Limit, overrides: Mapping[str, Limit] | None) -> Limit:
    """An account's own figure for ``group`` when it has one, else the cloud's default."""
    return (overrides or {}).get(group) or default


def _table(figures: Iterable[tuple[Iterable[str], Limit]]) -> dict[str, Limit]:
    return {group: limit for groups, limit in figures for group in groups}


# AWS. "Request throttling for the Amazon EC2 API" (Amazon EC2 Developer Guide,
# https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html): token buckets per account per Region,
# one per API action ("each API is evaluated individually"), sized by the action's category; RunInstances and
# TerminateInstances also draw on a resource bucket, one token per instance.
AWS_NON_MUTATING = Limit(100, 20)  # "Non-mutating actions" (Describe*, List*, Search*, Get*): 100, refill 20/s
AWS_UNFILTERED = Limit(50, 10)  # "Unfiltered and unpaginated non-mutating actions": 50, refill 10/s
AWS_MUTATING = Limit(50, 5)  # "Mutating actions": 50, refill 5/s
AWS_UNFILTERED_ACTIONS = frozenset(
    # the category's list on that page: without a filter or pagination these take from the smaller bucket
    {"DescribeInstances", "DescribeInstanceStatus", "DescribeNetworkInterfaces", "DescribeSecurityGroups",
     "DescribeSnapshots", "DescribeSpotInstanceRequests", "DescribeVolumes"}
)  # fmt: skip
AWS_LIMITS = _table(
    [
        # "Resource-intensive actions": 50, refill 5/s
        (["AuthorizeSecurityGroupIngress", "CreateKeyPair", "RevokeSecurityGroupIngress"], Limit(50, 5)),
        # "Uncategorized actions" with their own figures
        (["RunInstances"], Limit(5, 2)),  # RunInstances: 5, refill 2/s
        (["TerminateInstances"], Limit(100, 5)),  # TerminateInstances: 100, refill 5/s
        (["CreateTags", "DeleteTags"], Limit(100, 10)),  # CreateTags, DeleteTags: 100, refill 10/s
        # "Resource token bucket sizes and refill rates"
        (["RunInstances/instances"], Limit(1000, 2)),  # RunInstances: 1000 instances, refill 2/s
        (["TerminateInstances/instances"], Limit(1000, 20)),  # TerminateInstances: 1000 instances, refill 20/s
        # "AWS Systems Manager endpoints and quotas", Parameter Store "Max throughput (transactions per second)":
        # "Default throughput: 40 (Shared by the following API actions: GetParameter, GetParameters,
        # GetParametersByPath)", per account per Region; a rate with no burst stated, so a bucket of one second's.
        (["ssm/parameters"], Limit(40, 40)),
        # "Using the AWS Price List Query API" (AWS Billing User Guide), Quotas: token buckets per account per
        # Region, GetProducts: bucket size 10, refill 5 per second.
        (["pricing/GetProducts"], Limit(10, 5)),
    ]
)


def aws_group(service: str, action: str, params: Mapping[str, Any]) -> tuple[str, Limit]:
    """The bucket of one AWS request: its action's own, sized by the action's category."""
    if service == "ssm":
        return "ssm/parameters", AWS_LIMITS["ssm/parameters"]
    if service == "pricing":
        return f"pricing/{action}", AWS_LIMITS.get(f"pricing/{action}", Limit(10, 5))
    if action in AWS_LIMITS:
        return action, AWS_LIMITS[action]
    if action.startswith(("Describe", "Get", "List", "Search")):
        paged_or_filtered = any(params.get(name) for name in ("Filters", "MaxResults", "NextToken"))
        if action in AWS_UNFILTERED_ACTIONS and not paged_or_filtered:
            return f"{action}/unfiltered", AWS_UNFILTERED
        return action, AWS_NON_MUTATING
    return action, AWS_MUTATING


# Azure. "Understand how Azure Resource Manager throttles requests" (Azure Resource Manager docs,
# https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling): since 2024 a
# token bucket per region, per subscription, per service principal and per operation type. The region is the one
# of the Resource Manager instance serving the request, which for one broker deployment is one region.
AZURE_LIMITS = _table(
    [
        (["arm/reads"], Limit(250, 25)),  # Subscription reads: bucket 250, refill 25 per second
        (["arm/writes"], Limit(200, 10)),  # Subscription writes: bucket 200, refill 10 per second
        (["arm/deletes"], Limit(200, 10)),  # Subscription deletes: bucket 200, refill 10 per second
        # The Retail Prices API (unauthenticated, https://prices.azure.com) publishes no request rate: ten pages a
        # second after a burst of twenty is our conservative choice. One bucket for the whole broker: without
        # credentials, whatever limit it has is the caller's, not an account's.
        (["prices"], Limit(20, 10)),
        # Microsoft Entra ID publishes no token rate for a workforce tenant's application; MSAL's "Client and server
        # throttling" says only that it answers 429 with "Retry-After: 60" to an application asking too often. Ours:
        # a burst of twenty, then two a second, per tenant and application. Tokens are cached for their lifetime.
        (["entra/token"], Limit(20, 2)),
    ]
)


def azure_group(method: str) -> str:
    """An ARM request's operation type, as the throttling page counts them."""
    method = method.upper()
    if method in ("GET", "HEAD"):
        return "arm/reads"
    if method == "DELETE":
        return "arm/deletes"
    return "arm/writes"


# GCP. "Compute Engine rate quotas" (https://cloud.google.com/compute/docs/api-rate-limits): per project, counted
# per minute per quota group, every group apart. The page's legacy global groups state "Quota per project: 1500
# requests/minute" (Queries, Read requests, List requests, Operation read requests); its simplified groups (global
# reads and writes, reads and writes per region) state no default, and "offer higher limits", so 1500 a minute
# for each, which is then the conservative figure. Windows are counted, not bucketed: Limit.per_window.
GCP_COMPUTE_PER_MINUTE = 1500
GCP_LIMITS = _table(
    [
        (["compute/global-reads", "compute/global-writes", "compute/reads", "compute/writes"],
         Limit.per_window(GCP_COMPUTE_PER_MINUTE, 60)),
        # "Quotas and limits" (Cloud Billing, https://cloud.google.com/billing/quotas): "Each project can make 300
        # API calls per minute to the Cloud Billing API" (the Catalog's services.skus.list is one of them).
        (["billing"], Limit.per_window(300, 60)),
    ]
)  # fmt: skip


def gcp_group(method: str, path: str) -> tuple[str, str]:
    """(region or "global", group) of one Google Cloud REST request, from its method and URL path."""
    if "/compute/" not in path:
        return "global", "billing"
    kind = "reads" if method.upper() in ("GET", "HEAD") else "writes"
    parts = path.split("/")
    for scope in ("zones", "regions"):
        if scope in parts:
            index = parts.index(scope)
            location = parts[index + 1] if index + 1 < len(parts) else ""
            if location:
                region = location.rsplit("-", 1)[0] if scope == "zones" else location
                return region, f"compute/{kind}"
    return "global", f"compute/global-{kind}"


# Alibaba Cloud. "API throttling" (ECS developer reference, https://www.alibabacloud.com/help/doc-detail/437902.htm;
# in Chinese "流量控制", https://help.aliyun.com/zh/ecs/developer-reference/api-throttling): a threshold per API
# operation per region per Alibaba Cloud account, counted per minute ("if an operation is throttled in minute T it
# can be called again in minute T + 1"), visible only in the Quota Center console: ECS publishes no figures. Ours
# are conservative choices: 20 reads and 5 writes a second per operation, counted per minute (1,200 and 300), a
# fifth of the "100/1(s)" that Alibaba Cloud's published quota tables commonly give other services' reads (e.g.
# Tablestore's ListInstances, https://help.aliyun.com/zh/tablestore/developer-reference/api-tablestore-2020-12-09-quota).
# The page does state one figure: at most 5,000 instances created per account in a minute.
ALIBABA_READS = Limit.per_window(1200, 60)
ALIBABA_WRITES = Limit.per_window(300, 60)
ALIBABA_LIMITS = _table([(["RunInstances/instances"], Limit.per_window(5000, 60))])


def alibaba_limit(action: str) -> Limit:
    return ALIBABA_LIMITS.get(action) or (ALIBABA_READS if action.startswith("Describe") else ALIBABA_WRITES)


# Tencent Cloud. Every API document states a "默认接口请求频率限制" (default request frequency limit), per API,
# per access region (the API server the request reaches: the nearest one for the default endpoint) and per
# sub-account ("API 频率限制说明", Cloud API developer guide, https://cloud.tencent.com/document/product/1278/109059).
# The figures are per second, counted in windows: Limit.per_window.
TENCENT_PER_SECOND = {
    # "API 概览" (CVM API overview, https://cloud.tencent.com/document/api/213/15689)
    "cvm/RunInstances": 10,
    "cvm/TerminateInstances": 10,
    "cvm/DescribeInstances": 40,
    "cvm/DescribeInstanceTypeConfigs": 40,
    "cvm/DescribeZoneInstanceConfigInfos": 40,
    "cvm/DescribeZones": 20,
    "cvm/DescribeRegions": 20,
    "cvm/DescribeImages": 40,  # "查看镜像列表" (DescribeImages), https://cloud.tencent.com/document/api/213/15715
    "cvm/DeleteKeyPairs": 10,  # "DeleteKeyPairs", https://www.tencentcloud.com/document/api/213/33230
    # "CreateSecurityGroupPolicies", VPC API, https://www.tencentcloud.com/document/product/215/15807
    "vpc/CreateSecurityGroupPolicies": 100,
}
# The other APIs the broker calls were not found with a figure: 10 a second, the lowest of CVM's, is our
# conservative choice.
TENCENT_UNPUBLISHED = frozenset(
    {"cvm/ImportKeyPair", "cvm/DescribeKeyPairs", "vpc/CreateSecurityGroup", "vpc/DeleteSecurityGroup",
     "vpc/DescribeSecurityGroups", "vpc/DescribeSecurityGroupPolicies"}
)  # fmt: skip
TENCENT_DEFAULT_PER_SECOND = 10


def tencent_limit(group: str) -> Limit:
    return Limit.per_window(TENCENT_PER_SECOND.get(group, TENCENT_DEFAULT_PER_SECOND), 1)


# Kubernetes. An API server publishes no request rate per client: it shares its capacity by API Priority and
# Fairness and answers 429 with Retry-After past it (https://kubernetes.io/docs/concepts/cluster-administration/
# flow-control/); what it sizes is concurrency (kube-apiserver's --max-requests-inflight 400 and
# --max-mutating-requests-inflight 200 by default, https://kubernetes.io/docs/reference/command-line-tools-reference/
# kube-apiserver/). The figure is a conservative choice: one bucket per cluster for everything the broker sends it,
# 50 requests a second with bursts of 100, a small share of what one API server serves; a seller whose cluster
# takes more (or less) sizes it with ``rate_limit.api``.
KUBERNETES_LIMITS = {"api": Limit(capacity=100, refill_per_s=50)}


# ------------------------------------------------------------------------------------ an account's own figures

# The EC2 actions the broker calls (providers/aws): each is its own bucket (``aws_group``), sized by its category.
AWS_ACTIONS_CALLED = frozenset(
    {"AuthorizeSecurityGroupIngress", "CreatePlacementGroup", "CreateSecurityGroup", "DeleteKeyPair",
     "DeletePlacementGroup", "DeleteSecurityGroup", "DescribeAvailabilityZones", "DescribeImages",
     "DescribeInstanceTypeOfferings", "DescribeInstanceTypes", "DescribeInstances", "DescribeKeyPairs",
     "DescribeSecurityGroups", "DescribeSpotPriceHistory", "DescribeSubnets", "DescribeVpcs", "ImportKeyPair",
     "RunInstances", "TerminateInstances"}
)  # fmt: skip
# The ECS operations the broker calls (providers/alibaba/client.py's ACTIONS): ECS counts each apart.
ALIBABA_ACTIONS_CALLED = frozenset(
    {"AuthorizeSecurityGroup", "CreateSecurityGroup", "DeleteInstances", "DeleteKeyPairs", "DeleteSecurityGroup",
     "DescribeAvailableResource", "DescribeDisks", "DescribeImages", "DescribeInstanceAttribute",
     "DescribeInstanceStatus", "DescribeInstanceTypes", "DescribeInstances", "DescribeKeyPairs", "DescribePrice",
     "DescribeRegions", "DescribeSecurityGroupAttribute", "DescribeSecurityGroups", "DescribeSpotPriceHistory",
     "DescribeUserData", "DescribeVSwitches", "ImportKeyPair", "RebootInstance", "RunInstances", "StartInstance",
     "StopInstance"}
)  # fmt: skip
# Buckets the whole broker shares rather than an account: Azure's Retail Prices API takes no credentials, so no
# one account's figure may size its bucket.
BROKER_WIDE_GROUPS: Mapping[str, frozenset[str]] = {"azure": frozenset({"prices"})}
# By provider kind, the groups an account may size with an option ``rate_limit.<group>``: every bucket its own
# requests draw on, by the name the bucket has above.
ACCOUNT_GROUPS: Mapping[str, frozenset[str]] = {
    "aws": frozenset(AWS_LIMITS)
    | AWS_ACTIONS_CALLED
    | {f"{action}/unfiltered" for action in AWS_ACTIONS_CALLED & AWS_UNFILTERED_ACTIONS},
    "azure": frozenset(AZURE_LIMITS) - BROKER_WIDE_GROUPS["azure"],
    "gcp": frozenset(GCP_LIMITS),
    "alibaba": frozenset(ALIBABA_LIMITS) | ALIBABA_ACTIONS_CALLED,
    "tencent": frozenset(TENCENT_PER_SECOND) | TENCENT_UNPUBLISHED,
    "kubernetes": frozenset(KUBERNETES_LIMITS),
}
# The bounds of an account's figure: a request takes at least one token, so a bucket holds at least one; a
# hundred thousand, at once or a second, is far beyond any figure above and any a cloud grants.
CAPACITY_MIN = Decimal(1)
FIGURE_MAX = Decimal(100_000)
OPTION_VALUE_MAX_CHARS = 40
_GROUP_SHOWN_MAX = 60  # how much of an unknown group's name an error repeats
_FIGURE_TEXT = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
_FORMAT = "<capacity>/<refill per second>"


def account_groups(provider: str) -> frozenset[str]:
    """The groups an account of ``provider`` may give its own figures for (none for a kind without buckets)."""
    return ACCOUNT_GROUPS.get(provider, frozenset())


def limits_from_options(options: Mapping[str, Any], provider: str) -> dict[str, Limit]:
    """An account's own figures from its options: ``rate_limit.<group>`` = ``<capacity>/<refill per second>``,
    e.g. ``rate_limit.DescribeInstances`` = ``200/40`` for an AWS account AWS raised. An empty value sets nothing.

    The group must be one of ``account_groups(provider)``. Each figure is checked as text before anything converts
    it: the digits 0-9 with at most one decimal point (no sign, exponent, NaN or infinity), a capacity from
    ``CAPACITY_MIN`` and a refill above 0, both at most ``FIGURE_MAX``, the value at most
    ``OPTION_VALUE_MAX_CHARS`` long. Raises ``ValueError`` naming the option otherwise. Every path runs this one
    check: connecting an account (``providers.services``) and building its adapter.
    """
    groups = account_groups(provider)
    found: dict[str, Limit] = {}
    for option, raw in options.items():
        if not option.startswith(OPTION_PREFIX) or raw == "":
            continue
        group = option.removeprefix(OPTION_PREFIX)
        if group not in groups:
            raise ValueError(_unknown_group(group, provider, groups))
        if not isinstance(raw, str):
            raise ValueError(f"options.{option}: give {_FORMAT} as text, e.g. 100/20")
        if len(raw) > OPTION_VALUE_MAX_CHARS:
            raise ValueError(f"options.{option}: {len(raw)} characters; give {_FORMAT}, e.g. 100/20")
        capacity, slash, refill = raw.partition("/")
        if not slash or not _FIGURE_TEXT.fullmatch(capacity) or not _FIGURE_TEXT.fullmatch(refill):
            raise ValueError(
                f"options.{option}: {raw!r} is not {_FORMAT} written with the digits 0-9 and at most one decimal "
                "point each, e.g. 100/20 or 5/0.5"
            )
        # Decimal is exact and safe on at most 40 ASCII digits; only then is the text converted to a float.
        if not CAPACITY_MIN <= Decimal(capacity) <= FIGURE_MAX:
            raise ValueError(f"options.{option}: the capacity {capacity} is not from {CAPACITY_MIN} to {FIGURE_MAX}")
        if not 0 < Decimal(refill) <= FIGURE_MAX:
            raise ValueError(
                f"options.{option}: the refill {refill} per second is not above 0 and at most {FIGURE_MAX}"
            )
        found[group] = Limit(float(capacity), float(refill))
    return found


def _unknown_group(group: str, provider: str, groups: frozenset[str]) -> str:
    shown = group if len(group) <= _GROUP_SHOWN_MAX else f"{group[:_GROUP_SHOWN_MAX]}..."
    if not groups:
        return f"options.{OPTION_PREFIX}{shown}: {provider} accounts have no request rate limits to set"
    if group in BROKER_WIDE_GROUPS.get(provider, ()):
        return f"options.{OPTION_PREFIX}{group}: {provider}'s {group!r} bucket is the whole broker's, not an account's"
    close = difflib.get_close_matches(group, groups, n=1) if len(group) <= _GROUP_SHOWN_MAX else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"options.{OPTION_PREFIX}{shown}: {provider} has no request bucket {shown!r}{hint}; the groups "
        f"(providers.ratelimit.ACCOUNT_GROUPS) are {', '.join(sorted(groups))}"
    )
