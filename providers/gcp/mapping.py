"""Compute Engine / Cloud Billing shapes (plain dicts, snake_case proto field names) -> broker DTOs, and GCP error
codes -> broker error classes.

Pure functions: nothing here imports the SDK, so the tables are testable offline. ``client.py`` converts every
SDK message to a dict (``Message.to_dict``) before it reaches this module.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.launch import IngressRule, OrderResource
from providers.sshkeys import KEY_TYPES, SshPublicKey
from providers.types import InstanceHandle, InstanceState, QuotaUse

PROVIDER = "gcp"
ORDER_LABEL = "broker-order"  # GCP label keys allow only [a-z0-9_-]: the broker's "broker:order" becomes this
IDEMPOTENCY_METADATA = "broker-client-token"
ORDER_METADATA = "broker-order-ref"  # the unencoded order ref, when the label had to encode it
COMPUTE_SERVICE = "services/6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
# Self links and target links always use this base, whatever endpoint the client talks to.
API_BASE = "https://www.googleapis.com/compute/v1/"
PRICE_PLACES = Decimal("0.00001")
_REQUEST_ID_NAMESPACE = uuid.UUID("5b0f3c1e-2f6a-4c1e-9a43-6f1d2c3b4a50")  # fixed: request ids must be stable

# --------------------------------------------------------------------------------------------- errors

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider (Operation.error.errors[].code, HTTP 503 on the operation)
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityUnavailable,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityUnavailable,
    # quota: skip the region or account (403; GPUS_ALL_REGIONS is account-wide). The camelCase form is the
    # errors[].reason of a synchronous 403, the upper-case one the ErrorInfo reason or operation code.
    "QUOTA_EXCEEDED": QuotaExceeded,
    "quotaExceeded": QuotaExceeded,
    # transient: retry with backoff
    "RESOURCE_OPERATION_RATE_EXCEEDED": TransientProviderError,
    "RATE_LIMIT_EXCEEDED": TransientProviderError,
    "rateLimitExceeded": TransientProviderError,
    "userRateLimitExceeded": TransientProviderError,
    "RESOURCE_EXHAUSTED": TransientProviderError,  # the status name of a 429
    "resourceNotReady": TransientProviderError,  # another operation on the same resource is still running
    "UNAVAILABLE": TransientProviderError,
    "INTERNAL": TransientProviderError,
    "DEADLINE_EXCEEDED": TransientProviderError,
    "backendError": TransientProviderError,
    "internalError": TransientProviderError,
    # credentials: block the account
    "PERMISSION_DENIED": CredentialsRejected,
    "UNAUTHENTICATED": CredentialsRejected,
    "IAM_PERMISSION_DENIED": CredentialsRejected,
    "ACCESS_TOKEN_EXPIRED": CredentialsRejected,
    "SERVICE_DISABLED": CredentialsRejected,  # the API is not enabled for the project: an account setup problem
    "accessNotConfigured": CredentialsRejected,
    "authError": CredentialsRejected,
    "forbidden": CredentialsRejected,
    "invalid_grant": CredentialsRejected,  # OAuth token endpoint: unknown, disabled or deleted key
    "unauthorized_client": CredentialsRejected,
    # final: retrying the same request cannot help
    "notFound": ProviderRequestRejected,
    "NOT_FOUND": ProviderRequestRejected,
    "alreadyExists": ProviderRequestRejected,
    "ALREADY_EXISTS": ProviderRequestRejected,
    "invalid": ProviderRequestRejected,
    "INVALID_ARGUMENT": ProviderRequestRejected,
    "badRequest": ProviderRequestRejected,
    "FAILED_PRECONDITION": ProviderRequestRejected,
    "conditionNotMet": ProviderRequestRejected,
}

# Exceptions raised below HTTP (class names from requests/urllib3/google-auth): the request may not have arrived.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ReadTimeout",
        "ConnectTimeout",
        "Timeout",
        "ConnectionError",
        "ChunkedEncodingError",
        "SSLError",
        "ProxyError",
        "TransportError",
    }
)


def error_class_for(codes: Sequence[str], http_status: int | None = None) -> tuple[type[ProviderError], str]:
    """The broker error class and the deciding code for GCP error codes, most specific first.

    Codes are tried in order (ErrorInfo reason, errors[].reason or operation error code, status name); the first
    known one decides. Without a known code the HTTP status decides: 401/403 credentials, 429 and 5xx transient,
    anything else final.
    """
    for code in codes:
        known = ERROR_CLASSES.get(code)
        if known is not None:
            return known, code
    fallback = next((c for c in codes if c), str(http_status or ""))
    if http_status in (401, 403):
        return CredentialsRejected, fallback
    if http_status == 429 or (http_status is not None and http_status >= 500):
        return TransientProviderError, fallback
    return ProviderRequestRejected, fallback


def error_from_codes(codes: Sequence[str], message: str, http_status: int | None = None) -> ProviderError:
    cls, code = error_class_for([c for c in codes if c], http_status)
    return cls(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


@dataclass(frozen=True, slots=True)
class OperationError:
    """The first error of a failed zone operation, classified."""

    error_class: str
    code: str
    message: str
    http_status: int | None


def operation_error(operation: Mapping[str, Any]) -> OperationError | None:
    """None while the operation has no error; otherwise its classified first error."""
    errors = list((operation.get("error") or {}).get("errors") or [])
    if not errors:
        return None
    codes = [str(e.get("code", "")) for e in errors]
    message = "; ".join(str(e.get("message", "")) for e in errors if e.get("message"))
    status = operation.get("http_error_status_code") or None
    exc = error_from_codes(codes, message, int(status) if status else None)
    return OperationError(exc.error_class, exc.code, exc.message, exc.http_status)


def raise_operation_error(operation: Mapping[str, Any]) -> None:
    failure = operation_error(operation)
    if failure is None:
        return
    codes = [str(e.get("code", "")) for e in (operation.get("error") or {}).get("errors") or []]
    raise error_from_codes(codes, failure.message, failure.http_status)


# ------------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One Compute Engine accelerator type. ``key`` is None for GPUs without a canonical broker key."""

    name: str
    key: str | None
    memory_gb: int
    sku_name: str  # how Cloud Billing names its SKU: "Nvidia <sku_name> GPU running in ..."
    short: str  # how the broker writes it after an N1 host: n1-standard-8+1xT4
    nvlink: bool


