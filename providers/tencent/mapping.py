"""Tencent CVM response dicts -> broker DTOs, and Tencent error codes -> broker error classes.

Pure functions over plain dicts and strings: nothing here imports the Tencent SDK, so the tables can be tested
without a network and reused by any code that sees a Tencent error code.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
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
from providers.launch import IngressRule
from providers.types import InstanceHandle, InstanceState, OfferQuote, PricingModel

PROVIDER = "tencent"
ORDER_TAG = "broker:order"
# CVM's price answers (ItemPrice, in DescribeZoneInstanceConfigInfos and InquiryPriceRunInstances) state no currency:
# an account is billed in the currency of the site it signed up on, CNY on the China site (cloud.tencent.com) and
# USD on the International site (tencentcloud.com). Only the account can say which, so it is an account option.
SITE_CURRENCIES: dict[str, str] = {"china": "CNY", "international": "USD"}
DEFAULT_SITE = "china"
CLIENT_TOKEN_MAX_LENGTH = 64
INSTANCE_NAME_MAX_LENGTH = 128

ON_DEMAND_CHARGE = "POSTPAID_BY_HOUR"
SPOT_CHARGE = "SPOTPAID"
CHARGE_TYPES: dict[str, PricingModel] = {ON_DEMAND_CHARGE: PricingModel.ON_DEMAND, SPOT_CHARGE: PricingModel.SPOT}
CHARGE_FOR_MODEL: dict[PricingModel, str] = {model: charge for charge, model in CHARGE_TYPES.items()}

NOT_FOUND_CODE = "InvalidInstanceId.NotFound"
# The code reported for a LAUNCH_FAILED instance whose error message names no known code.
LAUNCH_FAILED_CODE = "LAUNCH_FAILED"

# --------------------------------------------------------------------------------------------- errors

ERROR_CLASSES: dict[str, type[ProviderError]] = {
    # no capacity: try another zone, type or provider
    "ResourceInsufficient": CapacityUnavailable,
    "ResourceInsufficient.SpecifiedInstanceType": CapacityUnavailable,
    "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance": CapacityUnavailable,
    "ResourceInsufficient.AvailabilityZoneSoldOut": CapacityUnavailable,
    "ResourceInsufficient.InsufficientOfferingMinimum": CapacityUnavailable,
    "ResourceInsufficient.CloudDiskSoldOut": CapacityUnavailable,
    # "this zone does not sell this type": the offer is stale, another zone or type may work
    "ResourceUnavailable.InstanceType": CapacityUnavailable,
    "ResourceNotFound.InvalidZoneInstanceType": CapacityUnavailable,
    # a spot bid below the market price, the counterpart of AWS SpotMaxPriceTooLow
    "InvalidParameterValue.InsufficientPrice": CapacityUnavailable,
    LAUNCH_FAILED_CODE: CapacityUnavailable,
    # quota: skip the region or account
    "LimitExceeded": QuotaExceeded,
    "LimitExceeded.InstanceQuota": QuotaExceeded,
    "LimitExceeded.CvmInstanceQuota": QuotaExceeded,
    "LimitExceeded.SpotQuota": QuotaExceeded,
    "LimitExceeded.UserSpotQuota": QuotaExceeded,
    "LimitExceeded.PrepayQuota": QuotaExceeded,
    "InstancesQuotaLimitExceeded": QuotaExceeded,
    "ResourceInsufficient.InsufficientGroupQuota": QuotaExceeded,
    "ResourceInsufficient.DisasterRecoverGroupCvmQuota": QuotaExceeded,
    # The region's key pairs are used up (ImportKeyPair): another region or account has room.
    "InvalidKeyPair.LimitExceeded": QuotaExceeded,
    # An account without balance can buy nothing in any region until topped up: skipping it is the quota action.
    "InvalidAccount.InsufficientBalance": QuotaExceeded,
    "InvalidAccount.UnpaidOrder": QuotaExceeded,
    # transient: retry with backoff
    "RequestLimitExceeded": TransientProviderError,
    "InternalError": TransientProviderError,
    "InternalServerError": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "MutexOperation.TaskRunning": TransientProviderError,
    "OperationDenied.InstanceOperationInProgress": TransientProviderError,
    "UnsupportedOperation.InstanceStatePending": TransientProviderError,
    # raised by the SDK itself: connection failures and timeouts, and non-200 HTTP answers (proxies, gateways)
    "ClientNetworkError": TransientProviderError,
    "ServerNetworkError": TransientProviderError,
    # credentials: block the account
    "AuthFailure": CredentialsRejected,
    "UnauthorizedOperation": CredentialsRejected,
    "UnauthorizedOperation.PermissionDenied": CredentialsRejected,
    "UnauthorizedOperation.InvalidToken": CredentialsRejected,
    "UnauthorizedOperation.MFAExpired": CredentialsRejected,
    "UnauthorizedOperation.MFANotFound": CredentialsRejected,
    "InvalidCredential": CredentialsRejected,  # the SDK's answer to an empty secret id or key
}

# Families of codes classified by prefix; an exact entry above wins over a prefix.
ERROR_PREFIXES: tuple[tuple[str, type[ProviderError]], ...] = (
    ("ResourcesSoldOut.", CapacityUnavailable),
    ("AuthFailure.", CredentialsRejected),
    ("RequestLimitExceeded", TransientProviderError),  # .IPLimitExceeded, .UinLimitExceeded, ...
    ("InternalError.", TransientProviderError),
)

# The SDK wraps any non-SDK exception of a call (an unparsable body, a missing key) as
# TencentCloudSDKException(type(e).__name__, str(e)): these names mean the answer could not be read.
MALFORMED_CODES: frozenset[str] = frozenset(
    {"JSONDecodeError", "KeyError", "TypeError", "ValueError", "AttributeError", "IndexError", "UnicodeDecodeError"}
)

# Codes a TerminateInstances call answers when the instance is already on its way out.
ALREADY_TERMINATING_CODES: frozenset[str] = frozenset(
    {
        "UnsupportedOperation.InstanceStateTerminating",
        "UnsupportedOperation.InstanceStateShutdown",
        "UnsupportedOperation.InstanceStateTerminated",
    }
)


def error_class_for(code: str) -> type[ProviderError]:
    """The broker error class for a Tencent error code (exact, then prefix). Unknown codes are final."""
    known = ERROR_CLASSES.get(code)
    if known is not None:
        return known
    if code in MALFORMED_CODES:
        return MalformedProviderResponse
    for prefix, cls in ERROR_PREFIXES:
        if code.startswith(prefix):
            return cls
    return ProviderRequestRejected


def is_known_code(code: str) -> bool:
    """True when ``code`` is in the tables (exactly or by prefix), i.e. it does not fall through to final."""
    return code in ERROR_CLASSES or any(code.startswith(prefix) for prefix, _ in ERROR_PREFIXES)


def error_from_code(code: str, message: str, request_id: str = "") -> ProviderError:
    """Build the broker error for a Tencent ``Error.Code``; the code, message and RequestId are kept."""
    text = message or code
    if request_id:
        text = f"{text} (RequestId {request_id})"
    return error_class_for(code)(text, code=code, provider=PROVIDER)


def malformed(message: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(message, provider=PROVIDER)


def validate_client_token(token: str) -> None:
    """CVM accepts at most 64 ASCII characters (InvalidClientToken.TooLong otherwise); check before the round trip."""
    if not token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    if len(token) > CLIENT_TOKEN_MAX_LENGTH:
        raise ProviderRequestRejected(
            f"client_token is {len(token)} characters; CVM allows at most {CLIENT_TOKEN_MAX_LENGTH}",
            code="InvalidClientToken.TooLong",
            provider=PROVIDER,
        )
    if not all(" " < ch <= "~" for ch in token):
        raise ProviderRequestRejected("client_token must be printable ASCII without spaces", provider=PROVIDER)


# ------------------------------------------------------------------------------------------------ GPUs

# The family fixes the GPU; DescribeInstanceTypeConfigs' GpuType only confirms it. Sources: the price page of
# the shared list-price table (GT4 = A100 40 GB, GN10X/GN10Xp = V100 32 GB, GN7/GI3X = T4) and TI-ONE specs.
FAMILY_GPU: dict[str, str] = {
    # The A100's form factor in GT4 is not sourced. PCIe is the conservative key: the broker ranks the PCIe
    # card at or below the SXM4 one, so an unverified SXM claim can never overstate the offer.
    "GT4": gpu_names.A100_40_PCIE,
    "GN10X": gpu_names.V100_32_SXM2,
    "GN10Xp": gpu_names.V100_32_SXM2,
    "GN7": gpu_names.T4,
    "GI3X": gpu_names.T4,
}

# The token GpuType must contain (case-insensitive) for a family's key to be trusted.
GPU_TYPE_TOKEN: dict[str, str] = {
    gpu_names.T4: "T4",
    gpu_names.V100_32_SXM2: "V100",
    gpu_names.A100_40_PCIE: "A100",
}

NOMINAL_MEMORY_GB: dict[str, int] = {
    gpu_names.T4: 16,
    gpu_names.V100_32_SXM2: 32,
    gpu_names.A100_40_PCIE: 40,
}
MEMORY_TOLERANCE = Decimal("0.10")

# SXM2 boards: the GPUs of a multi-GPU GN10X/GN10Xp instance share an NVLink mesh.
NVLINK_FAMILIES = frozenset({"GN10X", "GN10Xp"})


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What one instance type carries, mapped to the broker's vocabulary."""

    model: str
    count: int
    memory_gb: int
    interconnect: str
    raw_name: str
    physical_count: Decimal
    raw_memory_gib: Decimal | None


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _decimal(value: Any, what: str) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise malformed(f"{what}: {value!r} is not a number ({exc!r})") from None


