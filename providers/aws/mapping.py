"""AWS response dicts -> broker DTOs, and AWS error codes -> broker error classes.

Pure functions over plain dicts and strings: nothing here imports boto3 or botocore, so the tables can be
tested without a network and reused by any code that sees an AWS error code.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ImageUnavailable,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.launch import IngressRule, OrderResource
from providers.sshkeys import SshPublicKey
from providers.types import GPU_FRACTION, InstanceHandle, InstanceState
from untrusted.jsonbody import bounded_json

PROVIDER = "aws"
ORDER_TAG = "broker:order"
CLIENT_TOKEN_MAX_LENGTH = 64

# --------------------------------------------------------------------------------------------- errors

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "InsufficientInstanceCapacity": CapacityUnavailable,
    "InsufficientCapacity": CapacityUnavailable,
    "InsufficientHostCapacity": CapacityUnavailable,
    "InsufficientReservedInstanceCapacity": CapacityUnavailable,
    "Unsupported": CapacityUnavailable,
    "SpotMaxPriceTooLow": CapacityUnavailable,
    # quota: skip the region or account
    "VcpuLimitExceeded": QuotaExceeded,
    "InstanceLimitExceeded": QuotaExceeded,
    "MaxSpotInstanceCountExceeded": QuotaExceeded,
    # transient: retry with backoff
    "RequestLimitExceeded": TransientProviderError,
    "Throttling": TransientProviderError,
    "ThrottlingException": TransientProviderError,
    "InternalError": TransientProviderError,
    "InternalFailure": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "Unavailable": TransientProviderError,
    "RequestTimeout": TransientProviderError,
    "RequestTimeoutException": TransientProviderError,
    # credentials: block the account. The last four are what STS-signed and JSON-protocol services
    # (the Price List API) answer for a bad key or signature.
    "AuthFailure": CredentialsRejected,
    "UnauthorizedOperation": CredentialsRejected,
    "InvalidClientTokenId": CredentialsRejected,
    "SignatureDoesNotMatch": CredentialsRejected,
    "UnrecognizedClientException": CredentialsRejected,
    "InvalidSignatureException": CredentialsRejected,
    "AccessDeniedException": CredentialsRejected,
    "ExpiredToken": CredentialsRejected,
    # the image is not in this region: EC2's codes for an AMI id, SSM's for the public parameter naming one
    "InvalidAMIID.NotFound": ImageUnavailable,
    "InvalidAMIID.Unavailable": ImageUnavailable,
    "ParameterNotFound": ImageUnavailable,
}

# Errors raised below the HTTP layer (botocore exception class names): the request may not have reached AWS.
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ProxyConnectionError",
        "SSLError",
        "HTTPClientError",
        "ConnectionError",
    }
)


def error_class_for(code: str, http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an AWS error code. Unknown codes are final unless the status is 5xx."""
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if http_status is not None and http_status >= 500:
        return TransientProviderError
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an AWS ``Error.Code``; the code and message are kept on the exception."""
    return error_class_for(code, http_status)(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(name: str, message: str) -> ProviderError:
    """A connection failure or timeout, named by the SDK exception class; always retryable."""
    return TransientProviderError(message or name, code=name, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


def validate_client_token(token: str) -> None:
    """EC2 accepts at most 64 printable ASCII characters; anything else would be rejected after a round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; EC2 allows at most {CLIENT_TOKEN_MAX_LENGTH}", provider=PROVIDER
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------------ GPUs

# The family fixes the form factor (SXM vs PCIe) that GpuInfo does not state.
FAMILY_GPU: dict[str, str] = {
    "p3": gpu_names.V100_16_SXM2,
    "p3dn": gpu_names.V100_32_SXM2,
    "p4d": gpu_names.A100_40_SXM,
    "p4de": gpu_names.A100_80_SXM,
    "p5": gpu_names.H100_SXM,
    "p5e": gpu_names.H200_SXM,
    "p5en": gpu_names.H200_SXM,
    "p6-b200": gpu_names.B200,
    "g4dn": gpu_names.T4,
    "g5": gpu_names.A10G,
    "g6": gpu_names.L4,
    "gr6": gpu_names.L4,
    "g6f": gpu_names.L4,  # partitions of one L4: see gpu_spec
    "gr6f": gpu_names.L4,
    "g6e": gpu_names.L40S,
}

