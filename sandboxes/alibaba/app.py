"""The Alibaba Cloud ECS sandbox: an in-process emulator of the ECS RPC API (version 2014-05-26) that the real
``alibabacloud-ecs20140526`` SDK talks to unchanged over HTTP (``POST /`` with ``x-acs-action``, flattened
query parameters, JSON answers, ACS3-HMAC-SHA256 signatures).

What it serves:

- ``DescribeInstanceTypes`` (``MinimumGPUAmount``, ``InstanceTypes.N``, ``InstanceTypeFamily``, ``GPUSpec``
  filters; ``MaxResults``/``NextToken`` pages): the seeded GPU types plus a few CPU-only types;
- ``DescribeAvailableResource`` per zone with ``StatusCategory`` WithStock / ClosedWithStock / WithoutStock
  (a synthetic, documented stock table: ``DEFAULT_STOCK``);
- ``DescribePrice`` (hourly, pay-as-you-go) from ``prices.csv``: the real cn-shanghai list prices
  of the shared price table, in CNY, with their source;
- ``DescribeSpotPriceHistory``: empty, because no Alibaba spot price was sourced, unless a test adds points
  (``add_spot_price``);
- sites: both price answers state ``Currency``, the currency of the site the account signed up on (CNY on the
  China site, USD on the International site; ``SITE_CURRENCIES``). Every key is on the China site until
  ``set_account_site`` moves it; an International account is priced only where a test set a USD price
  (``set_price``), since no USD list price was sourced;
- ``RunInstances`` idempotent on ``ClientToken`` per region (same token and parameters -> the same
  ``InstanceIdSets``; other parameters -> ``IdempotenceParamNotMatch``), ``DescribeInstances``,
  ``DescribeInstanceStatus``, ``DeleteInstances`` (Force), ``DescribeRegions``;
- what a launch carries, kept as ECS keeps it: ``UserData`` (Base64, at most 32 KB before encoding:
  ``InvalidUserData.SizeExceeded``), ``SystemDisk.Size`` (20-2048 GiB and not below the image), ``KeyPairName``,
  ``SecurityGroupId`` and ``VSwitchId``, answered back by ``DescribeUserData``, ``DescribeInstanceAttribute``,
  ``DescribeDisks`` and ``DescribeInstances``; images, vSwitches, key pairs and security groups
  (``sandboxes/alibaba/resources.py``);
- booting: an instance that reaches ``Running`` starts the lease agent its user data names (``self.booter``);
  a released one is halted;
- injectable faults (``sandbox.faults``, default action ``RunInstances``) and credential checks: keys starting
  with ``bad`` get ``InvalidAccessKeyId.NotFound``; a key registered with ``register_key`` (or the demo key
  ``DEMO_CREDENTIALS``, always registered) has its signature verified (``SignatureDoesNotMatch`` otherwise);
  other keys are accepted with any secret, but every request must carry a well-formed ACS3 Authorization.

Lifecycle: an instance is ``Pending`` until a Describe call has observed it ``boot_observations`` times
(default 0: the first Describe already shows ``Running``). ``DeleteInstances`` releases it at once: ECS then no
longer lists it (``instances()`` keeps it, state ``Deleted``, for tests). One account: every accepted key sees
the same instances.

Use in-process: ``sandbox = start_alibaba_sandbox()``; point the adapter's ``endpoint_url`` at ``sandbox.url``;
``sandbox.reset()`` between tests. Standalone: ``python -m sandboxes serve --only alibaba``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.wrappers import Request, Response

from sandboxes.alibaba import wire
from sandboxes.alibaba.catalogue import CatalogueHandlers
from sandboxes.alibaba.instances import InstanceHandlers
from sandboxes.alibaba.power import PowerHandlers
from sandboxes.alibaba.resources import EcsResources, bindings_of
from sandboxes.alibaba.state import (
    CODE_STATUS,
    CPU_TYPES,
    DEFAULT_SITE,
    DEFAULT_STOCK,
    DEMO_CREDENTIALS,
    ECS_FAULTS,
    NONCE_MEMORY,
    REGIONS,
    SEED_GPU_KEYS,
    SEED_PATH,
    SITE_CURRENCIES,
    STOCK_CATEGORIES,
    Call,
    SandboxInstance,
    SpotPricePoint,
    _catalogue_entry,
    _cpu_entry,
    _Instance,
    _Request,
    _Stored,
    load_seed,
)
from sandboxes.alibaba.wire import WireError
from sandboxes.faults import TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

# --------------------------------------------------------------------------------------------- sandbox


class AlibabaSandbox(InstanceHandlers, PowerHandlers, CatalogueHandlers, SandboxApp):
    """The ECS sandbox WSGI app. ``start()`` serves it; ``faults`` injects failures; ``reset()`` forgets state."""

    kind = "alibaba"

    def __init__(self, seed_path: Path = SEED_PATH, key_secrets: dict[str, str] | None = None):
        super().__init__(FaultRegistry(default_action="RunInstances"))
        self.seed = load_seed(seed_path)
        self._prices = {(r.region, r.instance_type): r for r in self.seed}
        self._set_prices: dict[tuple[str, str, str], Decimal] = {}  # (currency, region, type) -> hourly price
        self._spot_history: dict[tuple[str, str], list[SpotPricePoint]] = {}
        self._sites: dict[str, str] = {}  # access key id -> site, when not DEFAULT_SITE
        self._catalogue: dict[str, dict[str, Any]] = {}
        for row in self.seed:
            self._catalogue.setdefault(row.instance_type, _catalogue_entry(row))
        for name, family, vcpus, memory in CPU_TYPES:
            self._catalogue[name] = _cpu_entry(name, family, vcpus, memory)
        self._lock = threading.Lock()
        self._stock = self._default_stock()
        self._instances: dict[str, _Instance] = {}
        self._tokens: dict[tuple[str, str], _Stored] = {}
        self._token_locks: dict[tuple[str, str], threading.Lock] = {}
        self._release_tokens: set[tuple[str, str]] = set()
        self._nonces: deque[str] = deque(maxlen=NONCE_MEMORY)
        self._nonce_set: set[str] = set()
        self._valid_keys: frozenset[str] | None = None
        self._default_secrets = {DEMO_CREDENTIALS["access_key_id"]: DEMO_CREDENTIALS["access_key_secret"]}
        self._default_secrets.update(key_secrets or {})
        self._secrets = dict(self._default_secrets)
        self._ip_counter = itertools.count(10)
        self.boot_observations = 0
        self.resources = EcsResources(REGIONS, self.faults, self._bindings)
        self._gpus: dict[str, tuple[str, int, int]] = {
            row.instance_type: (SEED_GPU_KEYS.get(row.gpu_model, row.gpu_model), row.gpu_count, row.gpu_memory_gb)
            for row in self.seed
        }
        self._handlers: dict[str, Callable[[_Request], dict[str, Any]]] = {
            "DescribeRegions": self._describe_regions,
            "DescribeInstanceTypes": self._describe_instance_types,
            "DescribeAvailableResource": self._describe_available_resource,
            "DescribePrice": self._describe_price,
            "DescribeSpotPriceHistory": self._describe_spot_price_history,
            "RunInstances": self._run_instances,
            "DescribeInstances": self._describe_instances,
            "DescribeInstanceStatus": self._describe_instance_status,
            "DeleteInstances": self._delete_instances,
            "StopInstance": self._stop_instance,
            "StartInstance": self._start_instance,
            "RebootInstance": self._reboot_instance,
            "DescribeUserData": self._describe_user_data,
            "DescribeInstanceAttribute": self._describe_instance_attribute,
            "DescribeDisks": self._describe_disks,
        }
        regional: dict[str, Callable[[str, dict[str, str]], dict[str, Any]]] = {
            "DescribeImages": self.resources.describe_images,
            "DescribeVSwitches": self.resources.describe_vswitches,
            "ImportKeyPair": self.resources.import_key_pair,
            "DescribeKeyPairs": self.resources.describe_key_pairs,
            "DeleteKeyPairs": self.resources.delete_key_pairs,
            "CreateSecurityGroup": self.resources.create_security_group,
            "AuthorizeSecurityGroup": self.resources.authorize_security_group,
            "DescribeSecurityGroups": self.resources.describe_security_groups,
            "DescribeSecurityGroupAttribute": self.resources.describe_security_group_attribute,
            "DeleteSecurityGroup": self.resources.delete_security_group,
        }
        for action, handler in regional.items():
            self._handlers[action] = self._in_region(handler)

    def _in_region(
        self, handler: Callable[[str, dict[str, str]], dict[str, Any]]
    ) -> Callable[[_Request], dict[str, Any]]:
        return lambda req: handler(self._region(req), req.params)

    def _bindings(self, region: str) -> list[Any]:
        with self._lock:
            return bindings_of(list(self._instances.values()), region)

    def _default_stock(self) -> dict[tuple[str, str, str], str]:
        stock: dict[tuple[str, str, str], str] = {}
        for row in self.seed:
            for zone in REGIONS.get(row.region, ("", (), ""))[1]:
                category = DEFAULT_STOCK.get((row.region, zone, row.instance_type), "WithStock")
                if category is not None:
                    stock[(row.region, zone, row.instance_type)] = category
        return stock

    # -------------------------------------------------------------------------------- public helpers

    @property
    def regions(self) -> list[str]:
        """Every region the sandbox answers for (only the seeded ones have stock and prices)."""
        return sorted(REGIONS)

    @property
    def seeded_regions(self) -> list[str]:
        return sorted({row.region for row in self.seed})

    @property
    def demo_credentials(self) -> dict[str, str]:
        """Credentials values for a demo ProviderAccount (keys ``access_key_id``, ``access_key_secret``)."""
        return dict(DEMO_CREDENTIALS)

    def zones(self, region: str) -> list[str]:
        return list(REGIONS.get(region, ("", (), ""))[1])

    def stock(self, region: str, zone: str, instance_type: str) -> str | None:
        """The zone's StatusCategory for the type, or None when the zone does not sell it."""
        with self._lock:
            return self._stock.get((region, zone, instance_type))

    def set_stock(self, region: str, zone: str, instance_type: str, category: str | None) -> None:
        """Change the stock of a (zone, type); None stops selling it there. Restored by ``reset()``."""
        if region not in REGIONS or zone not in REGIONS[region][1]:
            raise ValueError(f"unknown zone {zone!r} in {region!r}")
        if instance_type not in self._catalogue:
            raise ValueError(f"unknown instance type {instance_type!r}")
        if category is not None and category not in STOCK_CATEGORIES:
            raise ValueError(f"category must be one of {sorted(STOCK_CATEGORIES)} or None")
        with self._lock:
            if category is None:
                self._stock.pop((region, zone, instance_type), None)
            else:
                self._stock[(region, zone, instance_type)] = category

    def on_demand_price(self, region: str, instance_type: str) -> Decimal | None:
        row = self._prices.get((region, instance_type))
        return row.on_demand if row else None

    def set_account_site(self, access_key_id: str, site: str) -> None:
        """Put the account of ``access_key_id`` on a site (``SITE_CURRENCIES``): its price answers then state that
        site's currency and carry only prices in it. Restored to ``DEFAULT_SITE`` by ``reset()``."""
        if site not in SITE_CURRENCIES:
            raise ValueError(f"site must be one of {sorted(SITE_CURRENCIES)}")
        with self._lock:
            self._sites[access_key_id] = site

    def currency_of(self, access_key_id: str) -> str:
        with self._lock:
            return SITE_CURRENCIES[self._sites.get(access_key_id, DEFAULT_SITE)]

    def set_price(self, region: str, instance_type: str, amount: Decimal, currency: str) -> None:
        """An hourly list price in ``currency`` (e.g. a USD price for International accounts) until ``reset()``."""
        if currency not in SITE_CURRENCIES.values():
            raise ValueError(f"currency must be one of {sorted(SITE_CURRENCIES.values())}")
        if instance_type not in self._catalogue:
            raise ValueError(f"unknown instance type {instance_type!r}")
        with self._lock:
            self._set_prices[(currency, region, instance_type)] = amount

    def list_price(self, currency: str, region: str, instance_type: str) -> Decimal | None:
        """The hourly price an account billed in ``currency`` is quoted, or None when none is known."""
        row = self._prices.get((region, instance_type))
        if row is not None and row.currency == currency:
            return row.on_demand
        with self._lock:
            return self._set_prices.get((currency, region, instance_type))

    def add_spot_price(
        self,
        region: str,
        instance_type: str,
        zone: str,
        price: Decimal,
        *,
        currency: str,
        timestamp: datetime,
        origin_price: Decimal | None = None,
    ) -> None:
        """Add a point to the spot price history that accounts billed in ``currency`` see, until ``reset()``."""
        if zone not in self.zones(region):
            raise ValueError(f"unknown zone {zone!r} in {region!r}")
        if currency not in SITE_CURRENCIES.values():
            raise ValueError(f"currency must be one of {sorted(SITE_CURRENCIES.values())}")
        point = SpotPricePoint(zone, price, currency, timestamp.astimezone(UTC), origin_price)
        with self._lock:
            self._spot_history.setdefault((region, instance_type), []).append(point)

    def accept_access_keys(self, access_key_ids: Iterable[str] | None) -> None:
        """Accept only these key ids (InvalidAccessKeyId.NotFound for others); None restores the default rule:
        any non-empty key that does not start with ``bad``."""
        with self._lock:
            self._valid_keys = frozenset(access_key_ids) if access_key_ids is not None else None

    def register_key(self, access_key_id: str, secret: str) -> None:
        """Verify this key's signatures with ``secret`` (SignatureDoesNotMatch on a mismatch) until ``reset()``."""
        with self._lock:
            self._secrets[access_key_id] = secret

    def key_accepted(self, access_key_id: str) -> bool:
        with self._lock:
            valid = self._valid_keys
        if valid is not None:
            return access_key_id in valid
        return bool(access_key_id) and not access_key_id.startswith("bad")

    def instances(self, region: str | None = None) -> list[SandboxInstance]:
        """Every instance ever launched since the last reset, released ones with state ``Deleted``."""
        with self._lock:
            found = [
                SandboxInstance(
                    instance_id=i.instance_id,
                    region=i.region,
                    zone=i.zone,
                    instance_type=i.instance_type,
                    state=i.status,
                    spot_strategy=i.spot_strategy,
                    client_token=i.client_token,
                    image_id=i.image_id,
                    tags=dict(i.tags),
                    user_data=i.user_data,
                    system_disk_gb=i.system_disk_gb,
                    key_pair_name=i.key_pair_name,
                    security_group_id=i.security_group_id,
                    vswitch_id=i.vswitch_id,
                )
                for i in self._instances.values()
                if region is None or i.region == region
            ]
        return sorted(found, key=lambda i: (i.region, i.instance_id))

    def reset(self) -> None:
        self.faults.clear()
        with self._lock:
            self._instances.clear()
            self._tokens.clear()
            self._token_locks.clear()
            self._release_tokens.clear()
            self.clear_calls()
            self._nonces.clear()
            self._nonce_set.clear()
            self._valid_keys = None
            self._secrets = dict(self._default_secrets)
            self._stock = self._default_stock()
            self._set_prices.clear()
            self._spot_history.clear()
            self._sites.clear()
            self.boot_observations = 0
        self.resources.reset()
        self.booter.reset()

    def control_extra(self, request: Request, route: str) -> Response | None:
        if route == "credentials" and request.method in ("PUT", "POST"):
            body = request.get_json(force=True, silent=True) or {}
            keys = body.get("valid_access_key_ids")
            self.accept_access_keys(keys if keys is None else [str(k) for k in keys])
            for key_id, secret in (body.get("key_secrets") or {}).items():
                self.register_key(str(key_id), str(secret))
            return json_response({"valid_access_key_ids": keys, "key_secrets": sorted(body.get("key_secrets") or {})})
        if route == "calls" and request.method == "GET":
            return json_response({"calls": [[c.action, c.region] for c in self.calls()]})
        if route == "sites" and request.method in ("PUT", "POST"):
            body = request.get_json(force=True, silent=True) or {}
            key_id = str(body.get("access_key_id") or "")
            try:
                self.set_account_site(key_id, str(body.get("site") or ""))
            except ValueError as exc:
                return json_response({"error": str(exc)}, status=400)
            return json_response({"access_key_id": key_id, "currency": self.currency_of(key_id)})
        if route == "instances" and request.method == "GET":
            return json_response(
                {
                    "instances": [
                        {
                            "instance_id": i.instance_id,
                            "region": i.region,
                            "zone": i.zone,
                            "state": i.state,
                            "image_id": i.image_id,
                            "system_disk_gb": i.system_disk_gb,
                            "key_pair_name": i.key_pair_name,
                            "security_group_id": i.security_group_id,
                            "user_data_bytes": len(base64.b64decode(i.user_data)) if i.user_data else 0,
                        }
                        for i in self.instances()
                    ]
                }
            )
        if route == "stock" and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            self.set_stock(
                str(body["region"]), str(body["zone"]), str(body["instance_type"]), body.get("status_category")
            )
            return json_response(
                {"stock": self.stock(str(body["region"]), str(body["zone"]), str(body["instance_type"]))}
            )
        return None

    # -------------------------------------------------------------------------------------- routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        body = request.get_data()
        query = dict(parse_qsl(str(environ.get("QUERY_STRING", "")), keep_blank_values=True))
        params = dict(query)
        if request.mimetype == "application/x-www-form-urlencoded" and body:
            params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        action = request.headers.get("x-acs-action", "")
        instance_types = [v for k, v in params.items() if k == "InstanceType" or k.startswith("InstanceTypes.")]
        req = _Request(
            action=action,
            region=params.get("RegionId", ""),
            params=params,
            instance_types=tuple(instance_types),
            zone=params.get("ZoneId") or None,
        )
        try:
            req.access_key_id = self._credential_of(request)
        except WireError:
            req.access_key_id = ""
        with self._lock:
            self.record_call(Call(action, req.region, req.access_key_id, req.instance_types, req.zone))
        try:
            if request.path != "/" or request.method not in ("POST", "GET"):
                raise WireError(
                    "InvalidAction.NotFound", "Specified api is not found, please check your url and method.", 404
                )
            self._authenticate(request, query, body)
            fault = self._transport_fault(req)
            if fault is not None:
                raise self._fault_error(fault)
            if request.headers.get("x-acs-version") != wire.API_VERSION:
                raise WireError(
                    "InvalidVersion", f"Specified parameter Version is not valid; use {wire.API_VERSION}.", 400
                )
            handler = self._handlers.get(action)
            if handler is None:
                raise WireError("InvalidAction.NotFound", f"Specified api {action!r} is not found.", 404)
            response = wire.json_ok(handler(req))
        except WireError as error:
            response = wire.error_response(error, req.region)
        return response(environ, start_response)

    @staticmethod
    def _credential_of(request: Request) -> str:
        return wire.parse_authorization(request.headers.get("Authorization", "")).access_key_id

    def _authenticate(self, request: Request, query: dict[str, str], body: bytes) -> None:
        """Shape, payload hash and key of the ACS3 signature; the HMAC itself for keys with a registered secret."""
        auth = wire.parse_authorization(request.headers.get("Authorization", ""))
        payload_hash = hashlib.sha256(body).hexdigest()
        if request.headers.get("x-acs-content-sha256", "") != payload_hash:
            raise WireError("SignatureDoesNotMatch", "The x-acs-content-sha256 header does not match the body.", 400)
        if not self.key_accepted(auth.access_key_id):
            raise WireError(*self._code("InvalidAccessKeyId.NotFound"))
        with self._lock:
            secret = self._secrets.get(auth.access_key_id)
        if secret is not None:
            canonical = wire.canonical_request(
                request.method,
                request.path,
                query,
                lambda name: request.headers.get(name, ""),
                auth.signed_headers,
                payload_hash,
            )
            if not hmac.compare_digest(wire.signature(secret, canonical), auth.signature):
                raise WireError("SignatureDoesNotMatch", "Specified signature does not match our calculation.", 400)
        nonce = request.headers.get("x-acs-signature-nonce", "")
        with self._lock:
            if nonce in self._nonce_set:
                raise WireError("SignatureNonceUsed", "Specified signature nonce was used already.", 400)
            # Bounded memory: a long-running sandbox forgets the oldest nonces (ECS keeps them for 15 minutes).
            if len(self._nonces) == self._nonces.maxlen:
                self._nonce_set.discard(self._nonces[0])
            self._nonces.append(nonce)
            self._nonce_set.add(nonce)

    @staticmethod
    def _code(code: str) -> tuple[str, str, int]:
        for known, status, message in ECS_FAULTS.values():
            if known == code:
                return code, message, status
        return code, f"Sandbox fault {code}.", CODE_STATUS.get(code, 400)

    def _fault_error(self, fault: Fault) -> WireError:
        if fault.code:
            return WireError(*self._code(fault.code))
        code, status, message = ECS_FAULTS[fault.kind]
        return WireError(code, message, status)

    def _transport_fault(self, req: _Request) -> Fault | None:
        fault = self.faults.take(req.action, req.instance_types, req.zone, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(
                req.action, req.instance_types, req.zone, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        return fault

    def _region(self, req: _Request) -> str:
        region = wire.required(req.params, "RegionId")
        if region not in REGIONS:
            raise WireError("InvalidRegionId.NotFound", f"The specified RegionId {region!r} does not exist.", 404)
        return region

    def _zone(self, region: str, zone: str) -> str:
        if zone not in REGIONS[region][1]:
            raise WireError("InvalidZoneId.NotFound", "The specified zoneId does not exist.", 404)
        return zone


def start_alibaba_sandbox(host: str = "127.0.0.1", port: int = 0) -> AlibabaSandbox:
    """Build an ``AlibabaSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = AlibabaSandbox()
    sandbox.start(host, port)
    return sandbox
