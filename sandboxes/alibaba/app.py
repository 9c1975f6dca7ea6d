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
import binascii
import csv
import hashlib
import hmac
import itertools
import json
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.wrappers import Request, Response

from providers import gpu_names
from sandboxes.alibaba import wire
from sandboxes.alibaba.resources import EcsResources, SandboxImage, bindings_of
from sandboxes.alibaba.wire import WireError
from sandboxes.boot import simulated_gpus
from sandboxes.faults import OUTCOME_KINDS, TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

SEED_PATH = Path(__file__).parent / "prices.csv"
# The demo account's key pair: registered at start-up (and after every reset), so its signatures are verified.
DEMO_CREDENTIALS: dict[str, str] = {"access_key_id": "LTAI5tDemoSandbox0001", "access_key_secret": "sandbox-secret"}
NONCE_MEMORY = 10_000

# Regions the sandbox knows: (local name, zones, instance id prefix). Only cn-shanghai is seeded with prices
# and stock; cn-beijing exists so multi-region reads (find_by_order) have a second, empty region.
REGIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cn-shanghai": ("East China 2 (Shanghai)", ("cn-shanghai-e", "cn-shanghai-f", "cn-shanghai-g"), "uf6"),
    "cn-beijing": ("North China 2 (Beijing)", ("cn-beijing-h", "cn-beijing-i", "cn-beijing-j"), "2ze"),
}

# SYNTHETIC stock (no source has Alibaba stock data): every seeded type is WithStock in every seeded zone except
# these, chosen to exercise each category. None = the zone does not sell the type at all.
DEFAULT_STOCK: dict[tuple[str, str, str], str | None] = {
    ("cn-shanghai", "cn-shanghai-e", "ecs.ebmgn7e.32xlarge"): "WithoutStock",
    ("cn-shanghai", "cn-shanghai-g", "ecs.gn7-c13g1.26xlarge"): "ClosedWithStock",
    ("cn-shanghai", "cn-shanghai-f", "ecs.gn6v-c8g1.16xlarge"): None,
}
STOCK_CATEGORIES = frozenset({"WithStock", "ClosedWithStock", "WithoutStock"})

# The seed's gpu_model column -> the broker's GPU key, for the GPUs a booted machine shows.
SEED_GPU_KEYS: dict[str, str] = {
    "T4": gpu_names.T4,
    "V100": gpu_names.V100_16_SXM2,
    "V100-32GB": gpu_names.V100_32_SXM2,
    "A10": gpu_names.A10,
    "A100": gpu_names.A100_40_SXM,
    "A100-80GB": gpu_names.A100_80_SXM,
}
# RunInstances reference: UserData "cannot exceed 32 KB before Base64 encoding"; SystemDisk.Size 20 to 2048 GiB for
# the default categories, at least the image's size, and max{40, image size} when not given.
USER_DATA_MAX_BYTES = 32 * 1024
SYSTEM_DISK_MIN_GB = 20
SYSTEM_DISK_MAX_GB = 2048
SYSTEM_DISK_DEFAULT_GB = 40

# The seed's gpu_model column -> the GPUSpec string ECS reports.
GPU_SPECS: dict[str, str] = {
    "T4": "NVIDIA T4",
    "V100": "NVIDIA V100",
    "V100-32GB": "NVIDIA V100",
    "A10": "NVIDIA A10",
    "A100": "NVIDIA A100",
    "A100-80GB": "NVIDIA A100",
}
# CPU-only types, so the catalogue read has something to filter out: (type, family, vCPUs, GiB).
CPU_TYPES: tuple[tuple[str, str, int, float], ...] = (
    ("ecs.g7.large", "ecs.g7", 2, 8.0),
    ("ecs.c7.xlarge", "ecs.c7", 4, 8.0),
    ("ecs.r7.2xlarge", "ecs.r7", 8, 64.0),
)
INSTANCE_TYPES_MAX_RESULTS = 1600
INSTANCE_TYPES_DEFAULT_RESULTS = 250
INSTANCES_MAX_RESULTS = 100
STATUS_MAX_PAGE = 50
SPOT_STRATEGIES = frozenset({"NoSpot", "SpotAsPriceGo", "SpotWithPriceLimit"})
# The currency each Alibaba Cloud site bills in, as DescribePrice (PriceInfo.Price.Currency) and
# DescribeSpotPriceHistory (Currency) state it: "China site: CNY. International site: USD." (ECS API reference).
SITE_CURRENCIES: dict[str, str] = {"china": "CNY", "international": "USD"}
DEFAULT_SITE = "china"