# What GpuInfo must say for each key: (manufacturer, name). Used to confirm the family table and, for GPUs
# that exist in one form factor only, to map families the table does not list yet.
GPU_IDENTITY: dict[str, tuple[str, str]] = {
    gpu_names.T4: ("NVIDIA", "T4"),
    gpu_names.A10G: ("NVIDIA", "A10G"),
    gpu_names.L4: ("NVIDIA", "L4"),
    gpu_names.L40S: ("NVIDIA", "L40S"),
    gpu_names.V100_16_SXM2: ("NVIDIA", "V100"),
    gpu_names.V100_32_SXM2: ("NVIDIA", "V100"),
    gpu_names.A100_40_SXM: ("NVIDIA", "A100"),
    gpu_names.A100_80_SXM: ("NVIDIA", "A100"),
    gpu_names.H100_SXM: ("NVIDIA", "H100"),
    gpu_names.H200_SXM: ("NVIDIA", "H200"),
    gpu_names.B200: ("NVIDIA", "B200"),
}
SINGLE_FORM_FACTOR = frozenset({gpu_names.T4, gpu_names.A10G, gpu_names.L4, gpu_names.L40S, gpu_names.B200})

# Nominal per-GPU memory. AWS reports usable MiB (A10G and L4: 22888 MiB for a 24 GB card).
NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.A10G: 24,
    gpu_names.L4: 24,
    gpu_names.L40S: 48,
    gpu_names.V100_16_SXM2: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_SXM: 40,
    gpu_names.A100_80_SXM: 80,
    gpu_names.H100_SXM: 80,
    gpu_names.H200_SXM: 141,
    gpu_names.B200: 180,
}
MEMORY_TOLERANCE = Decimal("0.10")

