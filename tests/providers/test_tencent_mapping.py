"""Pure tables of the Tencent adapter: error codes, GPU names, catalogue rows, states, tokens. No network."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

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
from providers.tencent import catalog, errors, launching, mapping
from providers.tencent.client import ClientSettings, TencentClient, split_endpoint, translate
from providers.types import InstanceState, PricingModel

# Every Tencent code in /work/shared/CLOUD-APIS.md ("Error codes worth classifying", prefix families with
# examples), the SDK's own client-side codes, and examples of final codes.
CLOUD_APIS_CODES: list[tuple[str, type[ProviderError]]] = [
    ("ResourceInsufficient.SpecifiedInstanceType", CapacityUnavailable),
    ("ResourceInsufficient.ZoneSoldOutForSpecifiedInstance", CapacityUnavailable),
    ("ResourceInsufficient.AvailabilityZoneSoldOut", CapacityUnavailable),
    ("ResourceInsufficient.InsufficientOfferingMinimum", CapacityUnavailable),
    ("ResourcesSoldOut.AvailableZone", CapacityUnavailable),
    ("ResourcesSoldOut.SpecifiedInstanceType", CapacityUnavailable),
    ("ResourcesSoldOut.EipInsufficient", CapacityUnavailable),
    ("ResourcesSoldOut.SomeFutureShortage", CapacityUnavailable),
    ("InvalidParameterValue.InsufficientPrice", CapacityUnavailable),
    ("LAUNCH_FAILED", CapacityUnavailable),
    ("LimitExceeded.InstanceQuota", QuotaExceeded),
    ("LimitExceeded.CvmInstanceQuota", QuotaExceeded),
    ("LimitExceeded.SpotQuota", QuotaExceeded),
    ("InstancesQuotaLimitExceeded", QuotaExceeded),
    ("RequestLimitExceeded", TransientProviderError),
    ("RequestLimitExceeded.UinLimitExceeded", TransientProviderError),
    ("RequestLimitExceeded.GlobalRegionUinLimitExceeded", TransientProviderError),
    ("RequestLimitExceeded.IPLimitExceeded", TransientProviderError),
    ("InternalError", TransientProviderError),
    ("InternalError.TradeUnknownError", TransientProviderError),
    ("ClientNetworkError", TransientProviderError),
    ("ServerNetworkError", TransientProviderError),
    ("AuthFailure", CredentialsRejected),
    ("AuthFailure.SecretIdNotFound", CredentialsRejected),
    ("AuthFailure.SignatureFailure", CredentialsRejected),
    ("AuthFailure.SignatureExpire", CredentialsRejected),
    ("AuthFailure.InvalidSecretId", CredentialsRejected),
    ("AuthFailure.TokenFailure", CredentialsRejected),
    ("AuthFailure.MFAFailure", CredentialsRejected),
    ("AuthFailure.UnauthorizedOperation", CredentialsRejected),
    ("UnauthorizedOperation", CredentialsRejected),
    ("InvalidCredential", CredentialsRejected),
    ("InvalidParameterValue", ProviderRequestRejected),
    ("InvalidInstanceId.NotFound", ProviderRequestRejected),
    ("InvalidClientToken.TooLong", ProviderRequestRejected),
    ("UnsupportedOperation.NoInstanceTypeSupportSpot", ProviderRequestRejected),
    ("UnsupportedRegion", ProviderRequestRejected),
    ("InvalidAction", ProviderRequestRejected),
    ("ClientError", ProviderRequestRejected),
    # Same families, other meanings: a subnet out of addresses or an EIP count is not GPU capacity or quota.
    ("ResourceInsufficient.CidrBlock", ProviderRequestRejected),
    ("LimitExceeded.EipNumLimit", ProviderRequestRejected),
    ("UnauthorizedOperation.ImageNotBelongToAccount", ProviderRequestRejected),
    ("SomeFutureCode.NobodyKnows", ProviderRequestRejected),
    ("JSONDecodeError", MalformedProviderResponse),
    ("KeyError", MalformedProviderResponse),
]


@pytest.mark.parametrize(("code", "expected"), CLOUD_APIS_CODES)
def test_each_tencent_error_code_maps_to_its_broker_class(code: str, expected: type[ProviderError]) -> None:
    error = errors.error_from_code(code, "provider says no", "req-1")

    assert type(error) is expected
    assert (error.code, error.provider, error.message) == (code, "tencent", "provider says no (RequestId req-1)")


@pytest.mark.parametrize(("code", "expected"), sorted(errors.ERROR_CLASSES.items()))
def test_every_entry_of_the_table_is_what_the_classifier_returns(code: str, expected: type[ProviderError]) -> None:
    assert errors.error_class_for(code) is expected


@pytest.mark.parametrize(("prefix", "expected"), errors.ERROR_PREFIXES)
def test_every_prefix_family_classifies_its_members(prefix: str, expected: type[ProviderError]) -> None:
    assert errors.error_class_for(prefix + "Anything") is expected
    assert errors.error_class_for("X" + prefix) is ProviderRequestRejected


def test_the_retryable_flag_follows_the_class() -> None:
    assert errors.error_from_code("RequestLimitExceeded", "").retryable is True
    assert errors.error_from_code("ResourceInsufficient.SpecifiedInstanceType", "").retryable is False


def test_sdk_exceptions_translate_by_code_only() -> None:
    wire = translate(TencentCloudSDKException("LimitExceeded.SpotQuota", "配额不足", "rid-7"))
    network = translate(TencentCloudSDKException("ServerNetworkError", b"<html>502 Bad Gateway</html>"))
    wrapped = translate(TencentCloudSDKException("JSONDecodeError", "Expecting value: line 1 column 1"))

    assert (type(wire), wire.code, wire.message) == (
        QuotaExceeded,
        "LimitExceeded.SpotQuota",
        "配额不足 (RequestId rid-7)",
    )
    assert (type(network), network.message) == (TransientProviderError, "<html>502 Bad Gateway</html>")
    assert type(wrapped) is MalformedProviderResponse


# ------------------------------------------------------------------------------------------------ GPUs


@pytest.mark.parametrize(
    ("instance_type", "gpu_type", "memory", "expected"),
    [
        ("GT4.4XLARGE96", "NVIDIA A100", Decimal(40), gpu_names.A100_40_PCIE),
        ("GN10X.2XLARGE40", "NVIDIA V100", Decimal(32), gpu_names.V100_32_SXM2),
        ("GN10Xp.20XLARGE320", "Tesla V100-SXM2-32GB", Decimal(32), gpu_names.V100_32_SXM2),
        ("GN7.2XLARGE32", "NVIDIA T4", Decimal(16), gpu_names.T4),
        ("GI3X.8XLARGE64", "T4", None, gpu_names.T4),
        ("GN7.2XLARGE32", "", None, gpu_names.T4),  # no GpuType: the family alone decides
        ("GN7.2XLARGE32", "NVIDIA A10", Decimal(24), None),  # the catalogue contradicts the family
        ("GT4.4XLARGE96", "NVIDIA A100", Decimal(80), None),  # an 80 GB card is not the 40 GB key
        ("PNV4.7XLARGE116", "NVIDIA A10", Decimal(24), None),  # a family the table does not know
    ],
)
def test_family_and_gpu_type_map_to_canonical_keys(
    instance_type: str, gpu_type: str, memory: Decimal | None, expected: str | None
) -> None:
    assert catalog.gpu_model_key(instance_type, gpu_type, memory) == expected


def test_every_mapped_key_is_a_canonical_gpu_name() -> None:
    assert set(catalog.FAMILY_GPU.values()) <= gpu_names.ALL
    assert set(catalog.FAMILY_GPU.values()) == set(catalog.NOMINAL_MEMORY_GB) == set(catalog.GPU_TYPE_TOKEN)


def test_gpu_spec_of_a_multi_gpu_sxm2_type_is_nvlink() -> None:
    spec = catalog.gpu_spec("GN10Xp.20XLARGE320", 8, 8.0, "NVIDIA V100", 32.0)

    assert spec == catalog.GpuSpec(
        model=gpu_names.V100_32_SXM2,
        count=8,
        memory_gb=32,
        interconnect="nvlink",
        raw_name="NVIDIA V100",
        physical_count=Decimal("8.0"),
        raw_memory_gib=Decimal("32.0"),
    )


def test_a_vgpu_slice_keeps_the_raw_name_with_its_share() -> None:
    spec = catalog.gpu_spec("GN7vw.4XLARGE32", 1, 0.25, "NVIDIA T4", 4.0)

    assert spec is not None
    assert (spec.model, spec.count, spec.memory_gb) == ("NVIDIA T4 (1/4 partition)", 1, 4)


def test_types_without_gpus_have_no_gpu_spec() -> None:
    assert catalog.gpu_spec("S5.MEDIUM4", 0, 0.0, "", None) is None
    assert catalog.gpu_spec("S5.MEDIUM4", None, None, "", None) is None


def test_an_unreadable_gpu_count_is_malformed() -> None:
    with pytest.raises(MalformedProviderResponse):
        catalog.gpu_spec("GN7.2XLARGE32", "many", None, "T4", None)


# ------------------------------------------------------------------------------------------- catalogue


def _quota_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "Zone": "ap-guangzhou-3",
        "InstanceType": "GN7.2XLARGE32",
        "InstanceChargeType": "POSTPAID_BY_HOUR",
        "Cpu": 8,
        "Memory": 32,
        "InstanceFamily": "GN7",
        "TypeName": "GPU计算型GN7",
        "Status": "SELL",
        "StatusCategory": "EnoughStock",
        "Price": {"UnitPrice": 8.68, "ChargeUnit": "HOUR", "UnitPriceDiscount": 7.81, "Discount": 90.0},
        "Gpu": 1,
        "GpuCount": 1.0,
        "CpuType": "Intel Xeon Cascade Lake 8255C",
    }
    row.update(overrides)
    return row


IDENTITIES = {"GN7.2XLARGE32": catalog.GpuIdentity("NVIDIA T4", 16.0)}


def test_a_selling_row_becomes_an_offer_at_the_account_price() -> None:
    offer = catalog.offer_from_quota_item(_quota_row(), "ap-guangzhou", IDENTITIES, currency="CNY")

    assert offer is not None
    assert (offer.region, offer.zone, offer.instance_type, offer.pricing_model) == (
        "ap-guangzhou",
        "ap-guangzhou-3",
        "GN7.2XLARGE32",
        PricingModel.ON_DEMAND,
    )
    assert (offer.gpu_model, offer.gpu_count, offer.gpu_memory_gb, offer.vcpus, offer.memory_gib) == (
        gpu_names.T4,
        1,
        16,
        8,
        Decimal(32),
    )
    assert (offer.price, offer.currency, offer.capacity, offer.interconnect) == (Decimal("7.81"), "CNY", None, "pcie")
    assert offer.extra["list_price"] == "8.68"
    assert offer.extra["status_category"] == "EnoughStock"


def test_the_list_price_is_used_when_no_discounted_price_is_stated() -> None:
    row = _quota_row(Price={"UnitPrice": 8.68, "ChargeUnit": "HOUR"})

    offer = catalog.offer_from_quota_item(row, "ap-guangzhou", IDENTITIES, currency="CNY")

    assert offer is not None and offer.price == Decimal("8.68")


def test_spot_rows_are_spot_offers() -> None:
    offer = catalog.offer_from_quota_item(
        _quota_row(InstanceChargeType="SPOTPAID"), "ap-guangzhou", IDENTITIES, currency="CNY"
    )

    assert offer is not None and offer.pricing_model is PricingModel.SPOT


@pytest.mark.parametrize(
    "overrides",
    [
        {"Status": "SOLD_OUT", "StatusCategory": "WithoutStock"},
        {"StatusCategory": "WithoutStock"},
        {"InstanceChargeType": "PREPAID"},
        {"InstanceChargeType": "CDHPAID"},
        {"Gpu": 0, "GpuCount": 0.0},
        {"Price": None},
        {"Price": {"OriginalPrice": 6000.0, "DiscountPrice": 6000.0}},
        {"Price": {"UnitPrice": 1.2, "ChargeUnit": "GB"}},
    ],
)
def test_rows_the_broker_cannot_buy_are_left_out(overrides: dict[str, Any]) -> None:
    assert catalog.offer_from_quota_item(_quota_row(**overrides), "ap-guangzhou", IDENTITIES, currency="CNY") is None


def test_an_unreadable_row_is_malformed() -> None:
    with pytest.raises(MalformedProviderResponse):
        catalog.offer_from_quota_item(_quota_row(Cpu="eight"), "ap-guangzhou", IDENTITIES, currency="CNY")
    with pytest.raises(MalformedProviderResponse):
        catalog.offer_from_quota_item({"Zone": "ap-guangzhou-3"}, "ap-guangzhou", IDENTITIES, currency="CNY")


def test_gpu_families_and_identities_come_from_gpu_rows_only() -> None:
    rows = [_quota_row(), _quota_row(InstanceType="S5.LARGE8", InstanceFamily="S5", Gpu=0, GpuCount=0.0)]
    configs = [
        {"InstanceType": "GN7.2XLARGE32", "Zone": "ap-guangzhou-3", "GpuType": "", "GpuMemory": None},
        {"InstanceType": "GN7.2XLARGE32", "Zone": "ap-guangzhou-4", "GpuType": "NVIDIA T4", "GpuMemory": 16.0},
    ]

    assert catalog.gpu_families(rows) == ["GN7"]
    assert catalog.gpu_identities(configs) == {"GN7.2XLARGE32": catalog.GpuIdentity("NVIDIA T4", 16.0)}


# ------------------------------------------------------------------------------------------- instances


@pytest.mark.parametrize(
    ("state_name", "expected"),
    [
        ("PENDING", InstanceState.PENDING),
        ("LAUNCH_FAILED", InstanceState.FAILED),
        ("RUNNING", InstanceState.RUNNING),
        ("STOPPED", InstanceState.STOPPED),
        ("STARTING", InstanceState.PENDING),
        ("STOPPING", InstanceState.STOPPING),
        ("REBOOTING", InstanceState.RUNNING),
        ("SHUTDOWN", InstanceState.TERMINATED),
        ("TERMINATING", InstanceState.STOPPING),
        ("SERVICE_LIVE_MIGRATE", InstanceState.RUNNING),
        ("RESCUE_MODE", InstanceState.UNKNOWN),
        ("SOMETHING_NEW", InstanceState.UNKNOWN),
    ],
)
def test_instance_states_map_to_common_states(state_name: str, expected: InstanceState) -> None:
    assert mapping.instance_state(state_name) is expected


@pytest.mark.parametrize(
    ("message", "code", "cls"),
    [
        (
            "ResourceInsufficient.SpecifiedInstanceType: out of stock",
            "ResourceInsufficient.SpecifiedInstanceType",
            CapacityUnavailable,
        ),
        ("创建失败 (LimitExceeded.CvmInstanceQuota) 请提交工单", "LimitExceeded.CvmInstanceQuota", QuotaExceeded),
        ("failed: ResourcesSoldOut.AvailableZone.", "ResourcesSoldOut.AvailableZone", CapacityUnavailable),
        ("The instance failed to launch.", "LAUNCH_FAILED", CapacityUnavailable),
        ("", "LAUNCH_FAILED", CapacityUnavailable),
    ],
)  # fmt: skip
def test_a_launch_failure_is_classified_by_the_first_known_code_in_its_message(
    message: str, code: str, cls: type[ProviderError]
) -> None:
    assert mapping.launch_failure(message) == (code, cls)


def _instance(**overrides: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "InstanceId": "ins-abcdefgh",
        "Placement": {"Zone": "ap-shanghai-4", "ProjectId": 0},
        "InstanceType": "GN10Xp.2XLARGE40",
        "InstanceState": "RUNNING",
        "InstanceChargeType": "POSTPAID_BY_HOUR",
        "PrivateIpAddresses": ["10.0.0.8"],
        "PublicIpAddresses": ["203.0.113.9"],
        "CreatedTime": "2025-06-01T10:00:00Z",
        "Tags": [{"Key": "broker:order", "Value": "ord-9"}],
        "LatestOperation": "RunInstances",
        "LatestOperationState": "SUCCESS",
        "LatestOperationErrorMsg": None,
        "ImageId": "img-sbxu2404",
    }
    item.update(overrides)
    return item


def test_a_running_instance_becomes_a_handle() -> None:
    handle = mapping.instance_handle(_instance(), "ap-shanghai")

    assert (handle.instance_id, handle.zone, handle.state, handle.public_ip, handle.private_ip) == (
        "ins-abcdefgh",
        "ap-shanghai-4",
        InstanceState.RUNNING,
        "203.0.113.9",
        "10.0.0.8",
    )
    assert (handle.launched_at, handle.tags) == ("2025-06-01T10:00:00Z", {"broker:order": "ord-9"})
    assert "error_class" not in handle.extra


def test_a_launch_failed_instance_is_failed_with_its_error() -> None:
    item = _instance(
        InstanceState="LAUNCH_FAILED",
        LatestOperationState="FAILED",
        LatestOperationErrorMsg="ResourceInsufficient.ZoneSoldOutForSpecifiedInstance: sold out",
        PublicIpAddresses=None,
    )

    handle = mapping.instance_handle(item, "ap-shanghai")

    assert handle.state is InstanceState.FAILED
    assert handle.public_ip is None
    assert {k: handle.extra[k] for k in ("error_class", "error_code", "error_message")} == {
        "error_class": "capacity",
        "error_code": "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance",
        "error_message": "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance: sold out",
    }


def test_an_unreadable_instance_is_malformed() -> None:
    with pytest.raises(MalformedProviderResponse):
        mapping.instance_handle({"InstanceId": "ins-abcdefgh", "InstanceState": "RUNNING"}, "ap-shanghai")


@pytest.mark.parametrize("token", ["", "x" * 65, "has space", "ü-nicode"])
def test_invalid_client_tokens_are_rejected(token: str) -> None:
    with pytest.raises(ProviderRequestRejected):
        mapping.validate_client_token(token)


def test_a_64_character_ascii_client_token_is_accepted() -> None:
    mapping.validate_client_token("o" * 64)


def test_the_order_tag_wins_over_a_caller_tag() -> None:
    spec = mapping.tag_specification("ord-1", {"team": "ml", "broker:order": "forged"})

    assert spec == [
        {
            "ResourceType": "instance",
            "Tags": [{"Key": "broker:order", "Value": "ord-1"}, {"Key": "team", "Value": "ml"}],
        }
    ]


def test_the_newest_usable_ubuntu_image_is_chosen() -> None:
    images = [
        {"ImageId": "img-u2204", "OsName": "Ubuntu Server 22.04 LTS 64bit", "Platform": "Ubuntu"},
        {"ImageId": "img-u2404", "OsName": "Ubuntu Server 24.04 LTS 64bit", "Platform": "Ubuntu"},
        {"ImageId": "img-u2410", "OsName": "Ubuntu Server 24.10 64bit", "Platform": "Ubuntu", "ImageDeprecated": True},
        {"ImageId": "img-a2604", "OsName": "Ubuntu 26.04", "Platform": "Ubuntu", "Architecture": "arm"},
        {"ImageId": "img-c7", "OsName": "CentOS 30.1 64bit", "Platform": "CentOS"},
    ]

    assert launching.newest_ubuntu_image(images) == "img-u2404"
    assert launching.newest_ubuntu_image([]) is None


# -------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (None, ("https", None)),
        ("http://127.0.0.1:8705", ("http", "127.0.0.1:8705")),
        ("https://cvm.ap-guangzhou.tencentcloudapi.com/", ("https", "cvm.ap-guangzhou.tencentcloudapi.com")),
        ("cvm.tencentcloudapi.com", ("https", "cvm.tencentcloudapi.com")),
    ],
)
def test_endpoint_urls_split_into_protocol_and_host(url: str | None, expected: tuple[str, str | None]) -> None:
    assert split_endpoint(url) == expected


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:21", "http://127.0.0.1:8705/v3", "http://"])
def test_an_endpoint_that_is_not_an_origin_is_final(url: str) -> None:
    with pytest.raises(ProviderRequestRejected):
        split_endpoint(url)


def test_the_profile_carries_connect_and_read_timeouts_and_no_sdk_retries() -> None:
    client = TencentClient(ClientSettings("AKID", "key", endpoint_url="http://127.0.0.1:1", connect_timeout=0.3))

    profile = client.profile()

    assert profile.httpProfile.reqTimeout == (0.3, 20.0)
    assert (profile.httpProfile.protocol, profile.httpProfile.endpoint) == ("http", "127.0.0.1:1")
    assert profile.retryer is None
    assert "key" not in repr(client.settings)
