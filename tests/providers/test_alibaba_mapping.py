"""Pure tables of the Alibaba adapter: error codes, GPU families, states, tokens, answer shapes. No network."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import darabonba.exceptions as dara_errors
import pytest
import Tea.exceptions as tea_errors
from alibabacloud_tea_openapi.exceptions import ClientException, ServerException, ThrottlingException

from providers import gpu_names
from providers.alibaba import catalog, errors, mapping
from providers.alibaba.client import _translate, backoff_seconds, split_endpoint
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.types import InstanceHandle, InstanceState, PricingModel

# Every Alibaba code in /work/shared/CLOUD-APIS.md ("Error codes worth classifying"), with the HTTP status ECS
# sends, plus the adapter's extra codes, examples of "Throttling*" and "5xx", and final errors.
CLOUD_APIS_CODES: list[tuple[str, int, type[ProviderError]]] = [
    ("OperationDenied.NoStock", 403, CapacityUnavailable),
    ("Zone.NotOnSale", 403, CapacityUnavailable),
    ("InvalidResourceType.NotSupported", 403, CapacityUnavailable),
    ("InstanceType.Offline", 403, CapacityUnavailable),
    ("InvalidInstanceType.ZoneNotSupported", 403, CapacityUnavailable),
    ("InvalidInstanceType.PhasedOut", 403, CapacityUnavailable),
    ("InvalidSpotPriceLimit.LowerThanPublicPrice", 400, CapacityUnavailable),
    ("QuotaExceed.ElasticQuota", 403, QuotaExceeded),
    ("Throttling", 400, TransientProviderError),
    ("Throttling.User", 400, TransientProviderError),
    ("Throttling.Api", 400, TransientProviderError),
    ("Throttling.Resource", 503, TransientProviderError),
    ("ServiceUnavailable", 503, TransientProviderError),
    ("InternalError", 500, TransientProviderError),
    ("UnknownError", 500, TransientProviderError),
    ("LastTokenProcessing", 403, TransientProviderError),
    ("Idempotence.Processing", 400, TransientProviderError),
    ("IncorrectInstanceStatus.Initializing", 403, TransientProviderError),
    ("SignatureNonceUsed", 400, TransientProviderError),
    ("SomeFutureServerFault", 502, TransientProviderError),
    ("InvalidAccessKeyId.NotFound", 404, CredentialsRejected),
    ("InvalidAccessKeyId.Inactive", 400, CredentialsRejected),
    ("SignatureDoesNotMatch", 400, CredentialsRejected),
    ("IncompleteSignature", 400, CredentialsRejected),
    ("Forbidden.RAM", 403, CredentialsRejected),
    ("InvalidSecurityToken.Expired", 400, CredentialsRejected),
    ("InvalidInstanceId.NotFound", 404, ProviderRequestRejected),
    ("IdempotenceParamNotMatch", 400, ProviderRequestRejected),
    ("InvalidClientToken.ValueNotSupported", 400, ProviderRequestRejected),
    ("IncorrectInstanceStatus", 403, ProviderRequestRejected),
    ("InvalidImageId.NotFound", 404, ProviderRequestRejected),
    ("InvalidParameter", 400, ProviderRequestRejected),
    ("Account.Arrearage", 400, ProviderRequestRejected),
    ("SomeFutureClientFault", 400, ProviderRequestRejected),
    # What a booted launch meets, with the statuses of the RunInstances, ImportKeyPair, AuthorizeSecurityGroup,
    # DeleteSecurityGroup and DeleteKeyPairs error tables of the ECS API reference.
    ("InvalidUserData.SizeExceeded", 400, ProviderRequestRejected),
    ("InvalidUserData.Base64FormatInvalid", 400, ProviderRequestRejected),
    ("InvalidSystemDiskSize.LessThanImageSize", 404, ProviderRequestRejected),
    ("InvalidSystemDiskSize.LessThanMinSize", 404, ProviderRequestRejected),
    ("InvalidSystemDiskSize.MoreThanMaxSize", 404, ProviderRequestRejected),
    ("InvalidKeyPairName.NotFound", 404, ProviderRequestRejected),
    ("InvalidSecurityGroupId.NotFound", 404, ProviderRequestRejected),
    ("InvalidPublicKeyBody.Malformed", 400, ProviderRequestRejected),
    ("KeyPair.AlreadyExist", 400, ProviderRequestRejected),
    ("AuthorizationLimitExceed", 403, ProviderRequestRejected),
    ("DependencyViolation", 403, ProviderRequestRejected),
    ("InvalidParameter.KeypairAlreadyAttachedInstance", 400, ProviderRequestRejected),
]


def _client_error(code: str, status: int, message: str = "provider says no") -> Exception:
    data = {"RequestId": "R1", "HostId": "ecs.cn-shanghai.aliyuncs.com", "Code": code, "Message": message}
    cls = ServerException if status >= 500 else ClientException
    return cls(
        status_code=status,
        code=code,
        message=f"code: {status}, {message} request id: R1",
        data=data,
        request_id="R1",
    )


@pytest.mark.parametrize(("code", "status", "expected"), CLOUD_APIS_CODES)
def test_each_alibaba_error_code_maps_to_its_broker_class(
    code: str, status: int, expected: type[ProviderError]
) -> None:
    error = _translate(_client_error(code, status))

    assert type(error) is expected
    assert (error.code, error.message, error.provider, error.http_status) == (
        code,
        "provider says no",
        "alibaba",
        status,
    )
    assert error.retryable is (expected is TransientProviderError)


def test_every_code_in_the_table_is_covered_by_the_parametrized_test() -> None:
    assert set(errors.ERROR_CLASSES) - {c for c, _, _ in CLOUD_APIS_CODES} <= {
        "LastOrderProcessing",
        "OperationDenied.ResourceControl",
        "InvalidSecurityToken.Malformed",
        "Forbidden.AccessKeyDisabled",
        "InvalidZoneId.NotFound",
        "InvalidInstanceType.ValueNotSupported",
        "MissingParameter",
        "InvalidAccountStatus.NotEnoughBalance",
    }


def test_the_code_wins_over_the_status() -> None:
    assert errors.error_class_for("Throttling.User", 400) is TransientProviderError
    assert errors.error_class_for("OperationDenied.NoStock", 500) is CapacityUnavailable
    assert errors.error_class_for("InvalidAccessKeyId.NotFound", 503) is CredentialsRejected
    assert errors.error_class_for("Brand.NewCode", None) is ProviderRequestRejected


def test_a_throttling_exception_with_retry_after_is_transient() -> None:
    exc = ThrottlingException(status_code=400, code="Throttling.User", message="slow down", retry_after=300, data={})

    error = _translate(exc)

    assert (type(error), error.code) == (TransientProviderError, "Throttling.User")
    assert backoff_seconds(1, 300) == 0.3
    assert [backoff_seconds(n) for n in (1, 2, 3, 10)] == [0.1, 0.2, 0.4, 2.0]


def test_transport_failures_are_transient_and_unparseable_answers_malformed() -> None:
    timeout = tea_errors.UnretryableException(None, dara_errors.RetryError("Read timed out. (read timeout=0.5)"))
    garbage = tea_errors.UnretryableException(None, ValueError("Expecting value: line 1 column 1"))

    assert (type(_translate(timeout)), _translate(timeout).code) == (TransientProviderError, "TransportError")
    assert "Read timed out" in _translate(timeout).message
    assert type(_translate(garbage)) is MalformedProviderResponse


def test_error_answers_without_a_code() -> None:
    # The SDK formats a missing Code as the string "None".
    assert type(_translate(ServerException(status_code=502, code="None", data={}))) is TransientProviderError
    assert type(_translate(ClientException(status_code=400, code="None", data={}))) is MalformedProviderResponse


def test_other_sdk_failures_become_broker_errors() -> None:
    assert (
        type(_translate(dara_errors.ValidateException("ClientToken is exceed max-length"))) is ProviderRequestRejected
    )
    assert type(_translate(dara_errors.RequiredArgumentException("RegionId"))) is ProviderRequestRejected
    assert type(_translate(AttributeError("'list' object has no attribute 'get'"))) is MalformedProviderResponse
    assert type(_translate(RuntimeError("boom"))) is ProviderRequestRejected


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://127.0.0.1:8702", ("http", "127.0.0.1:8702")),
        ("https://ecs.cn-shanghai.aliyuncs.com", ("https", "ecs.cn-shanghai.aliyuncs.com")),
        ("ecs-vpc.cn-shanghai.aliyuncs.com", ("https", "ecs-vpc.cn-shanghai.aliyuncs.com")),
        ("http://127.0.0.1:8702/", ("http", "127.0.0.1:8702")),
    ],
)
def test_endpoint_urls_split_into_protocol_and_host(endpoint: str, expected: tuple[str, str]) -> None:
    assert split_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["not a url", "ftp://127.0.0.1:21", "http://127.0.0.1:99999", "http://h/x"])
def test_malformed_endpoint_urls_are_final(endpoint: str) -> None:
    with pytest.raises(ProviderRequestRejected):
        split_endpoint(endpoint)


@pytest.mark.parametrize(
    ("instance_type", "spec", "amount", "memory", "expected"),
    [
        ("ecs.gn6i-c4g1.xlarge", "NVIDIA T4", 1, "16", (gpu_names.T4, 1, 16, "pcie")),
        ("ecs.gn6i-c24g1.24xlarge", "NVIDIA T4", 4, "16", (gpu_names.T4, 4, 16, "pcie")),
        # GPUMemorySize read as the instance total also matches: 4 x 16.
        ("ecs.gn6i-c24g1.24xlarge", "NVIDIA T4", 4, "64", (gpu_names.T4, 4, 16, "pcie")),
        ("ecs.gn6v-c8g1.2xlarge", "NVIDIA V100", 1, "16", (gpu_names.V100_16_SXM2, 1, 16, "pcie")),
        ("ecs.gn6v-c8g1.16xlarge", "NVIDIA V100", 8, "16", (gpu_names.V100_16_SXM2, 8, 16, "nvlink")),
        ("ecs.gn6e-c12g1.24xlarge", "NVIDIA V100", 8, "32", (gpu_names.V100_32_SXM2, 8, 32, "nvlink")),
        ("ecs.gn7i-c8g1.2xlarge", "NVIDIA A10", 1, "24", (gpu_names.A10, 1, 24, "pcie")),
        ("ecs.gn7i-c32g1.32xlarge", "NVIDIA A10", 4, "24", (gpu_names.A10, 4, 24, "pcie")),
        ("ecs.gn7-c13g1.26xlarge", "NVIDIA A100", 8, "40", (gpu_names.A100_40_SXM, 8, 40, "nvlink")),
        ("ecs.gn7e-c16g1.4xlarge", "NVIDIA A100 80GB", 1, "80", (gpu_names.A100_80_SXM, 1, 80, "pcie")),
        ("ecs.ebmgn7e.32xlarge", "NVIDIA A100", 8, "80", (gpu_names.A100_80_SXM, 8, 80, "nvlink")),
        # Contradictions and unknown families keep the provider's name, so ingestion quarantines them.
        ("ecs.gn7i-c8g1.2xlarge", "NVIDIA A100", 1, "24", ("NVIDIA A100", 1, 24, "pcie")),
        ("ecs.gn7-c12g1.3xlarge", "NVIDIA A100", 1, "80", ("NVIDIA A100", 1, 80, "pcie")),
        ("ecs.gn8is.2xlarge", "NVIDIA L20", 1, "48", ("NVIDIA L20", 1, 48, "pcie")),
        ("ecs.gn5-c8g1.14xlarge", "NVIDIA P100", 8, "16", ("NVIDIA P100", 8, 16, "pcie")),
    ],
)
def test_families_map_to_canonical_gpu_keys(
    instance_type: str, spec: str, amount: int, memory: str, expected: tuple[str, int, int, str]
) -> None:
    family = catalog.instance_family(instance_type)
    gpu = catalog.gpu_spec(instance_type, family, spec, amount, Decimal(memory))

    assert (gpu.model, gpu.count, gpu.memory_gb, gpu.interconnect) == expected


def test_every_mapped_family_has_a_canonical_key_spec_word_and_memory() -> None:
    assert set(catalog.FAMILY_GPU.values()) <= gpu_names.ALL
    assert set(catalog.FAMILY_GPU.values()) == set(catalog.GPU_SPEC_WORD) == set(catalog.NOMINAL_MEMORY_GB)


@pytest.mark.parametrize(
    ("instance_type", "family_field", "family"),
    [
        ("ecs.gn6i-c4g1.xlarge", "", "gn6i"),
        ("ecs.gn6i-c4g1.xlarge", "ecs.gn6i", "gn6i"),
        ("ecs.ebmgn7e.32xlarge", "", "ebmgn7e"),
        ("ecs.gn7.whatever", "", "gn7"),
    ],
)
def test_instance_family(instance_type: str, family_field: str, family: str) -> None:
    assert catalog.instance_family(instance_type, family_field) == family


def _type_entry(**overrides: Any) -> dict[str, Any]:
    entry = {
        "InstanceTypeId": "ecs.gn7e-c16g1.4xlarge",
        "InstanceTypeFamily": "ecs.gn7e",
        "CpuCoreCount": 16,
        "MemorySize": 125.0,
        "GPUAmount": 1,
        "GPUSpec": "NVIDIA A100",
        "GPUMemorySize": 80.0,
        "CpuArchitecture": "X86",
    }
    return {**entry, **overrides}


def test_an_instance_type_entry_maps_with_its_caveat() -> None:
    spec = catalog.instance_type_spec(_type_entry())

    assert spec is not None
    assert (spec.instance_type, spec.family, spec.vcpus, spec.memory_gib) == (
        "ecs.gn7e-c16g1.4xlarge",
        "gn7e",
        16,
        Decimal(125),
    )
    assert spec.gpu.model == gpu_names.A100_80_SXM
    assert spec.extra == {
        "gpu_spec": "NVIDIA A100",
        "gpu_memory_gib_reported": "80.0",
        "gpu_model_source": "ECS family table (family->GPU not verified, GPU-SPECS.md section 5)",
        "instance_type_family": "ecs.gn7e",
        "cpu_architecture": "X86",
    }


def test_cpu_only_types_are_skipped_and_unreadable_entries_are_malformed() -> None:
    assert catalog.instance_type_spec(_type_entry(GPUAmount=0, GPUSpec="", GPUMemorySize=0.0)) is None
    with pytest.raises(MalformedProviderResponse):
        catalog.instance_type_spec({"InstanceTypeId": "ecs.gn7i-c8g1.2xlarge", "GPUAmount": 1})
    with pytest.raises(MalformedProviderResponse):
        catalog.instance_type_spec(_type_entry(MemorySize=None))


def test_zone_stock_reads_every_zone_and_category() -> None:
    body = {
        "AvailableZones": {
            "AvailableZone": [
                {
                    "ZoneId": "cn-shanghai-e",
                    "AvailableResources": {
                        "AvailableResource": [
                            {
                                "Type": "InstanceType",
                                "SupportedResources": {
                                    "SupportedResource": [
                                        {"Value": "ecs.gn7i-c8g1.2xlarge", "StatusCategory": "WithStock"},
                                        {"Value": "ecs.ebmgn7e.32xlarge", "StatusCategory": "WithoutStock"},
                                    ]
                                },
                            },
                            {"Type": "SystemDisk", "SupportedResources": {"SupportedResource": [{"Value": "x"}]}},
                        ]
                    },
                },
                {
                    "ZoneId": "cn-shanghai-g",
                    "AvailableResources": {
                        "AvailableResource": [
                            {
                                "Type": "InstanceType",
                                "SupportedResources": {
                                    "SupportedResource": [{"Value": "ecs.gn7i-c8g1.2xlarge", "Status": "Available"}]
                                },
                            }
                        ]
                    },
                },
            ]
        }
    }

    assert catalog.zone_stock(body) == {
        "ecs.gn7i-c8g1.2xlarge": {"cn-shanghai-e": "WithStock", "cn-shanghai-g": "Available"},
        "ecs.ebmgn7e.32xlarge": {"cn-shanghai-e": "WithoutStock"},
    }
    assert catalog.zone_stock({}) == {}
    assert catalog.STOCK_BUYABLE == {"WithStock", "ClosedWithStock"}
    with pytest.raises(MalformedProviderResponse):
        catalog.zone_stock({"AvailableZones": {"AvailableZone": [{"RegionId": "cn-shanghai"}]}})


def test_price_is_read_as_exact_decimals() -> None:
    body = {
        "PriceInfo": {"Price": {"OriginalPrice": 9.53, "DiscountPrice": 0.0, "TradePrice": 9.53, "Currency": "CNY"}}
    }

    assert catalog.price_from_body(body) == catalog.Price(
        trade=Decimal("9.53"), original=Decimal("9.53"), discount=Decimal("0.0"), currency="CNY"
    )
    with pytest.raises(MalformedProviderResponse):
        catalog.price_from_body({"PriceInfo": {}})


# DescribePrice's PriceInfo.Price.Currency: "China site: CNY. International site: USD." (ECS API reference,
# "DescribePrice", https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice; the
# same text on alibabacloud_ecs20140526's DescribePriceResponseBodyPriceInfoPrice.currency).
def test_a_price_keeps_the_currency_its_answer_states() -> None:
    body = {"PriceInfo": {"Price": {"OriginalPrice": 1.52, "TradePrice": 1.52, "Currency": "USD"}}}

    assert catalog.price_from_body(body).currency == "USD"


@pytest.mark.parametrize("currency", [None, "", "RMB", "usd", 7])
def test_a_price_without_a_sites_currency_is_refused_not_assumed(currency: Any) -> None:
    price: dict[str, Any] = {"OriginalPrice": 9.53, "TradePrice": 9.53}
    if currency is not None:
        price["Currency"] = currency

    with pytest.raises(MalformedProviderResponse, match="Currency"):
        catalog.price_from_body({"PriceInfo": {"Price": price}})


def test_newest_spot_price_per_zone() -> None:
    rows = [
        {"ZoneId": "cn-shanghai-e", "SpotPrice": 1.2, "OriginPrice": 9.53, "Timestamp": "2024-05-01T10:00:00Z"},
        {"ZoneId": "cn-shanghai-e", "SpotPrice": 1.4, "OriginPrice": 9.53, "Timestamp": "2024-05-01T11:00:00Z"},
        {"ZoneId": "cn-shanghai-f", "SpotPrice": 1.3, "Timestamp": "2024-05-01T09:00:00Z"},
    ]

    newest = catalog.newest_spot_prices(rows)

    assert newest == {
        "cn-shanghai-e": catalog.SpotPoint(Decimal("1.4"), Decimal("9.53"), datetime(2024, 5, 1, 11, tzinfo=UTC)),
        "cn-shanghai-f": catalog.SpotPoint(Decimal("1.3"), None, datetime(2024, 5, 1, 9, tzinfo=UTC)),
    }
    assert catalog.newest_spot_prices([]) == {}
    with pytest.raises(MalformedProviderResponse):
        catalog.newest_spot_prices([{"ZoneId": "cn-shanghai-e", "SpotPrice": "x", "Timestamp": "now"}])


def test_ecs_timestamps_parse_and_format() -> None:
    assert catalog.parse_time("2017-12-10T04:04Z") == datetime(2017, 12, 10, 4, 4, tzinfo=UTC)
    assert catalog.parse_time("2017-09-20T15:00:00Z") == datetime(2017, 9, 20, 15, tzinfo=UTC)
    assert catalog.format_time(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2024-01-02T03:04:05Z"


@pytest.mark.parametrize(
    ("model", "max_price", "expected"),
    [
        (PricingModel.ON_DEMAND, None, ("NoSpot", None)),
        (PricingModel.ON_DEMAND, Decimal("3"), ("NoSpot", None)),
        (PricingModel.SPOT, None, ("SpotAsPriceGo", None)),
        (PricingModel.SPOT, Decimal("2.5"), ("SpotWithPriceLimit", Decimal("2.5"))),
    ],
)
def test_spot_strategy(model: PricingModel, max_price: Decimal | None, expected: tuple[str, Decimal | None]) -> None:
    assert catalog.spot_strategy(model, max_price) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("Pending", InstanceState.PENDING),
        ("Starting", InstanceState.PENDING),
        ("Running", InstanceState.RUNNING),
        ("Stopping", InstanceState.STOPPING),
        ("Stopped", InstanceState.STOPPED),
        ("Levitating", InstanceState.UNKNOWN),
    ],
)
def test_instance_statuses_map_to_common_states(status: str, expected: InstanceState) -> None:
    assert mapping.instance_state(status) is expected


@pytest.mark.parametrize("token", ["", "x" * 65, "order-1/attempt-1 ", "ordre-é"])
def test_invalid_client_tokens_are_rejected(token: str) -> None:
    with pytest.raises(ProviderRequestRejected):
        mapping.validate_client_token(token)


def test_a_64_character_ascii_client_token_is_accepted() -> None:
    mapping.validate_client_token("o" * 64)


def test_the_order_tag_wins_over_a_caller_tag() -> None:
    assert mapping.run_tags("ord-7", {"team": "alice", "broker:order": "spoofed"}) == [
        {"Key": "broker:order", "Value": "ord-7"},
        {"Key": "team", "Value": "alice"},
    ]


def test_a_describe_instances_entry_maps_to_a_handle() -> None:
    item = {
        "InstanceId": "i-uf6abc",
        "RegionId": "cn-shanghai",
        "ZoneId": "cn-shanghai-f",
        "InstanceType": "ecs.gn7i-c8g1.2xlarge",
        "Status": "Running",
        "CreationTime": "2024-05-01T10:04Z",
        "ImageId": "ubuntu_22_04_x64_20G_alibase_20230815.vhd",
        "InstanceChargeType": "PostPaid",
        "SpotStrategy": "SpotAsPriceGo",
        "PublicIpAddress": {"IpAddress": ["47.100.1.2"]},
        "VpcAttributes": {"VSwitchId": "vsw-1", "PrivateIpAddress": {"IpAddress": ["172.16.0.9"]}},
        "Tags": {"Tag": [{"TagKey": "broker:order", "TagValue": "ord-1"}]},
    }

    assert mapping.instance_handle(item, "cn-shanghai") == InstanceHandle(
        instance_id="i-uf6abc",
        region="cn-shanghai",
        zone="cn-shanghai-f",
        instance_type="ecs.gn7i-c8g1.2xlarge",
        state=InstanceState.RUNNING,
        public_ip="47.100.1.2",
        private_ip="172.16.0.9",
        launched_at="2024-05-01T10:04:00+00:00",
        tags={"broker:order": "ord-1"},
        extra={
            "status": "Running",
            "spot_strategy": "SpotAsPriceGo",
            "charge_type": "PostPaid",
            "image_id": "ubuntu_22_04_x64_20G_alibase_20230815.vhd",
            "vswitch_id": "vsw-1",
            "stopped_mode": "",
        },
    )
    with pytest.raises(MalformedProviderResponse):
        mapping.instance_handle({"InstanceId": "i-1"}, "cn-shanghai")
