"""Alibaba Cloud ECS response dicts -> broker DTOs, and ECS error codes -> broker error classes.

Pure functions over plain dicts (the API's own PascalCase field names, as ``to_map()`` of the SDK's response
models gives them) and strings: nothing here imports the SDK, so the tables can be tested without a network.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from providers import gpu_names, sshkeys
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
from providers.types import InstanceHandle, InstanceState, PricingModel

PROVIDER = "alibaba"
ORDER_TAG = "broker:order"
CLIENT_TOKEN_MAX_LENGTH = 64
# The currency of an ECS price is the account's site, and the answer states it: DescribePrice's
# PriceInfo.Price.Currency and DescribeSpotPriceHistory's top-level Currency are CNY on the China site and USD on the
# International site. The broker converts; the adapter only passes on what the answer says, and never guesses.
SITE_CURRENCIES = frozenset({"CNY", "USD"})

# --------------------------------------------------------------------------------------------- errors

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "OperationDenied.NoStock": CapacityUnavailable,
    "Zone.NotOnSale": CapacityUnavailable,
    "InvalidResourceType.NotSupported": CapacityUnavailable,
    "InstanceType.Offline": CapacityUnavailable,
    "InvalidInstanceType.PhasedOut": CapacityUnavailable,
    "InvalidInstanceType.ZoneNotSupported": CapacityUnavailable,
    # A spot ceiling below the market price is a miss for this offer, like AWS's SpotMaxPriceTooLow.
    "InvalidSpotPriceLimit.LowerThanPublicPrice": CapacityUnavailable,
    # quota: skip the region or account
    "QuotaExceed.ElasticQuota": QuotaExceeded,
    # transient: retry with backoff (every "Throttling*" code is caught by THROTTLING_PREFIX below)
    "Throttling": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "InternalError": TransientProviderError,
    "UnknownError": TransientProviderError,
    "LastTokenProcessing": TransientProviderError,
    "Idempotence.Processing": TransientProviderError,
    "LastOrderProcessing": TransientProviderError,
    "OperationDenied.ResourceControl": TransientProviderError,
    "IncorrectInstanceStatus.Initializing": TransientProviderError,
    # A replayed nonce only means this exact request was sent twice; a new request gets a new nonce.
    "SignatureNonceUsed": TransientProviderError,
    # credentials: block the account
    "InvalidAccessKeyId.NotFound": CredentialsRejected,
    "InvalidAccessKeyId.Inactive": CredentialsRejected,
    "SignatureDoesNotMatch": CredentialsRejected,
    "IncompleteSignature": CredentialsRejected,
    "InvalidSecurityToken.Expired": CredentialsRejected,
    "InvalidSecurityToken.Malformed": CredentialsRejected,
    "Forbidden.RAM": CredentialsRejected,
    "Forbidden.AccessKeyDisabled": CredentialsRejected,
    # final: named here so the table documents them; any other 4xx code is final too
    "InvalidInstanceId.NotFound": ProviderRequestRejected,
    "IdempotenceParamNotMatch": ProviderRequestRejected,
    "InvalidClientToken.ValueNotSupported": ProviderRequestRejected,
    "IncorrectInstanceStatus": ProviderRequestRejected,
    "InvalidImageId.NotFound": ProviderRequestRejected,
    "InvalidZoneId.NotFound": ProviderRequestRejected,
    "InvalidInstanceType.ValueNotSupported": ProviderRequestRejected,
    "InvalidParameter": ProviderRequestRejected,
    "MissingParameter": ProviderRequestRejected,
    "Account.Arrearage": ProviderRequestRejected,
    "InvalidAccountStatus.NotEnoughBalance": ProviderRequestRejected,
    # What a booted launch can meet (RunInstances, ImportKeyPair, AuthorizeSecurityGroup, DeleteSecurityGroup and
    # DeleteKeyPairs error tables); the adapter reads the last two as "still in use", not as failures.
    "InvalidUserData.SizeExceeded": ProviderRequestRejected,
    "InvalidUserData.Base64FormatInvalid": ProviderRequestRejected,
    "InvalidSystemDiskSize.LessThanImageSize": ProviderRequestRejected,
    "InvalidSystemDiskSize.LessThanMinSize": ProviderRequestRejected,
    "InvalidSystemDiskSize.MoreThanMaxSize": ProviderRequestRejected,
    "InvalidKeyPairName.NotFound": ProviderRequestRejected,
    "InvalidSecurityGroupId.NotFound": ProviderRequestRejected,
    "InvalidPublicKeyBody.Malformed": ProviderRequestRejected,
    "KeyPair.AlreadyExist": ProviderRequestRejected,
    "AuthorizationLimitExceed": ProviderRequestRejected,
    "DependencyViolation": ProviderRequestRejected,
    "InvalidParameter.KeypairAlreadyAttachedInstance": ProviderRequestRejected,
}
THROTTLING_PREFIX = "Throttling."

# Failures below the HTTP layer, named by the adapter (the SDK reports them without a code).
TRANSPORT_ERROR_CODE = "TransportError"


def error_class_for(code: str, http_status: int | None = None) -> type[ProviderError]:
    """The broker error class for an ECS error code. Unknown codes are final unless the status is 5xx.

    The code decides, never the status: ECS answers ``Throttling.User`` with HTTP 400 and ``NoStock`` with 403.
    """
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if code.startswith(THROTTLING_PREFIX):
        return TransientProviderError
    if http_status is not None and http_status >= 500:
        return TransientProviderError
    return ProviderRequestRejected


def error_from_code(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """Build the broker error for an ECS ``Code``; the code and message are kept on the exception."""
    return error_class_for(code, http_status)(message or code, code=code, provider=PROVIDER, http_status=http_status)


def transport_error(message: str) -> ProviderError:
    """A connection failure or timeout; always retryable."""
    return TransientProviderError(message or TRANSPORT_ERROR_CODE, code=TRANSPORT_ERROR_CODE, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


def validate_client_token(token: str) -> None:
    """ECS accepts at most 64 ASCII characters; anything else would be rejected after a round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; ECS allows at most {CLIENT_TOKEN_MAX_LENGTH}",
            provider=PROVIDER,
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------------ GPUs