ACCELERATORS: dict[str, AcceleratorSpec] = {
    a.name: a
    for a in (
        AcceleratorSpec("nvidia-tesla-t4", gpu_names.T4, 16, "Tesla T4", "T4", nvlink=False),
        AcceleratorSpec("nvidia-tesla-p4", None, 8, "Tesla P4", "P4", nvlink=False),
        AcceleratorSpec("nvidia-tesla-p100", None, 16, "Tesla P100", "P100", nvlink=False),
        # GCP's V100 is the 16 GB SXM2 board; its 8-card N1 hosts are NVLink-connected.
        AcceleratorSpec("nvidia-tesla-v100", gpu_names.V100_16_SXM2, 16, "Tesla V100", "V100", nvlink=True),
        AcceleratorSpec("nvidia-tesla-a100", gpu_names.A100_40_SXM, 40, "Tesla A100", "A100", nvlink=True),
        AcceleratorSpec("nvidia-a100-80gb", gpu_names.A100_80_SXM, 80, "Tesla A100 80GB", "A100-80GB", nvlink=True),
        AcceleratorSpec("nvidia-l4", gpu_names.L4, 24, "L4", "L4", nvlink=False),
        AcceleratorSpec("nvidia-h100-80gb", gpu_names.H100_SXM, 80, "H100 80GB", "H100", nvlink=True),
        AcceleratorSpec("nvidia-h100-mega-80gb", gpu_names.H100_SXM, 80, "H100 80GB Mega", "H100-MEGA", nvlink=True),
        AcceleratorSpec("nvidia-h200-141gb", gpu_names.H200_SXM, 141, "H200 141GB", "H200", nvlink=True),
        AcceleratorSpec("nvidia-b200", gpu_names.B200, 180, "B200", "B200", nvlink=True),
    )
}
ACCELERATOR_BY_SKU_NAME: dict[str, str] = {a.sku_name: a.name for a in ACCELERATORS.values()}
ACCELERATOR_BY_SHORT: dict[str, str] = {a.short.lower(): a.name for a in ACCELERATORS.values()}

# Machine series with bundled GPUs -> the accelerator the series must carry (GPU-SPECS section 5). A catalogue
# entry that contradicts this keeps the raw accelerator name, so ingestion quarantines it.
SERIES_GPU: tuple[tuple[str, str], ...] = (
    ("a2-ultragpu-", "nvidia-a100-80gb"),
    ("a2-", "nvidia-tesla-a100"),
    ("a3-ultragpu-", "nvidia-h200-141gb"),
    ("a3-megagpu-", "nvidia-h100-mega-80gb"),
    ("a3-", "nvidia-h100-80gb"),
    ("a4-", "nvidia-b200"),
    ("g2-", "nvidia-l4"),
)
# Machine type prefix -> the family word of its vCPU and RAM SKUs, longest prefix first.
HOST_FAMILIES: tuple[tuple[str, str], ...] = (
    ("a3-ultragpu-", "A3 Ultra"),
    ("a3-megagpu-", "A3 Mega"),
    ("a3-", "A3"),
    ("a2-", "A2"),
    ("a4-", "A4"),
    ("g2-", "G2"),
    ("n1-", "N1 Predefined"),
)
# Series whose GPUs are attached to the instance (guest_accelerators) rather than part of the machine type.
# The regional quota metric each accelerator type counts against (Compute Engine's GPU quota names).
GPU_QUOTA_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}


def quota_uses(region: Mapping[str, Any]) -> dict[str, QuotaUse]:
    """The ``quotas[]`` of a regions.get answer by metric."""
    uses: dict[str, QuotaUse] = {}
    for item in region.get("quotas") or ():
        try:
            uses[str(item["metric"])] = QuotaUse(str(item["metric"]), float(item["limit"]), float(item.get("usage", 0)))
        except (KeyError, TypeError, ValueError):
            continue
    return uses