NVLINK_FAMILIES = frozenset({"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en"})


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary.

    ``fraction`` < 1 marks GPU partitions: ``count`` slices, each that share of a ``model`` card, with
    ``memory_gb`` the slice's memory (the matching engine's ``OfferView.gpu_fraction``).
    """

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    manufacturer: str
    memory_mib: int
    fraction: Fraction = Fraction(1)


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _memory_matches(key: str, memory_mib: int, share: Fraction = Fraction(1)) -> bool:
    nominal_mib = Decimal(NOMINAL_MEMORY_GB[key] * 1024) * share.numerator / share.denominator
    return abs(Decimal(memory_mib) - nominal_mib) <= nominal_mib * MEMORY_TOLERANCE


def _identity_matches(key: str, manufacturer: str, name: str, memory_mib: int, share: Fraction) -> bool:
    return GPU_IDENTITY.get(key) == (manufacturer, name) and _memory_matches(key, memory_mib, share)


def gpu_model_key(
    instance_type: str, name: str, manufacturer: str, memory_mib: int, share: Fraction = Fraction(1)
) -> str | None:
    """The canonical key, or None when the GPU is unknown or the catalogue contradicts the family table.

    ``share`` is the GPU partition size: a slice's memory is checked against that share of the card's."""
    family_key = FAMILY_GPU.get(instance_family(instance_type))
    if family_key is not None:
        return family_key if _identity_matches(family_key, manufacturer, name, memory_mib, share) else None
    for key in SINGLE_FORM_FACTOR:
        if _identity_matches(key, manufacturer, name, memory_mib, share):
            return key
    return None


def gpu_spec(instance_type: str, gpu_info: Mapping[str, Any]) -> GpuSpec:
    """Map ``GpuInfo`` of ``describe_instance_types``. Unknown GPUs keep the provider's name for quarantine.

    A partitioned GPU (``GpuPartitionSize`` < 1, e.g. g6f's eighth of an L4) reports ``Count`` 0 whole GPUs
    and ``LogicalGpuCount`` slices, each with the slice's ``MemoryInfo``: it maps to the card's key with
    ``fraction`` set, ``count`` the slices and ``memory_gb`` that share of the card's nominal memory.
    """
    try:
        gpus = list(gpu_info["Gpus"])
        if not gpus:
            raise ValueError("empty Gpus")
        names = sorted({str(g["Name"]) for g in gpus})
        manufacturer = str(gpus[0].get("Manufacturer", ""))
        memory_mib = int(gpus[0]["MemoryInfo"]["SizeInMiB"])
        partition = Fraction(str(gpus[0].get("GpuPartitionSize", 1))).limit_denominator(64)
        if not 0 < partition <= 1:
            raise ValueError(f"GpuPartitionSize {partition} is outside (0, 1]")
        if partition == 1:
            count = sum(int(g["Count"]) for g in gpus)
        else:
            count = sum(int(g.get("LogicalGpuCount", g["Count"])) for g in gpus)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"{instance_type}: unreadable GpuInfo ({exc})") from None
    raw_name = "+".join(names)
    key: str | None = None
    if len(names) == 1:
        key = gpu_model_key(instance_type, names[0], manufacturer, memory_mib, partition)
    if key is not None:
        model = key
        memory_gb = int(NOMINAL_MEMORY_GB[key] * partition)
    else:
        # An unknown slice is not the whole card its name suggests; the suffix keeps it out of the known keys.
        model = raw_name if partition == 1 else f"{raw_name} ({partition} partition)"
        memory_gb = memory_mib // 1024
    family = instance_family(instance_type)
    nvlink = count > 1 and (family in NVLINK_FAMILIES or family.startswith("p6"))
    return GpuSpec(
        model=model,
        count=count,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=raw_name,
        manufacturer=manufacturer,
        memory_mib=memory_mib,
        fraction=partition if key is not None else Fraction(1),
    )


# ------------------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class InstanceTypeSpec:
    """One GPU instance type from ``describe_instance_types``."""

    instance_type: str
    gpu: GpuSpec
    vcpus: int
    memory_gib: Decimal
    extra: dict[str, Any]


def instance_type_spec(item: Mapping[str, Any]) -> InstanceTypeSpec | None:
    """None for types without ``GpuInfo``; raises ``MalformedProviderResponse`` for unreadable entries."""
    gpu_info = item.get("GpuInfo")
    if not gpu_info:
        return None
    try:
        name = str(item["InstanceType"])
        vcpus = int(item["VCpuInfo"]["DefaultVCpus"])
        memory_gib = Decimal(int(item["MemoryInfo"]["SizeInMiB"])) / Decimal(1024)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable instance type entry ({exc!r})") from None
    gpu = gpu_spec(name, gpu_info)
    network = item.get("NetworkInfo") or {}
    extra: dict[str, Any] = {
        "gpu_name": gpu.raw_name,
        "gpu_manufacturer": gpu.manufacturer,
        "gpu_memory_mib": gpu.memory_mib,
        "network_performance": str(network.get("NetworkPerformance", "")),
        "efa_supported": bool(network.get("EfaSupported", False)),
        "architectures": list((item.get("ProcessorInfo") or {}).get("SupportedArchitectures", [])),
    }
    if gpu.fraction < 1:
        # Where the catalogue and the matching engine read a slice's share of the card (OfferView.gpu_fraction).
        extra[GPU_FRACTION] = float(gpu.fraction)
    return InstanceTypeSpec(instance_type=name, gpu=gpu, vcpus=vcpus, memory_gib=memory_gib, extra=extra)


def zones_by_type(offerings: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """``describe_instance_type_offerings`` rows -> instance type -> sorted zone names."""
    zones: dict[str, set[str]] = {}
    try:
        for row in offerings:
            zones.setdefault(str(row["InstanceType"]), set()).add(str(row["Location"]))
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable instance type offering ({exc!r})") from None
    return {name: sorted(locations) for name, locations in zones.items()}


# A Price List item is one product's JSON text, a few KB nesting 7 deep (product -> terms -> OnDemand -> offer
# -> priceDimensions -> dimension -> pricePerUnit); parsed within these bounds (a ValueError beyond them).
MAX_PRICE_ITEM_BYTES = 1024 * 1024
MAX_PRICE_ITEM_DEPTH = 16


def _price_item(raw: Any) -> Any:
    if isinstance(raw, str | bytes):
        return bounded_json(raw, max_bytes=MAX_PRICE_ITEM_BYTES, max_depth=MAX_PRICE_ITEM_DEPTH)
    return raw


# What the broker reads a price in: US dollars per instance-hour. Each price dimension states its "unit"
# ("the usage measurement unit for the price") and keys "pricePerUnit" by currency code ("Reading the service
# price list file for an AWS service", https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/
# reading-service-price-list-file-for-services.html); a price in anything else is refused by name, never
# read as if it were USD per hour.
HOURLY_UNIT = "Hrs"
PRICE_CURRENCY = "USD"


@dataclass(frozen=True, slots=True)
class PriceRefusal:
    """A Price List product the broker would not read a price from, and why."""

    instance_type: str
    sku: str
    reason: str


def _hourly_usd(product: Mapping[str, Any]) -> tuple[Decimal, str] | str:
    """(hourly USD price, SKU) of one parsed product, or the reason it states none in USD per hour."""
    terms = product.get("terms", {}).get("OnDemand", {})
    sku = str(product.get("product", {}).get("sku", ""))
    stated: list[str] = []
    for term in terms.values():
        for dimension in term.get("priceDimensions", {}).values():
            unit = str(dimension.get("unit", ""))
            per_unit = dimension.get("pricePerUnit", {})
            if unit == HOURLY_UNIT and PRICE_CURRENCY in per_unit:
                return Decimal(str(per_unit[PRICE_CURRENCY])), sku
            stated.append(f"{'/'.join(sorted(per_unit)) or 'no currency'} per {unit or 'unstated unit'!r}")
    if not stated:
        return "no on-demand price dimension"
    return f"on-demand price in {', '.join(stated)}; only {PRICE_CURRENCY} per {HOURLY_UNIT!r} is read"


def on_demand_usd(price_list: Iterable[Any]) -> tuple[Decimal, str] | None:
    """The hourly USD price and SKU from Price List items (each a JSON string), or None if none is stated.

    With the exact TERM_MATCH filters one product matches; the first priced one wins.
    """
    for raw in price_list:
        try:
            priced = _hourly_usd(_price_item(raw))
        except (ValueError, TypeError, AttributeError, InvalidOperation) as exc:
            raise malformed(f"unreadable Price List item ({exc!r})") from None
        if not isinstance(priced, str):
            return priced
    return None


@dataclass(slots=True)
class OnDemandPrices:
    """Price List items read per instance type: the usable prices and the products refused, with reasons."""

    prices: dict[str, tuple[Decimal, str]] = field(default_factory=dict)
    refused: list[PriceRefusal] = field(default_factory=list)


def on_demand_usd_by_type(price_list: Iterable[Any]) -> OnDemandPrices:
    """Price List items for many instance types -> instance type -> (hourly USD, SKU); the first priced wins.

    A product whose on-demand price is not in USD per hour is refused (listed with its reason), so a type with
    no other priced product goes unquoted instead of quoted in the wrong unit or currency.
    """
    result = OnDemandPrices()
    for raw in price_list:
        try:
            product = _price_item(raw)
            instance_type = str(product.get("product", {}).get("attributes", {}).get("instanceType", ""))
            priced = _hourly_usd(product) if instance_type and instance_type not in result.prices else None
        except (ValueError, TypeError, AttributeError, InvalidOperation) as exc:
            raise malformed(f"unreadable Price List item ({exc!r})") from None
        if isinstance(priced, str):
            sku = str(product.get("product", {}).get("sku", ""))
            result.refused.append(PriceRefusal(instance_type, sku, priced))
        elif priced is not None:
            result.prices[instance_type] = priced
    # A type refused in one product but priced by another is quoted: only its lasting refusals are reported.
    result.refused = [r for r in result.refused if r.instance_type not in result.prices]
    return result


@dataclass(frozen=True, slots=True)
class SpotPoint:
    price: Decimal
    timestamp: datetime


def newest_spot_prices(history: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], SpotPoint]:
    """``SpotPriceHistory`` rows -> (instance type, zone) -> the newest point."""
    newest: dict[tuple[str, str], SpotPoint] = {}
    try:
        for row in history:
            key = (str(row["InstanceType"]), str(row["AvailabilityZone"]))
            point = SpotPoint(price=Decimal(str(row["SpotPrice"])), timestamp=row["Timestamp"])
            if not isinstance(point.timestamp, datetime):
                raise TypeError("Timestamp is not a datetime")
            if key not in newest or point.timestamp > newest[key].timestamp:
                newest[key] = point
    except (KeyError, TypeError, InvalidOperation) as exc:
        raise malformed(f"unreadable spot price history row ({exc!r})") from None
    return newest


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    # A stopped instance holds no GPU for the buyer and is not billed for compute: for the broker it is gone
    # from service but not terminated, the same bucket as stopping.
    "stopped": InstanceState.STOPPING,
    "shutting-down": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}

# StateReason codes of an instance that died during launch rather than being terminated on request.
LAUNCH_FAILURE_REASONS = frozenset(
    {
        "Server.InternalError",
        "Server.InsufficientInstanceCapacity",
        "Client.InternalError",
        "Client.VolumeLimitExceeded",
        "Client.InvalidSnapshot.NotFound",
    }
)


def instance_state(state_name: str, state_reason_code: str = "") -> InstanceState:
    state = STATES.get(state_name, InstanceState.UNKNOWN)
    if state is InstanceState.TERMINATED and state_reason_code in LAUNCH_FAILURE_REASONS:
        return InstanceState.FAILED
    return state


def tags_dict(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in tags or ()}


def tag_specifications(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """Tags for the instance and its volumes; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(merged.items())]
    return [{"ResourceType": kind, "Tags": tag_list} for kind in ("instance", "volume")]


