"""The GCP mapping tables and pure functions: error codes, GPU keys, names, SKUs, prices, instance states."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.gcp import catalog, errors, mapping
from providers.types import InstanceState

# Every GCP code CLOUD-APIS.md lists, with the class the broker must give it.
CLOUD_APIS_CODES = [
    ("ZONE_RESOURCE_POOL_EXHAUSTED", None, CapacityUnavailable),
    ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", 503, CapacityUnavailable),
    ("QUOTA_EXCEEDED", 403, QuotaExceeded),
    ("RESOURCE_OPERATION_RATE_EXCEEDED", None, TransientProviderError),
    ("", 429, TransientProviderError),
    ("", 500, TransientProviderError),
    ("", 502, TransientProviderError),
    ("", 503, TransientProviderError),
    ("PERMISSION_DENIED", 403, CredentialsRejected),
    ("", 401, CredentialsRejected),
    ("", 403, CredentialsRejected),
]


@pytest.mark.parametrize(("code", "status", "expected"), CLOUD_APIS_CODES)
def test_every_listed_code_has_its_class(code, status, expected):
    error = errors.error_from_codes([code], "message", status)

    assert type(error) is expected
    assert error.provider == "gcp"
    assert error.code == (code or str(status))


@pytest.mark.parametrize(("code", "expected"), sorted(errors.ERROR_CLASSES.items()))
def test_the_whole_table_classifies_without_a_status(code, expected):
    assert errors.error_class_for([code]) == (expected, code)


@pytest.mark.parametrize("status", [None, 400, 404, 409, 412])
def test_an_unknown_code_is_final_unless_the_status_says_otherwise(status):
    cls, code = errors.error_class_for(["SOMETHING_NEW"], status)

    assert (cls, code) == (ProviderRequestRejected, "SOMETHING_NEW")


def test_a_quota_reason_wins_over_the_403_status_name():
    # A synchronous quota 403 carries ErrorInfo QUOTA_EXCEEDED, errors[].reason quotaExceeded and the
    # PERMISSION_DENIED status name: the most specific code must decide.
    cls, code = errors.error_class_for(["QUOTA_EXCEEDED", "quotaExceeded", "PERMISSION_DENIED"], 403)

    assert (cls, code) == (QuotaExceeded, "QUOTA_EXCEEDED")


def test_a_capacity_code_wins_over_its_503():
    cls, _ = errors.error_class_for(["ZONE_RESOURCE_POOL_EXHAUSTED"], 503)

    assert cls is CapacityUnavailable


def test_operation_error_is_classified_from_its_codes():
    operation = {
        "status": "DONE",
        "http_error_status_code": 503,
        "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "message": "no room"}]},
    }

    failure = errors.operation_error(operation)

    assert failure == errors.OperationError("capacity", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "no room", 503)
    with pytest.raises(CapacityUnavailable):
        errors.raise_operation_error(operation)
    assert errors.operation_error({"status": "DONE", "error": {"errors": []}}) is None


# ------------------------------------------------------------------------------------------------- GPUs


@pytest.mark.parametrize(
    ("machine", "accelerator", "count", "model", "memory", "interconnect"),
    [
        ("a2-highgpu-1g", "nvidia-tesla-a100", 1, gpu_names.A100_40_SXM, 40, "pcie"),
        ("a2-highgpu-8g", "nvidia-tesla-a100", 8, gpu_names.A100_40_SXM, 40, "nvlink"),
        ("a2-ultragpu-8g", "nvidia-a100-80gb", 8, gpu_names.A100_80_SXM, 80, "nvlink"),
        ("a3-highgpu-8g", "nvidia-h100-80gb", 8, gpu_names.H100_SXM, 80, "nvlink"),
        ("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8, gpu_names.H100_SXM, 80, "nvlink"),
        ("a3-ultragpu-8g", "nvidia-h200-141gb", 8, gpu_names.H200_SXM, 141, "nvlink"),
        ("g2-standard-24", "nvidia-l4", 2, gpu_names.L4, 24, "pcie"),
        ("n1-standard-8", "nvidia-tesla-t4", 1, gpu_names.T4, 16, "pcie"),
        ("n1-standard-64", "nvidia-tesla-v100", 8, gpu_names.V100_16_SXM2, 16, "nvlink"),
    ],
)
def test_gpu_keys_follow_the_family_table(machine, accelerator, count, model, memory, interconnect):
    spec = catalog.gpu_spec(machine, accelerator, count)

    assert (spec.model, spec.count, spec.memory_gb, spec.interconnect) == (model, count, memory, interconnect)


def test_a_gpu_that_contradicts_its_family_keeps_the_raw_name():
    assert catalog.gpu_spec("a2-highgpu-1g", "nvidia-l4", 1).model == "nvidia-l4"
    assert catalog.gpu_spec("n1-standard-8", "nvidia-tesla-p100", 1).model == "nvidia-tesla-p100"
    assert catalog.gpu_spec("x9-weird-1g", "nvidia-future-x", 1).model == "nvidia-future-x"


def test_every_canonical_key_used_exists():
    assert {a.key for a in catalog.ACCELERATORS.values() if a.key} <= gpu_names.ALL


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    ("name", "machine", "accelerator", "count"),
    [
        ("a2-highgpu-1g", "a2-highgpu-1g", None, 0),
        ("n1-standard-8+1xT4", "n1-standard-8", "nvidia-tesla-t4", 1),
        ("n1-standard-64+8xV100", "n1-standard-64", "nvidia-tesla-v100", 8),
        ("n1-standard-8+2xnvidia-tesla-t4", "n1-standard-8", "nvidia-tesla-t4", 2),
    ],
)
def test_instance_type_names_round_trip(name, machine, accelerator, count):
    parsed = catalog.parse_instance_type(name)

    assert (parsed.machine_type, parsed.accelerator, parsed.count) == (machine, accelerator, count)
    assert catalog.parse_instance_type(str(parsed)) == parsed


@pytest.mark.parametrize("name", ["", "A2-HIGHGPU", "n1-standard-8+1xK80", "a2-highgpu-1g+1xT4", "n1-standard-8+0xT4"])
def test_bad_instance_type_names_are_rejected(name):
    with pytest.raises(ProviderRequestRejected):
        catalog.parse_instance_type(name)


@pytest.mark.parametrize("token", ["ord-1-a1", "ORD 77 / attempt #2", "x" * 200, "---", "é"])
def test_instance_names_are_valid_and_deterministic(token):
    name = mapping.instance_name(token)

    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name)
    assert mapping.instance_name(token) == name
    assert mapping.instance_name(token + "-2") != name


def test_request_ids_are_stable_uuids_per_action():
    first = mapping.request_id("insert", "ord-1-a1")

    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", first)
    assert mapping.request_id("insert", "ord-1-a1") == first
    assert mapping.request_id("delete", "ord-1-a1") != first


def test_labels_are_label_safe_and_the_order_label_wins():
    labels = mapping.labels("ORD/9", {"Team": "Vision", mapping.ORDER_LABEL: "spoofed", "9lives": "ok"})

    assert labels[mapping.ORDER_LABEL] == mapping.label_value("ORD/9")
    assert labels["team"] == mapping.label_value("Vision")
    assert labels["t_9lives"] == "ok"
    assert all(re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) for k in labels)
    assert all(re.fullmatch(r"[a-z0-9_-]{0,63}", v) for v in labels.values())
    assert mapping.label_value("ord-1") == "ord-1"


def test_instance_ids_are_zone_slash_name_in_the_region():
    assert mapping.split_instance_id("us-central1", "us-central1-a/gb-x") == ("us-central1-a", "gb-x")
    for bad in ("gb-x", "us-central1-a/", "europe-west4-a/gb-x", "us-central1-a/gb/x"):
        with pytest.raises(ProviderRequestRejected):
            mapping.split_instance_id("us-central1", bad)


# ------------------------------------------------------------------------------------------------ prices


def _sku(description, usage, region, units, nanos, unit="h", family="Compute"):
    return {
        "sku_id": f"SKU-{len(description)}-{usage}",
        "description": description,
        "category": {"resource_family": family, "usage_type": usage},
        "service_regions": [region],
        "pricing_info": [
            {
                "effective_time": "2025-06-01T00:00:00Z",
                "pricing_expression": {
                    "usage_unit": unit,
                    "tiered_rates": [
                        {
                            "start_usage_amount": 0.0,
                            "unit_price": {"units": units, "nanos": nanos, "currency_code": "USD"},
                        }
                    ],
                },
            }
        ],
    }


A2_SKUS = [
    _sku("Nvidia Tesla A100 GPU running in Iowa", "OnDemand", "us-central1", "2", 933908000),
    _sku("A2 Instance Core running in Iowa", "OnDemand", "us-central1", "0", 31611000),
    _sku("A2 Instance Ram running in Iowa", "OnDemand", "us-central1", "0", 4237000, unit="GiBy.h"),
    _sku(
        "Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Iowa",
        "Preemptible",
        "us-central1",
        "1",
        434100000,
    ),
    _sku("Storage PD Capacity in Iowa", "OnDemand", "us-central1", "0", 40000000, "GiBy.mo", "Storage"),
    _sku("Commitment v1: Nvidia Tesla A100 GPU in Iowa", "Commit1Yr", "us-central1", "1", 0),
]


def test_sku_index_keeps_gpu_core_and_ram_rates_only():
    index = catalog.sku_index(A2_SKUS)

    assert {k: v.price for k, v in index.items()} == {
        ("us-central1", "OnDemand", "gpu", "nvidia-tesla-a100"): Decimal("2.933908"),
        ("us-central1", "OnDemand", "core", "A2"): Decimal("0.031611"),
        ("us-central1", "OnDemand", "ram", "A2"): Decimal("0.004237"),
        ("us-central1", "Preemptible", "gpu", "nvidia-tesla-a100"): Decimal("1.4341"),
    }


def test_a_ram_sku_in_an_unexpected_unit_is_skipped_not_misread():
    skus = [_sku("A2 Instance Ram running in Iowa", "OnDemand", "us-central1", "0", 4237000, unit="GBy.mo")]

    assert catalog.sku_index(skus) == {}


def test_machine_price_is_the_rounded_sum_of_its_skus():
    index = catalog.sku_index(A2_SKUS)

    composed = catalog.compose_price(index, "us-central1", "OnDemand", "A2", 12, Decimal(85), "nvidia-tesla-a100", 1)

    assert composed is not None
    assert composed.exact == Decimal("3.673385")
    assert composed.price == Decimal("3.67339")
    assert composed.currency == "USD"
    # No spot vCPU/RAM SKU: no spot price, never a guess.
    assert (
        catalog.compose_price(index, "us-central1", "Preemptible", "A2", 12, Decimal(85), "nvidia-tesla-a100", 1)
        is None
    )


# Cloud Billing words a spot GPU card "Nvidia Tesla K80 GPU attached to Spot Preemptible VMs running in Warsaw":
# "REST Resource: billingAccounts.skus" (Cloud Billing pricing API v1beta), BillingAccountSku,
# https://cloud.google.com/billing/docs/reference/pricing-api/rest/v1beta/billingAccounts.skus (the same sentence
# in the generated client reference, https://googleapis.dev/ruby/google-apis-cloudbilling_v1beta/v0.10.0/Google/
# Apis/CloudbillingV1beta/GoogleCloudBillingBillingaccountskusV1betaBillingAccountSku.html). Only vCPU and RAM SKUs
# begin with "Spot Preemptible". category.usageType is "OnDemand" or "Preemptible" ("Class Category", Google Cloud
# Billing v1 API, https://cloud.google.com/dotnet/docs/reference/Google.Cloud.Billing.V1/latest/
# Google.Cloud.Billing.V1.Category).
N1_T4_SPOT_SKUS = [
    _sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", "us-central1", "0", 350000000),
    _sku(
        "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas",
        "Preemptible",
        "us-central1",
        "0",
        131100000,
    ),
    _sku(
        "Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", "us-central1", "0", 6655000
    ),
    _sku(
        "Spot Preemptible N1 Predefined Instance Ram running in Americas",
        "Preemptible",
        "us-central1",
        "0",
        892000,
        unit="GiBy.h",
    ),
]


def test_a_spot_gpu_sku_in_cloud_billing_wording_prices_the_spot_machine():
    index = catalog.sku_index(N1_T4_SPOT_SKUS)

    spot = catalog.compose_price(
        index, "us-central1", "Preemptible", "N1 Predefined", 8, Decimal(30), "nvidia-tesla-t4", 1
    )

    assert spot is not None
    assert spot.exact == Decimal("0.131100") + Decimal("0.006655") * 8 + Decimal("0.000892") * 30
    assert spot.sku_ids["gpu"] == N1_T4_SPOT_SKUS[1]["sku_id"]
    assert index[("us-central1", "OnDemand", "gpu", "nvidia-tesla-t4")].price == Decimal("0.35")
    assert index[("us-central1", "Preemptible", "gpu", "nvidia-tesla-t4")].price == Decimal("0.1311")


@pytest.mark.parametrize(
    ("description", "usage"),
    [
        # a spot card's wording filed as on demand must never become the on-demand price
        ("Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "OnDemand"),
        ("Nvidia Tesla T4 GPU running in Americas", "Preemptible"),
        ("Spot Preemptible N1 Predefined Instance Core running in Americas", "OnDemand"),
        ("N1 Predefined Instance Core running in Americas", "Preemptible"),
        # not Cloud Billing's wording for a GPU (the form this adapter and its sandbox once invented)
        ("Spot Preemptible Nvidia Tesla T4 GPU running in Americas", "Preemptible"),
    ],
)
def test_a_sku_whose_description_contradicts_its_usage_type_is_skipped(description, usage):
    assert catalog.sku_index([_sku(description, usage, "us-central1", "0", 131100000)]) == {}


def test_unreadable_skus_are_malformed():
    broken = _sku("A2 Instance Core running in Iowa", "OnDemand", "us-central1", "zero", 31611000)

    with pytest.raises(MalformedProviderResponse):
        catalog.sku_index([broken])


# --------------------------------------------------------------------------------------------- instances


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", InstanceState.PENDING),
        ("STAGING", InstanceState.PENDING),
        ("RUNNING", InstanceState.RUNNING),
        ("STOPPING", InstanceState.STOPPING),
        ("TERMINATED", InstanceState.STOPPED),
        ("SUSPENDED", InstanceState.STOPPING),
        ("REPAIRING", InstanceState.PENDING),
        ("SOMETHING", InstanceState.UNKNOWN),
    ],
)
def test_instance_states(status, state):
    assert mapping.instance_state(status) is state


def test_n1_instances_get_the_broker_name_with_their_attached_gpus():
    base = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/"
    item = {
        "name": "gb-x",
        "zone": base.rstrip("/"),
        "status": "RUNNING",
        "machine_type": base + "machineTypes/n1-standard-8",
        "guest_accelerators": [{"accelerator_type": base + "acceleratorTypes/nvidia-tesla-t4", "accelerator_count": 1}],
        "network_interfaces": [{"network_i_p": "10.0.0.2", "access_configs": [{"nat_i_p": "34.1.2.3"}]}],
        "labels": {"broker-order": "ord-1"},
    }

    handle = mapping.instance_handle(item)

    assert (handle.instance_id, handle.region, handle.instance_type) == (
        "us-central1-a/gb-x",
        "us-central1",
        "n1-standard-8+1xT4",
    )
    assert (handle.state, handle.public_ip, handle.private_ip) == (InstanceState.RUNNING, "34.1.2.3", "10.0.0.2")
    bundled = {**item, "machine_type": base + "machineTypes/a2-highgpu-1g"}
    assert mapping.instance_handle(bundled).instance_type == "a2-highgpu-1g"


def _op(kind, status, at, error=None):
    op = {"name": f"op-{kind}-{at}", "operation_type": kind, "status": status, "insert_time": at}
    if error:
        op["error"] = {"errors": [{"code": error, "message": error.lower()}]}
    return op


@pytest.mark.parametrize(
    ("operations", "state"),
    [
        ([_op("insert", "DONE", "1", "ZONE_RESOURCE_POOL_EXHAUSTED")], InstanceState.FAILED),
        ([_op("insert", "RUNNING", "1")], InstanceState.PENDING),
        ([_op("insert", "DONE", "1"), _op("delete", "DONE", "2")], InstanceState.TERMINATED),
        ([_op("insert", "DONE", "1")], InstanceState.TERMINATED),
        ([_op("compute.instances.preempted", "DONE", "2"), _op("insert", "DONE", "1")], InstanceState.TERMINATED),
    ],
)
def test_a_missing_instance_is_judged_by_its_newest_operation(operations, state):
    handle = mapping.handle_without_instance("us-central1-a", "gb-x", operations)

    assert handle is not None
    assert handle.state is state
    assert handle.instance_id == "us-central1-a/gb-x"


def test_a_failed_insert_carries_the_error_for_the_broker():
    handle = mapping.handle_without_instance("us-central1-a", "gb-x", [_op("insert", "DONE", "1", "QUOTA_EXCEEDED")])

    assert handle is not None
    assert (handle.extra["error_class"], handle.extra["error_code"]) == ("quota", "QUOTA_EXCEEDED")
    assert mapping.handle_without_instance("us-central1-a", "gb-x", []) is None