def quota_needs(
    quotas: Mapping[str, QuotaUse], accelerator: str, gpus: int, vcpus: int, spot: bool
) -> dict[str, float]:
    """What a launch adds to which metric. Spot VMs count against the PREEMPTIBLE_ quotas where the project has
    them (a limit above zero) and against the standard ones otherwise, as Compute Engine does."""

    def metric(standard: str) -> str:
        preemptible = quotas.get(f"PREEMPTIBLE_{standard}")
        return preemptible.name if spot and preemptible is not None and preemptible.limit > 0 else standard

    needs: dict[str, float] = {}
    gpu_metric = GPU_QUOTA_METRICS.get(accelerator)
    if gpu_metric and gpus:
        needs[metric(gpu_metric)] = gpus
    if vcpus:
        needs[metric("CPUS")] = vcpus
    return needs


ATTACHED_GPU_SERIES = ("n1-",)

# GCP attaches GPUs to any N1 shape; quoting every pairing would flood the catalogue with near-duplicates.
# The broker quotes these (option ``n1_bundles`` replaces the list).
DEFAULT_N1_BUNDLES: tuple[str, ...] = (
    "n1-standard-4+1xT4",
    "n1-standard-8+1xT4",
    "n1-standard-16+2xT4",
    "n1-standard-32+4xT4",
    "n1-standard-16+2xV100",
    "n1-standard-32+4xV100",
    "n1-standard-64+8xV100",
)

_BUNDLE = re.compile(r"^(?P<machine>[a-z][a-z0-9-]*[a-z0-9])\+(?P<count>[1-9]\d*)x(?P<gpu>[A-Za-z0-9-]+)$")


@dataclass(frozen=True, slots=True)
class InstanceTypeName:
    """The broker's instance type split into the machine type and, for N1, the attached GPUs."""

    machine_type: str
    accelerator: str | None = None
    count: int = 0

    def __str__(self) -> str:
        if self.accelerator is None:
            return self.machine_type
        spec = ACCELERATORS.get(self.accelerator)
        return f"{self.machine_type}+{self.count}x{spec.short if spec else self.accelerator}"


def parse_instance_type(name: str) -> InstanceTypeName:
    """``a2-highgpu-1g`` or ``n1-standard-8+1xT4`` (also ``+1xnvidia-tesla-t4``). Raises ProviderRequestRejected."""
    match = _BUNDLE.match(name)
    if match is None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", name):
            raise ProviderRequestRejected(f"not a GCP instance type: {name!r}", code="invalid", provider=PROVIDER)
        return InstanceTypeName(name)
    gpu = match["gpu"]
    accelerator = gpu if gpu in ACCELERATORS else ACCELERATOR_BY_SHORT.get(gpu.lower())
    if accelerator is None:
        raise ProviderRequestRejected(f"unknown GPU {gpu!r} in {name!r}", code="invalid", provider=PROVIDER)
    if not match["machine"].startswith(ATTACHED_GPU_SERIES):
        raise ProviderRequestRejected(
            f"{match['machine']} bundles its GPUs; attach GPUs only to {', '.join(ATTACHED_GPU_SERIES)} machines",
            code="invalid",
            provider=PROVIDER,
        )
    return InstanceTypeName(match["machine"], accelerator, int(match["count"]))


def host_family(machine_type: str) -> str | None:
    return next((family for prefix, family in HOST_FAMILIES if machine_type.startswith(prefix)), None)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    count: int
    memory_gb: int
    interconnect: str
    accelerator: str


def gpu_spec(machine_type: str, accelerator: str, count: int) -> GpuSpec:
    """The canonical key for ``count`` x ``accelerator`` on ``machine_type``; unknown or contradictory -> raw name."""
    spec = ACCELERATORS.get(accelerator)
    expected = next((gpu for prefix, gpu in SERIES_GPU if machine_type.startswith(prefix)), None)
    consistent = expected is None or expected == accelerator
    if spec is None or spec.key is None or not consistent:
        return GpuSpec(accelerator, count, spec.memory_gb if spec else 0, "pcie", accelerator)
    interconnect = "nvlink" if count > 1 and spec.nvlink else "pcie"
    return GpuSpec(spec.key, count, spec.memory_gb, interconnect, accelerator)


# ------------------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class MachineType:
    """One ``machine_types.aggregated_list`` entry."""

    name: str
    zone: str
    vcpus: int
    memory_gib: Decimal
    accelerators: tuple[tuple[str, int], ...]
    description: str


def zone_of_scope(scope: str) -> str | None:
    """``zones/us-central1-a`` -> ``us-central1-a``; regional and global scopes -> None."""
    kind, _, name = scope.partition("/")
    return name if kind == "zones" and name else None


