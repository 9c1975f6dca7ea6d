"""Pure tables of the AWS adapter: error codes, GPU names, states, tokens. No network."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from typing import Any

import botocore.exceptions
import botocore.parsers
import pytest

from providers import gpu_names
from providers.aws import catalog, errors, launching, mapping
from providers.aws.client import _translate
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
from providers.types import GPU_FRACTION, InstanceState
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

# Every AWS code in /work/shared/CLOUD-APIS.md ("Error codes worth classifying"), plus the extra credential
# codes of the brief and examples of "5xx other than capacity" and of final errors.
CLOUD_APIS_CODES: list[tuple[str, int, type[ProviderError]]] = [
    ("InsufficientInstanceCapacity", 500, CapacityUnavailable),
    ("InsufficientCapacity", 500, CapacityUnavailable),
    ("InsufficientHostCapacity", 500, CapacityUnavailable),
    ("Unsupported", 400, CapacityUnavailable),
    ("SpotMaxPriceTooLow", 400, CapacityUnavailable),
    ("VcpuLimitExceeded", 400, QuotaExceeded),
    ("InstanceLimitExceeded", 400, QuotaExceeded),
    ("MaxSpotInstanceCountExceeded", 400, QuotaExceeded),
    ("RequestLimitExceeded", 503, TransientProviderError),
    ("Throttling", 400, TransientProviderError),
    ("InternalError", 500, TransientProviderError),
    ("ServiceUnavailable", 503, TransientProviderError),
    ("SomeFutureServerFault", 502, TransientProviderError),
    ("AuthFailure", 401, CredentialsRejected),
    ("UnauthorizedOperation", 403, CredentialsRejected),
    ("InvalidClientTokenId", 403, CredentialsRejected),
    ("SignatureDoesNotMatch", 403, CredentialsRejected),
    ("InvalidParameterValue", 400, ProviderRequestRejected),
    ("InvalidInstanceID.NotFound", 400, ProviderRequestRejected),
    ("IdempotentParameterMismatch", 400, ProviderRequestRejected),
    ("SomeFutureClientFault", 400, ProviderRequestRejected),
]


def _client_error(code: str, status: int, message: str = "provider says no") -> botocore.exceptions.ClientError:
    response: Any = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "RunInstances")


@pytest.mark.parametrize(("code", "status", "expected"), CLOUD_APIS_CODES)
def test_each_aws_error_code_maps_to_its_broker_class(code: str, status: int, expected: type[ProviderError]) -> None:
    error = _translate(_client_error(code, status))

    assert type(error) is expected
    assert (error.code, error.message, error.provider, error.http_status) == (code, "provider says no", "aws", status)
    assert error.retryable is (expected is TransientProviderError)


def test_capacity_codes_win_over_their_5xx_status() -> None:
    assert errors.error_class_for("InsufficientInstanceCapacity", 500) is CapacityUnavailable
    assert errors.error_class_for("InsufficientInstanceCapacity", None) is CapacityUnavailable


@pytest.mark.parametrize(
    ("exception", "code"),
    [
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1/"), "ReadTimeoutError"),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1:1/"), "ConnectTimeoutError"),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1/"), "EndpointConnectionError"),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:1/"), "ConnectionClosedError"),
    ],
)
def test_connection_errors_and_timeouts_are_transient(exception: Exception, code: str) -> None:
    error = _translate(exception)

    assert type(error) is TransientProviderError
    assert (error.code, error.provider) == (code, "aws")


def test_other_sdk_errors_become_broker_errors() -> None:
    assert type(_translate(botocore.exceptions.NoCredentialsError())) is CredentialsRejected
    assert type(_translate(botocore.exceptions.ParamValidationError(report="bad"))) is ProviderRequestRejected
    assert type(_translate(botocore.parsers.ResponseParserError("garbage"))) is MalformedProviderResponse


def _gpu_info(name: str, mib: int, count: int = 8) -> dict[str, Any]:
    gpu = {"Name": name, "Manufacturer": "NVIDIA", "Count": count, "LogicalGpuCount": count, "GpuPartitionSize": 1.0}
    return {"Gpus": [{**gpu, "MemoryInfo": {"SizeInMiB": mib}}], "TotalGpuMemoryInMiB": mib * count}


def _slice_info(name: str, mib: int, partition: float) -> dict[str, Any]:
    """A partitioned GPU as DescribeInstanceTypes reports it: ``Count`` 0 whole GPUs, one logical device, its
    share in ``GpuPartitionSize`` and the slice's own memory (EC2 API reference, GpuDeviceInfo: "gpuPartitionSize
    - The size of each GPU as a fraction of a full GPU, between 0 (excluded) and 1 (included)"; "logicalGpuCount
    - Total number of GPU devices of this type", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GpuDeviceInfo.html)."""
    gpu = {"Name": name, "Manufacturer": "NVIDIA", "Count": 0, "LogicalGpuCount": 1, "GpuPartitionSize": partition}
    return {"Gpus": [{**gpu, "MemoryInfo": {"SizeInMiB": mib}}], "TotalGpuMemoryInMiB": mib}