# What each fault kind looks like on the ECS wire: (Code, HTTP status, Message).
ECS_FAULTS: dict[FaultKind, tuple[str, int, str]] = {
    FaultKind.CAPACITY: (
        "OperationDenied.NoStock",
        403,
        "The requested resource is sold out in the specified zone; try other types of resources or other regions "
        "and zones.",
    ),
    FaultKind.QUOTA: (
        "QuotaExceed.ElasticQuota",
        403,
        "No additional quota is available for the specified ECS instance type.",
    ),
    # ECS throttles with HTTP 400: only the code says it is transient.
    FaultKind.THROTTLE: ("Throttling.User", 400, "Request was denied due to user flow control."),
    FaultKind.CREDENTIALS: ("InvalidAccessKeyId.NotFound", 404, "Specified access key is not found."),
}
CODE_STATUS: dict[str, int] = {
    "OperationDenied.NoStock": 403,
    "Zone.NotOnSale": 403,
    "InvalidResourceType.NotSupported": 403,
    "InstanceType.Offline": 403,
    "QuotaExceed.ElasticQuota": 403,
    "Throttling": 400,
    "Throttling.User": 400,
    "Throttling.Api": 400,
    "ServiceUnavailable": 503,
    "InternalError": 500,
    "InvalidAccessKeyId.NotFound": 404,
    "InvalidAccessKeyId.Inactive": 400,
    "SignatureDoesNotMatch": 400,
    "Forbidden.RAM": 403,
}
_STATUS_READS = frozenset({"DescribeInstances", "DescribeInstanceStatus"})


# ------------------------------------------------------------------------------------------------ seed


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: an hourly list price for a (region, instance type), with source."""

    region: str
    instance_type: str
    family: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: Decimal
    on_demand: Decimal
    spot: Decimal | None
    currency: str
    source: str
    source_date: str
    note: str = ""


def load_seed(path: Path = SEED_PATH) -> list[SeedPrice]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            SeedPrice(
                region=row["region"],
                instance_type=row["instance_type"],
                family=row["instance_type_family"],
                gpu_model=row["gpu_model"],
                gpu_count=int(row["gpu_count"]),
                gpu_memory_gb=int(row["gpu_memory_gb_each"]),
                vcpus=int(row["vcpus"]),
                memory_gib=Decimal(row["memory_gib"]),
                on_demand=Decimal(row["on_demand_cny"]),
                spot=Decimal(row["spot_cny"]) if row["spot_cny"] else None,
                currency=row["currency"],
                source=row["source"],
                source_date=row["source_date"],
                note=row.get("note", ""),
            )
            for row in csv.DictReader(handle)
        ]


def _catalogue_entry(row: SeedPrice) -> dict[str, Any]:
    return {
        "InstanceTypeId": row.instance_type,
        "InstanceTypeFamily": row.family,
        "InstanceCategory": "GPU-accelerated",
        "InstanceFamilyLevel": "EnterpriseLevel",
        "CpuArchitecture": "X86",
        "CpuCoreCount": row.vcpus,
        "MemorySize": float(row.memory_gib),
        "GPUAmount": row.gpu_count,
        "GPUSpec": GPU_SPECS.get(row.gpu_model, row.gpu_model),
        "GPUMemorySize": float(row.gpu_memory_gb),  # per GPU, GiB
        "LocalStorageCategory": "",
        "EniQuantity": 8,
    }


def _cpu_entry(name: str, family: str, vcpus: int, memory: float) -> dict[str, Any]:
    return {
        "InstanceTypeId": name,
        "InstanceTypeFamily": family,
        "InstanceCategory": "General-purpose",
        "InstanceFamilyLevel": "EnterpriseLevel",
        "CpuArchitecture": "X86",
        "CpuCoreCount": vcpus,
        "MemorySize": memory,
        "GPUAmount": 0,
        "GPUSpec": "",
        "GPUMemorySize": 0.0,
        "LocalStorageCategory": "",
        "EniQuantity": 3,
    }


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as the sandbox holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    spot_strategy: str
    client_token: str
    image_id: str
    tags: dict[str, str]
    # What the launch carried, as RunInstances received it (UserData still Base64-encoded).
    user_data: str = ""
    system_disk_gb: int = SYSTEM_DISK_DEFAULT_GB
    key_pair_name: str = ""
    security_group_id: str = ""
    vswitch_id: str = ""


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before authentication and faults were applied."""

    action: str
    region: str
    access_key_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(slots=True)
class _Instance:
    instance_id: str
    region: str
    zone: str
    instance_type: str
    image_id: str
    spot_strategy: str
    spot_price_limit: float
    client_token: str
    tags: dict[str, str]
    created: datetime
    private_ip: str
    vswitch_id: str
    security_group_id: str
    vpc_id: str = ""
    user_data: str = ""
    system_disk_gb: int = SYSTEM_DISK_DEFAULT_GB
    key_pair_name: str = ""
    status: str = "Pending"
    observed: int = 0