def gpu_model_key(instance_type: str, gpu_type: str, gpu_memory_gib: Decimal | None) -> str | None:
    """The canonical key, or None when the family is unknown or the catalogue contradicts the family table.

    An empty ``gpu_type`` or memory does not contradict: the family alone is then trusted.
    """
    key = FAMILY_GPU.get(instance_family(instance_type))
    if key is None:
        return None
    if gpu_type and GPU_TYPE_TOKEN[key] not in gpu_type.upper():
        return None
    if gpu_memory_gib is not None and gpu_memory_gib > 0:
        nominal = Decimal(NOMINAL_MEMORY_GB[key])
        if abs(gpu_memory_gib - nominal) > nominal * MEMORY_TOLERANCE:
            return None
    return key


def gpu_spec(instance_type: str, gpu: Any, gpu_count: Any, gpu_type: str, gpu_memory_gib: Any) -> GpuSpec | None:
    """Map the GPU fields of a catalogue row; None for a type without GPUs.

    ``gpu_count`` (physical cards, below 1 for a vGPU slice) wins over the integer ``gpu``. Unknown or
    fractional GPUs keep the provider's name so that ingestion quarantines them.
    """
    physical = _decimal(gpu_count, f"{instance_type} GpuCount")
    if physical is None:
        physical = _decimal(gpu, f"{instance_type} Gpu")
    if physical is None or physical <= 0:
        return None
    memory = _decimal(gpu_memory_gib, f"{instance_type} GpuMemory")
    whole = physical >= 1 and physical == physical.to_integral_value()
    family = instance_family(instance_type)
    raw_name = gpu_type or f"{family} GPU"
    key = gpu_model_key(instance_type, gpu_type, memory) if whole else None
    if key is not None:
        model, memory_gb = key, NOMINAL_MEMORY_GB[key]
    elif whole:
        model, memory_gb = raw_name, int(memory or 0)
    else:
        # A vGPU slice is not the whole card its name suggests; keep it out of the canonical keys.
        share = Fraction(str(physical)).limit_denominator(64)
        model, memory_gb = f"{raw_name} ({share} partition)", int(memory or 0)
    count = int(physical) if whole else 1
    nvlink = count > 1 and family in NVLINK_FAMILIES
    return GpuSpec(
        model=model,
        count=count,
        memory_gb=memory_gb,
        interconnect="nvlink" if nvlink else "pcie",
        raw_name=raw_name,
        physical_count=physical,
        raw_memory_gib=memory,
    )


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """``GpuType``/``GpuMemory`` of one instance type from ``DescribeInstanceTypeConfigs``."""

    gpu_type: str
    gpu_memory_gib: Any