# g6f and gr6f: an eighth, a quarter or a half of one L4, with 3, 6 or 12 GB of its memory (Amazon ECS
# Developer Guide, "Specifying GPUs in an Amazon ECS task definition", the G6f fraction table,
# https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs-gpu-specifying.html). The MiB figures are
# moto's copy of DescribeInstanceTypes (22888 MiB usable on the whole card, divided by the share).
@pytest.mark.parametrize(
    ("instance_type", "mib", "partition", "share", "memory_gb"),
    [
        ("g6f.large", 2861, 0.125, Fraction(1, 8), 3),
        ("g6f.xlarge", 2861, 0.125, Fraction(1, 8), 3),
        ("g6f.2xlarge", 5722, 0.25, Fraction(1, 4), 6),
        ("g6f.4xlarge", 11444, 0.5, Fraction(1, 2), 12),
        ("gr6f.4xlarge", 11444, 0.5, Fraction(1, 2), 12),
    ],
)
def test_a_gpu_partition_is_a_fraction_of_the_card_not_zero_gpus(
    instance_type: str, mib: int, partition: float, share: Fraction, memory_gb: int
) -> None:
    spec = catalog.gpu_spec(instance_type, _slice_info("L4", mib, partition))

    assert (spec.model, spec.count, spec.fraction, spec.memory_gb, spec.interconnect) == (
        gpu_names.L4,
        1,
        share,
        memory_gb,
        "pcie",
    )


def test_a_slice_whose_memory_is_not_its_share_of_the_card_is_not_that_card() -> None:
    # An "L4" half with an eighth's memory contradicts the catalogue: keep the provider's name for quarantine.
    spec = catalog.gpu_spec("g6f.4xlarge", _slice_info("L4", 2861, 0.5))

    assert (spec.model, spec.fraction) == ("L4 (1/2 partition)", Fraction(1))


@pytest.mark.parametrize("partition", [0, -0.5, 1.5])
def test_a_partition_size_outside_zero_to_one_is_malformed(partition: float) -> None:
    with pytest.raises(MalformedProviderResponse):
        catalog.gpu_spec("g6f.large", _slice_info("L4", 2861, partition))


def test_a_fractional_type_carries_its_share_in_extra_and_a_whole_one_does_not() -> None:
    def item(name: str, gpu_info: dict[str, Any]) -> dict[str, Any]:
        return {
            "InstanceType": name,
            "VCpuInfo": {"DefaultVCpus": 2},
            "MemoryInfo": {"SizeInMiB": 8192},
            "GpuInfo": gpu_info,
        }

    sliced = catalog.instance_type_spec(item("g6f.large", _slice_info("L4", 2861, 0.125)))
    whole = catalog.instance_type_spec(item("g6.xlarge", _gpu_info("L4", 22888, count=1)))

    assert sliced is not None and whole is not None
    assert sliced.extra[GPU_FRACTION] == 0.125
    assert GPU_FRACTION not in whole.extra