# ECS instance family -> GPU. CAVEAT: GPU-SPECS.md section 5 lists these families but their GPU models were
# NOT verified against an Alibaba-authored page; the table follows the shared price list's gpu_model column.
# Every offer says so in ``extra["gpu_model_source"]``. GPUSpec and GPUMemorySize must agree with the table,
# otherwise the provider's own name is kept so ingestion quarantines the row.
FAMILY_GPU: dict[str, str] = {
    "gn6i": gpu_names.T4,
    "gn6v": gpu_names.V100_16_SXM2,
    "gn6e": gpu_names.V100_32_SXM2,
    "gn7i": gpu_names.A10,
    "gn7": gpu_names.A100_40_SXM,
    "gn7e": gpu_names.A100_80_SXM,
    "ebmgn7e": gpu_names.A100_80_SXM,
}
GPU_MODEL_SOURCE = "ECS family table (family->GPU not verified, GPU-SPECS.md section 5)"

# The word GPUSpec must contain for each key ("NVIDIA A100" must not satisfy A10, so words, not substrings).
GPU_SPEC_WORD: dict[str, str] = {
    gpu_names.T4: "T4",
    gpu_names.A10: "A10",
    gpu_names.V100_16_SXM2: "V100",
    gpu_names.V100_32_SXM2: "V100",
    gpu_names.A100_40_SXM: "A100",
    gpu_names.A100_80_SXM: "A100",
}
NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.A10: 24,
    gpu_names.V100_16_SXM2: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_SXM: 40,
    gpu_names.A100_80_SXM: 80,
}
MEMORY_TOLERANCE = Decimal("0.10")
NVLINK_FAMILIES = frozenset({"gn6v", "gn6e", "gn7", "gn7e", "ebmgn7e"})
_FAMILY_SPLIT = re.compile(r"[-.]")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary."""

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    memory_gib_reported: Decimal


def instance_family(instance_type: str, family_field: str = "") -> str:
    """``ecs.gn6i-c4g1.xlarge`` (or its InstanceTypeFamily ``ecs.gn6i``) -> ``gn6i``.

    Bare-metal names keep their prefix: ``ecs.ebmgn7e.32xlarge`` -> ``ebmgn7e``.
    """
    source = family_field or instance_type
    return _FAMILY_SPLIT.split(source.removeprefix("ecs."), maxsplit=1)[0]


def _near(value: Decimal, nominal: Decimal) -> bool:
    return abs(value - nominal) <= nominal * MEMORY_TOLERANCE


def gpu_spec(instance_type: str, family: str, spec: str, amount: int, memory_gib: Decimal) -> GpuSpec:
    """Map GPUSpec/GPUAmount/GPUMemorySize. The docs do not say whether GPUMemorySize is per GPU or per
    instance, so both readings are accepted when they match the family's nominal size."""
    key = FAMILY_GPU.get(family)
    per_gpu: Decimal | None = None
    if key is not None and GPU_SPEC_WORD[key] in spec.upper().split():
        nominal = Decimal(NOMINAL_MEMORY_GB[key])
        if _near(memory_gib, nominal):
            per_gpu = memory_gib
        elif amount > 1 and _near(memory_gib, nominal * amount):
            per_gpu = memory_gib / amount
    nvlink = amount > 1 and family in NVLINK_FAMILIES
    if key is not None and per_gpu is not None:
        model, memory_gb = key, NOMINAL_MEMORY_GB[key]
    else:
        model, memory_gb = spec or f"unknown GPU ({instance_type})", int(memory_gib)
    return GpuSpec(
        model=model,
        count=amount,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=spec,
        memory_gib_reported=memory_gib,
    )


