"""The AWS sandbox itself, driven by plain boto3 and by its HTTP control API."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.catalogue import load_seed
from sandboxes.aws.keys import CHARLIE


def _client(sandbox: AwsSandbox, service: str, region: str = "us-east-1", key: str = CHARLIE.access_key_id) -> Any:
    # One attempt: botocore would otherwise retry the sandbox's 500s and hide the faults under test.
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=sandbox.url,
        aws_access_key_id=key,
        aws_secret_access_key=CHARLIE.secret_access_key,
        config=botocore.config.Config(retries={"total_max_attempts": 1}),
    )


def _control(sandbox: AwsSandbox, method: str, route: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{sandbox.url}/_sandbox/{route}", data=data, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - the sandbox's local URL
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _run_p4d(sandbox: AwsSandbox, idempotency_key: str = "charlie-1", zone: str = "us-east-1a") -> dict[str, Any]:
    result: dict[str, Any] = _client(sandbox, "ec2").run_instances(
        ImageId="ami-785db401",
        InstanceType="p4d.24xlarge",
        MinCount=1,
        MaxCount=1,
        ClientToken=idempotency_key,
        Placement={"AvailabilityZone": zone},
    )
    return result


def test_the_seed_has_sourced_prices_for_at_least_ten_gpu_types() -> None:
    seed = load_seed()

    assert len({r.instance_type for r in seed}) == 22
    assert len({(r.region, r.instance_type) for r in seed}) == len(seed) == 48
    assert {r.region for r in seed} == {
        "us-east-1",
        "us-west-2",
        "eu-west-1",
        "eu-central-1",
        "eu-north-1",
        "ap-south-1",
        "ap-southeast-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-east-1",
    }
    # The fractional L4s (g6f) are newer than the SkyPilot catalogue snapshot: their rows cite a Vantage export.
    sources = ("github:skypilot-org/skypilot-catalog/", "github:tsaol/aws-gpu/data/all_gpu_instances.js@")
    assert all(r.source.startswith(sources) for r in seed)
    assert {r.instance_type for r in seed if not r.source.startswith(sources[0])} == {
        "g6f.large",
        "g6f.xlarge",
        "g6f.2xlarge",
        "g6f.4xlarge",
    }
    assert all(r.spot is None or r.spot < r.on_demand for r in seed)
    assert not any(r.instance_type.startswith(("p3.", "p5e.")) for r in seed)


def test_every_seeded_type_is_offered_in_two_zones_and_priced_per_zone(aws_sandbox: AwsSandbox) -> None:
    for row in aws_sandbox.seed:
        zones = aws_sandbox.zones(row.region, row.instance_type)
        assert len(zones) >= 2, row
        prices = [aws_sandbox.spot_price(row.region, row.instance_type, z) for z in zones]
        if row.spot is None:
            assert prices == [None] * len(zones)
        else:
            assert row.spot in prices
            assert all(p is not None and p < row.on_demand for p in prices)

    offered = _client(aws_sandbox, "ec2").describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["p6-b200.48xlarge"]}]
    )
    assert sorted(o["Location"] for o in offered["InstanceTypeOfferings"]) == ["us-east-1a", "us-east-1c"]


def test_price_list_honours_term_match_and_paginates(aws_sandbox: AwsSandbox) -> None:
    pricing = _client(aws_sandbox, "pricing")
    instance_filters = [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p4d.24xlarge"},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"},
    ]

    pages = list(
        pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=instance_filters, PaginationConfig={"PageSize": 1}
        )
    )

    assert [len(p["PriceList"]) for p in pages] == [1, 1, 1]
    products = [json.loads(item) for page in pages for item in page["PriceList"]]
    assert all(isinstance(item, str) for page in pages for item in page["PriceList"])
    assert {p["product"]["attributes"]["capacitystatus"] for p in products} == {
        "Used",
        "UnusedCapacityReservation",
        "AllocatedCapacityReservation",
    }

    exact = pricing.get_products(
        ServiceCode="AmazonEC2",
        Filters=[*instance_filters, {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"}],
    )
    assert len(exact["PriceList"]) == 1
    (term,) = json.loads(exact["PriceList"][0])["terms"]["OnDemand"].values()
    (dimension,) = term["priceDimensions"].values()
    assert (dimension["unit"], dimension["pricePerUnit"]) == ("Hrs", {"USD": "21.9576420000"})
    assert "NextToken" not in exact


def test_price_list_rejects_a_foreign_next_token(aws_sandbox: AwsSandbox) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _client(aws_sandbox, "pricing").get_products(ServiceCode="AmazonEC2", NextToken="not-a-token")

    assert caught.value.response["Error"]["Code"] == "InvalidNextTokenException"


def test_spot_history_is_deterministic_and_its_newest_point_is_the_seed(aws_sandbox: AwsSandbox) -> None:
    ec2 = _client(aws_sandbox, "ec2")
    query = {
        "InstanceTypes": ["p4de.24xlarge"],
        "ProductDescriptions": ["Linux/UNIX"],
        "AvailabilityZone": "us-east-1d",
        "StartTime": datetime.now(UTC) - timedelta(days=2),
    }

    first = ec2.describe_spot_price_history(**query)["SpotPriceHistory"]
    second = ec2.describe_spot_price_history(**query)["SpotPriceHistory"]

    assert first == second
    assert len(first) == 4
    assert [row["Timestamp"] for row in first] == sorted((row["Timestamp"] for row in first), reverse=True)
    assert Decimal(first[0]["SpotPrice"]) == Decimal("9.9734")
    assert all(Decimal(row["SpotPrice"]) < Decimal("27.44705") for row in first)
    assert {(row["InstanceType"], row["AvailabilityZone"], row["ProductDescription"]) for row in first} == {
        ("p4de.24xlarge", "us-east-1d", "Linux/UNIX")
    }


def test_spot_history_reports_the_price_in_effect_at_the_start_time(aws_sandbox: AwsSandbox) -> None:
    rows = _client(aws_sandbox, "ec2").describe_spot_price_history(
        InstanceTypes=["p4de.24xlarge"], StartTime=datetime.now(UTC), ProductDescriptions=["Linux/UNIX"]
    )["SpotPriceHistory"]

    assert sorted(row["AvailabilityZone"] for row in rows) == ["us-east-1b", "us-east-1c", "us-east-1d"]


def test_run_instances_is_idempotent_on_client_token_per_region(aws_sandbox: AwsSandbox) -> None:
    first = _run_p4d(aws_sandbox)
    again = _run_p4d(aws_sandbox)
    other_region = _client(aws_sandbox, "ec2", region="us-west-2").run_instances(
        ImageId="ami-785db401", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1, ClientToken="charlie-1"
    )

    assert again["Instances"][0]["InstanceId"] == first["Instances"][0]["InstanceId"]
    assert again["ReservationId"] == first["ReservationId"]
    assert other_region["Instances"][0]["InstanceId"] != first["Instances"][0]["InstanceId"]
    assert [i.region for i in aws_sandbox.instances()] == ["us-east-1", "us-west-2"]


def test_faults_are_driven_over_http(aws_sandbox: AwsSandbox) -> None:
    assert _control(aws_sandbox, "GET", "health") == (200, {"sandbox": "aws", "status": "ok"})

    status, created = _control(
        aws_sandbox, "POST", "faults", {"kind": "capacity", "instance_type": "p4d.24xlarge", "times": 1}
    )
    assert status == 201
    assert created["faults"][0] | {"id": 0} == {
        "id": 0,
        "kind": "capacity",
        "action": "RunInstances",
        "instance_type": "p4d.24xlarge",
        "zone": None,
        "times": 1,
        "seconds": 0.0,
        "code": None,
        "remaining": 1,
        "fired": 0,
        "region": None,
        "message": None,
    }
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _run_p4d(aws_sandbox)
    assert caught.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert _control(aws_sandbox, "GET", "faults") == (200, {"faults": []})
    assert aws_sandbox.instances() == []

    _control(aws_sandbox, "POST", "faults", [{"kind": "quota"}, {"kind": "throttle", "action": None}])
    assert _control(aws_sandbox, "DELETE", "faults") == (200, {"cleared": 2})
    assert _control(aws_sandbox, "POST", "faults", {"kind": "meteor"})[0] == 400


def test_reset_forgets_instances_faults_tokens_and_calls(aws_sandbox: AwsSandbox) -> None:
    first = _run_p4d(aws_sandbox)
    aws_sandbox.faults.inject("quota")
    aws_sandbox.accept_access_keys({"AKIDONLY"})

    assert _control(aws_sandbox, "POST", "reset") == (200, {"reset": True})

    assert (aws_sandbox.instances(), aws_sandbox.faults.active(), aws_sandbox.calls()) == ([], [], [])
    again = _run_p4d(aws_sandbox)
    assert again["Instances"][0]["InstanceId"] != first["Instances"][0]["InstanceId"]


def test_unknown_access_keys_get_auth_failure(aws_sandbox: AwsSandbox) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _client(aws_sandbox, "pricing", key="bad-key").get_products(ServiceCode="AmazonEC2")

    assert caught.value.response["Error"]["Code"] == "UnrecognizedClientException"
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        _client(aws_sandbox, "ec2", key="bad-key").describe_regions()
    assert caught.value.response["Error"]["Code"] == "AuthFailure"


def test_the_standalone_sandbox_serves_until_interrupted() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        # Only AWS: the other sandboxes would take the following ports, which another process may hold.
        [
            sys.executable,
            "-m",
            "sandboxes",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--only",
            "aws",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "the sandbox did not start within 30 s"
        assert process.stdout.readline().strip() == f"aws sandbox listening on http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sandbox/health", timeout=5) as response:
            assert json.loads(response.read()) == {"sandbox": "aws", "status": "ok"}
    finally:
        process.terminate()
        started = time.monotonic()
        process.wait(timeout=10)
    assert process.returncode == 0
    assert time.monotonic() - started < 5
    assert process.stderr is not None and process.stderr.read() == ""