@pytest.mark.parametrize(
    ("instance_type", "gpu_info", "expected"),
    [
        ("p4d.24xlarge", _gpu_info("A100", 40960), (gpu_names.A100_40_SXM, 8, 40, "nvlink")),
        ("p4de.24xlarge", _gpu_info("A100", 81920), (gpu_names.A100_80_SXM, 8, 80, "nvlink")),
        ("p5.48xlarge", _gpu_info("H100", 81920), (gpu_names.H100_SXM, 8, 80, "nvlink")),
        ("p5.4xlarge", _gpu_info("H100", 81920, count=1), (gpu_names.H100_SXM, 1, 80, "pcie")),
        ("p5e.48xlarge", _gpu_info("H200", 144384), (gpu_names.H200_SXM, 8, 141, "nvlink")),
        ("p5en.48xlarge", _gpu_info("H200", 144384), (gpu_names.H200_SXM, 8, 141, "nvlink")),
        ("p6-b200.48xlarge", _gpu_info("B200", 183359), (gpu_names.B200, 8, 180, "nvlink")),
        ("p3.16xlarge", _gpu_info("V100", 16384), (gpu_names.V100_16_SXM2, 8, 16, "nvlink")),
        ("p3dn.24xlarge", _gpu_info("V100", 32768), (gpu_names.V100_32_SXM2, 8, 32, "nvlink")),
        ("g5.xlarge", _gpu_info("A10G", 22888, count=1), (gpu_names.A10G, 1, 24, "pcie")),
        ("g5.12xlarge", _gpu_info("A10G", 22888, count=4), (gpu_names.A10G, 4, 24, "pcie")),
        ("g6.xlarge", _gpu_info("L4", 22888, count=1), (gpu_names.L4, 1, 24, "pcie")),
        ("gr6.4xlarge", _gpu_info("L4", 22888, count=1), (gpu_names.L4, 1, 24, "pcie")),
        ("g6e.48xlarge", _gpu_info("L40S", 45776), (gpu_names.L40S, 8, 48, "pcie")),
        ("g4dn.xlarge", _gpu_info("T4", 16384, count=1), (gpu_names.T4, 1, 16, "pcie")),
        # Unknown or contradictory GPUs keep the provider's name, so ingestion quarantines them.
        ("p6-b300.48xlarge", _gpu_info("B300", 275040), ("B300", 8, 268, "nvlink")),
        ("g5g.xlarge", _gpu_info("T4g", 16384, count=1), ("T4g", 1, 16, "pcie")),
        ("p4d.24xlarge", _gpu_info("H100", 81920), ("H100", 8, 80, "nvlink")),
        # A slice of a GPU no key covers keeps the provider's name and says so (quarantined too).
        ("g9f.large", _slice_info("X9", 4096, partition=0.25), ("X9 (1/4 partition)", 1, 4, "pcie")),
    ],
)
def test_gpu_info_and_family_map_to_canonical_keys(
    instance_type: str, gpu_info: dict[str, Any], expected: tuple[str, int, int, str]
) -> None:
    spec = catalog.gpu_spec(instance_type, gpu_info)

    assert (spec.model, spec.count, spec.memory_gb, spec.interconnect) == expected


def test_every_mapped_key_is_a_canonical_gpu_name() -> None:
    assert set(catalog.FAMILY_GPU.values()) <= gpu_names.ALL
    assert set(catalog.NOMINAL_MEMORY_GB) <= gpu_names.ALL


def test_unreadable_gpu_info_is_malformed() -> None:
    with pytest.raises(MalformedProviderResponse):
        catalog.gpu_spec("p4d.24xlarge", {"Gpus": [{"Name": "A100"}]})


@pytest.mark.parametrize(
    ("state_name", "reason", "expected"),
    [
        ("pending", "", InstanceState.PENDING),
        ("running", "", InstanceState.RUNNING),
        ("stopping", "", InstanceState.STOPPING),
        ("stopped", "", InstanceState.STOPPED),
        ("shutting-down", "", InstanceState.STOPPING),
        ("terminated", "Client.UserInitiatedShutdown", InstanceState.TERMINATED),
        ("terminated", "Server.InsufficientInstanceCapacity", InstanceState.FAILED),
        ("terminated", "Server.InternalError", InstanceState.FAILED),
        ("rebooting-on-mars", "", InstanceState.UNKNOWN),
    ],
)
def test_instance_states_map_to_common_states(state_name: str, reason: str, expected: InstanceState) -> None:
    assert mapping.instance_state(state_name, reason) is expected


@pytest.mark.parametrize("token", ["", "x" * 65, "order-1/attempt-1 ", "ordre-é"])
def test_invalid_client_tokens_are_rejected(token: str) -> None:
    with pytest.raises(ProviderRequestRejected):
        mapping.validate_client_token(token)


def test_a_64_character_ascii_client_token_is_accepted() -> None:
    mapping.validate_client_token("o" * 64)


def test_tag_specifications_put_the_order_tag_on_instance_and_volumes() -> None:
    specs = mapping.tag_specifications("ord-7", {"team": "alice", "broker:order": "spoofed"})

    tags = [{"Key": "broker:order", "Value": "ord-7"}, {"Key": "team", "Value": "alice"}]
    assert specs == [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}]


def test_on_demand_price_is_read_from_json_string_items() -> None:
    item = {
        "product": {"sku": "SKU1"},
        "terms": {
            "OnDemand": {
                "SKU1.T": {"priceDimensions": {"SKU1.T.R": {"unit": "Hrs", "pricePerUnit": {"USD": "1.0060000000"}}}}
            }
        },
    }

    assert catalog.on_demand_usd([json.dumps(item)]) == (Decimal("1.006"), "SKU1")
    assert catalog.on_demand_usd([]) is None
    with pytest.raises(MalformedProviderResponse):
        catalog.on_demand_usd(["{not json"])