# ------------------------------------------------------------------------------------------- catalogue


def _decimal(value: Any) -> Decimal:
    """A JSON number (float after the SDK's parsing) or numeric string as an exact Decimal of its shortest repr."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"not a number: {value!r}")
    return Decimal(str(value))


@dataclass(frozen=True, slots=True)
class InstanceTypeSpec:
    """One GPU instance type from ``DescribeInstanceTypes``."""

    instance_type: str
    family: str
    gpu: GpuSpec
    vcpus: int
    memory_gib: Decimal
    extra: dict[str, Any]


def instance_type_spec(item: Mapping[str, Any]) -> InstanceTypeSpec | None:
    """None for types without GPUs; raises ``MalformedProviderResponse`` for unreadable entries."""
    try:
        name = str(item["InstanceTypeId"])
        amount = int(item.get("GPUAmount") or 0)
        if amount <= 0:
            return None
        vcpus = int(item["CpuCoreCount"])
        memory_gib = _decimal(item["MemorySize"])
        gpu_memory = _decimal(item.get("GPUMemorySize") or 0)
        spec = str(item.get("GPUSpec") or "")
        family_field = str(item.get("InstanceTypeFamily") or "")
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable instance type entry ({exc!r})") from None
    family = instance_family(name, family_field)
    gpu = gpu_spec(name, family, spec, amount, gpu_memory)
    extra: dict[str, Any] = {
        "gpu_spec": spec,
        "gpu_memory_gib_reported": str(gpu_memory),
        "gpu_model_source": GPU_MODEL_SOURCE,
        "instance_type_family": family_field or f"ecs.{family}",
        "cpu_architecture": str(item.get("CpuArchitecture") or ""),
    }
    return InstanceTypeSpec(instance_type=name, family=family, gpu=gpu, vcpus=vcpus, memory_gib=memory_gib, extra=extra)


# ------------------------------------------------------------------------------------------ availability

# DescribeAvailableResource categories. ClosedWithStock = "little stock left, replenishment stopped": still buyable.
STOCK_BUYABLE = frozenset({"WithStock", "ClosedWithStock"})


def zone_stock(body: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``DescribeAvailableResource`` (DestinationResource=InstanceType) -> instance type -> zone -> StatusCategory."""
    stock: dict[str, dict[str, str]] = {}
    try:
        for zone in (body.get("AvailableZones") or {}).get("AvailableZone") or []:
            zone_id = str(zone["ZoneId"])
            for resource in (zone.get("AvailableResources") or {}).get("AvailableResource") or []:
                if resource.get("Type") != "InstanceType":
                    continue
                for supported in (resource.get("SupportedResources") or {}).get("SupportedResource") or []:
                    category = str(supported.get("StatusCategory") or supported.get("Status") or "")
                    stock.setdefault(str(supported["Value"]), {})[zone_id] = category
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable DescribeAvailableResource answer ({exc!r})") from None
    return stock


