"""The only module that imports boto3/botocore.

``AwsClient`` builds the SDK clients (explicit timeouts, retry policy per purpose) and runs every call
through ``_translate``, so callers receive plain dicts or ``ProviderError`` subclasses and never an SDK
exception. Every HTTP request a client sends first draws on the account's shared rate-limit buckets
(``providers.ratelimit``, through botocore's event hooks: ``_count_requests``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.config
import botocore.exceptions as sdk_errors
import botocore.session
from botocore.parsers import ResponseParserError

from providers import ratelimit
from providers.aws import errors
from providers.deadline import CALL_DEADLINE_S, CallDeadline
from providers.errors import CredentialsRejected, ProviderError, ProviderRequestRejected

PRICING_REGION = "us-east-1"  # the Price List API is served from us-east-1 (and ap-south-1) only
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_MAX_ATTEMPTS = 3

_loader_lock = threading.Lock()
_shared_loader: Any = None
# SDK clients outlive the adapter that built them: building one costs ~70 ms (endpoint resolution, the service
# model's shapes), and an order builds an adapter at placement, launch and every poll. botocore clients are
# thread-safe. The key holds everything a client is made of, the secret as a hash, so no two accounts (nor two
# keys of one account) ever share one.
_CLIENT_CACHE_SIZE = 256
_client_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_client_cache_lock = threading.Lock()


def _botocore_session() -> Any:
    """A fresh botocore session that reuses one process-wide data loader.

    Adapters are built per task; without the shared loader each one re-reads the EC2 service model
    (~0.3 s). The loader only caches the SDK's static JSON models, never credentials.
    """
    global _shared_loader
    session = botocore.session.get_session()
    with _loader_lock:
        if _shared_loader is None:
            _shared_loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _shared_loader)
    return session


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach AWS. Secrets are excluded from ``repr`` so they never reach a log line."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    rate_limits: Mapping[str, ratelimit.Limit] | None = None  # this account's own figures by bucket group


_RATE_PLAN = "gpu_broker_rate_plan"  # the request context's key for what each attempt of a call draws


def _count_requests(client: Any, settings: ClientSettings, service: str, region: str) -> None:
    """Make every HTTP request ``client`` sends (each page, each of botocore's retries) draw on the account's shared
    buckets (``providers.ratelimit``) first. ``before-parameter-build`` runs once per API call and sees its
    parameters (the bucket can depend on a filter or the number of instances); ``before-send`` runs before each
    attempt and waits, bounded by the call's deadline. The rate limit's own error is no botocore error, so botocore
    does not retry it and it reaches the caller as it is."""
    service_id = client.meta.service_model.service_id.hyphenize()
    attempt_s = settings.connect_timeout + settings.read_timeout

    def plan(params: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        group, default = ratelimit.aws_group(service, model.name, params)
        draws: list[ratelimit.Draw] = [_draw(group, default, 1)]
        instances = {"RunInstances": params.get("MaxCount"), "TerminateInstances": len(params.get("InstanceIds") or [])}
        count = instances.get(model.name)
        if count:  # these actions also take one token per instance from a resource bucket
            resource = f"{model.name}/instances"
            draws.append(_draw(resource, ratelimit.AWS_LIMITS[resource], float(count)))
        context[_RATE_PLAN] = (draws, CallDeadline(attempt_s))

    def _draw(group: str, default: ratelimit.Limit, cost: float) -> ratelimit.Draw:
        key = ratelimit.BucketKey(errors.PROVIDER, settings.access_key_id, region, group)
        return key, ratelimit.resolve(group, default, settings.rate_limits), cost

    def before_send(request: Any, **_: Any) -> None:
        planned = (getattr(request, "context", None) or {}).get(_RATE_PLAN)
        if planned is not None:
            ratelimit.acquire(*planned)

    client.meta.events.register(f"before-parameter-build.{service_id}", plan)
    client.meta.events.register(f"before-send.{service_id}", before_send)


def _translate(exc: Exception) -> ProviderError:
    """SDK exception -> broker error. Classification of AWS errors is by code string only."""
    if isinstance(exc, sdk_errors.ClientError):
        error = exc.response.get("Error") or {}
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str(error.get("Code", ""))
        return errors.error_from_code(code, str(error.get("Message", "")) or str(exc), status)
    name = type(exc).__name__
    if isinstance(exc, sdk_errors.ConnectionError | sdk_errors.HTTPClientError) or name in errors.TRANSPORT_ERRORS:
        return errors.transport_error(name, str(exc))
    if isinstance(exc, sdk_errors.NoCredentialsError | sdk_errors.PartialCredentialsError):
        return CredentialsRejected(str(exc), code=name, provider=errors.PROVIDER)
    if isinstance(exc, ResponseParserError):
        return errors.malformed(f"{name}: {exc}")
    # Anything else (parameter validation, unknown SDK failure) would fail the same way again.
    return ProviderRequestRejected(str(exc), code=name, provider=errors.PROVIDER)


@contextmanager
def _sdk_errors() -> Iterator[None]:
    try:
        yield
    except (sdk_errors.BotoCoreError, sdk_errors.ClientError, ResponseParserError) as exc:
        raise _translate(exc) from exc


class AwsClient:
    """Lazily built, cached SDK clients for one account.

    ``call``/``pages``/``price_list`` use the read clients (botocore standard retries, ``max_attempts``
    in total); ``launch`` uses a client with retries off so a capacity error (HTTP 500) reaches the broker
    on the first answer.
    """

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self._session: Any = None  # built only when a client is not in the shared cache (~40 ms: its handlers)
        self._clients: dict[tuple[str, str, bool], Any] = {}
        self._lock = threading.Lock()  # boto3 sessions are not thread-safe when creating clients

    def _config(self, *, retries: bool) -> botocore.config.Config:
        # botocore retries inside one call and has only per-attempt timeouts: as many attempts as fit, at those
        # timeouts, in the call deadline. Standard mode waits up to 2^(n-1) s before retry n, at most 20 s
        # (botocore/retries/standard.py, ExponentialBackoff): 1 + 2 s for the default three attempts.
        s = self.settings
        fit = max(1, int(CALL_DEADLINE_S // (s.connect_timeout + s.read_timeout)))
        retry_policy = {"mode": "standard", "total_max_attempts": min(s.max_attempts, fit) if retries else 1}
        return botocore.config.Config(
            connect_timeout=self.settings.connect_timeout,
            read_timeout=self.settings.read_timeout,
            retries=retry_policy,
            user_agent_extra="gpu-broker",
        )

    def _cache_key(self, service: str, region: str, retries: bool) -> tuple[Any, ...]:
        s = self.settings
        secret = hashlib.sha256(f"{s.secret_access_key}\0{s.session_token or ''}".encode()).hexdigest()
        limits = tuple(sorted((s.rate_limits or {}).items()))
        return (service, region, retries, s.access_key_id, secret, s.endpoint_url, s.connect_timeout, s.read_timeout,
                s.max_attempts, limits)  # fmt: skip

    def _client(self, service: str, region: str, *, retries: bool = True) -> Any:
        key = (service, region, retries)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                shared_key = self._cache_key(service, region, retries)
                with _client_cache_lock:
                    client = _client_cache.get(shared_key)
                    if client is not None:
                        _client_cache.move_to_end(shared_key)
                        self._clients[key] = client
                        return client
                if self._session is None:
                    self._session = boto3.session.Session(
                        aws_access_key_id=self.settings.access_key_id,
                        aws_secret_access_key=self.settings.secret_access_key,
                        aws_session_token=self.settings.session_token,
                        botocore_session=_botocore_session(),
                    )
                try:
                    with _sdk_errors():
                        client = self._session.client(
                            service,
                            region_name=region,
                            endpoint_url=self.settings.endpoint_url,
                            config=self._config(retries=retries),
                        )
                except ValueError as exc:  # botocore's answer to a malformed endpoint URL or region name
                    raise ProviderRequestRejected(
                        f"cannot build the {service} client: {exc}", provider=errors.PROVIDER
                    ) from exc
                _count_requests(client, self.settings, service, region)
                self._clients[key] = client
                with _client_cache_lock:
                    _client_cache[shared_key] = client
                    while len(_client_cache) > _CLIENT_CACHE_SIZE:
                        _client_cache.popitem(last=False)
            return client

    def call(self, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One EC2 read (or a safely repeatable write such as terminate) with retries."""
        method: Callable[..., dict[str, Any]] = getattr(self._client("ec2", region), operation)
        with _sdk_errors():
            return method(**params)

    def pages(self, region: str, operation: str, result_key: str, **params: Any) -> list[Any]:
        """Every item under ``result_key`` across all pages of an EC2 read."""
        items: list[Any] = []
        with _sdk_errors():
            for page in self._client("ec2", region).get_paginator(operation).paginate(**params):
                items.extend(page.get(result_key) or [])
        return items

    def launch(self, region: str, **params: Any) -> dict[str, Any]:
        """``run_instances`` exactly once: no SDK retry, the broker decides on retry or failover."""
        with _sdk_errors():
            result: dict[str, Any] = self._client("ec2", region, retries=False).run_instances(**params)
            return result

    def once(self, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One EC2 write exactly once (``start_instances``): a capacity refusal (HTTP 500) reaches the broker on
        the first answer instead of after botocore's retries."""
        method: Callable[..., dict[str, Any]] = getattr(self._client("ec2", region, retries=False), operation)
        with _sdk_errors():
            return method(**params)

    def parameter(self, region: str, name: str) -> str:
        """The value of one Systems Manager parameter (e.g. the public parameter naming a region's current AMI).

        ``ParameterNotFound`` becomes ``ImageUnavailable`` (``errors.ERROR_CLASSES``)."""
        with _sdk_errors():
            result = self._client("ssm", region).get_parameter(Name=name)
        try:
            return str(result["Parameter"]["Value"])
        except (KeyError, TypeError) as exc:
            raise errors.malformed(f"get_parameter answered without Parameter.Value ({exc!r})") from None

    def price_list(self, **params: Any) -> list[Any]:
        """Every ``PriceList`` item of ``pricing.get_products`` across pages (items are JSON strings)."""
        items: list[Any] = []
        with _sdk_errors():
            for page in self._client("pricing", PRICING_REGION).get_paginator("get_products").paginate(**params):
                items.extend(page.get("PriceList") or [])
        return items