def gpu_identities(configs: Iterable[Mapping[str, Any]]) -> dict[str, GpuIdentity]:
    """``InstanceTypeConfigSet`` rows (one per zone) -> instance type -> its GPU identity (first non-empty wins)."""
    found: dict[str, GpuIdentity] = {}
    try:
        for row in configs:
            name = str(row["InstanceType"])
            gpu_type = str(row.get("GpuType") or "")
            current = found.get(name)
            if current is None or (not current.gpu_type and gpu_type):
                found[name] = GpuIdentity(gpu_type=gpu_type, gpu_memory_gib=row.get("GpuMemory"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance type config ({exc!r})") from None
    return found


# ------------------------------------------------------------------------------------------- catalogue

SELLING = "SELL"
WITHOUT_STOCK = "WithoutStock"


def is_gpu_row(item: Mapping[str, Any]) -> bool:
    """True for a ``InstanceTypeQuotaSet`` row that carries at least a slice of a GPU."""
    for key in ("GpuCount", "Gpu"):
        value = item.get(key)
        if value not in (None, ""):
            try:
                return Decimal(str(value)) > 0
            except InvalidOperation:
                raise malformed(f"{item.get('InstanceType')}: {key} {value!r} is not a number") from None
    return False


def hourly_price(price: Mapping[str, Any] | None) -> tuple[Decimal, Decimal] | None:
    """(price the account pays, list price) per hour from ``ItemPrice``; None when no hourly price is stated.

    ``UnitPriceDiscount`` is the account's price after its discount, ``UnitPrice`` the list price; both are the
    first pricing step (the first 96 hours when later steps are returned).
    """
    if not price:
        return None
    unit = str(price.get("ChargeUnit") or "HOUR").upper()
    if unit != "HOUR":
        return None
    listed = _decimal(price.get("UnitPrice"), "UnitPrice")
    paid = _decimal(price.get("UnitPriceDiscount"), "UnitPriceDiscount")
    if paid is None:
        paid = listed
    if paid is None:
        return None
    return paid, listed if listed is not None else paid


def site_currency(site: str) -> str:
    """The currency an account on ``site`` is priced in. Raises ``ValueError`` naming the option for another site."""
    try:
        return SITE_CURRENCIES[site]
    except KeyError:
        raise ValueError(f"options.site: {site!r} is not one of {', '.join(sorted(SITE_CURRENCIES))}") from None


def offer_from_quota_item(
    item: Mapping[str, Any], region: str, identities: Mapping[str, GpuIdentity], *, currency: str
) -> OfferQuote | None:
    """One ``InstanceTypeQuotaSet`` row -> an offer priced in ``currency`` (the account's site's, since the row
    states none), or None when it is not one the broker can buy.

    Left out: types without GPUs, charge types other than POSTPAID_BY_HOUR/SPOTPAID, rows without an hourly
    price, and sold-out rows (``Status`` SOLD_OUT or ``StatusCategory`` WithoutStock): CVM has no stock count,
    so the broker learns about stock only by the row's presence. Raises ``MalformedProviderResponse``.
    """
    try:
        name = str(item["InstanceType"])
        zone = str(item["Zone"])
        charge = str(item.get("InstanceChargeType") or "")
        status = str(item.get("Status") or "")
        category = str(item.get("StatusCategory") or "")
        vcpus = int(item["Cpu"])
        memory_gib = Decimal(str(item["Memory"]))
    except (KeyError, TypeError, ValueError, InvalidOperation) as exc:
        raise malformed(f"unreadable instance type quota row ({exc!r})") from None
    pricing_model = CHARGE_TYPES.get(charge)
    if pricing_model is None or status != SELLING or category == WITHOUT_STOCK or not is_gpu_row(item):
        return None
    prices = hourly_price(item.get("Price"))
    if prices is None:
        return None
    paid, listed = prices
    identity = identities.get(name, GpuIdentity("", None))
    gpu = gpu_spec(name, item.get("Gpu"), item.get("GpuCount"), identity.gpu_type, identity.gpu_memory_gib)
    if gpu is None:
        return None
    price_info = item.get("Price") or {}
    extra: dict[str, Any] = {
        "charge_type": charge,
        "status": status,
        "status_category": category,
        "list_price": str(listed),
        "discount": str(price_info.get("Discount", "")),
        "instance_family": str(item.get("InstanceFamily") or instance_family(name)),
        "type_name": str(item.get("TypeName") or ""),
        "cpu_type": str(item.get("CpuType") or ""),
        "gpu_type": gpu.raw_name,
        "gpu_count_physical": str(gpu.physical_count),
        "gpu_memory_gib": str(gpu.raw_memory_gib) if gpu.raw_memory_gib is not None else "",
        "network_card_gbps": item.get("NetworkCard"),
        "instance_bandwidth_gbps": item.get("InstanceBandwidth"),
    }
    return OfferQuote(
        region=region,
        zone=zone,
        instance_type=name,
        pricing_model=pricing_model,
        gpu_model=gpu.model,
        gpu_count=gpu.count,
        gpu_memory_gb=gpu.memory_gb,
        vcpus=vcpus,
        memory_gib=memory_gib,
        price=paid,
        currency=currency,
        capacity=None,
        interconnect=gpu.interconnect,
        extra=extra,
    )


def gpu_families(items: Iterable[Mapping[str, Any]]) -> list[str]:
    """The instance families of the GPU rows of ``InstanceTypeQuotaSet``, sorted."""
    families: set[str] = set()
    try:
        for item in items:
            if is_gpu_row(item):
                name = str(item["InstanceType"])
                families.add(str(item.get("InstanceFamily") or instance_family(name)))
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance type quota row ({exc!r})") from None
    return sorted(families)


# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "PENDING": InstanceState.PENDING,
    "LAUNCH_FAILED": InstanceState.FAILED,
    "RUNNING": InstanceState.RUNNING,
    # A stopped instance holds no GPU for the buyer: out of service but not terminated, like stopping.
    "STOPPED": InstanceState.STOPPING,
    "STARTING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING,
    "REBOOTING": InstanceState.RUNNING,
    # SHUTDOWN is "stopped, waiting to be destroyed" (the recycle bin): the terminate has been carried out.
    "SHUTDOWN": InstanceState.TERMINATED,
    "TERMINATING": InstanceState.STOPPING,
    # A live migration keeps the guest running; that is its point.
    "ENTER_SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
    "SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
    "EXIT_SERVICE_LIVE_MIGRATE": InstanceState.RUNNING,
}

_CODE_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*")


def launch_failure(message: str) -> tuple[str, type[ProviderError]]:
    """The code and class of a LAUNCH_FAILED instance from its ``LatestOperationErrorMsg``.

    CVM reports an asynchronous failure only as free text; the first known error code in it decides. With none,
    the failure counts as capacity: the request was accepted and then could not be placed, so the broker should
    try elsewhere rather than retry the same placement or give up.
    """
    for token in _CODE_TOKEN.findall(message or ""):
        if is_known_code(token) and token != LAUNCH_FAILED_CODE:
            return token, error_class_for(token)
    return LAUNCH_FAILED_CODE, CapacityUnavailable


def instance_state(state_name: str) -> InstanceState:
    return STATES.get(state_name, InstanceState.UNKNOWN)


def tags_dict(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value") or "") for t in tags or ()}


def tag_specification(order_ref: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """``TagSpecification`` for the instance; the broker's order tag wins over a caller tag of the same key."""
    merged = {**tags, ORDER_TAG: order_ref}
    return [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in sorted(merged.items())]}]


def _first(values: Any) -> str | None:
    if isinstance(values, list) and values:
        return str(values[0]) or None
    return None


def instance_handle(item: Mapping[str, Any], region: str) -> InstanceHandle:
    """An ``InstanceSet`` entry of ``DescribeInstances`` -> ``InstanceHandle``.

    A LAUNCH_FAILED instance is ``FAILED`` with ``extra`` error_class / error_code / error_message.
    """
    try:
        state_name = str(item["InstanceState"])
        placement = item.get("Placement") or {}
        extra: dict[str, Any] = {
            "state_name": state_name,
            "charge_type": str(item.get("InstanceChargeType") or ""),
            "latest_operation": str(item.get("LatestOperation") or ""),
            "latest_operation_state": str(item.get("LatestOperationState") or ""),
            "latest_operation_request_id": str(item.get("LatestOperationRequestId") or ""),
            "image_id": str(item.get("ImageId") or ""),
            "uuid": str(item.get("Uuid") or ""),
            "instance_name": str(item.get("InstanceName") or ""),
        }
        if state_name == "LAUNCH_FAILED":
            message = str(item.get("LatestOperationErrorMsg") or "the instance failed to launch")
            code, cls = launch_failure(message)
            extra.update({"error_class": cls.error_class, "error_code": code, "error_message": message})
        return InstanceHandle(
            instance_id=str(item["InstanceId"]),
            region=region,
            zone=str(placement["Zone"]),
            instance_type=str(item["InstanceType"]),
            state=instance_state(state_name),
            public_ip=_first(item.get("PublicIpAddresses")),
            private_ip=_first(item.get("PrivateIpAddresses")),
            launched_at=str(item.get("CreatedTime") or "") or None,
            tags=tags_dict(item.get("Tags")),
            extra=extra,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def handles(items: Iterable[Mapping[str, Any]], region: str) -> list[InstanceHandle]:
    try:
        return [instance_handle(item, region) for item in items]
    except TypeError as exc:
        raise malformed(f"unreadable InstanceSet ({exc!r})") from None


# ----------------------------------------------------------------------------------------------- images

UBUNTU_PLATFORM = "Ubuntu"
_VERSION = re.compile(r"(\d+)\.(\d+)")


def newest_ubuntu_image(images: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of the highest Ubuntu release (then newest build) among usable x86_64 ``DescribeImages`` results."""
    best: tuple[tuple[int, int, str], str] | None = None
    for image in images:
        if str(image.get("Platform", "")) != UBUNTU_PLATFORM or image.get("ImageDeprecated"):
            continue
        if str(image.get("Architecture", "x86_64")) != "x86_64" or str(image.get("ImageState", "NORMAL")) != "NORMAL":
            continue
        match = _VERSION.search(str(image.get("OsName", "")))
        if match is None:
            continue
        key = (int(match.group(1)), int(match.group(2)), str(image.get("CreatedTime", "")))
        if best is None or key > best[0]:
            best = (key, str(image["ImageId"]))
    return best[1] if best else None


# ------------------------------------------------------------------------------------------------ boot
#
# What a launch carries on CVM (``providers.launch.BootSpec``) in CVM's and VPC's own fields. Sources:
# RunInstances https://cloud.tencent.com/document/api/213/15730 (UserData, SystemDisk, LoginSettings.KeyIds,
# SecurityGroupIds), ImportKeyPair https://cloud.tencent.com/document/api/213/15703, DeleteKeyPairs
# https://cloud.tencent.com/document/api/213/15700, CreateSecurityGroup https://cloud.tencent.com/document/api/215/15806
# and DescribeSecurityGroupLimits https://cloud.tencent.com/document/api/215/41428.

# ImportKeyPair KeyName: "digits, letters and underscores, at most 25 characters".
KEY_NAME_MAX_LENGTH = 25
KEY_NAME_PREFIX = "brk_"
# ImportKeyPair PublicKey: "the public key of the key pair, in OpenSSH RSA format". Other key types reach the
# machine through the boot script alone.
NATIVE_KEY_TYPES = frozenset({"ssh-rsa"})
# CreateSecurityGroup GroupName: "any name of at most 60 characters"; GroupDescription: at most 100.
SECURITY_GROUP_NAME_MAX_LENGTH = 60
SECURITY_GROUP_DESCRIPTION = "gpu-broker: the buyer's addresses for one order"
# DescribeSecurityGroupLimits' SecurityGroupPolicyLimit: 100 rules in one security group (its documented example).
SECURITY_GROUP_POLICY_LIMIT = 100
# RunInstances UserData: "base64-encoded, at most 16 KB". The limit is read as applying to the encoded field
# (the stricter reading): a script refused here might have fitted, never the other way round.
USER_DATA_MAX_BYTES = 16 * 1024

# A new security group denies everything in both directions until rules are added (CreateSecurityGroup's
# description), so the machine gets explicit egress or it could not fetch its agent. With Protocol ALL the
# SecurityGroupPolicy data type asks for Port "all".
EGRESS_POLICIES: tuple[dict[str, str], ...] = (
    {"Protocol": "ALL", "Port": "all", "CidrBlock": "0.0.0.0/0", "Action": "ACCEPT"},
    {"Protocol": "ALL", "Port": "all", "Ipv6CidrBlock": "::/0", "Action": "ACCEPT"},
)

# DeleteKeyPairs: "a key pair used by an instance or image cannot be deleted". The code is not in the reference's
# excerpt we could read; InvalidParameterValue.KeyPairNotSupported ("the key does not support this operation",
# the SDK's error table) is the one Tencent's own Terraform provider retries a key pair deletion on.
KEY_PAIR_IN_USE_CODES = frozenset({"InvalidParameterValue.KeyPairNotSupported", "InvalidKeyPair"})
KEY_PAIR_GONE_CODES = frozenset({"InvalidKeyPairId.NotFound"})
KEY_NAME_TAKEN_CODE = "InvalidKeyPairName.Duplicate"
PUBLIC_KEY_TAKEN_CODE = "InvalidPublicKey.Duplicate"
# DeleteSecurityGroup on a group still bound to an instance: ResourceInUse ("the resource is in use", VPC's table).
SECURITY_GROUP_IN_USE_CODES = frozenset({"ResourceInUse"})
SECURITY_GROUP_GONE_CODES = frozenset({"InvalidSecurityGroupID.NotFound"})


def canonical_public_key(text: str) -> str:
    """``"<type> <base64>"`` of an OpenSSH public key line; CVM keeps the comment, comparisons must not."""
    return " ".join(str(text).split()[:2])


def key_pair_name(order_ref: str, public_key: str) -> str:
    """A deterministic KeyName for one buyer key of one order: ``brk_`` and 21 hex digits of a hash, so a
    resumed launch asks for the same name and the order reference (longer than 25 characters) is in the tag."""
    digest = hashlib.sha256(f"{order_ref}\n{canonical_public_key(public_key)}".encode()).hexdigest()
    return (KEY_NAME_PREFIX + digest)[:KEY_NAME_MAX_LENGTH]


def security_group_name(order_ref: str) -> str:
    return f"broker-{order_ref}"[:SECURITY_GROUP_NAME_MAX_LENGTH]


def order_tags(order_ref: str) -> list[dict[str, str]]:
    return [{"Key": ORDER_TAG, "Value": order_ref}]


def order_of(tags: Iterable[Mapping[str, Any]] | None) -> str | None:
    """The order reference tagged on a key pair or security group, if any."""
    return tags_dict(tags).get(ORDER_TAG) or None


def ingress_policies(rules: Iterable[IngressRule]) -> list[dict[str, str]]:
    """One ACCEPT policy per (port, address range): ``CidrBlock`` for IPv4, ``Ipv6CidrBlock`` for IPv6 (the two
    are exclusive in one policy)."""
    policies: list[dict[str, str]] = []
    for rule in rules:
        for cidr in rule.cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            field = "CidrBlock" if network.version == 4 else "Ipv6CidrBlock"
            policies.append(
                {"Protocol": rule.protocol.upper(), "Port": str(rule.port), field: str(network), "Action": "ACCEPT"}
            )
    return policies


def policy_key(policy: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What makes two policies the same rule, whatever else CVM returns with them (index, time, description)."""
    cidr = str(policy.get("CidrBlock") or policy.get("Ipv6CidrBlock") or "")
    return (
        str(policy.get("Protocol") or "").upper(),
        str(policy.get("Port") or "").lower(),
        cidr,
        str(policy.get("Action") or ""),
    )


def missing_policies(wanted: Iterable[Mapping[str, Any]], present: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The wanted policies a security group lacks: a resumed launch adds only those."""
    have = {policy_key(p) for p in present}
    return [dict(p) for p in wanted if policy_key(p) not in have]


def encode_user_data(script: bytes) -> str:
    return base64.b64encode(script).decode("ascii")