# ----------------------------------------------------------------------------------------------- prices


@dataclass(frozen=True, slots=True)
class Price:
    """``PriceInfo.Price`` of ``DescribePrice``: TradePrice is what the account pays after discounts."""

    trade: Decimal
    original: Decimal
    discount: Decimal
    currency: str


def answer_currency(value: Any, field: str) -> str:
    """The currency an ECS price answer states in ``field``.

    Raises ``MalformedProviderResponse`` when it is missing or not a site's currency: a price in an unknown
    currency converted at the wrong rate is worse than no price (a USD price read as CNY is about 7x too low).
    """
    currency = value if isinstance(value, str) else ""
    if not currency:
        raise malformed(f"{field} is missing: the currency of the prices is not assumed")
    if currency not in SITE_CURRENCIES:
        known = ", ".join(sorted(SITE_CURRENCIES))
        raise malformed(f"{field} is {currency!r}, not the currency of an Alibaba Cloud site ({known})")
    return currency


def price_from_body(body: Mapping[str, Any]) -> Price:
    """``DescribePrice``'s answer; its currency must be stated (``answer_currency``)."""
    try:
        price = body["PriceInfo"]["Price"]
        return Price(
            trade=_decimal(price["TradePrice"]),
            original=_decimal(price.get("OriginalPrice", price["TradePrice"])),
            discount=_decimal(price.get("DiscountPrice") or 0),
            currency=answer_currency(price.get("Currency"), "DescribePrice PriceInfo.Price.Currency"),
        )
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable DescribePrice answer ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class SpotPoint:
    price: Decimal
    origin_price: Decimal | None
    timestamp: datetime


def parse_time(value: str) -> datetime:
    """ECS timestamps: ``2017-09-20T15:00:00Z`` or, in DescribeInstances, minute precision ``2017-12-10T04:04Z``."""
    for pattern in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ"):
        try:
            return datetime.strptime(value, pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def newest_spot_prices(points: Iterable[Mapping[str, Any]]) -> dict[str, SpotPoint]:
    """``SpotPrices.SpotPriceType`` rows of one instance type -> zone -> the newest point."""
    newest: dict[str, SpotPoint] = {}
    try:
        for row in points:
            origin = row.get("OriginPrice")
            point = SpotPoint(
                price=_decimal(row["SpotPrice"]),
                origin_price=_decimal(origin) if origin is not None else None,
                timestamp=parse_time(str(row["Timestamp"])),
            )
            zone = str(row["ZoneId"])
            if zone not in newest or point.timestamp > newest[zone].timestamp:
                newest[zone] = point
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable spot price history row ({exc!r})") from None
    return newest


def spot_strategy(pricing_model: PricingModel, max_price: Decimal | None) -> tuple[str, Decimal | None]:
    """RunInstances' SpotStrategy (and SpotPriceLimit) for a pricing model."""
    if pricing_model is PricingModel.SPOT:
        return ("SpotWithPriceLimit", max_price) if max_price is not None else ("SpotAsPriceGo", None)
    return "NoSpot", None


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "Pending": InstanceState.PENDING,
    "Starting": InstanceState.PENDING,
    "Running": InstanceState.RUNNING,
    "Stopping": InstanceState.STOPPING,
    # A stopped pay-as-you-go instance holds no GPU for the buyer: out of service but not released, as on AWS.
    "Stopped": InstanceState.STOPPING,
}