def test_newest_ubuntu_release_is_chosen() -> None:
    images = [
        {"ImageId": "ami-old", "Name": "ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-20170721"},
        {"ImageId": "ami-new", "Name": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20240423"},
        {"ImageId": "ami-mid", "Name": "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20240501"},
        {"ImageId": "ami-pending", "Name": "ubuntu/images/ubuntu-oracular-24.10-amd64-server-1", "State": "pending"},
    ]

    assert launching.newest_ubuntu_image(images) == "ami-new"
    assert launching.newest_ubuntu_image([]) is None


# ------------------------------------------------------------------------------------------------ boot


@pytest.mark.parametrize("code", ["InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "ParameterNotFound"])
def test_an_image_the_region_lacks_is_image_unavailable(code: str) -> None:
    assert errors.error_class_for(code, 400) is ImageUnavailable


def test_the_key_pair_gets_the_first_key_ec2_imports() -> None:
    ecdsa, rsa3072, rsa4096, ed25519 = parsed(ecdsa_public(), rsa_public(), rsa_public(4096), ed25519_public())

    # ImportKeyPair takes RSA (1024, 2048 or 4096 bits) and ED25519 (EC2 User Guide, create-key-pairs).
    assert launching.native_key([ecdsa, rsa3072, ed25519]) == ed25519
    assert launching.native_key([rsa4096, ed25519]) == rsa4096
    assert launching.native_key([ecdsa, rsa3072]) is None


def test_ingress_becomes_one_permission_per_port_with_ipv6_ranges_apart() -> None:
    rules = [
        IngressRule(port=22, cidrs=("203.0.113.7/24", "2001:DB8::/32")),
        IngressRule(port=22, cidrs=("203.0.113.0/24",)),
        IngressRule(port=53, cidrs=("198.51.100.0/24",), protocol="udp"),
    ]

    wanted = launching.wanted_permissions(rules)

    assert wanted == [("tcp", 22, "203.0.113.0/24"), ("tcp", 22, "2001:db8::/32"), ("udp", 53, "198.51.100.0/24")]
    assert launching.ip_permissions(wanted) == [
        {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [{"CidrIp": "203.0.113.0/24"}],
            "Ipv6Ranges": [{"CidrIpv6": "2001:db8::/32"}],
        },
        {"IpProtocol": "udp", "FromPort": 53, "ToPort": 53, "IpRanges": [{"CidrIp": "198.51.100.0/24"}]},
    ]
    assert launching.existing_permissions(launching.ip_permissions(wanted)) == set(wanted)


def test_existing_permissions_skip_port_ranges_and_all_traffic() -> None:
    permissions = [
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "tcp", "FromPort": 1000, "ToPort": 2000, "IpRanges": [{"CidrIp": "10.0.0.0/8"}]},
    ]

    assert launching.existing_permissions(permissions) == set()


def test_image_facts_read_the_root_device_and_its_snapshot_size() -> None:
    image = {
        "ImageId": "ami-0abc",
        "RootDeviceName": "/dev/sda1",
        "BlockDeviceMappings": [
            {"DeviceName": "/dev/sdb", "VirtualName": "ephemeral0"},
            {"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": "snap-1", "VolumeSize": 75}},
        ],
    }

    assert launching.image_facts(image) == launching.ImageFacts("ami-0abc", "/dev/sda1", 75)
    assert launching.root_volume(launching.image_facts(image), 300) == [
        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 300, "VolumeType": "gp3", "DeleteOnTermination": True}}
    ]
    with pytest.raises(MalformedProviderResponse):
        launching.image_facts({"ImageId": "ami-0abc"})


def test_tagged_resources_become_order_resources() -> None:
    tags = [{"Key": "broker:order", "Value": "ord-7"}]
    group = {"GroupId": "sg-1", "GroupName": "broker-ord-7", "VpcId": "vpc-1", "Tags": tags}
    key = {"KeyPairId": "key-1", "KeyName": "broker-ord-7", "Tags": tags}

    assert launching.order_resource("security_group", group, "us-east-1") == OrderResource(
        "security_group", "sg-1", "us-east-1", "ord-7", {"name": "broker-ord-7", "vpc_id": "vpc-1"}
    )
    assert launching.order_resource("key_pair", key, "us-east-1") == OrderResource(
        "key_pair", "key-1", "us-east-1", "ord-7", {"name": "broker-ord-7"}
    )
    assert launching.order_filter("ord-7") == [{"Name": "tag:broker:order", "Values": ["ord-7"]}]
    assert launching.order_filter() == [{"Name": "tag-key", "Values": ["broker:order"]}]


@pytest.mark.parametrize(
    "performance, gbps",
    [
        ("100 Gigabit", 100.0),
        ("Up to 25 Gigabit", 25.0),
        ("4x 100 Gigabit", 400.0),
        ("3200 Gigabit", 3200.0),
        ("Up to 12.5 Gigabit", 12.5),
        ("High", None),
        ("", None),
        ("1" * 40 + " Gigabit", None),
    ],
)
def test_network_performance_text_becomes_gbit_per_second_where_it_names_a_figure(performance, gbps):
    # NetworkInfo.NetworkPerformance: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_NetworkInfo.html
    assert catalog.network_gbps(performance) == gbps