def instance_handle(item: Mapping[str, Any], region: str, reservation_id: str = "") -> InstanceHandle:
    """An ``Instances[]`` entry of ``run_instances``/``describe_instances`` -> ``InstanceHandle``."""
    try:
        state = item["State"]
        state_name = str(state["Name"])
        reason = item.get("StateReason") or {}
        launch_time = item.get("LaunchTime")
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=region,
            zone=str(item["Placement"]["AvailabilityZone"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(state_name, str(reason.get("Code", ""))),
            public_ip=item.get("PublicIpAddress") or None,
            private_ip=item.get("PrivateIpAddress") or None,
            launched_at=launch_time.isoformat() if isinstance(launch_time, datetime) else None,
            tags=tags_dict(item.get("Tags")),
            extra={
                "state_name": state_name,
                "state_reason": str(reason.get("Code", "")),
                "lifecycle": str(item.get("InstanceLifecycle") or "on-demand"),
                "client_token": str(item.get("ClientToken", "")),
                "image_id": str(item.get("ImageId", "")),
                "reservation_id": reservation_id,
            },
        )
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles_from_reservations(reservations: Iterable[Mapping[str, Any]], region: str) -> list[InstanceHandle]:
    handles: list[InstanceHandle] = []
    try:
        for reservation in reservations:
            reservation_id = str(reservation.get("ReservationId", ""))
            handles.extend(instance_handle(i, region, reservation_id) for i in reservation["Instances"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable reservation ({exc!r})") from None
    return handles


# ----------------------------------------------------------------------------------------------- images

UBUNTU_OWNER = "099720109477"  # Canonical's AWS account
UBUNTU_NAME_PATTERN = "ubuntu/images/*ubuntu-*-amd64-server-*"
_UBUNTU_VERSION = re.compile(r"-(\d+)\.(\d+)-amd64-server-(\d*)")


def newest_ubuntu_image(images: Iterable[Mapping[str, Any]]) -> str | None:
    """The image id of the highest Ubuntu release (then newest build) among ``describe_images`` results."""
    best: tuple[tuple[int, int, str, str], str] | None = None
    for image in images:
        name = str(image.get("Name", ""))
        match = _UBUNTU_VERSION.search(name)
        if match is None or image.get("State", "available") != "available":
            continue
        key = (int(match.group(1)), int(match.group(2)), match.group(3), str(image.get("CreationDate", "")))
        if best is None or key > best[0]:
            best = (key, str(image["ImageId"]))
    return best[1] if best else None


# ----------------------------------------------------------------------------------- what a boot creates

# The default GPU-ready image: AWS publishes each Deep Learning AMI's current id per region as a public SSM
# parameter named /aws/service/deeplearning/ami/<architecture>/<ami_type>/latest/ami-id, where ami_type is the
# AMI's name without "Deep Learning" and "AMI" ("Finding the ID of a DLAMI",
# https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html). This one is "Deep Learning Base OSS
# Nvidia Driver GPU AMI (Ubuntu 22.04)": NVIDIA driver, CUDA and the container toolkit, logging in as ubuntu.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_LOGIN_USER = "ubuntu"

# "Amazon EC2 does not accept DSA keys ... Supported lengths: 1024, 2048, and 4096" for RSA; ED25519 for Linux
# ("Create a key pair using a third-party tool and import the public key", EC2 User Guide,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/create-key-pairs.html). ECDSA is not importable.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519"})
RSA_IMPORT_BITS = frozenset({1024, 2048, 4096})
ROOT_VOLUME_TYPE = "gp3"
RESOURCE_PREFIX = "broker-"
# The limits (rules per security group per address family, user data, gp3 sizes) and their sources are on
# ``AwsAdapter.launch_limits``; these error codes are the EC2 API's ("Error codes for the Amazon EC2 API",
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
IN_USE = "DependencyViolation"
GROUP_GONE = frozenset({"InvalidGroup.NotFound", "InvalidGroupId.NotFound"})
ALREADY_THERE = frozenset({"InvalidKeyPair.Duplicate", "InvalidGroup.Duplicate", "InvalidPermission.Duplicate"})
# Placement groups ("Error codes for the Amazon EC2 API", same page): a name taken in the Region, a name the
# Region does not know, and a group that still holds instances (DeletePlacementGroup) or holds them in another
# Availability Zone (RunInstances into a cluster group).
PLACEMENT_GROUP_DUPLICATE = "InvalidPlacementGroup.Duplicate"
PLACEMENT_GROUP_UNKNOWN = "InvalidPlacementGroup.Unknown"
PLACEMENT_GROUP_IN_USE = "InvalidPlacementGroup.InUse"
# "cluster: packs instances close together inside an Availability Zone" (CreatePlacementGroup's Strategy,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html).
CLUSTER_STRATEGY = "cluster"
PLACEMENT_GROUP_TAG = "broker:placement-group"


def resource_name(order_ref: str) -> str:
    """The key pair's and the security group's name for an order: one of each per order and region, so a
    repeated launch finds them by name (both names are unique per region; a group's per VPC)."""
    return f"{RESOURCE_PREFIX}{order_ref}"


def order_tags(resource_type: str, order_ref: str) -> list[dict[str, Any]]:
    """``TagSpecifications`` marking one created resource with the broker's order."""
    return [{"ResourceType": resource_type, "Tags": [{"Key": ORDER_TAG, "Value": order_ref}]}]


def placement_group_tags(name: str) -> list[dict[str, Any]]:
    """``TagSpecifications`` marking a placement group as the broker's, so it can be found by tag."""
    return [{"ResourceType": "placement-group", "Tags": [{"Key": PLACEMENT_GROUP_TAG, "Value": name}]}]


def order_filter(order_ref: str | None = None) -> list[dict[str, Any]]:
    """``Filters`` for resources tagged with one order, or with any order when ``order_ref`` is None."""
    if order_ref is None:
        return [{"Name": "tag-key", "Values": [ORDER_TAG]}]
    return [{"Name": f"tag:{ORDER_TAG}", "Values": [order_ref]}]


def native_key(keys: Iterable[SshPublicKey]) -> SshPublicKey | None:
    """The first key EC2's ``ImportKeyPair`` takes (RSA of a documented length, or ED25519). An instance has one
    key pair, so the others, and ECDSA keys, reach the machine through the boot script alone."""
    for key in keys:
        if key.key_type == "ssh-ed25519" or (key.key_type == "ssh-rsa" and key.bits in RSA_IMPORT_BITS):
            return key
    return None


Permission = tuple[str, int, str]  # (protocol, port, CIDR): one security group rule


def wanted_permissions(rules: Iterable[IngressRule]) -> list[Permission]:
    """Every (protocol, port, CIDR) the boot opens, in a stable order, without repeats."""
    seen: dict[Permission, None] = {}
    for rule in rules:
        for cidr in rule.cidrs:
            seen[(rule.protocol, rule.port, str(ipaddress.ip_network(cidr, strict=False)))] = None
    return list(seen)


def existing_permissions(ip_permissions: Iterable[Mapping[str, Any]]) -> set[Permission]:
    """The (protocol, port, CIDR) rules of a group's ``IpPermissions`` that open a single port."""
    found: set[Permission] = set()
    try:
        for permission in ip_permissions:
            if permission.get("FromPort") != permission.get("ToPort") or permission.get("FromPort") is None:
                continue
            key = (str(permission["IpProtocol"]), int(permission["FromPort"]))
            found.update((*key, str(r["CidrIp"])) for r in permission.get("IpRanges") or [])
            found.update((*key, str(r["CidrIpv6"])) for r in permission.get("Ipv6Ranges") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable security group permission ({exc!r})") from None
    return found


def ip_permissions(permissions: Iterable[Permission]) -> list[dict[str, Any]]:
    """``IpPermissions`` for ``AuthorizeSecurityGroupIngress``: one entry per (protocol, port), IPv4 ranges in
    ``IpRanges`` and IPv6 ranges in ``Ipv6Ranges`` (API reference, IpPermission)."""
    grouped: dict[tuple[str, int], dict[str, Any]] = {}
    for protocol, port, cidr in permissions:
        entry = grouped.setdefault(
            (protocol, port),
            {"IpProtocol": protocol, "FromPort": port, "ToPort": port, "IpRanges": [], "Ipv6Ranges": []},
        )
        if ipaddress.ip_network(cidr, strict=False).version == 6:
            entry["Ipv6Ranges"].append({"CidrIpv6": cidr})
        else:
            entry["IpRanges"].append({"CidrIp": cidr})
    return [{k: v for k, v in entry.items() if v != []} for entry in grouped.values()]


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """What a launch needs of its image: where the root volume attaches and the smallest size it may have."""

    image_id: str
    root_device: str
    root_snapshot_gb: int | None


def image_facts(image: Mapping[str, Any]) -> ImageFacts:
    """A ``describe_images`` entry -> its root device and the size of the snapshot behind it."""
    try:
        image_id = str(image["ImageId"])
        root = str(image["RootDeviceName"])
        snapshot_gb = next(
            (
                int(m["Ebs"]["VolumeSize"])
                for m in image.get("BlockDeviceMappings") or []
                if m.get("DeviceName") == root and (m.get("Ebs") or {}).get("VolumeSize") is not None
            ),
            None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable image entry ({exc!r})") from None
    return ImageFacts(image_id, root, snapshot_gb)


def root_volume(facts: ImageFacts, disk_gb: int) -> list[dict[str, Any]]:
    """``BlockDeviceMappings`` that size the image's root volume (gp3, gone with the instance)."""
    return [
        {
            "DeviceName": facts.root_device,
            "Ebs": {"VolumeSize": disk_gb, "VolumeType": ROOT_VOLUME_TYPE, "DeleteOnTermination": True},
        }
    ]


def order_resource(kind: str, item: Mapping[str, Any], region: str) -> OrderResource:
    """A tagged ``KeyPairs[]`` or ``SecurityGroups[]`` entry -> ``OrderResource``."""
    tags = tags_dict(item.get("Tags"))
    try:
        if kind == "key_pair":
            resource_id, extra = str(item["KeyPairId"]), {"name": str(item["KeyName"])}
        else:
            resource_id = str(item["GroupId"])
            extra = {"name": str(item.get("GroupName", "")), "vpc_id": str(item.get("VpcId", ""))}
    except (KeyError, TypeError) as exc:
        raise malformed(f"unreadable {kind} entry ({exc!r})") from None
    return OrderResource(
        kind=kind, resource_id=resource_id, region=region, order_ref=tags.get(ORDER_TAG, ""), extra=extra
    )