def instance_state(status: str) -> InstanceState:
    return STATES.get(status, InstanceState.UNKNOWN)


def run_tags(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, str]]:
    """RunInstances ``Tag.N``; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    return [{"Key": k, "Value": v} for k, v in sorted(merged.items())]


def tags_dict(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(t["TagKey"]): str(t.get("TagValue", "")) for t in (tags or {}).get("Tag") or []}


def _first_ip(addresses: Mapping[str, Any] | None) -> str | None:
    values = (addresses or {}).get("IpAddress") or []
    return str(values[0]) if values else None


def instance_handle(item: Mapping[str, Any], region: str) -> InstanceHandle:
    """An ``Instances.Instance`` entry of ``DescribeInstances`` -> ``InstanceHandle``."""
    try:
        status = str(item["Status"])
        created = str(item.get("CreationTime") or "")
        vpc = item.get("VpcAttributes") or {}
        eip = (item.get("EipAddress") or {}).get("IpAddress") or None
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=str(item.get("RegionId") or region),
            zone=str(item["ZoneId"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(status),
            public_ip=_first_ip(item.get("PublicIpAddress")) or (str(eip) if eip else None),
            private_ip=_first_ip(vpc.get("PrivateIpAddress")) or _first_ip(item.get("InnerIpAddress")),
            launched_at=parse_time(created).isoformat() if created else None,
            tags=tags_dict(item.get("Tags")),
            extra={
                "status": status,
                "spot_strategy": str(item.get("SpotStrategy") or "NoSpot"),
                "charge_type": str(item.get("InstanceChargeType") or ""),
                "image_id": str(item.get("ImageId") or ""),
                "vswitch_id": str(vpc.get("VSwitchId") or ""),
            },
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles_from_body(body: Mapping[str, Any], region: str) -> list[InstanceHandle]:
    """Every instance of one ``DescribeInstances`` page."""
    try:
        items = (body.get("Instances") or {}).get("Instance") or []
    except AttributeError as exc:
        raise malformed(f"unreadable DescribeInstances answer ({exc!r})") from None
    return [instance_handle(item, region) for item in items]


# ------------------------------------------------------------------ boot: keys, firewall, disk, image, user data

# RunInstances UserData: "The size of instance user data cannot exceed 32 KB before Base64 encoding" (RunInstances
# API reference; "Instance user data", https://www.alibabacloud.com/help/en/ecs/user-guide/overview-of-ecs-instance-
# user-data). Older pages still say 16 KB: the current reference is the one followed.
USER_DATA_MAX_BYTES = 32 * 1024
# RunInstances SystemDisk.Size (GiB): 20 to 2048 for the default categories (cloud_efficiency, cloud_ssd, ESSD PL1),
# and never below the image's size.
SYSTEM_DISK_MIN_GB = 20
SYSTEM_DISK_MAX_GB = 2048
# AuthorizeSecurityGroup: "The total number of inbound security group rules in each security group cannot exceed 200";
# one call takes Permissions.N with N from 1 to 100.
INGRESS_RULES_MAX = 200
PERMISSIONS_PER_CALL = 100
# ImportKeyPair takes rsa, dsa, ssh-rsa, ssh-dss and ecdsa public keys (and their OpenSSH certificates); ED25519 and
# the security-key types are not listed, so those reach the machine through the boot script only.
NATIVE_KEY_TYPES = frozenset({sshkeys.RSA, *sshkeys.ECDSA_TYPES})
# Alibaba publishes its public images in families ("acs:<os>_<version>_<arch>"): DescribeImages with ImageFamily
# answers every build of the family, and ECS itself launches the newest Available one when given the family
# ("Image family overview", https://www.alibabacloud.com/help/en/elastic-compute-service/latest/image-family-overview).
DEFAULT_IMAGE_FAMILY = "acs:ubuntu_22_04_x64"
RESOURCE_PREFIX = "gpu-broker-"
NAME_MAX = 128
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9:_.\-]")

# The GPU driver: ECS public images carry none. Alibaba's documented way to have it at creation is user data that
# fetches its installer from the region's internal mirror (the address comes from the instance metadata item
# ``source-address``) and runs it with the driver, CUDA and cuDNN versions. The script name, path, arguments and
# these versions are the ones Alibaba's own quickstarts pass (aliyun-computenest/quickstart-LobeChat,
# lobe-chat-gpu/init_gpu.sh); the guard skips it on an image that already has a working driver.
GPU_DRIVER_VERSION = "550.127.08"
CUDA_VERSION = "12.4.1"
CUDNN_VERSION = "9.2.0.82"
GPU_INSTALLER = "auto_install_v4.0.sh"
GPU_INSTALLER_PATH = "/opsx/ecs/linux/binary/script/"
METADATA_SOURCE_ADDRESS = "http://100.100.100.200/latest/meta-data/source-address"


def gpu_driver_prelude() -> str:
    """Shell lines installing the NVIDIA driver the way Alibaba documents it, unless ``nvidia-smi`` already works."""
    return "\n".join(
        [
            "if ! nvidia-smi >/dev/null 2>&1; then",
            f"  mirror=$(curl -fsS --max-time 10 {METADATA_SOURCE_ADDRESS} | head -n 1)",
            "  install -d -m 700 /root/auto_install",
            f"  if curl -fsS --max-time 300 -o /root/auto_install/{GPU_INSTALLER} "
            f'"$mirror{GPU_INSTALLER_PATH}{GPU_INSTALLER}"; then',
            f"    (cd /root/auto_install && bash {GPU_INSTALLER} {GPU_DRIVER_VERSION} {CUDA_VERSION} {CUDNN_VERSION} "
            "FALSE FALSE) >>/var/log/gpu-broker-driver.log 2>&1",
            "  fi",
            "fi",
        ]
    )


def order_resource_name(order_ref: str) -> str:
    """The name of the key pair and the security group an order's launches share in a region.

    ImportKeyPair and CreateSecurityGroup take 2-128 characters starting with a letter: letters, digits, ``:``,
    ``_``, ``.`` and ``-``. Anything else in the reference becomes ``-``.
    """
    return (RESOURCE_PREFIX + _NAME_UNSAFE.sub("-", order_ref))[:NAME_MAX]


def security_group_token(order_ref: str, region: str, vpc_id: str) -> str:
    """CreateSecurityGroup's ClientToken (at most 64 ASCII characters): one per order, region and VPC, so two
    attempts racing to create the group get the same one back."""
    return "sg-" + hashlib.sha256(f"{order_ref}|{region}|{vpc_id}".encode()).hexdigest()[:40]


def order_tags(order_ref: str) -> list[dict[str, str]]:
    """``Tag.N`` for everything a launch creates besides the instance."""
    return [{"Key": ORDER_TAG, "Value": order_ref}]


def native_key(keys: Sequence[sshkeys.SshPublicKey]) -> sshkeys.SshPublicKey | None:
    """The key ECS's own key pair gets: the first of a type ImportKeyPair takes. An instance binds one key pair
    holding one key, so the others (and every ED25519 key) are installed by the boot script alone."""
    return next((key for key in keys if key.key_type in NATIVE_KEY_TYPES), None)


def encode_user_data(script: bytes) -> str:
    """RunInstances UserData is the script Base64-encoded."""
    return base64.b64encode(script).decode("ascii")


def ingress_permissions(rules: Iterable[IngressRule], description: str) -> list[dict[str, str]]:
    """AuthorizeSecurityGroup ``Permissions.N``: one accept rule per (port, address range), IPv4 ranges in
    ``SourceCidrIp`` and IPv6 ranges in ``Ipv6SourceCidrIp`` (one rule cannot carry both)."""
    permissions: list[dict[str, str]] = []
    seen: set[tuple[str, int, str]] = set()
    for rule in rules:
        for cidr in rule.cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            if (rule.protocol, rule.port, str(network)) in seen:
                continue
            seen.add((rule.protocol, rule.port, str(network)))
            source = "SourceCidrIp" if network.version == 4 else "Ipv6SourceCidrIp"
            permissions.append(
                {
                    "IpProtocol": rule.protocol,
                    "PortRange": f"{rule.port}/{rule.port}",
                    source: str(network),
                    "Policy": "accept",
                    "Priority": "1",
                    "Description": description,
                }
            )
    return permissions


def _port_range(value: str, protocol: str) -> range:
    start, _, end = value.partition("/")
    low, high = int(start), int(end or start)
    if low == -1 or protocol.lower() == "all":  # ICMP, GRE and "all" rules name -1/-1: every port
        return range(1, 65536)
    return range(low, high + 1)


def ingress_pairs(permissions: Iterable[Mapping[str, Any]]) -> set[tuple[int, str]]:
    """Every (port, address range) that ``Permissions.Permission`` of DescribeSecurityGroupAttribute lets in:
    inbound accept rules with an address source; a port range counts every port in it."""
    pairs: set[tuple[int, str]] = set()
    try:
        for item in permissions:
            if str(item.get("Direction") or "ingress").lower() != "ingress":
                continue
            if str(item.get("Policy") or "accept").lower() != "accept":
                continue
            cidr = str(item.get("SourceCidrIp") or item.get("Ipv6SourceCidrIp") or "")
            if not cidr:
                continue
            network = str(ipaddress.ip_network(cidr, strict=False))
            pairs.update((port, network) for port in _port_range(str(item["PortRange"]), str(item["IpProtocol"])))
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable security group rule ({exc!r})") from None
    return pairs


def newest_image(items: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest Available image of a DescribeImages answer: what ECS launches for the family."""
    available = [item for item in items if str(item.get("Status") or "Available") == "Available"]
    try:
        return max(available, key=lambda item: parse_time(str(item["CreationTime"])), default=None)
    except (KeyError, ValueError) as exc:
        raise malformed(f"unreadable image entry ({exc!r})") from None