def region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def machine_type(item: Mapping[str, Any], zone: str) -> MachineType:
    try:
        accelerators = tuple(
            (str(a["guest_accelerator_type"]), int(a["guest_accelerator_count"]))
            for a in item.get("accelerators") or []
        )
        return MachineType(
            name=str(item["name"]),
            zone=zone,
            vcpus=int(item["guest_cpus"]),
            memory_gib=Decimal(int(item["memory_mb"])) / Decimal(1024),
            accelerators=accelerators,
            description=str(item.get("description", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable machine type entry ({exc!r})") from None


def accelerator_limits(scoped: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[tuple[str, str], int]:
    """``accelerator_types.aggregated_list`` items -> (zone, accelerator type) -> maximum cards per instance."""
    limits: dict[tuple[str, str], int] = {}
    try:
        for scope, item in scoped:
            zone = zone_of_scope(scope)
            if zone is not None:
                limits[(zone, str(item["name"]))] = int(item.get("maximum_cards_per_instance") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable accelerator type entry ({exc!r})") from None
    return limits


# ------------------------------------------------------------------------------------------------ prices

ON_DEMAND = "OnDemand"
PREEMPTIBLE = "Preemptible"  # Spot VMs are billed on the Preemptible SKUs
# Cloud Billing words spot SKUs differently per resource: a GPU card is "Nvidia Tesla T4 GPU attached to Spot
# Preemptible VMs running in Americas", while vCPU and RAM are "Spot Preemptible N1 Predefined Instance Core
# running in ...". Each pattern says which of the two forms it saw, so the usage type can be checked against it.
_GPU_SKU = re.compile(r"^Nvidia (?P<name>.+?) GPU (?P<spot>attached to Spot Preemptible VMs )?running in ")
_HOST_SKU = re.compile(r"^(?P<spot>Spot Preemptible )?(?P<family>.+?) Instance (?P<resource>Core|Ram) running in ")
UNITS = {"gpu": "h", "core": "h", "ram": "GiBy.h"}


@dataclass(frozen=True, slots=True)
class SkuRate:
    sku_id: str
    price: Decimal
    currency: str


# (region, usage type, resource, family or accelerator type) -> rate
SkuIndex = dict[tuple[str, str, str, str], SkuRate]


def money(value: Mapping[str, Any]) -> Decimal:
    """A ``google.type.Money`` dict -> Decimal (units may arrive as a string: it is an int64)."""
    return Decimal(int(value.get("units") or 0)) + Decimal(int(value.get("nanos") or 0)).scaleb(-9)


def _unit_price(sku: Mapping[str, Any]) -> tuple[Decimal, str, str] | None:
    """(price, currency, usage unit) of the newest pricing info's first tier."""
    infos = list(sku.get("pricing_info") or [])
    if not infos:
        return None
    info = max(infos, key=lambda i: str(i.get("effective_time") or ""))
    expression = info.get("pricing_expression") or {}
    tiers = sorted(expression.get("tiered_rates") or [], key=lambda t: float(t.get("start_usage_amount") or 0))
    if not tiers:
        return None
    price = tiers[0].get("unit_price") or {}
    return money(price), str(price.get("currency_code") or ""), str(expression.get("usage_unit") or "")


def sku_index(skus: Iterable[Mapping[str, Any]]) -> SkuIndex:
    """The GPU, vCPU and RAM rates of Compute Engine SKUs, by region. Other SKUs (disks, licences, commitments)
    are skipped; a SKU whose unit is not per hour (or per GiB-hour for RAM) is skipped too rather than misread."""
    index: SkuIndex = {}
    try:
        for sku in skus:
            category = sku.get("category") or {}
            usage_type = str(category.get("usage_type", ""))
            if category.get("resource_family") != "Compute" or usage_type not in (ON_DEMAND, PREEMPTIBLE):
                continue
            description = str(sku.get("description", ""))
            key: tuple[str, str] | None = None
            described = _GPU_SKU.match(description) or _HOST_SKU.match(description)
            if described is None or (PREEMPTIBLE if described["spot"] else ON_DEMAND) != usage_type:
                # A description and a usage type that disagree name no price we can trust: a spot rate
                # filed as on-demand (or the reverse) would be quoted at the wrong provisioning model.
                continue
            if described.re is _GPU_SKU:
                accelerator = ACCELERATOR_BY_SKU_NAME.get(described["name"])
                key = ("gpu", accelerator) if accelerator else None
            else:
                key = ("core" if described["resource"] == "Core" else "ram", described["family"])
            if key is None:
                continue
            priced = _unit_price(sku)
            if priced is None or priced[2] != UNITS[key[0]]:
                continue
            rate = SkuRate(str(sku.get("sku_id", "")), priced[0], priced[1])
            for region in sku.get("service_regions") or []:
                index.setdefault((str(region), usage_type, *key), rate)
    except (TypeError, ValueError, AttributeError, InvalidOperation) as exc:
        raise malformed(f"unreadable billing SKU ({exc!r})") from None
    return index


@dataclass(frozen=True, slots=True)
class ComposedPrice:
    """A machine's hourly price: the rounded quote, the exact SKU sum and the SKUs it came from."""

    price: Decimal
    exact: Decimal
    currency: str
    sku_ids: dict[str, str]


def compose_price(
    index: SkuIndex,
    region: str,
    usage_type: str,
    family: str,
    vcpus: int,
    memory_gib: Decimal,
    accelerator: str,
    gpu_count: int,
) -> ComposedPrice | None:
    """GPU + vCPU + RAM SKUs summed; None when any part has no SKU (never guess a missing part).

    The quote is rounded half-up to 0.00001 per hour: per-GiB RAM rates leave sub-cent noise in the sum, and five
    places is the precision GCP's own per-machine price tables use.
    """
    parts = (
        ("gpu", accelerator, Decimal(gpu_count)),
        ("core", family, Decimal(vcpus)),
        ("ram", family, memory_gib),
    )
    exact = Decimal(0)
    sku_ids: dict[str, str] = {}
    currencies: set[str] = set()
    for resource, key, quantity in parts:
        rate = index.get((region, usage_type, resource, key))
        if rate is None:
            return None
        exact += rate.price * quantity
        sku_ids[resource] = rate.sku_id
        currencies.add(rate.currency)
    if len(currencies) != 1:
        raise malformed(f"{region} {family}: SKUs in several currencies {sorted(currencies)}")
    price = exact.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)
    return ComposedPrice(price=price, exact=exact, currency=currencies.pop(), sku_ids=sku_ids)


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    # GCP is restarting the instance on another host after a failure: it will be back without a new launch.
    "REPAIRING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING,
    "PENDING_STOP": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.STOPPING,
    # GCP's TERMINATED means *stopped*: the instance and its disks still exist and can be started again, so for
    # the broker it is out of service but not gone. A deleted instance 404s; describe reports that as terminated.
    "TERMINATED": InstanceState.STOPPING,
}
# Statuses in which the outcome lives on an operation: a failed insert or a running delete.
OPERATION_STATUSES = frozenset({"PROVISIONING", "STOPPING"})
GONE_OPERATIONS = frozenset({"delete", "compute.instances.preempted"})


def instance_state(status: str) -> InstanceState:
    return STATES.get(status, InstanceState.UNKNOWN)


def instance_name(client_token: str) -> str:
    """A valid, deterministic instance name for a client token: ``gb-<slug>-<hash>``, at most 59 characters.

    The slug keeps the name readable; the hash keeps two tokens that slug alike apart.
    """
    if not client_token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", client_token.lower())).strip("-")[:44].rstrip("-")
    digest = hashlib.sha256(client_token.encode()).hexdigest()[:10]
    return f"gb-{slug}-{digest}" if slug else f"gb-{digest}"


def request_id(action: str, key: str) -> str:
    """The ``requestId`` GCP deduplicates on: a UUID derived from the action and the broker's key."""
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{action}/{key}"))


_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def label_value(value: str) -> str:
    """A GCP label value for ``value``: itself when valid, else a lower-cased slug plus a hash (deterministic,
    so a search encodes the same way)."""
    if _LABEL_VALUE.match(value):
        return value
    slug = re.sub(r"[^a-z0-9_-]+", "-", value.lower())[:50]
    return f"{slug}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


def labels(order_ref: str, tags: Mapping[str, str]) -> dict[str, str]:
    """Labels for the instance: caller tags made label-safe, then the order label (which always wins)."""
    result: dict[str, str] = {}
    for key, value in sorted(tags.items()):
        safe = re.sub(r"[^a-z0-9_-]+", "_", key.lower())[:63]
        if not _LABEL_KEY.match(safe):
            safe = f"t_{safe}"[:63]
        result[safe] = label_value(value)
    result[ORDER_LABEL] = label_value(order_ref)
    return result


def instance_link(project: str, zone: str, name: str) -> str:
    return f"{API_BASE}projects/{project}/zones/{zone}/instances/{name}"


def split_instance_id(region: str, instance_id: str) -> tuple[str, str]:
    """``<zone>/<name>`` -> (zone, name), checking the zone belongs to ``region``."""
    zone, sep, name = instance_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        raise ProviderRequestRejected(
            f"GCP instance ids are '<zone>/<name>', got {instance_id!r}", code="invalid", provider=PROVIDER
        )
    if region_of_zone(zone) != region:
        raise ProviderRequestRejected(f"zone {zone} is not in region {region}", code="invalid", provider=PROVIDER)
    return zone, name


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def broker_instance_type(item: Mapping[str, Any]) -> str:
    """The broker's name for an instance's type: the machine type, plus ``+NxGPU`` for attached GPUs."""
    machine = _last_segment(str(item.get("machine_type", "")))
    attached = list(item.get("guest_accelerators") or [])
    if attached and machine.startswith(ATTACHED_GPU_SERIES):
        first = attached[0]
        count = sum(int(a.get("accelerator_count") or 0) for a in attached)
        return str(InstanceTypeName(machine, _last_segment(str(first.get("accelerator_type", ""))), count))
    return machine


def instance_handle(item: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> InstanceHandle:
    """An ``Instance`` dict -> ``InstanceHandle`` with id ``<zone>/<name>``."""
    try:
        zone = _last_segment(str(item["zone"]))
        status = str(item.get("status", ""))
        interfaces = list(item.get("network_interfaces") or [])
        private_ip = str(interfaces[0].get("network_i_p") or "") if interfaces else ""
        access = list(interfaces[0].get("access_configs") or []) if interfaces else []
        public_ip = str(access[0].get("nat_i_p") or "") if access else ""
        scheduling = item.get("scheduling") or {}
        metadata = {str(i.get("key")): str(i.get("value", "")) for i in (item.get("metadata") or {}).get("items") or []}
        return InstanceHandle(
            instance_id=f"{zone}/{item['name']}",
            region=region_of_zone(zone),
            zone=zone,
            instance_type=broker_instance_type(item),
            state=instance_state(status),
            public_ip=public_ip or None,
            private_ip=private_ip or None,
            launched_at=str(item.get("creation_timestamp") or "") or None,
            tags={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
            extra={
                "status": status,
                "gcp_id": str(item.get("id", "")),
                "machine_type": _last_segment(str(item.get("machine_type", ""))),
                "provisioning_model": str(scheduling.get("provisioning_model") or "STANDARD"),
                "client_token": metadata.get(IDEMPOTENCY_METADATA, ""),
                "order_ref": metadata.get(ORDER_METADATA, ""),
                "self_link": str(item.get("self_link", "")),
                **(extra or {}),
            },
        )
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def latest_operation(operations: Iterable[Mapping[str, Any]], kinds: Iterable[str] | None = None) -> dict[str, Any]:
    """The newest operation (by insert time, then list order) of the given types; {} when there is none."""
    wanted = set(kinds) if kinds is not None else None
    chosen: dict[str, Any] = {}
    for op in operations:
        if wanted is not None and str(op.get("operation_type", "")) not in wanted:
            continue
        if not chosen or str(op.get("insert_time", "")) >= str(chosen.get("insert_time", "")):
            chosen = dict(op)
    return chosen


def operation_extra(operation: Mapping[str, Any]) -> dict[str, Any]:
    """What a handle carries about the operation that decided its state (``error_*`` when it failed)."""
    extra: dict[str, Any] = {
        "operation": str(operation.get("name", "")),
        "operation_type": str(operation.get("operation_type", "")),
        "operation_status": str(operation.get("status", "")),
    }
    failure = operation_error(operation)
    if failure is not None:
        extra.update(error_class=failure.error_class, error_code=failure.code, error_message=failure.message)
    return extra


def handle_without_instance(
    zone: str, name: str, operations: Sequence[Mapping[str, Any]], instance_type: str = ""
) -> InstanceHandle | None:
    """The handle for an instance that 404s, decided by its newest operation; None if GCP never heard of it.

    A delete (or preemption) means terminated; a failed insert means failed, with the operation's error; an insert
    still running means pending (the instance is not visible yet); a finished insert with no instance means it
    was removed since.
    """
    gone = latest_operation(operations, GONE_OPERATIONS)
    insert = latest_operation(operations, {"insert"})
    if not gone and not insert:
        return None
    if gone and (not insert or str(gone.get("insert_time", "")) >= str(insert.get("insert_time", ""))):
        newest, state = gone, InstanceState.TERMINATED
    elif operation_error(insert) is not None:
        newest, state = insert, InstanceState.FAILED
    elif str(insert.get("status")) != "DONE":
        newest, state = insert, InstanceState.PENDING
    else:
        newest, state = insert, InstanceState.TERMINATED
    return InstanceHandle(
        instance_id=f"{zone}/{name}",
        region=region_of_zone(zone),
        zone=zone,
        instance_type=instance_type,
        state=state,
        extra={"status": "", **operation_extra(newest)},
    )


# --------------------------------------------------------------------------------------------- launches

DEFAULT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
DEFAULT_NETWORK = "global/networks/default"
DEFAULT_BOOT_DISK_GB = 100


def instance_resource(
    *,
    name: str,
    zone: str,
    instance_type: InstanceTypeName,
    spot: bool,
    image: str,
    boot_disk_gb: int,
    network: str,
    subnetwork: str | None,
    labels: Mapping[str, str],
    metadata: Mapping[str, str],
    network_tags: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``Instance`` body of ``instances.insert`` (proto field names; ``type_`` as proto-plus spells it).
    ``network_tags`` become ``tags.items``, which firewall rules select instances by."""
    interface: dict[str, Any] = {
        "network": network,
        "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}],
    }
    if subnetwork:
        interface["subnetwork"] = subnetwork
    # GPU VMs cannot live-migrate: GCP rejects onHostMaintenance=MIGRATE for them.
    scheduling: dict[str, Any] = {"on_host_maintenance": "TERMINATE"}
    if spot:
        # DELETE rather than STOP: a stopped Spot VM keeps its disks billed and its name taken.
        scheduling.update(provisioning_model="SPOT", instance_termination_action="DELETE", automatic_restart=False)
    else:
        scheduling.update(provisioning_model="STANDARD", automatic_restart=True)
    resource: dict[str, Any] = {
        "name": name,
        "machine_type": f"zones/{zone}/machineTypes/{instance_type.machine_type}",
        "labels": dict(labels),
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(metadata.items())]},
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "type_": "PERSISTENT",
                "initialize_params": {"source_image": image, "disk_size_gb": boot_disk_gb},
            }
        ],
        "network_interfaces": [interface],
        "scheduling": scheduling,
    }
    if network_tags:
        resource["tags"] = {"items": list(network_tags)}
    if instance_type.accelerator is not None:
        resource["guest_accelerators"] = [
            {
                "accelerator_type": f"zones/{zone}/acceleratorTypes/{instance_type.accelerator}",
                "accelerator_count": instance_type.count,
            }
        ]
    return resource


# ------------------------------------------------------------------------------------------------- boot

# Compute Engine API v1, Metadata.items[]: a value's "size must be less than or equal to 262144 bytes (256 KiB)"
# and "the total size of all keys and values must be less than 512 KB" (Metadata resource of
# https://cloud.google.com/compute/docs/reference/rest/v1/instances). Both count raw bytes: values are plain strings.
METADATA_VALUE_MAX_BYTES = 262144
METADATA_SOURCE = (
    "Compute Engine API v1, Metadata.items[].value, https://cloud.google.com/compute/docs/reference/rest/v1/instances"
)
STARTUP_SCRIPT_KEY = "startup-script"
SSH_KEYS_KEY = "ssh-keys"
# "--metadata is used to specify that the NVIDIA driver should be installed on your behalf. The value is
# install-nvidia-driver=True" (Create a Deep Learning VM instance from the command line,
# https://cloud.google.com/deep-learning-vm/docs/cli). Only Deep Learning VM images read it.
DRIVER_METADATA_KEY = "install-nvidia-driver"
DRIVER_METADATA_VALUE = "True"
# The GPU-ready default: a Deep Learning VM image family, resolved to its newest image at launch ("Choose an image",
# https://cloud.google.com/deep-learning-vm/docs/images: Base, CUDA 12.9, Ubuntu 22.04, NVIDIA driver 580).
DLVM_PROJECT = "deeplearning-platform-release"
DLVM_FAMILY = "common-cu129-ubuntu-2204-nvidia-580"
# AttachedDiskInitializeParams.diskSizeGb: "the size of the disk in base-2 GB. The size must be at least 10 GB"
# (https://cloud.google.com/compute/docs/reference/rest/v1/instances); a zonal persistent disk holds at most
# 64 TB ("Storage options", https://cloud.google.com/compute/docs/disks).
DISK_GB_MIN = 10
DISK_GB_MAX = 65536
# Metadata ssh-keys lines are copied into authorized_keys by the guest agent, and "VMs accept the key formats listed
# in the sshd_config file" ("Create SSH keys", https://cloud.google.com/compute/docs/connect/create-ssh-keys): every
# type OpenSSH takes, so every type the broker accepts.
NATIVE_KEY_TYPES = frozenset(KEY_TYPES)

# Firewall rule names and network tags: "1-63 characters long, and comply with RFC1035", i.e.
# [a-z]([-a-z0-9]*[a-z0-9])? (Firewall.name, https://cloud.google.com/compute/docs/reference/rest/v1/firewalls;
# Tags.items, https://cloud.google.com/compute/docs/reference/rest/v1/instances).
FIREWALL_PREFIX = "gbfw-"
TAG_PREFIX = "gb-"
ORDER_MARK = "broker-order="  # firewall rules have no labels: the order rides in the description
ALLOW_PRIORITY = 1000
# Below the allow rules, above the default network's default-allow-ssh/-rdp/-icmp (65534): everyone else stays out.
DENY_PRIORITY = 1001
_RESOURCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ORDER_IN_DESCRIPTION = re.compile(rf"{re.escape(ORDER_MARK)}(\S+)")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image to boot: one image by ``name``, or the newest of a ``family``, in ``project``."""

    project: str
    name: str = ""
    family: str = ""

    def __str__(self) -> str:
        tail = f"family/{self.family}" if self.family else self.name
        return f"projects/{self.project}/global/images/{tail}"

    @property
    def is_deep_learning_vm(self) -> bool:
        return self.project == DLVM_PROJECT


DEFAULT_GPU_IMAGE = ImageRef(DLVM_PROJECT, family=DLVM_FAMILY)
_IMAGE_PATH = re.compile(
    r"^(?:https://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/(?P<project>[^/]+)/)?"
    r"global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)
_PROJECT_FAMILY = re.compile(r"^(?P<project>[a-z][-a-z0-9.:]{1,61}[a-z0-9])/(?P<family>[a-z][-a-z0-9]{0,62})$")


def image_ref(value: str, own_project: str) -> ImageRef:
    """A buyer's image in any form GCP documents: a self link or ``projects/P/global/images/NAME`` (one image),
    ``.../images/family/F`` or ``P/F`` (the newest image of a family), ``global/images/...`` or a bare name (the
    account's own project). Raises ``ProviderRequestRejected`` (code ``invalid``) for anything else."""
    text = value.strip()
    if match := _IMAGE_PATH.match(text):
        project = match["project"] or own_project
        ref = ImageRef(project, name=match["name"] or "", family=match["family"] or "")
    elif match := _PROJECT_FAMILY.match(text):
        ref = ImageRef(match["project"], family=match["family"])
    elif _RESOURCE_NAME.match(text):
        ref = ImageRef(own_project, name=text)
    else:
        raise ProviderRequestRejected(f"not a GCP image reference: {value!r}", code="invalid", provider=PROVIDER)
    if not _RESOURCE_NAME.match(ref.name or ref.family):
        raise ProviderRequestRejected(f"not a GCP image name: {value!r}", code="invalid", provider=PROVIDER)
    return ref


def image_usable(image: Mapping[str, Any]) -> bool:
    """An image GCP will boot: READY and not marked OBSOLETE or DELETED (a DEPRECATED one still boots)."""
    state = str((image.get("deprecated") or {}).get("state") or "")
    return str(image.get("status") or "READY") == "READY" and state not in ("OBSOLETE", "DELETED")


def ssh_keys_value(login_user: str, keys: Iterable[SshPublicKey]) -> str:
    """The ``ssh-keys`` metadata value: one ``USERNAME:KEY_VALUE`` line per key ("Add SSH keys to VMs",
    https://cloud.google.com/compute/docs/connect/add-ssh-keys). No ``google-ssh`` expiry comment: the guest agent
    drops a key whose expiry it cannot parse, and the machine's life bounds the key's anyway."""
    return "\n".join(f"{login_user}:{key.public_key}" for key in keys)


def order_slug(order_ref: str) -> str:
    """At most 40 name-safe characters for an order: the reference itself when it is safe, else a slug and a hash
    (deterministic, so a later search builds the same names)."""
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", order_ref.lower())).strip("-")
    if slug == order_ref and len(slug) <= 40:
        return slug
    digest = hashlib.sha256(order_ref.encode()).hexdigest()[:12]
    return f"{slug[:27].rstrip('-')}-{digest}" if slug else digest


def network_tag(order_ref: str) -> str:
    """The network tag an order's instances carry and its firewall rules target."""
    return f"{TAG_PREFIX}{order_slug(order_ref)}"


def firewall_prefix(order_ref: str) -> str:
    return f"{FIREWALL_PREFIX}{order_slug(order_ref)}-"


@dataclass(frozen=True, slots=True)
class FirewallGroup:
    """One VPC firewall rule's worth of the buyer's ingress: the source ranges and what they may reach."""

    source_ranges: tuple[str, ...]
    allowed: tuple[tuple[str, tuple[int, ...]], ...]  # (protocol, ports)

    @property
    def digest(self) -> str:
        text = repr((self.source_ranges, self.allowed))
        return hashlib.sha256(text.encode()).hexdigest()[:8]


def firewall_groups(ingress: Iterable[IngressRule]) -> list[FirewallGroup]:
    """The buyer's ingress as VPC firewall rules. A rule lets every one of its source ranges reach every one of its
    ports, so only rules naming the same ranges share one (merging others would widen both); and "a firewall rule can
    contain either IPv4 or IPv6 ranges, but not both" ("Use VPC firewall rules",
    https://cloud.google.com/firewall/docs/using-firewalls)."""
    by_ranges: dict[tuple[str, ...], dict[str, set[int]]] = {}
    for rule in ingress:
        for cidrs in (rule.ipv4_cidrs, rule.ipv6_cidrs):
            if not cidrs:
                continue
            ranges = tuple(sorted({str(ipaddress.ip_network(c, strict=False)) for c in cidrs}))
            by_ranges.setdefault(ranges, {}).setdefault(rule.protocol, set()).add(rule.port)
    groups = [
        FirewallGroup(ranges, tuple((proto, tuple(sorted(ports))) for proto, ports in sorted(protocols.items())))
        for ranges, protocols in by_ranges.items()
    ]
    return sorted(groups, key=lambda g: (g.source_ranges, g.allowed))


def _description(order_ref: str, what: str) -> str:
    return f"gpu-broker: {what} {ORDER_MARK}{order_ref}"


def firewall_allow_resource(order_ref: str, group: FirewallGroup, network: str) -> dict[str, Any]:
    """The ``Firewall`` body (proto field names) letting ``group`` reach the order's tagged instances."""
    return {
        "name": f"{firewall_prefix(order_ref)}{group.digest}",
        "description": _description(order_ref, "the buyer's addresses into the machines of"),
        "network": network,
        "direction": "INGRESS",
        "priority": ALLOW_PRIORITY,
        "source_ranges": list(group.source_ranges),
        "target_tags": [network_tag(order_ref)],
        "allowed": [{"I_p_protocol": proto, "ports": [str(p) for p in ports]} for proto, ports in group.allowed],
    }


def firewall_deny_resource(order_ref: str, network: str) -> dict[str, Any]:
    """The rule that keeps every other IPv4 source out of the order's instances, whatever broader allow rules (the
    default network's default-allow-ssh from 0.0.0.0/0) the project has below its priority."""
    return {
        "name": f"{firewall_prefix(order_ref)}deny",
        "description": _description(order_ref, "everyone else out of the machines of"),
        "network": network,
        "direction": "INGRESS",
        "priority": DENY_PRIORITY,
        "source_ranges": ["0.0.0.0/0"],
        "target_tags": [network_tag(order_ref)],
        "denied": [{"I_p_protocol": "all"}],
    }


def firewall_order_ref(item: Mapping[str, Any]) -> str | None:
    """The order a broker firewall rule belongs to (from its description); None for anyone else's rule."""
    if not str(item.get("name", "")).startswith(FIREWALL_PREFIX):
        return None
    match = _ORDER_IN_DESCRIPTION.search(str(item.get("description") or ""))
    if match is None or not str(item["name"]).startswith(firewall_prefix(match[1])):
        return None
    return match[1]


def firewall_order_resource(item: Mapping[str, Any]) -> OrderResource | None:
    """A broker firewall rule as an ``OrderResource`` (firewall rules are global: region ``global``); kind
    ``firewall`` for the allow rules, ``firewall_deny`` for the rule that keeps everyone else out."""
    order_ref = firewall_order_ref(item)
    if order_ref is None:
        return None
    denies = bool(item.get("denied"))
    return OrderResource(
        kind="firewall_deny" if denies else "firewall",
        resource_id=str(item["name"]),
        region="global",
        order_ref=order_ref,
        extra={
            "network": _last_segment(str(item.get("network", ""))),
            "priority": int(item.get("priority") or 0),
            "source_ranges": list(item.get("source_ranges") or []),
            "target_tags": list(item.get("target_tags") or []),
            "ports": sorted(str(port) for rule in item.get("allowed") or [] for port in rule.get("ports") or []),
        },
    )