@dataclass(frozen=True, slots=True)
class SpotPricePoint:
    """One point of a (region, instance type)'s spot price history, in the currency of the site it is shown to."""

    zone: str
    price: Decimal
    currency: str
    timestamp: datetime
    origin_price: Decimal | None = None


@dataclass(frozen=True, slots=True)
class _Stored:
    fingerprint: tuple[tuple[str, str], ...]
    body: dict[str, Any]


@dataclass(slots=True)
class _Request:
    action: str
    region: str
    params: dict[str, str]
    access_key_id: str = ""
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


def _spot_row(point: SpotPricePoint, instance_type: str, network_type: str) -> dict[str, Any]:
    """A ``SpotPrices.SpotPriceType`` entry of DescribeSpotPriceHistory."""
    row: dict[str, Any] = {
        "ZoneId": point.zone,
        "InstanceType": instance_type,
        "IoOptimized": "optimized",
        "NetworkType": network_type,
        "SpotPrice": float(point.price),
        "Timestamp": point.timestamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if point.origin_price is not None:
        row["OriginPrice"] = float(point.origin_price)
    return row


def _minutes(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


# --------------------------------------------------------------------------------------------- sandbox


class AlibabaSandbox(SandboxApp):
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

    # ------------------------------------------------------------------------------------ catalogue

    def _describe_regions(self, req: _Request) -> dict[str, Any]:
        regions = [
            {"RegionId": r, "LocalName": name, "RegionEndpoint": f"ecs.{r}.aliyuncs.com", "Status": "available"}
            for r, (name, _, _) in sorted(REGIONS.items())
        ]
        return {"Regions": {"Region": regions}}

    def _describe_instance_types(self, req: _Request) -> dict[str, Any]:
        params = req.params
        wanted = set(wire.indexed_list(params, "InstanceTypes"))
        families = set(wire.indexed_list(params, "InstanceTypeFamilies"))
        if params.get("InstanceTypeFamily"):
            families.add(params["InstanceTypeFamily"])
        min_gpus = wire.integer(params, "MinimumGPUAmount", 0, 0, 1000)
        max_gpus = wire.integer(params, "MaximumGPUAmount", 1000, 0, 1000)
        gpu_spec = params.get("GPUSpec", "")
        max_results = wire.integer(params, "MaxResults", INSTANCE_TYPES_DEFAULT_RESULTS, 1, INSTANCE_TYPES_MAX_RESULTS)
        matches = [
            entry
            for name, entry in sorted(self._catalogue.items())
            if (not wanted or name in wanted)
            and (not families or entry["InstanceTypeFamily"] in families)
            and min_gpus <= entry["GPUAmount"] <= max_gpus
            and (not gpu_spec or entry["GPUSpec"] == gpu_spec)
        ]
        page, token = self._page(matches, params, max_results)
        return {"NextToken": token, "InstanceTypes": {"InstanceType": page}}

    def _page(self, items: list[Any], params: dict[str, str], size: int) -> tuple[list[Any], str]:
        return wire.token_page(items, params, size)

    def _describe_available_resource(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        destination = wire.required(params, "DestinationResource")
        if destination not in ("InstanceType", "Zone"):
            raise WireError(
                "InvalidParameter",
                f'The sandbox answers DestinationResource "InstanceType" or "Zone", not {destination!r}.',
            )
        charge_type = params.get("InstanceChargeType") or "PostPaid"
        if charge_type not in ("PostPaid", "PrePaid"):
            raise WireError(
                "InvalidInstanceChargeType.NotFound", "The InstanceChargeType does not exist in our records", 404
            )
        if (params.get("SpotStrategy") or "NoSpot") not in SPOT_STRATEGIES:
            raise WireError("InvalidSpotStrategy", "The specified SpotStrategy is not valid.", 400)
        zones = [self._zone(region, params["ZoneId"])] if params.get("ZoneId") else list(REGIONS[region][1])
        only_type = params.get("InstanceType") or None
        with self._lock:
            stock = dict(self._stock)
        answer: list[dict[str, Any]] = []
        for zone in zones:
            offered = sorted(
                (name, category)
                for (r, z, name), category in stock.items()
                if r == region and z == zone and (only_type is None or name == only_type)
            )
            if not offered:  # like ECS, a zone that sells none of the asked types is left out
                continue
            categories = {category for _, category in offered}
            zone_category = next(c for c in ("WithStock", "ClosedWithStock", "WithoutStock") if c in categories)
            if destination == "InstanceType":
                resources = [
                    {"Value": name, "Status": self._sale_status(category), "StatusCategory": category}
                    for name, category in offered
                ]
            else:
                resources = [
                    {"Value": zone, "Status": self._sale_status(zone_category), "StatusCategory": zone_category}
                ]
            answer.append(
                {
                    "ZoneId": zone,
                    "RegionId": region,
                    "Status": self._sale_status(zone_category),
                    "StatusCategory": zone_category,
                    "AvailableResources": {
                        "AvailableResource": [
                            {"Type": destination, "SupportedResources": {"SupportedResource": resources}}
                        ]
                    },
                }
            )
        return {"AvailableZones": {"AvailableZone": answer}}

    @staticmethod
    def _sale_status(category: str) -> str:
        return "SoldOut" if category == "WithoutStock" else "Available"

    def _describe_price(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        resource_type = params.get("ResourceType") or "instance"
        if resource_type != "instance":
            raise WireError(
                "InvalidParameter", f"The sandbox prices ResourceType instance only, not {resource_type!r}."
            )
        instance_type = wire.required(params, "InstanceType")
        if instance_type not in self._catalogue:
            raise WireError(
                "InvalidInstanceType.ValueNotSupported",
                "The specified InstanceType does not exist or beyond the permitted range.",
                400,
            )
        if params.get("ZoneId"):
            self._zone(region, params["ZoneId"])
        # Only hourly pay-as-you-go prices were sourced; the real API's default unit (Month) is not served.
        if params.get("PriceUnit") != "Hour":
            raise WireError(
                "InvalidParameter", "The sandbox serves PriceUnit=Hour only (the sourced prices are hourly)."
            )
        if (params.get("SpotStrategy") or "NoSpot") != "NoSpot":
            raise WireError("PriceNotFound", "No spot price was sourced for Alibaba Cloud; none is served.", 400)
        currency = self.currency_of(req.access_key_id)
        amount = self.list_price(currency, region, instance_type)
        if amount is None:
            raise WireError("PriceNotFound", f"No sourced {currency} price for {instance_type} in {region}.", 400)
        price = float(amount)
        detail = {"Resource": "instanceType", "OriginalPrice": price, "DiscountPrice": 0.0, "TradePrice": price}
        return {
            "PriceInfo": {
                "Price": {
                    "OriginalPrice": price,
                    "DiscountPrice": 0.0,
                    "TradePrice": price,
                    "Currency": currency,
                    "DetailInfos": {"DetailInfo": [detail]},
                },
                "Rules": {"Rule": []},
            }
        }

    def _describe_spot_price_history(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        instance_type = wire.required(params, "InstanceType")
        network_type = wire.required(params, "NetworkType")
        if network_type not in ("classic", "vpc"):
            raise WireError("InvalidParameter", 'The specified parameter "NetworkType" is not valid.')
        bounds: dict[str, datetime] = {}
        for name in ("StartTime", "EndTime"):
            if params.get(name):
                try:
                    bounds[name] = datetime.strptime(params[name], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                except ValueError:
                    raise WireError("InvalidParameter", f'The specified parameter "{name}" is not valid.') from None
        currency = self.currency_of(req.access_key_id)
        with self._lock:
            history = list(self._spot_history.get((region, instance_type), ()))
        # No Alibaba spot price was sourced: only points a test added are served, in the account's currency.
        rows = [
            _spot_row(p, instance_type, network_type)
            for p in sorted(history, key=lambda p: (p.timestamp, p.zone))
            if p.currency == currency
            and params.get("ZoneId") in (None, "", p.zone)
            and bounds.get("StartTime", p.timestamp) <= p.timestamp <= bounds.get("EndTime", p.timestamp)
        ]
        return {"Currency": currency, "NextOffset": 0, "SpotPrices": {"SpotPriceType": rows}}

    # ------------------------------------------------------------------------------------ instances

    def _run_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        launch = self._launch_request(region, params)
        token = params.get("ClientToken", "")
        if token and (len(token) > 64 or not token.isascii()):
            raise WireError("InvalidClientToken.ValueNotSupported", "The ClientToken provided is invalid.", 400)
        if not token:
            return self._create(req, region, launch)
        key = (region, token)
        # Every other parameter is part of the request's identity: a token reused for another request is refused.
        fingerprint = tuple(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first, then gets its answer.
        with token_lock:
            with self._lock:
                stored = self._tokens.get(key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    raise WireError(
                        "IdempotenceParamNotMatch",
                        "Request uses a client token in a previous request but is not identical to that request.",
                        400,
                    )
                return json.loads(json.dumps(stored.body))  # a copy: the stored answer must stay as first sent
            body = self._create(req, region, launch)
            with self._lock:
                self._tokens[key] = _Stored(fingerprint, body)
            return body

    def _launch_request(self, region: str, params: dict[str, str]) -> dict[str, Any]:
        """Validate a RunInstances request (final errors only) and return what ``_create`` needs."""
        instance_type = wire.required(params, "InstanceType")
        if instance_type not in self._catalogue:
            raise WireError(
                "InvalidInstanceType.ValueNotSupported",
                "The specified InstanceType does not exist or beyond the permitted range.",
                400,
            )
        image = self.resources.image(region, wire.required(params, "ImageId"))
        if image is None:
            raise WireError("InvalidImageId.NotFound", "The specified ImageId does not exist.", 404)
        zone = self._zone(region, params["ZoneId"]) if params.get("ZoneId") else ""
        amount = wire.integer(params, "Amount", 1, 1, 100)
        min_amount = wire.integer(params, "MinAmount", amount, 1, 100)
        if min_amount > amount:
            raise WireError("InvalidMinAmount.Malformed", "The specified parameter MinAmount is not valid.", 400)
        charge_type = params.get("InstanceChargeType") or "PostPaid"
        if charge_type != "PostPaid":
            raise WireError("InvalidParameter", "The sandbox sells pay-as-you-go (PostPaid) instances only.")
        strategy = params.get("SpotStrategy") or "NoSpot"
        if strategy not in SPOT_STRATEGIES:
            raise WireError("InvalidSpotStrategy", "The specified SpotStrategy is not valid.", 400)
        limit = 0.0
        if strategy == "SpotWithPriceLimit":
            try:
                limit = float(wire.required(params, "SpotPriceLimit"))
            except ValueError:
                limit = -1.0
            if limit <= 0:
                raise WireError("InvalidSpotPriceLimit", "The specified SpotPriceLimitis not valid.", 400)
        tags = wire.tags(params)
        user_data = self._user_data(params)
        disk = self._system_disk(params, image)
        key_pair = params.get("KeyPairName") or ""
        if key_pair and self.resources.key_pair(region, key_pair) is None:
            raise WireError(
                "InvalidKeyPairName.NotFound", "The specified KeyPairName does not exist in our records.", 404
            )
        prefix = REGIONS[region][2]
        vswitch_id = params.get("VSwitchId") or f"vsw-sandbox{prefix}"
        vswitch = self.resources.vswitch(region, vswitch_id)
        if vswitch is not None and zone and vswitch.zone != zone:
            raise WireError("InvalidParameter.Mismatch", "Specified virtual switch is not in the specified zone.", 400)
        if vswitch is not None and not zone:  # ECS launches in the vSwitch's zone when no zone is named
            zone = vswitch.zone
        vpc_id = vswitch.vpc_id if vswitch is not None else f"vpc-sandbox{prefix}"
        group_id = params.get("SecurityGroupId") or f"sg-sandbox{prefix}"
        group = self.resources.group(group_id)
        if self.resources.group_deleted(group_id) or (group is not None and group.region != region):
            raise WireError("InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist.", 404)
        if group is not None and group.vpc_id != vpc_id:
            raise WireError(
                "InvalidParameter.Mismatch", "Specified security group and virtual switch are not in the same VPC.", 400
            )
        return {
            "instance_type": instance_type,
            "image_id": image.image_id,
            "zone": zone,
            "amount": amount,
            "strategy": strategy,
            "limit": limit,
            "tags": tags,
            "vswitch_id": vswitch_id,
            "vpc_id": vpc_id,
            "security_group_id": group_id,
            "user_data": user_data,
            "system_disk_gb": disk,
            "key_pair_name": key_pair,
        }

    @staticmethod
    def _user_data(params: dict[str, str]) -> str:
        """UserData as sent: Base64 of at most 32 KB of raw data (the limit counts the bytes before encoding)."""
        encoded = params.get("UserData") or ""
        if not encoded:
            return ""
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise WireError("InvalidUserData.Base64FormatInvalid", "The specified UserData is not valid", 400) from None
        if len(raw) > USER_DATA_MAX_BYTES:
            raise WireError("InvalidUserData.SizeExceeded", 'The specified parameter "UserData" exceeds the size.', 400)
        return encoded

    @staticmethod
    def _system_disk(params: dict[str, str], image: SandboxImage) -> int:
        """SystemDisk.Size in GiB: 20 to 2048 and not below the image (ECS answers these refusals with 404)."""
        raw = params.get("SystemDisk.Size") or ""
        if not raw:
            return max(SYSTEM_DISK_DEFAULT_GB, image.size_gb)
        try:
            size = int(raw)
        except ValueError:
            raise WireError(
                "InvalidSystemDiskSize", "The specified parameter SystemDisk.Size is invalid.", 404
            ) from None
        if size < SYSTEM_DISK_MIN_GB:
            raise WireError(
                "InvalidSystemDiskSize.LessThanMinSize",
                "The specified parameter SystemDisk.Size is less than the min size.",
                404,
            )
        if size > SYSTEM_DISK_MAX_GB:
            raise WireError(
                "InvalidSystemDiskSize.MoreThanMaxSize",
                "The specified parameter SystemDisk.Size is more than the max size.",
                404,
            )
        if size < image.size_gb:
            raise WireError(
                "InvalidSystemDiskSize.LessThanImageSize",
                "The specified parameter SystemDisk.Size is less than the image size.",
                404,
            )
        return size

    def _create(self, req: _Request, region: str, launch: dict[str, Any]) -> dict[str, Any]:
        """What ECS decides after accepting the request: injected outcomes, then stock, then the instances."""
        instance_type = str(launch["instance_type"])
        # Outcome faults fire only for a request ECS would act on: a replayed token returned its answer before.
        fault = self.faults.take(req.action, (instance_type,), launch["zone"] or None, kinds=OUTCOME_KINDS)
        if fault is not None:
            raise self._fault_error(fault)
        zone = str(launch["zone"]) or self._zone_with_stock(region, instance_type)
        category = self.stock(region, zone, instance_type)
        if category is None:
            raise WireError(
                "InvalidInstanceType.ZoneNotSupported", "The specified zone does not support this instancetype.", 403
            )
        if category == "WithoutStock":
            raise WireError(*self._code("OperationDenied.NoStock"))
        now = datetime.now(UTC)
        created: list[str] = []
        with self._lock:
            for _ in range(int(launch["amount"])):
                instance_id = f"i-{REGIONS[region][2]}{uuid.uuid4().hex[:17]}"
                n = next(self._ip_counter)
                self._instances[instance_id] = _Instance(
                    instance_id=instance_id,
                    region=region,
                    zone=zone,
                    instance_type=instance_type,
                    image_id=str(launch["image_id"]),
                    spot_strategy=str(launch["strategy"]),
                    spot_price_limit=float(launch["limit"]),
                    client_token=req.params.get("ClientToken", ""),
                    tags=dict(launch["tags"]),
                    created=now,
                    private_ip=f"172.16.{n // 250}.{n % 250 + 1}",
                    vswitch_id=str(launch["vswitch_id"]),
                    security_group_id=str(launch["security_group_id"]),
                    vpc_id=str(launch["vpc_id"]),
                    user_data=str(launch["user_data"]),
                    system_disk_gb=int(launch["system_disk_gb"]),
                    key_pair_name=str(launch["key_pair_name"]),
                )
                created.append(instance_id)
        price = self.on_demand_price(region, instance_type)
        return {
            "OrderId": str(int(now.timestamp() * 1000)),
            "TradePrice": float(price) if price is not None else 0.0,
            "InstanceIdSets": {"InstanceIdSet": created},
        }

    def _zone_with_stock(self, region: str, instance_type: str) -> str:
        for zone in REGIONS[region][1]:
            if self.stock(region, zone, instance_type) in ("WithStock", "ClosedWithStock"):
                return zone
        raise WireError(*self._code("OperationDenied.NoStock"))

    def _observe(self, instance: _Instance, started: list[_Instance]) -> None:
        """A Describe call saw the instance: it runs after ``boot_observations`` looks (caller holds the lock).
        One that just reached Running is added to ``started``, to boot once the lock is released."""
        if instance.status == "Pending":
            if instance.observed >= self.boot_observations:
                instance.status = "Running"
                started.append(instance)
            instance.observed += 1

    def _boot(self, started: list[_Instance]) -> None:
        """Start the lease agent each instance's user data names, as cloud-init runs it on a real machine."""
        for instance in started:
            key, count, memory = self._gpus.get(instance.instance_type, ("", 0, 0))
            self.booter.boot(
                instance_id=instance.instance_id,
                user_data=base64.b64decode(instance.user_data) if instance.user_data else None,
                gpus=simulated_gpus(key, count, memory),
                instance_type=instance.instance_type,
                zone=instance.zone,
            )

    def _listed(self, region: str) -> list[_Instance]:
        # Released instances vanish from every Describe call, as ECS forgets them; instances() still shows them.
        return sorted(
            (i for i in self._instances.values() if i.region == region and i.status != "Deleted"),
            key=lambda i: (i.created, i.instance_id),
        )

    def _describe_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids: set[str] | None = None
        if params.get("InstanceIds"):
            try:
                parsed = json.loads(params["InstanceIds"])
                if not isinstance(parsed, list) or not all(isinstance(i, str) for i in parsed) or len(parsed) > 100:
                    raise ValueError("not a list of at most 100 ids")
            except ValueError:
                raise WireError(
                    "InvalidInstanceIds.Malformed", "The specified parameter InstanceIds is not valid.", 400
                ) from None
            ids = set(parsed) if parsed else None
        tags = wire.indexed_pairs(params, "Tag")
        token_mode = bool(params.get("NextToken") or params.get("MaxResults"))
        if token_mode:
            size = wire.integer(params, "MaxResults", 10, 1, INSTANCES_MAX_RESULTS)
        else:
            size = wire.integer(params, "PageSize", 10, 1, INSTANCES_MAX_RESULTS)
            number = wire.integer(params, "PageNumber", 1, 1, 1_000_000)
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if (ids is None or i.instance_id in ids)
                and (not params.get("ZoneId") or i.zone == params["ZoneId"])
                and (not params.get("InstanceType") or i.instance_type == params["InstanceType"])
                and all(k in i.tags and (v is None or v == "" or i.tags[k] == v) for k, v in tags)
            ]
            if token_mode:
                page, token = self._page(matches, params, size)
            else:
                page, token = matches[(number - 1) * size : number * size], ""
            started: list[_Instance] = []
            for instance in page:
                self._observe(instance, started)
            items = [self._instance_item(i) for i in page]
        self._boot(started)
        body: dict[str, Any] = {"TotalCount": len(matches), "Instances": {"Instance": items}}
        if token_mode:
            body["NextToken"] = token
        else:
            body.update({"PageNumber": number, "PageSize": size})
        return body

    def _instance_item(self, i: _Instance) -> dict[str, Any]:
        entry = self._catalogue[i.instance_type]
        image = self.resources.image(i.region, i.image_id)
        return {
            "InstanceId": i.instance_id,
            "InstanceName": i.instance_id,
            "HostName": f"iZ{i.instance_id[2:]}Z",
            "RegionId": i.region,
            "ZoneId": i.zone,
            "InstanceType": i.instance_type,
            "InstanceTypeFamily": entry["InstanceTypeFamily"],
            "Cpu": entry["CpuCoreCount"],
            "Memory": int(entry["MemorySize"] * 1024),  # DescribeInstances reports MiB
            "GPUAmount": entry["GPUAmount"],
            "GPUSpec": entry["GPUSpec"],
            "Status": i.status,
            "CreationTime": _minutes(i.created),
            "StartTime": _minutes(i.created),
            "ExpiredTime": "2099-12-31T15:59Z",
            "ImageId": i.image_id,
            "OSType": "linux",
            "OSName": image.os_name if image is not None else "",
            "InstanceChargeType": "PostPaid",
            "InternetChargeType": "PayByTraffic",
            "InternetMaxBandwidthOut": 0,
            "SpotStrategy": i.spot_strategy,
            "SpotPriceLimit": i.spot_price_limit,
            "InstanceNetworkType": "vpc",
            "IoOptimized": True,
            "DeletionProtection": False,
            "SerialNumber": str(uuid.uuid5(uuid.NAMESPACE_OID, i.instance_id)),
            "PublicIpAddress": {"IpAddress": []},
            "InnerIpAddress": {"IpAddress": []},
            "EipAddress": {"IpAddress": "", "AllocationId": "", "Bandwidth": 0},
            "VpcAttributes": {
                "VpcId": i.vpc_id,
                "VSwitchId": i.vswitch_id,
                "PrivateIpAddress": {"IpAddress": [i.private_ip]},
                "NatIpAddress": "",
            },
            "SecurityGroupIds": {"SecurityGroupId": [i.security_group_id]},
            "KeyPairName": i.key_pair_name,
            "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in sorted(i.tags.items())]},
        }

    def _one_instance(self, req: _Request) -> _Instance:
        """The listed instance ``InstanceId`` names (the caller holds the lock). DescribeInstanceAttribute has no
        RegionId (the regional endpoint says it); one endpoint serves every region here, so the id decides."""
        region = self._region(req) if req.params.get("RegionId") else None
        instance_id = wire.required(req.params, "InstanceId")
        instance = self._instances.get(instance_id)
        if instance is None or region not in (None, instance.region) or instance.status == "Deleted":
            raise WireError("InvalidInstanceId.NotFound", "The specified InstanceId does not exist.", 404)
        return instance

    def _describe_user_data(self, req: _Request) -> dict[str, Any]:
        """DescribeUserData: the UserData the instance was launched with, still Base64-encoded ("" for none)."""
        with self._lock:
            instance = self._one_instance(req)
            return {"InstanceId": instance.instance_id, "RegionId": instance.region, "UserData": instance.user_data}

    def _describe_instance_attribute(self, req: _Request) -> dict[str, Any]:
        """DescribeInstanceAttribute: the instance's image, network, security groups and state."""
        with self._lock:
            instance = self._one_instance(req)
            item = self._instance_item(instance)
        keys = (
            "InstanceId", "InstanceName", "HostName", "RegionId", "ZoneId", "InstanceType", "Cpu", "Memory",
            "Status", "CreationTime", "ExpiredTime", "ImageId", "InstanceChargeType", "InternetChargeType",
            "InternetMaxBandwidthOut", "InstanceNetworkType", "SerialNumber", "PublicIpAddress",
            "InnerIpAddress", "EipAddress", "VpcAttributes", "SecurityGroupIds",
        )  # fmt: skip
        return {
            **{k: item[k] for k in keys},
            "IoOptimized": "optimized",
            "InternetMaxBandwidthIn": 200,
            "Description": "",
            "StoppedMode": "Not-applicable",
            "OperationLocks": {"LockReason": []},
        }

    def _describe_disks(self, req: _Request) -> dict[str, Any]:
        """DescribeDisks: one system disk per listed instance (``SystemDisk.Size`` GiB, released with it);
        InstanceId, DiskType (all, system or data) and ZoneId filters, PageNumber/PageSize pages (at most 100)."""
        params = req.params
        region = self._region(req)
        disk_type = params.get("DiskType") or "all"
        if disk_type not in ("all", "system", "data"):
            raise WireError("InvalidDiskType.ValueNotSupported", 'The specified parameter "DiskType" is not valid.')
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if disk_type != "data"
                and (not params.get("InstanceId") or i.instance_id == params["InstanceId"])
                and (not params.get("ZoneId") or i.zone == params["ZoneId"])
            ]
        page, number, size = wire.number_page(matches, params, 10, 100)
        disks = [
            {
                "DiskId": f"d-{REGIONS[i.region][2]}{hashlib.sha256(i.instance_id.encode()).hexdigest()[:17]}",
                "RegionId": i.region,
                "ZoneId": i.zone,
                "InstanceId": i.instance_id,
                "Type": "system",
                "Category": "cloud_efficiency",
                "Size": i.system_disk_gb,
                "ImageId": i.image_id,
                "Device": "/dev/xvda",
                "Status": "In_use",
                "Portable": False,
                "DeleteWithInstance": True,
                "Encrypted": False,
                "CreationTime": _minutes(i.created),
                "Tags": {"Tag": []},
            }
            for i in page
        ]
        return {"TotalCount": len(matches), "PageNumber": number, "PageSize": size, "Disks": {"Disk": disks}}

    def _describe_instance_status(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids = set(wire.indexed_list(params, "InstanceId"))
        size = wire.integer(params, "PageSize", 10, 1, STATUS_MAX_PAGE)
        number = wire.integer(params, "PageNumber", 1, 1, 1_000_000)
        with self._lock:
            matches = [
                i
                for i in self._listed(region)
                if (not ids or i.instance_id in ids) and (not params.get("ZoneId") or i.zone == params["ZoneId"])
            ]
            page = matches[(number - 1) * size : number * size]
            started: list[_Instance] = []
            for instance in page:
                self._observe(instance, started)
            statuses = [{"InstanceId": i.instance_id, "Status": i.status} for i in page]
        self._boot(started)
        return {
            "TotalCount": len(matches),
            "PageNumber": number,
            "PageSize": size,
            "InstanceStatuses": {"InstanceStatus": statuses},
        }

    def _delete_instances(self, req: _Request) -> dict[str, Any]:
        params = req.params
        region = self._region(req)
        ids = wire.indexed_list(params, "InstanceId")
        if not ids:
            wire.required(params, "InstanceId.1")
        force = wire.boolean(params, "Force")
        token = params.get("ClientToken", "")
        with self._lock:
            if token and (region, token) in self._release_tokens:  # the same release again: same (empty) answer
                return {}
            targets: list[_Instance] = []
            for instance_id in ids:
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != region or instance.status == "Deleted":
                    raise WireError(
                        "InvalidInstanceId.NotFound", f"The specified InstanceId {instance_id} does not exist.", 404
                    )
                # All or nothing: every id is checked before any is released, as one ECS request does.
                if instance.status == "Pending":
                    raise WireError(
                        "IncorrectInstanceStatus.Initializing",
                        "The specified instance is initializing, try again later.",
                        403,
                    )
                if instance.status in ("Running", "Starting", "Stopping") and not force:
                    raise WireError(
                        "IncorrectInstanceStatus",
                        "The current status of the resource does not support this operation.",
                        403,
                    )
                targets.append(instance)
            for instance in targets:
                instance.status = "Deleted"
            if token:
                self._release_tokens.add((region, token))
        for instance in targets:
            self.booter.halt(instance.instance_id)
        return {}


def start_alibaba_sandbox(host: str = "127.0.0.1", port: int = 0) -> AlibabaSandbox:
    """Build an ``AlibabaSandbox`` and serve it on a daemon thread; ``sandbox.url`` is its base URL."""
    sandbox = AlibabaSandbox()
    sandbox.start(host, port)
    return sandbox