def image_size_gb(item: Mapping[str, Any]) -> int:
    try:
        return int(item.get("Size") or 0)
    except (TypeError, ValueError):
        raise malformed(f"unreadable image size {item.get('Size')!r}") from None


def _order_of(tags: Mapping[str, Any] | None) -> str:
    return tags_dict(tags).get(ORDER_TAG, "")


def key_pair_resources(items: Iterable[Mapping[str, Any]], region: str) -> list[OrderResource]:
    """DescribeKeyPairs ``KeyPairs.KeyPair`` entries tagged with an order."""
    found: list[OrderResource] = []
    for item in items:
        order_ref = _order_of(item.get("Tags"))
        if order_ref:
            found.append(
                OrderResource(
                    kind="key_pair",
                    resource_id=str(item["KeyPairName"]),
                    region=region,
                    order_ref=order_ref,
                    extra={"fingerprint": str(item.get("KeyPairFingerPrint") or "")},
                )
            )
    return found


def security_group_resources(items: Iterable[Mapping[str, Any]], region: str) -> list[OrderResource]:
    """DescribeSecurityGroups ``SecurityGroups.SecurityGroup`` entries tagged with an order."""
    found: list[OrderResource] = []
    for item in items:
        order_ref = _order_of(item.get("Tags"))
        if order_ref:
            found.append(
                OrderResource(
                    kind="security_group",
                    resource_id=str(item["SecurityGroupId"]),
                    region=region,
                    order_ref=order_ref,
                    extra={"vpc_id": str(item.get("VpcId") or ""), "name": str(item.get("SecurityGroupName") or "")},
                )
            )
    return found
